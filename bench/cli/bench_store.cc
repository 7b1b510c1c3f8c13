// argus-bench store: page writes and reads through the disk tier, each beside fio's figure for
// the same pattern (block size = the tier's slot size, same queue depth, same region size, O_DIRECT
// on both sides), measured in the same run.
#include <fmt/core.h>
#include <stdio.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <filesystem>
#include <random>

#include "argus/env.h"
#include "bench/cli/bench.h"
#include "core/progress.h"
#include "core/files.h"
#include "core/measure.h"

namespace argus::cli {
namespace {

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

struct ProcessOutput {
  int exit_code = -1;
  std::string out;
};

// Runs a shell command line; stdout is captured.
ProcessOutput RunCapture(const std::string& command) {
  ProcessOutput r;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0) r.out.append(buf.data(), n);
  const int status = ::pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string ReadText(const std::string& path) {
  auto bytes = ReadFileBytes(path);
  if (!bytes.ok()) return "";
  return std::string(reinterpret_cast<const char*>(bytes->data()), bytes->size());
}

std::string SizeName(uint64_t n) {
  if (n % (1 << 20) == 0) return fmt::format("{} MiB", n >> 20);
  if (n % (1 << 10) == 0) return fmt::format("{} KiB", n >> 10);
  return fmt::format("{} B", n);
}

}  // namespace

// ---- fio -------------------------------------------------------------------------------------

Fio Fio::Find(const std::string& program) {
  Fio fio;
  fio.program_ = program;
  ProcessOutput r = RunCapture(ShellQuote(program) + " --version 2>/dev/null");
  std::string version = r.out.substr(0, r.out.find('\n'));
  if (r.exit_code != 0 || version.empty()) {
    fio.reason_ = fmt::format("`{} --version` failed (exit code {}): fio is not installed", program,
                              r.exit_code);
  } else {
    fio.version_ = version;
  }
  return fio;
}

Result<FioFigure> Fio::Run(const FioJob& job) const {
  // fio splits --filename at ':'.
  std::string file;
  for (char c : job.file) file += c == ':' ? std::string("\\:") : std::string(1, c);
  const std::string err_path = job.file + ".err";
  const char* rw =
      job.write ? (job.random ? "randwrite" : "write") : (job.random ? "randread" : "read");
  std::string command = fmt::format(
      "{} --name=argus --filename={} --rw={} --bs={} --iodepth={} --size={} --direct=1 "
      "--ioengine=io_uring --numjobs=1 --output-format=json",
      ShellQuote(program_), ShellQuote(file), rw, job.block_bytes, job.queue_depth, job.size_bytes);
  if (job.fsync_every > 0) command += fmt::format(" --fsync={}", job.fsync_every);
  command += " 2>" + ShellQuote(err_path);
  const ProcessOutput r = RunCapture(command);
  const std::string err = ReadText(err_path);
  std::error_code ignored;
  std::filesystem::remove(err_path, ignored);
  auto fail = [&](std::string_view why) {
    return Status::IOError(fmt::format("fio {} of {}-byte blocks on {}: {}{}{}", rw,
                                       job.block_bytes, job.file, why, err.empty() ? "" : ": ",
                                       err.substr(0, 2000)));
  };
  if (r.exit_code != 0) return fail(fmt::format("exit code {}", r.exit_code));
  // fio may print notes before its JSON.
  const size_t start = r.out.find('{');
  nlohmann::json j = nlohmann::json::parse(start == std::string::npos ? "" : r.out.substr(start),
                                           nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.contains("jobs") || !j["jobs"].is_array() || j["jobs"].empty()) {
    return fail("no JSON report with a job on stdout");
  }
  const nlohmann::json& result = j["jobs"][0];
  if (result.value("error", 0) != 0)
    return fail(fmt::format("job error {}", result["error"].dump()));
  const nlohmann::json& side = result[job.write ? "write" : "read"];
  FioFigure figure;
  figure.seconds = side.value("runtime", 0.0) / 1e3;
  figure.gbps = side.value("bw_bytes", 0.0) / 1e9;
  figure.iops = side.value("iops", 0.0);
  if (!(figure.seconds > 0 && figure.gbps > 0)) return fail("the report moved no bytes");
  return figure;
}

// ---- The bench -------------------------------------------------------------------------------

namespace {

constexpr const char* kOrders[] = {"sequential", "random"};

struct PageSet {
  uint64_t page_bytes = 0, slot_bytes = 0;
  std::vector<PageKey> keys;  // in the order they were written: consecutive slots
  uint64_t region_bytes() const { return slot_bytes * keys.size(); }
};

StoreFigure ArgusFigure(const PageSet& set, double seconds) {
  const double n = static_cast<double>(set.keys.size());
  return {.seconds = seconds,
          .gbps = n * static_cast<double>(set.slot_bytes) / seconds / 1e9,
          .payload_gbps = n * static_cast<double>(set.page_bytes) / seconds / 1e9,
          .pages_per_second = n / seconds};
}

// Runs fio for a point, and on success keeps its best figure. A failing fio is reported once and
// then left out, so the bench still gives its absolute figures.
class FioSide {
 public:
  FioSide(const StoreBenchOptions& o, FioInfo& info) : fio_(Fio::Find(o.fio)), info_(info) {
    info_.available = fio_.available();
    if (fio_.available()) {
      info_.version = fio_.version();
    } else {
      Disable(fio_.reason());
    }
  }

  void Measure(const FioJob& job, StorePoint& point) {
    if (!usable_) return;
    auto figure = fio_.Run(job);
    if (!figure.ok()) {
      Disable(figure.status().message());
      return;
    }
    if (!point.fio || point.fio->gbps < figure->gbps) point.fio = *figure;
  }

 private:
  void Disable(const std::string& why) {
    usable_ = false;
    info_.available = false;
    info_.reason = why;
    fmt::print(stderr, "bench store: {}; reporting absolute figures only\n", why);
  }

  Fio fio_;
  FioInfo& info_;
  bool usable_ = true;
};

Result<double> TimeReads(DiskTier& tier, std::span<const PageKey> keys) {
  const auto start = Clock::now();
  ARGUS_ASSIGN_OR_RETURN(std::unique_ptr<PageReadBatch> batch, tier.ReadBatch(keys));
  for (size_t i = 0; i < keys.size(); ++i) {
    ARGUS_RETURN_IF_ERROR(batch->Get(i).status());
    batch->Release(i);
  }
  batch.reset();
  return Seconds(start);
}

// Writes options.bytes of pages of one size with Puts of put_batch pages; returns the seconds.
Result<double> WritePages(DiskTier& tier, PageSet& set, uint64_t n_pages, uint32_t put_batch) {
  std::vector<std::vector<std::byte>> payloads(put_batch, std::vector<std::byte>(set.page_bytes));
  std::vector<PagePut> puts;
  const auto start = Clock::now();
  for (uint64_t i = 0; i < n_pages;) {
    puts.clear();
    for (uint32_t b = 0; b < put_batch && i < n_pages; ++b, ++i) {
      // Distinct contents per page: its key's bytes stamped over a filler.
      std::vector<std::byte>& p = payloads[b];
      std::fill(p.begin(), p.end(), static_cast<std::byte>(i));
      const PageKey key{set.page_bytes, i};
      std::memcpy(p.data(), &key, std::min(sizeof(key), p.size()));
      set.keys.push_back(key);
      puts.push_back({key, "bench", p});
    }
    ARGUS_RETURN_IF_ERROR(tier.Put(puts));
  }
  return Seconds(start);
}

Status ValidateOptions(const StoreBenchOptions& o) {
  if (o.dir.empty()) return Status::InvalidArgument("bench store: --dir is required");
  if (o.page_sizes.empty() || o.queue_depths.empty()) {
    return Status::InvalidArgument("bench store: no page sizes or no queue depths");
  }
  for (uint64_t n : o.page_sizes) {
    if (n == 0 || n > kMaxPagePayloadBytes) {
      return Status::InvalidArgument(
          fmt::format("bench store: page size {} (1 .. {} bytes)", n, kMaxPagePayloadBytes));
    }
  }
  for (uint32_t qd : o.queue_depths) {
    if (qd == 0) return Status::InvalidArgument("bench store: queue depth 0");
  }
  if (o.reps < 1 || o.put_batch < 1) {
    return Status::InvalidArgument("bench store: --reps and --put-batch must be at least 1");
  }
  return Status::Ok();
}

}  // namespace

void to_json(nlohmann::json& j, const FioFigure& f) {
  j = {{"seconds", f.seconds}, {"gbps", f.gbps}, {"iops", f.iops}};
}

void to_json(nlohmann::json& j, const StoreFigure& f) {
  j = {{"seconds", f.seconds},
       {"gbps", f.gbps},
       {"payload_gbps", f.payload_gbps},
       {"pages_per_second", f.pages_per_second}};
}

void to_json(nlohmann::json& j, const StorePoint& p) {
  j = {{"page_bytes", p.page_bytes},
       {"slot_bytes", p.slot_bytes},
       {"pages", p.pages},
       {"argus", p.argus}};
  if (p.fio) {
    j["fio"] = *p.fio;
    j["vs_fio"] = p.vs_fio();
  }
}

void to_json(nlohmann::json& j, const StoreReadPoint& r) {
  j = r.point;
  j["order"] = r.order;
  j["queue_depth"] = r.queue_depth;
}

void to_json(nlohmann::json& j, const StoreReport& r) {
  const StoreBenchOptions& c = r.config;
  nlohmann::json fio = {{"available", r.fio.available}};
  if (!r.fio.version.empty()) {
    fio["version"] = r.fio.version;
    fio["engine"] = "io_uring, O_DIRECT";
  }
  if (!r.fio.reason.empty()) fio["reason"] = r.fio.reason;
  nlohmann::json writes = nlohmann::json::array();
  for (const StorePoint& p : r.writes) {
    writes.push_back(p);
    writes.back()["put_batch"] = c.put_batch;
  }
  j = {{"bench", "store"},
       {"config",
        {{"dir", c.dir},
         {"page_sizes", c.page_sizes},
         {"queue_depths", c.queue_depths},
         {"bytes_per_page_size", c.bytes},
         {"reps", c.reps},
         {"put_batch", c.put_batch},
         {"seed", c.seed}}},
       {"store",
        {{"io_backend", r.store.io_backend},
         {"direct_io", r.store.direct_io},
         {"alignment_bytes", r.store.alignment_bytes}}},
       {"fio", fio},
       {"writes", writes},
       {"reads", r.reads}};
  if (r.decode) j["decode"] = *r.decode;
}

Result<StoreReport> RunStoreBench(const StoreBenchOptions& o) {
  ARGUS_RETURN_IF_ERROR(ValidateOptions(o));
  Env& env = *Env::Default();
  ARGUS_RETURN_IF_ERROR(env.CreateDir(o.dir));
  const std::string store_dir = o.dir + "/argus-bench-store";
  const std::string fio_file = o.dir + "/argus-bench-fio.dat";
  // Left-overs of an earlier run go first; what this run writes goes when it ends, well or not
  // (after the stores, which live in inner scopes, are closed).
  struct RemoveFiles {
    std::string store_dir, fio_file;
    void operator()() const {
      std::error_code ignored;
      std::filesystem::remove_all(store_dir, ignored);
      std::filesystem::remove(fio_file, ignored);
    }
    ~RemoveFiles() { (*this)(); }
  } const remove_files{store_dir, fio_file};
  remove_files();

  const uint64_t max_page = *std::max_element(o.page_sizes.begin(), o.page_sizes.end());
  const uint32_t max_qd = *std::max_element(o.queue_depths.begin(), o.queue_depths.end());
  auto n_pages_of = [&](uint64_t page_bytes) {
    return std::max<uint64_t>(1, o.bytes / page_bytes);
  };
  uint64_t total_payload = 0;
  for (uint64_t n : o.page_sizes) total_payload += n_pages_of(n) * n;
  DiskTierOptions tier_options;
  tier_options.dir = store_dir;
  // Room for every page with its header and alignment padding (at most one 64 KiB block each).
  tier_options.disk_budget_bytes = 2 * total_payload + (uint64_t{64} << 20);
  // The reads in flight plus the page being consumed, headers included.
  tier_options.staging_budget_bytes = (max_qd + 2) * (max_page + (uint64_t{64} << 10));
  tier_options.io = o.io;
  tier_options.verify_on_open = false;  // the pages were just written; reads verify them anyway

  StoreReport report{.config = o};
  FioSide fio(o, report.fio);

  const uint64_t n_steps =
      o.page_sizes.size() * (1 + o.queue_depths.size() * std::size(kOrders) * o.reps);
  uint64_t n_done = 0;
  Progress progress("bench store");
  const auto start = Clock::now();

  // Writes: every page set, through one store; fio writes the same region with an fdatasync
  // after every put_batch blocks, as each Put makes its pages durable (it also appends and
  // syncs a journal record, which fio does not).
  std::vector<PageSet> sets;
  {
    tier_options.queue_depth = max_qd;
    ARGUS_ASSIGN_OR_RETURN(std::unique_ptr<DiskTier> tier, DiskTier::Open(tier_options));
    report.store = tier->stats();
    if (!report.store.direct_io) {
      fmt::print(stderr,
                 "bench store: the file system refused O_DIRECT: the store's figures include the "
                 "page cache\n");
    }
    for (uint64_t page_bytes : o.page_sizes) {
      PageSet set;
      set.page_bytes = page_bytes;
      ARGUS_ASSIGN_OR_RETURN(double seconds,
                             WritePages(*tier, set, n_pages_of(page_bytes), o.put_batch));
      ARGUS_ASSIGN_OR_RETURN(StoredPageInfo info, tier->Info(set.keys.front()));
      set.slot_bytes = info.slot_bytes;
      StorePoint point{.page_bytes = page_bytes,
                       .slot_bytes = set.slot_bytes,
                       .pages = set.keys.size(),
                       .argus = ArgusFigure(set, seconds)};
      FioJob job{fio_file, true, false, set.slot_bytes, set.region_bytes(), 1, o.put_batch};
      fio.Measure(job, point);
      report.writes.push_back(point);
      sets.push_back(std::move(set));
      progress.Update(++n_done, n_steps);
    }
  }

  // Reads: for each queue depth, a store opened with it; every point interleaves ARGUS and fio
  // reps and keeps the best of each.
  std::mt19937_64 rng(o.seed);
  for (uint32_t qd : o.queue_depths) {
    tier_options.queue_depth = qd;
    ARGUS_ASSIGN_OR_RETURN(std::unique_ptr<DiskTier> tier, DiskTier::Open(tier_options));
    for (const PageSet& set : sets) {
      for (const char* order : kOrders) {
        const bool random = std::strcmp(order, "random") == 0;
        std::vector<PageKey> keys = set.keys;
        if (random) std::shuffle(keys.begin(), keys.end(), rng);
        StoreReadPoint read{.order = order,
                            .queue_depth = qd,
                            .point = {.page_bytes = set.page_bytes,
                                      .slot_bytes = set.slot_bytes,
                                      .pages = keys.size()}};
        double best = 1e30;
        for (int r = 0; r < o.reps; ++r) {
          ARGUS_ASSIGN_OR_RETURN(double seconds, TimeReads(*tier, keys));
          best = std::min(best, seconds);
          read.point.argus = ArgusFigure(set, best);
          FioJob job{fio_file, false, random, set.slot_bytes, set.region_bytes(), qd, 0};
          fio.Measure(job, read.point);
          progress.Update(++n_done, n_steps);
        }
        report.reads.push_back(read);
      }
    }
  }
  progress.Done(Seconds(start));
  return report;
}

void PrintStoreBench(const StoreReport& report) {
  const DiskTierStats& store = report.store;
  const FioInfo& fio = report.fio;
  fmt::print("store: {}, {}, alignment {} B; fio: {}\n", store.io_backend,
             store.direct_io ? "O_DIRECT" : "buffered (O_DIRECT refused)", store.alignment_bytes,
             fio.available ? fio.version + " (io_uring, O_DIRECT)" : "not run (" + fio.reason + ")");
  fmt::print(
      "GB/s of slot bytes (header + payload + padding; fio's block size is the slot size)\n\n");
  auto fio_cells = [](const StorePoint& p) {
    if (!p.fio) return fmt::format("{:>9} {:>7}", "-", "-");
    return fmt::format("{:>9.3f} {:>7.2f}", p.fio->gbps, p.vs_fio());
  };
  fmt::print("writes: durable Puts of {} pages; fio: write, iodepth 1, fdatasync every {} blocks\n",
             report.config.put_batch, report.config.put_batch);
  fmt::print("{:>9} {:>9} {:>7} | {:>9} {:>9} {:>7}\n", "page", "slot", "pages", "ARGUS", "fio",
             "ratio");
  for (const StorePoint& p : report.writes) {
    fmt::print("{:>9} {:>9} {:>7} | {:>9.3f} {}\n", SizeName(p.page_bytes), SizeName(p.slot_bytes),
               p.pages, p.argus.gbps, fio_cells(p));
  }
  fmt::print("\nreads: ReadBatch, verified, at the queue depth; fio: read / randread\n");
  fmt::print("{:>9} {:>10} {:>4} | {:>9} {:>9} {:>7}\n", "page", "order", "qd", "ARGUS", "fio",
             "ratio");
  for (const StoreReadPoint& r : report.reads) {
    fmt::print("{:>9} {:>10} {:>4} | {:>9.3f} {}\n", SizeName(r.point.page_bytes), r.order,
               r.queue_depth, r.point.argus.gbps, fio_cells(r.point));
  }
}

}  // namespace argus::cli

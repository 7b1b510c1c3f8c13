// Decode with pages on disk, side by side with all in RAM: the decode section of
// `argus-bench store`.
#include <fmt/format.h>

#include <filesystem>

#include "argus/core.h"
#include "bench/cli/attention_bench.h"
#include "bench/cli/bench.h"
#include "core/measure.h"

namespace argus::cli {
namespace {

struct DiskCase {
  double fraction = 0;
  std::unique_ptr<DiskTier> disk;  // declared before the cache: destroyed after it
  FilledCache filled;
  size_t n_pages_on_disk = 0;
  DecodePass best;
};

// Moves the oldest `fraction` of every layer's full pages to disk.
Result<size_t> MovePagesToDisk(FilledCache& filled, double fraction) {
  KvCache& cache = *filled.cache;
  size_t n_moved = 0;
  for (uint32_t layer = 0; layer < cache.geometry().n_layers; ++layer) {
    ARGUS_ASSIGN_OR_RETURN(std::vector<PageView> pages, cache.Pages(filled.seq, layer));
    size_t n_full = 0;
    for (const PageView& page : pages) n_full += page.key_min != nullptr ? 1 : 0;
    const auto n = static_cast<size_t>(fraction * static_cast<double>(n_full) + 0.5);
    for (size_t i = 0; i < n; ++i) ARGUS_RETURN_IF_ERROR(cache.MoveToDisk(pages[i].id));
    n_moved += n;
  }
  return n_moved;
}

}  // namespace

void to_json(nlohmann::json& j, const DecodeOnDiskCase& c) {
  j = {{"fraction_on_disk", c.fraction_on_disk},
       {"pages_on_disk", c.pages_on_disk},
       {"ms_per_token", c.ms_per_token},
       {"time_vs_ram", c.time_vs_ram},
       {"disk_bytes_per_token", c.disk_bytes_per_token},
       {"disk_read_gbps", c.disk_read_gbps}};
  if (c.disk_read_vs_reference) j["disk_read_vs_reference"] = *c.disk_read_vs_reference;
  if (c.disk) {
    j["io_backend"] = c.disk->io_backend;
    j["direct_io"] = c.disk->direct_io;
    j["staging_peak_bytes"] = c.disk->staging_peak_bytes;
  }
}

void to_json(nlohmann::json& j, const DecodeOnDiskReport& r) {
  j = {{"model", r.model},
       {"layers_built", r.layers_built},
       {"tokens", r.tokens},
       {"codecs", r.codecs},
       {"page_tokens", r.page_tokens},
       {"threads", r.threads},
       {"reps", r.reps},
       {"queue_depth", r.queue_depth},
       {"slot_bytes", r.slot_bytes},
       {"reference_read", r.reference_read},
       {"reference_read_gbps", r.reference_read_gbps},
       {"identical_to_ram", true},  // MeasureDecodeOnDisk fails otherwise
       {"cases", r.cases}};
}

Result<DecodeOnDiskReport> MeasureDecodeOnDisk(const DecodeOnDiskOptions& o, ThreadPool& pool) {
  ARGUS_ASSIGN_OR_RETURN(ModelGeometry model, FindModel(o.model));
  const SyntheticContext context =
      MakeSyntheticContext(model, KeyRegime::kModerateOutliers, 1, 4096, pool);
  AttentionEngine engine(pool);
  ARGUS_ASSIGN_OR_RETURN(CacheEvictor evictor, CacheEvictor::Create(pool));
  ARGUS_ASSIGN_OR_RETURN(FilledCache ram, BuildSyntheticCache(context, o.n_layers, o.n_tokens,
                                                              o.pair, o.page_tokens, "decode"));
  std::vector<DiskCase> cases;
  for (double fraction : o.fractions) {
    if (fraction <= 0) continue;
    DiskCase c;
    c.fraction = fraction;
    DiskTierOptions disk_options;
    disk_options.dir = fmt::format("{}/decode-{:.0f}", o.dir, fraction * 100);
    disk_options.disk_budget_bytes = size_t{1} << 40;
    disk_options.staging_budget_bytes = o.staging_bytes;
    disk_options.io = o.io;
    disk_options.queue_depth = o.queue_depth;
    std::filesystem::remove_all(disk_options.dir);
    ARGUS_ASSIGN_OR_RETURN(c.disk, DiskTier::Open(disk_options));
    ARGUS_ASSIGN_OR_RETURN(c.filled, BuildSyntheticCache(context, o.n_layers, o.n_tokens, o.pair,
                                                         o.page_tokens, "decode", c.disk.get()));
    const auto start = Clock::now();
    ARGUS_ASSIGN_OR_RETURN(c.n_pages_on_disk, MovePagesToDisk(c.filled, fraction));
    fmt::print(stderr, "decode: moved {} pages ({:.0f}%) to disk in {:.1f} s\n", c.n_pages_on_disk,
               fraction * 100, Seconds(start));
    cases.push_back(std::move(c));
  }

  // Interleaved passes, best of reps each: every case sees the same machine.
  const CacheGeometry& g = ram.cache->geometry();
  std::vector<float> out(size_t{g.n_layers} * g.n_q_heads * g.head_dim);
  std::vector<float> expected(out.size());
  DecodePass best_ram;
  best_ram.seconds = 1e30;
  for (DiskCase& c : cases) c.best.seconds = 1e30;
  uint64_t slot_bytes = 0;
  for (const DiskCase& c : cases) {
    for (const PageKey& key : c.disk->Keys()) {
      ARGUS_ASSIGN_OR_RETURN(StoredPageInfo info, c.disk->Info(key));
      slot_bytes = std::max<uint64_t>(slot_bytes, info.slot_bytes);
    }
  }
  double reference_gbps = 0;
  for (int r = 0; r < o.reps; ++r) {
    if (o.reference_read && slot_bytes > 0) {
      ARGUS_ASSIGN_OR_RETURN(double gbps, o.reference_read(slot_bytes));
      reference_gbps = std::max(reference_gbps, gbps);
    }
    ARGUS_ASSIGN_OR_RETURN(
        DecodePass pass, DecodeAllLayers(engine, ram, context.q.data(), expected.data(), &evictor));
    if (pass.seconds < best_ram.seconds) best_ram = pass;
    for (DiskCase& c : cases) {
      ARGUS_ASSIGN_OR_RETURN(
          pass, DecodeAllLayers(engine, c.filled, context.q.data(), out.data(), &evictor));
      if (pass.seconds < c.best.seconds) c.best = pass;
      if (out != expected) {
        return Status::Internal(fmt::format(
            "decode with {:.0f}% of the pages on disk differs from all in RAM", c.fraction * 100));
      }
    }
  }

  DecodeOnDiskReport report{.model = model.name,
                            .layers_built = o.n_layers,
                            .tokens = o.n_tokens,
                            .codecs = o.pair.name(),
                            .page_tokens = o.page_tokens,
                            .threads = pool.n_threads(),
                            .reps = o.reps,
                            .queue_depth = o.queue_depth,
                            .slot_bytes = slot_bytes,
                            .reference_read = o.reference_name,
                            .reference_read_gbps = reference_gbps};
  auto row = [&](double fraction, const DecodePass& pass, size_t n_on_disk, const DiskTier* disk) {
    DecodeOnDiskCase c{.fraction_on_disk = fraction,
                       .pages_on_disk = n_on_disk,
                       .ms_per_token = pass.seconds * 1e3,
                       .time_vs_ram = pass.seconds / best_ram.seconds,
                       .disk_bytes_per_token = pass.attention.disk_bytes_read,
                       .disk_read_gbps = pass.attention.disk_bytes_read / pass.seconds / 1e9};
    if (reference_gbps > 0 && pass.attention.disk_bytes_read > 0)
      c.disk_read_vs_reference = c.disk_read_gbps / reference_gbps;
    if (disk != nullptr) c.disk = disk->stats();
    return c;
  };
  report.cases.push_back(row(0, best_ram, 0, nullptr));
  for (const DiskCase& c : cases)
    report.cases.push_back(row(c.fraction, c.best, c.n_pages_on_disk, c.disk.get()));
  std::vector<std::string> dirs;
  for (const DiskCase& c : cases) dirs.push_back(c.disk->options().dir);
  cases.clear();  // the caches erase their pages, then the stores close
  for (const std::string& dir : dirs) std::filesystem::remove_all(dir);
  return report;
}

}  // namespace argus::cli

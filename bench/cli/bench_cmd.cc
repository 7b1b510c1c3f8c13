// The subcommands of argus-bench: options, the readable tables, the JSON reports.
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <tuple>

#include "argus/core.h"
#include "bench/cli/attention_bench.h"
#include "bench/cli/bench.h"
#include "bench/cli/bench_commands.h"
#include "cli/commands.h"
#include "core/files.h"

namespace argus::cli {
namespace {

// A quality figure of a codec on a regime at a head_dim; NaN when not measured.
double QualityFigure(const CodecFigures* c, std::string_view regime, uint32_t dim,
                     double CodecQuality::*field) {
  const CodecQualityRow* row = c ? c->FindQuality(regime, dim) : nullptr;
  return row && row->skipped.empty() ? row->quality.*field : NAN;
}

// Quality on real activations beside the synthetic regimes' logit error at the measured
// head_dim nearest the dump's.
void PrintRealQuality(const CodecBenchReport& report, const std::vector<uint32_t>& dims) {
  const RealKvConfig& real = *report.real_kv;
  const std::string& regime = real.regime;
  const uint32_t real_dim = real.head_dim;
  const uint32_t dim = *std::min_element(dims.begin(), dims.end(), [&](uint32_t a, uint32_t b) {
    return std::abs(int64_t{a} - real_dim) < std::abs(int64_t{b} - real_dim);
  });
  fmt::print(
      "quality on real activations, {} ({}; {} tokens in tiles of {}): {} (layer, KV head) "
      "groups,\neach with its query heads at the last token; mean (max) over the groups. Speed "
      "above is synthetic: it depends on the shape, not on the values.\n",
      regime, real.geometry, real.tokens, real.tile_tokens, real.n_groups);
  fmt::print("{:<18} {:>9} {:>9} | {:>21} {:>21} {:>21} | {:>26}\n", "codec", "k rel", "v rel",
             "logit rms error", "out err", "KL", fmt::format("synthetic logit rms, dim {}", dim));
  fmt::print("{:<18} {:>9} {:>9} | {:>21} {:>21} {:>21} | {:>8} {:>8} {:>8}\n", "", "rmse", "rmse",
             "mean (max)", "mean (max)", "mean (max)", "iso", "moderate", "heavy");
  for (const CodecFigures& c : report.codecs) {
    const CodecQualityRow* row = nullptr;
    for (const CodecQualityRow& r : c.quality) {
      if (r.regime == regime) row = &r;
    }
    if (row == nullptr) continue;
    if (!row->skipped.empty()) {
      fmt::print("{:<18} skipped: {}\n", c.codec, row->skipped);
      continue;
    }
    auto both = [&](double CodecQuality::*field) {
      return fmt::format("{:.2e} ({:.2e})", row->quality.*field, (*row->max).*field);
    };
    fmt::print("{:<18} {:>9.2e} {:>9.2e} | {:>21} {:>21} {:>21} | {:>8.2e} {:>8.2e} {:>8.2e}\n",
               c.codec, row->quality.k_rel_rmse, row->quality.v_rel_rmse,
               both(&CodecQuality::logit_rms), both(&CodecQuality::out_rel_err),
               both(&CodecQuality::kl),
               QualityFigure(&c, "isotropic", dim, &CodecQuality::logit_rms),
               QualityFigure(&c, "moderate-outliers", dim, &CodecQuality::logit_rms),
               QualityFigure(&c, "heavy-outliers", dim, &CodecQuality::logit_rms));
  }
  fmt::print("\n");
}

}  // namespace

CLI::Option* AddJsonOption(CLI::App& cmd, std::string* path) {
  const CLI::Validator directory_exists(
      [](std::string& file) -> std::string {
        const std::filesystem::path dir = std::filesystem::path(file).parent_path();
        if (dir.empty() || std::filesystem::is_directory(dir)) return {};
        return "the directory " + dir.string() + " does not exist";
      },
      "PATH");
  return cmd.add_option("--json", *path, "Write the report as JSON to this file")
      ->check(directory_exists);
}

void WriteJsonReport(const std::string& json, const std::string& path, std::string_view who) {
  if (path.empty()) return;
  const std::string text = json + "\n";
  ThrowIfError(WriteFileBytes(path, std::as_bytes(std::span(text.data(), text.size()))));
  fmt::print(stderr, "{}: wrote {}\n", who, path);
}

void PrintCodecBench(const CodecBenchReport& report) {
  fmt::print(
      "machine: read {:.1f} GB/s (1 thread), FMA {:.1f} GFLOP/s (1 thread), LLC {:.0f} MiB\n",
      report.read_gbps_one_thread, report.fma_gflops_one_thread,
      static_cast<double>(report.last_level_cache_bytes) / (1 << 20));
  fmt::print(
      "speed: scores+accumulate over a context larger than {:.0f} MiB, 1 thread; "
      "quality: {} tokens vs double precision\n\n",
      static_cast<double>(report.min_context_bytes) / (1 << 20), report.config.quality_tokens);
  std::vector<uint32_t> dims;
  for (const CodecSpeed& row : report.codecs[0].speed) {
    if (std::find(dims.begin(), dims.end(), row.dim) == dims.end()) dims.push_back(row.dim);
  }
  const std::vector<uint32_t>& groups = report.config.groups;
  for (uint32_t dim : dims) {
    // Columns: one speed-up per measured GQA group, the bandwidth fraction at the first group
    // of 4 or more (where the float path is arithmetic-bound), and quality.
    const uint32_t bw_gqa = [&] {
      for (uint32_t g : groups) {
        if (g >= 4) return g;
      }
      return groups.back();
    }();
    std::string speed_sub;
    for (uint32_t g : groups) speed_sub += fmt::format(" {:>6}", fmt::format("GQA{}", g));
    const std::string speed_head = fmt::format("{:>{}}", "speedup vs f16", speed_sub.size());
    fmt::print("{:<18} {:>6} {:>6} {:>7} {:>7} |{} {:>6} | {:>27} {:>9} {:>9}\n",
               fmt::format("codec (dim {})", dim), "bits", "path", "enc", "dec", speed_head, "bw",
               "logit rms error", "out err", "KL");
    fmt::print("{:<18} {:>6} {:>6} {:>7} {:>7} |{} {:>6} | {:>8} {:>8} {:>9} {:>9} {:>9}\n", "",
               "/val", "", "GB/s", "GB/s", speed_sub, fmt::format("GQA{}", bw_gqa), "iso",
               "moderate", "heavy", "heavy", "heavy");
    for (const CodecFigures& c : report.codecs) {
      std::string speedups;
      for (uint32_t g : groups) {
        const CodecSpeed* row = c.FindSpeed(dim, g);
        speedups += fmt::format(" {:>6.2f}", row ? row->speedup_vs_f16() : NAN);
      }
      const CodecSpeed* bw_row = c.FindSpeed(dim, bw_gqa);
      auto q = [&](const char* regime, double CodecQuality::*field) {
        return QualityFigure(&c, regime, dim, field);
      };
      const CodecCodingRate* rates = nullptr;
      for (const CodecCodingRate& r : c.coding) {
        if (r.dim == dim) rates = &r;
      }
      fmt::print(
          "{:<18} {:>6.2f} {:>6} {:>7.2f} {:>7.2f} |{} {:>6.2f} | {:>8.2e} {:>8.2e} {:>9.2e} "
          "{:>9.2e} {:>9.2e}\n",
          c.codec, c.bits_per_value, c.kernel_path, rates ? rates->encode_gbps : NAN,
          rates ? rates->decode_gbps : NAN, speedups, bw_row ? bw_row->bandwidth_fraction : NAN,
          q("isotropic", &CodecQuality::logit_rms),
          q("moderate-outliers", &CodecQuality::logit_rms),
          q("heavy-outliers", &CodecQuality::logit_rms),
          q("heavy-outliers", &CodecQuality::out_rel_err), q("heavy-outliers", &CodecQuality::kl));
    }
    fmt::print("\n");
  }
  if (report.real_kv) PrintRealQuality(report, dims);
}

// The decode section of `bench store`: its store in the bench's directory, its reference fio's
// sequential reads of the decode's slot size at the decode's queue depth, in the same rounds.
Result<DecodeOnDiskReport> MeasureDecode(const StoreBenchOptions& store, DecodeOnDiskOptions d) {
  d.dir = store.dir;
  d.io = store.io;
  const std::string fio_file = store.dir + "/argus-bench-decode-fio.dat";
  const Fio fio = Fio::Find(store.fio);
  if (fio.available()) {
    d.reference_name = fmt::format("fio {}: sequential O_DIRECT io_uring reads, queue depth {}",
                                   fio.version(), d.queue_depth);
    d.reference_read = [&](uint64_t slot_bytes) -> Result<double> {
      const FioJob job{fio_file, false, false, slot_bytes, 256 * slot_bytes, d.queue_depth, 0};
      ARGUS_ASSIGN_OR_RETURN(FioFigure figure, fio.Run(job));
      return figure.gbps;
    };
  } else {
    d.reference_name = "none: " + fio.reason();
    fmt::print(stderr, "bench store: decode reads have no reference: {}\n", fio.reason());
  }
  ThreadPool pool;
  auto report = MeasureDecodeOnDisk(d, pool);
  std::error_code ignored;
  std::filesystem::remove(fio_file, ignored);
  return report;
}

void PrintDecodeOnDisk(const DecodeOnDiskReport& d) {
  fmt::print("decode with pages on disk: {} ({} layers built), {} tokens, {}, {} threads\n",
             d.model, d.layers_built, d.tokens, d.codecs, d.threads);
  fmt::print("reference: {} = {:.2f} GB/s\n", d.reference_read, d.reference_read_gbps);
  fmt::print("{:>8} {:>8} {:>12} {:>10} {:>14} {:>10} {:>10}\n", "on disk", "pages", "ms/token",
             "vs RAM", "disk MB/token", "disk GB/s", "vs ref");
  for (const DecodeOnDiskCase& c : d.cases) {
    fmt::print("{:>7.0f}% {:>8} {:>12.2f} {:>10.2f} {:>14.1f} {:>10.2f} {:>10}\n",
               c.fraction_on_disk * 100, c.pages_on_disk, c.ms_per_token, c.time_vs_ram,
               static_cast<double>(c.disk_bytes_per_token) / 1e6, c.disk_read_gbps,
               c.disk_read_vs_reference ? fmt::format("{:.2f}", *c.disk_read_vs_reference)
                                        : std::string("-"));
  }
  fmt::print("\n");
}

void AddBenchCommands(CLI::App& bench) {
  struct Options {
    CodecBenchOptions codec;
    AttentionBenchOptions attention;
    E2eBenchOptions e2e;
    StoreBenchOptions store;
    DecodeOnDiskOptions decode;
    PlacementBenchOptions placement;
    CapacityBenchOptions capacity;
    std::string json_path;
  };
  auto opt = std::make_shared<Options>();
  auto* codecs = bench.add_subcommand("codecs", "Every codec against f16: speed, bytes, error");
  AddJsonOption(*codecs, &opt->json_path);
  codecs
      ->add_option("--codecs", opt->codec.specs,
                   "Codec specs to measure (default: all, plus variants)")
      ->delimiter(',');
  codecs->add_option("--dims", opt->codec.dims, "Head dimensions")
      ->capture_default_str()
      ->delimiter(',');
  codecs->add_option("--gqa", opt->codec.groups, "GQA group sizes (query heads per KV head)")
      ->capture_default_str()
      ->delimiter(',');
  codecs
      ->add_option("--quality-tokens", opt->codec.quality_tokens,
                   "Context length of the quality measurement")
      ->capture_default_str();
  codecs->add_option("--seed", opt->codec.seed, "Seed of the synthetic KV generator")
      ->capture_default_str();
  codecs->add_option("--reps", opt->codec.reps, "Timed passes per measurement (the best is kept)")
      ->capture_default_str();
  codecs->add_flag("--quick", opt->codec.quick,
                   "Smaller context (half the last-level cache): a quick look");
  codecs->add_option("--kv-dir", opt->codec.kv_dir,
                     "Also measure quality on real activations: a directory written by argus "
                     "eval --dump-kv");
  codecs->callback([opt] {
    const CodecBenchReport report = ValueOrThrow(RunCodecBench(opt->codec));
    PrintCodecBench(report);
    WriteJsonReport(nlohmann::json(report).dump(2), opt->json_path, "bench codecs");
  });

  auto* attention = bench.add_subcommand(
      "attention", "Decode attention per token and layer: codec pairs against f16, by context");
  AttentionBenchOptions& a = opt->attention;
  AddJsonOption(*attention, &opt->json_path);
  auto* contexts = attention->add_option("--contexts", a.contexts, "Context lengths (tokens)")
                       ->capture_default_str()
                       ->delimiter(',');
  auto* models =
      attention->add_option("--models", a.models, "Model geometries: llama-3-8b, qwen2.5-0.5b")
          ->capture_default_str()
          ->delimiter(',');
  attention
      ->add_option("--pairs", a.pairs,
                   "K/V codec pairs, each timed beside f16/f16 (e.g. int4:channel/int4)")
      ->capture_default_str()
      ->delimiter(',');
  auto* layers = attention
                     ->add_option("--layers", a.layers,
                                  "Layers built and timed per model (figures are scaled to all "
                                  "layers)")
                     ->capture_default_str();
  AddThreadsOption(*attention, a.threads);
  auto* reps =
      attention->add_option("--reps", a.reps, "Timed passes per measurement (the best is kept)")
          ->capture_default_str();
  attention->add_option("--page-tokens", a.page_tokens, "Tokens per page")->capture_default_str();
  attention->add_option("--seed", a.seed, "Seed of the synthetic KV generator")
      ->capture_default_str();
  attention->add_flag("--quick", a.quick, "Contexts 4096,16384 and 2 reps, unless given");
  attention
      ->add_option("--kv-dir", a.kv_dir,
                   "Real activations instead of synthetic KV: a directory written by argus eval "
                   "--dump-kv (its geometry, layers and tokens; errors against double precision)")
      ->excludes(contexts)
      ->excludes(models)
      ->excludes(layers);
  attention->callback([opt, contexts, reps] {
    AttentionBenchOptions options = opt->attention;
    if (options.quick && contexts->count() == 0) options.contexts = {4096, 16384};
    if (options.quick && reps->count() == 0) options.reps = 2;
    const AttentionBenchReport report = ValueOrThrow(RunAttentionBench(options));
    PrintAttentionBench(report);
    WriteJsonReport(nlohmann::json(report).dump(2), opt->json_path, "bench attention");
  });

  auto* e2e = bench.add_subcommand(
      "e2e", "Decode time per token of a whole model by context depth and KV codec");
  E2eBenchOptions& e = opt->e2e;
  AddJsonOption(*e2e, &opt->json_path);
  e2e->add_option("-m,--model", e.model_path,
                  "GGUF model (default: a random-weight model of --preset)")
      ->check(CLI::ExistingFile);
  e2e->add_option("--preset", e.preset, "Geometry of the random model")->capture_default_str();
  e2e->add_option("--type", e.type, "Weights of the random model: q8_0 or q4_0")
      ->capture_default_str()
      ->check(CLI::IsMember({"q8_0", "q4_0"}));
  e2e->add_option("--depths", e.depths, "Context depths (tokens)")
      ->capture_default_str()
      ->delimiter(',');
  e2e->add_option("--kv", e.kv, "KV codecs, K/V pairs or one codec for both")
      ->capture_default_str()
      ->delimiter(',');
  e2e->add_option("--tokens", e.tokens, "Decode steps per round")->capture_default_str();
  e2e->add_option("--rounds", e.rounds, "Interleaved rounds (the best is kept)")
      ->capture_default_str();
  AddThreadsOption(*e2e, e.threads);
  e2e->add_option("--page-tokens", e.page_tokens, "Tokens per KV page")->capture_default_str();
  e2e->add_option("--peer", e.peer_path,
                  "llama.cpp's depthbench, run at each depth and KV type f16/q8_0/q4_0 beside "
                  "argus (default: ../shared/peers/bin/depthbench when present)");
  e2e->add_flag("--no-peer", e.no_peer, "Run argus alone");
  e2e->add_option("--prefill", e.prefill,
                  "Prompt lengths whose time to first token is measured (f16 KV), beside "
                  "llama-bench's prompt processing")
      ->delimiter(',')
      ->capture_default_str();
  e2e->add_option("--prefill-batch", e.prefill_batch, "Prompt tokens per chunk")
      ->capture_default_str();
  e2e->add_option("--prefill-rounds", e.prefill_rounds,
                  "Interleaved prefill rounds (best kept); 0 measures no time to first token")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  e2e->callback([opt] {
    const E2eReport report = ValueOrThrow(RunE2eBench(opt->e2e));
    PrintE2eBench(report);
    WriteJsonReport(nlohmann::json(report).dump(2), opt->json_path, "bench e2e");
  });

  auto* store = bench.add_subcommand(
      "store", "Disk tier page writes and reads beside fio's figure for the same pattern");
  StoreBenchOptions& s = opt->store;
  store->add_option("--dir", s.dir, "Directory for the bench's store and fio's file")->required();
  AddJsonOption(*store, &opt->json_path);
  AsByteSize(store->add_option("--page-sizes", s.page_sizes, "Page payload sizes (e.g. 64K,1M)")
                 ->capture_default_str()
                 ->delimiter(','));
  store->add_option("--queue-depths", s.queue_depths, "Read queue depths")
      ->capture_default_str()
      ->delimiter(',');
  AsByteSize(
      store
          ->add_option("--bytes", s.bytes,
                       "Payload bytes stored per page size, each read once per point and rep")
          ->capture_default_str());
  store->add_option("--reps", s.reps, "Interleaved ARGUS/fio rounds (the best is kept)")
      ->capture_default_str();
  store->add_option("--put-batch", s.put_batch, "Pages per durable Put")->capture_default_str();
  store->add_option("--io", s.io, "Store reads: auto (io_uring where allowed), uring or threads")
      ->transform(CLI::CheckedTransformer(
          std::map<std::string, DiskIoBackend>{{"auto", DiskIoBackend::kAuto},
                                               {"uring", DiskIoBackend::kUring},
                                               {"threads", DiskIoBackend::kThreads}}));
  store->add_option("--fio", s.fio, "The fio program")->capture_default_str();
  store->add_option("--seed", s.seed, "Seed of the random read order")->capture_default_str();
  DecodeOnDiskOptions& d = opt->decode;
  store->add_option("--decode-model", d.model, "Geometry of the decode section")
      ->capture_default_str();
  store->add_option("--decode-tokens", d.n_tokens, "Context of the decode section (0: skip it)")
      ->capture_default_str();
  store->add_option("--decode-layers", d.n_layers, "Layers built for the decode section")
      ->capture_default_str();
  store->add_option("--decode-fractions", d.fractions, "Shares of the pages moved to disk")
      ->delimiter(',')
      ->capture_default_str();
  store->add_option("--decode-reps", d.reps, "Interleaved decode rounds (the best is kept)")
      ->capture_default_str();
  store->callback([opt] {
    StoreReport report = ValueOrThrow(RunStoreBench(opt->store));
    if (opt->decode.n_tokens > 0) {
      report.decode = ValueOrThrow(MeasureDecode(opt->store, opt->decode));
      PrintDecodeOnDisk(*report.decode);
    }
    PrintStoreBench(report);
    WriteJsonReport(nlohmann::json(report).dump(2), opt->json_path, "bench store");
  });

  auto* placement = bench.add_subcommand(
      "placement", "Profiles on identical traces under RAM budgets, beside the offline optimum");
  PlacementBenchOptions& pl = opt->placement;
  placement->add_option("--dir", pl.dir, "Directory for the runs' disk tiers")->required();
  AddJsonOption(*placement, &opt->json_path);
  placement->add_option("--model", pl.model, "Geometry: llama-3-8b or qwen2.5-0.5b")
      ->capture_default_str();
  placement->add_option("--layers", pl.layers, "Layers of the traces")->capture_default_str();
  placement->add_option("--prefix-tokens", pl.prefix_tokens, "Context before decoding")
      ->capture_default_str();
  placement->add_option("--steps", pl.steps, "Decode steps per trace")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  placement->add_option("--page-tokens", pl.page_tokens, "Tokens per page")->capture_default_str();
  placement->add_option("--budgets", pl.budgets, "RAM budgets as fractions of the exact cache")
      ->capture_default_str()
      ->delimiter(',');
  placement->add_option("--profiles", pl.profiles, "Profiles: built-in names or JSON files")
      ->capture_default_str()
      ->delimiter(',');
  placement
      ->add_option("--traces", pl.traces,
                   "Traces to run: recency, recall, needle@0.1, needle@0.5, needle@0.9 (default "
                   "all)")
      ->delimiter(',');
  placement->add_option("--hot-mass", pl.hot_mass, "Mass that makes a page needed (optimum)")
      ->capture_default_str();
  placement
      ->add_option("--activation-reps", pl.activation_reps,
                   "Interleaved rounds timing activation overhead (0: skip)")
      ->capture_default_str();
  AddThreadsOption(*placement, pl.threads);
  placement->add_option("--seed", pl.seed, "Seed of the traces")->capture_default_str();
  placement->callback([opt] {
    const PlacementReport report = ValueOrThrow(RunPlacementBench(opt->placement));
    PrintPlacementBench(report);
    WriteJsonReport(nlohmann::json(report).dump(2), opt->json_path, "bench placement");
  });

  auto* capacity = bench.add_subcommand(
      "capacity", "A context far beyond RAM through the placement engine, beside one all in RAM");
  CapacityBenchOptions& ca = opt->capacity;
  capacity->add_option("--dir", ca.dir, "Directory for the disk tier")->required();
  AddJsonOption(*capacity, &opt->json_path);
  capacity->add_option("--model", ca.model, "Geometry: llama-3-8b or qwen2.5-0.5b")
      ->capture_default_str();
  capacity->add_option("--layers", ca.layers, "Layers (0: the model's)")->capture_default_str();
  capacity->add_option("--tokens", ca.tokens, "Context of the long run")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  AsByteSize(capacity->add_option("--ram-budget", ca.ram_budget_bytes, "RAM budget of the long run")
                 ->capture_default_str());
  capacity
      ->add_option("--ram-fraction", ca.ram_fraction,
                   "RAM budget as a fraction of the long context's exact KV (in place of "
                   "--ram-budget)")
      ->check(CLI::Range(0.0, 1.0));
  capacity->add_option("--profile", ca.profile, "Profile: a built-in name or a JSON file")
      ->capture_default_str();
  capacity
      ->add_option("--disk-time-share", ca.disk_time_share,
                   "Share of a step's time the engine may spend reading disk pages in place "
                   "of sketched ones (PlacementOptions::disk_time_share)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  capacity->add_option("--steps", ca.steps, "Decode steps")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  capacity->add_option("--needle-period", ca.needle_period, "Steps between needle queries")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  capacity->add_option("--needle-depth", ca.needle_depth, "Needle position (0 start, 1 end)")
      ->capture_default_str();
  capacity->add_option("--reference-tokens", ca.reference_tokens, "Context of the all-in-RAM run")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  capacity->add_option("--page-tokens", ca.page_tokens, "Tokens per page")->capture_default_str();
  AddThreadsOption(*capacity, ca.threads);
  capacity->callback([opt] {
    const CapacityReport report = ValueOrThrow(RunCapacityBench(opt->capacity));
    PrintCapacityBench(report);
    WriteJsonReport(nlohmann::json(report).dump(2), opt->json_path, "bench capacity");
  });
}

}  // namespace argus::cli

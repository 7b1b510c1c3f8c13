#include "cli/model_options.h"

#include <fmt/core.h>
#include <fmt/ranges.h>

#include <cmath>
#include <filesystem>

#include "argus/core.h"
#include "cli/commands.h"

namespace argus::cli {

CLI::Option* AsByteSize(CLI::Option* option) {
  // A transform runs before those added earlier: this sees the text as given.
  return option->transform(CLI::AsSizeValue(false))
      ->transform(CLI::Validator(
          [](std::string& value) {
            const size_t first = value.find_first_not_of(" \t");
            return first != std::string::npos && value[first] == '-'
                       ? "a size is not negative: " + value
                       : std::string();
          },
          "", "NONNEGATIVE"));
}

CLI::Validator FiniteRange(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& value) {
        double x = 0;
        if (!CLI::detail::lexical_cast(value, x) || !std::isfinite(x) || x < lo || x > hi)
          return fmt::format("{} is not a finite number in [{}, {}]", value, lo, hi);
        return std::string();
      },
      fmt::format("FLOAT in [{} - {}]", lo, hi));
}

CLI::Option* AddThreadsOption(CLI::App& cmd, unsigned& threads, const std::string& help) {
  return cmd.add_option("-t,--threads", threads, help)
      ->capture_default_str()
      ->check([](const std::string& value) {
        unsigned n = 0;
        if (!CLI::detail::lexical_cast(value, n)) return std::string();  // the type's own error
        Status status = CheckThreadCount(n, "-t");
        return status.ok() ? std::string() : status.message();
      });
}

void AddModelOptions(CLI::App& cmd, ModelOptions& o) {
  cmd.add_option("-m,--model", o.model_path, "GGUF model file")
      ->required()
      ->check(CLI::ExistingFile);
  cmd.add_option("-c,--ctx-size", o.n_ctx, "Context size in tokens (0: the command's default)")
      ->capture_default_str();
  AddThreadsOption(cmd, o.threads);
  cmd.add_option("-b,--batch-size", o.n_batch, "Prompt tokens evaluated together")
      ->capture_default_str()
      ->check(CLI::Range(1u, 4096u));
  cmd.add_option("--profile", o.profile,
                 "KV placement profile: exact, balanced, research, capacity or a JSON file "
                 "(docs/profiles.md); other than exact, a placement engine keeps the cache "
                 "within --ram-budget")
      ->capture_default_str();
  cmd.add_option("--cache-type-k", o.cache_type_k,
                 "Codec spec of full K pages (default f16; --profile exact without --disk-dir)");
  cmd.add_option("--cache-type-v", o.cache_type_v,
                 "Codec spec of full V pages (default f16; --profile exact without --disk-dir)");
  cmd.add_option("--cache-type-active", o.cache_type_active,
                 "Codec of each sequence's partly filled page, f16 or f32: f32 quantises full "
                 "pages from the model's float values (as llama.cpp quantises each token), f16 "
                 "from their fp16 rounding at half the memory")
      ->capture_default_str()
      ->check(CLI::IsMember({"f16", "f32"}));
  cmd.add_option("--disk-dir", o.disk_dir,
                 "Disk tier directory for the placement engine's disk states and exact masters "
                 "(created if missing; the run's pages are erased at its end)");
  AsByteSize(cmd.add_option("--disk-budget", o.disk_budget_bytes,
                            "Disk bytes the --disk-dir tier may use, e.g. 8G (default 8G)"));
  cmd.add_option("--page-tokens", o.page_tokens, "Tokens per KV page (a power of two)")
      ->capture_default_str();
  AsByteSize(
      cmd.add_option("--ram-budget", o.ram_budget_bytes,
                     "RAM budget of the KV cache, e.g. 512M, 2G (0: what the context needs)"));
  cmd.add_option("--epsilon", o.epsilon,
                 "Certified page skipping: skipped attention mass at most this (0: exact; with "
                 "a placement profile, replaces the profile's while its ladder is active)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
}

std::unique_ptr<Model> LoadModel(const ModelOptions& o) {
  std::unique_ptr<Model> model = ValueOrThrow(Model::Load(o.model_path));
  fmt::print(stderr, "model: {} ({:.1f} MiB of weights)\n", model->config().ToString(),
             model->weight_bytes() / 1048576.0);
  return model;
}

namespace {

// A run's store: each page is verified when it is read, so Open does not read the whole store
// (that would cost a run time proportional to the store, not to its work).
DiskTierOptions RunStoreOptions(const std::string& dir, size_t budget_bytes) {
  DiskTierOptions options;
  options.dir = dir;
  options.disk_budget_bytes = budget_bytes;
  options.verify_on_open = false;
  return options;
}

}  // namespace

std::unique_ptr<DiskTier> OpenDiskTier(const std::string& dir, size_t budget_bytes) {
  if (dir.empty()) return nullptr;
  return ValueOrThrow(DiskTier::Open(RunStoreOptions(dir, budget_bytes)));
}

std::unique_ptr<DiskTier> OpenPromptCache(const std::string& dir, size_t budget_bytes,
                                          std::string_view command) {
  const DiskTierOptions options = RunStoreOptions(dir, budget_bytes);
  auto store = DiskTier::Open(options);
  if (store.ok()) return std::move(store).value();
  if (store.status().code() == StatusCode::kCorruption) {
    // Set aside, not deleted: the damaged files stay for `argus store check`.
    std::error_code error;
    std::string aside;
    for (int n = 1; aside.empty() || std::filesystem::exists(aside, error); ++n)
      aside = dir + ".damaged-" + std::to_string(n);
    std::filesystem::rename(dir, aside, error);
    if (!error) {
      fmt::print(stderr, "{}: prompt cache {} is damaged ({}); moved it to {}, starting empty\n",
                 command, dir, store.status().ToString(), aside);
      store = DiskTier::Open(options);
      if (store.ok()) return std::move(store).value();
    } else {
      store = Status::IOError(store.status().message() +
                              "; moving it aside failed: " + error.message());
    }
  }
  fmt::print(stderr, "{}: running without the prompt cache: {}\n", command,
             store.status().ToString());
  return nullptr;
}

std::string ReadTextFile(const std::string& path) {
  const std::vector<std::byte> bytes = ValueOrThrow(ReadFileBytes(path));
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

void CompactPromptCache(DiskTier& store, std::string_view command) {
  const DiskTierStats stats = store.stats();
  const size_t n_live = stats.n_pages + store.RecordNames().size();
  if (stats.n_journal_records <= 2 * n_live + 16) return;
  if (Status status = store.Compact(); !status.ok())
    fmt::print(stderr, "{}: prompt cache journal not compacted: {}\n", command, status.ToString());
}

ContextOptions ContextOptionsOf(const ModelOptions& o, const Model& model, DiskTier* disk,
                                bool background) {
  ContextOptions c;
  c.n_ctx = o.n_ctx ? o.n_ctx : model.config().n_ctx_train;
  c.n_threads = o.threads;
  c.n_batch = o.n_batch;
  c.k_codec = o.cache_type_k.empty() ? "f16" : o.cache_type_k;
  c.v_codec = o.cache_type_v.empty() ? "f16" : o.cache_type_v;
  c.page_tokens = o.page_tokens;
  c.active_codec = o.cache_type_active;
  c.ram_budget_bytes = o.ram_budget_bytes;
  c.attention.epsilon = o.epsilon;
  c.disk = disk;
  if (o.disk_budget_bytes != 0 && o.disk_dir.empty()) {
    throw CommandError{
        Status::InvalidArgument("--disk-budget sizes the --disk-dir tier; give both")};
  }
  if (o.profile == "exact" && o.disk_dir.empty()) return c;  // the plain cache

  PlacementOptions placement;
  placement.profile = ValueOrThrow(Profile::Load(o.profile));
  placement.background = background;
  const Profile& p = placement.profile;
  if (!o.cache_type_k.empty() || !o.cache_type_v.empty()) {
    throw CommandError{Status::InvalidArgument(
        "--cache-type-k/--cache-type-v choose the codecs of --profile exact without --disk-dir; "
        "profile '" +
        p.name + "' takes its codecs from its ladder (a JSON profile can name any)")};
  }
  if (p.NeedsDisk() && disk == nullptr) {
    throw CommandError{Status::InvalidArgument("profile '" + p.name +
                                               "' keeps pages or exact masters on disk: give "
                                               "--disk-dir DIR")};
  }
  c.k_codec = p.ladder[0].k_codec;
  c.v_codec = p.ladder[0].v_codec;
  if (o.epsilon != 0) placement.profile.epsilon = o.epsilon;
  c.attention.epsilon = 0;  // the engine's attention takes the profile's
  c.placement = std::move(placement);
  return c;
}

void PrintPlacementStats(const PlacementStats& s, uint64_t n_tokens) {
  fmt::print(stderr, "placement: {} ({} of {} requests active)\n",
             s.active ? "active" : "inactive (below the high-water mark)", s.n_requests_active,
             s.n_requests);
  fmt::print(stderr, "  RAM {:.2f} of {:.2f} MiB, disk {:.2f} MiB, {:.2f} bits per value in RAM\n",
             s.ram_used_bytes / 1048576.0, s.ram_budget_bytes / 1048576.0,
             s.disk_used_bytes / 1048576.0, s.effective_bits_per_value);
  fmt::print(stderr, "  pages per state {}; {} promotions ({} on demand), {} demotions\n",
             fmt::join(s.pages_per_state, "/"), s.n_promotions, s.n_promotions_on_demand,
             s.n_demotions);
  const double per_token = n_tokens ? 1.0 / static_cast<double>(n_tokens) : 0;
  fmt::print(stderr,
             "  disk read {:.1f} KiB per token (attention {:.1f}, promotions {:.1f}); masters "
             "written {:.2f} MiB\n",
             (s.attention_disk_bytes_read + s.promoted_bytes_read) * per_token / 1024.0,
             s.attention_disk_bytes_read * per_token / 1024.0,
             s.promoted_bytes_read * per_token / 1024.0, s.master_bytes_written / 1048576.0);
  fmt::print(stderr, "  step {:.3f} ms measured; disk pages allowed in place of sketches: {}\n",
             s.step_seconds * 1e3, s.n_disk_pages_allowed);
  for (const auto& [codec, path] : s.kernel_paths) {
    fmt::print(stderr, "  kernel {:<16} {}\n", codec, path);
  }
  if (!s.last_error.empty()) fmt::print(stderr, "  last migration error: {}\n", s.last_error);
}

}  // namespace argus::cli

// argus run / argus eval / argus make-model: a GGUF model decoding through an ARGUS KV cache,
// its perplexity, and random-weight models of real geometries.
#include <fmt/core.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "argus/model.h"
#include "cli/commands.h"
#include "cli/model_options.h"
#include "cli/remote_options.h"
#include "core/files.h"
#include "core/measure.h"
#include "core/npy.h"
#include "core/progress.h"
#include "eval/kv_dump.h"

namespace argus::cli {
namespace {

void PrintCacheStats(const CacheStats& stats) {
  fmt::print(stderr, "KV cache: {} pages ({} full), {:.2f} MiB in RAM of a {:.2f} MiB budget\n",
             stats.n_pages, stats.n_full_pages, stats.ram.used_bytes / 1048576.0,
             stats.ram.budget_bytes / 1048576.0);
  for (const CodecBytes& c : stats.by_codec) {
    if (c.k_bytes + c.v_bytes == 0) continue;
    fmt::print(stderr, "  {:<14} K {:>10.3f} MiB ({} pages)  V {:>10.3f} MiB ({} pages)\n", c.codec,
               c.k_bytes / 1048576.0, c.n_k_pages, c.v_bytes / 1048576.0, c.n_v_pages);
  }
}

void PrintTimeSplit(const char* what, const TimeSplit& t) {
  if (t.n_tokens == 0) return;
  const double ms = 1000.0 / static_cast<double>(t.n_tokens);
  fmt::print(stderr,
             "{}: {} tokens, {:.2f} ms/token ({:.1f} tok/s): matmul {:.2f}, attention {:.2f}, "
             "other {:.2f} ms\n",
             what, t.n_tokens, t.total_s() * ms, t.n_tokens / t.total_s(), t.matmul_s * ms,
             t.attention_s * ms, t.other_s * ms);
}

struct RunOptions {
  ModelOptions model;
  std::string prompt, prompt_file;
  int n_predict = 128;
  SamplerOptions sampler;
  bool stats = false;
  std::string prompt_cache_dir;
  size_t prompt_cache_bytes = size_t{4} << 30;
  RemoteOptions remote;
};

void Run(const RunOptions& o) {
  std::unique_ptr<Model> model = LoadModel(o.model);
  const std::string prompt = o.prompt_file.empty() ? o.prompt : ReadTextFile(o.prompt_file);
  const std::vector<int32_t> tokens = model->tokenizer().Encode(prompt, true);
  if (tokens.empty()) throw CommandError{Status::InvalidArgument("the prompt has no tokens")};
  if (!o.prompt_cache_dir.empty() && !o.model.disk_dir.empty()) {
    throw CommandError{Status::InvalidArgument(
        "give one of --prompt-cache and --disk-dir: a run has one disk store, and the prompt "
        "cache's also serves the placement engine")};
  }
  // The prompt cache: a disk tier of prefix pages, shared by every run given the same directory.
  std::unique_ptr<DiskTier> disk =
      o.prompt_cache_dir.empty() ? OpenDiskTier(o.model.disk_dir, o.model.DiskBudget())
                                 : OpenPromptCache(o.prompt_cache_dir, o.prompt_cache_bytes, "run");
  DiskTier* prompt_cache = o.prompt_cache_dir.empty() ? nullptr : disk.get();
  ContextOptions options = ContextOptionsOf(o.model, *model, disk.get(), /*background=*/true);
  if (!o.remote.url.empty() && o.prompt_cache_dir.empty()) {
    throw CommandError{Status::InvalidArgument(
        "--remote needs --prompt-cache DIR: pages from Redis are kept in that local tier")};
  }
  // Without a usable local tier (it warned already) the shared one has nowhere to keep pages.
  std::unique_ptr<RemoteTier> remote =
      prompt_cache != nullptr ? OpenRemoteTier(o.remote, "run") : nullptr;
  options.remote = remote.get();
  if (tokens.size() >= options.n_ctx) {
    throw CommandError{Status::InvalidArgument(fmt::format(
        "the prompt has {} tokens; the context holds {} (-c)", tokens.size(), options.n_ctx))};
  }
  // The request's length decides whether the placement ladder is active (not -c alone).
  options.expected_tokens = static_cast<uint32_t>(std::min<size_t>(
      options.n_ctx, tokens.size() + static_cast<size_t>(std::max(o.n_predict, 0))));
  std::unique_ptr<Context> context = ValueOrThrow(Context::Create(*model, options));
  Sampler sampler(o.sampler);

  const auto t0 = Clock::now();
  std::span<const float> logits;
  // The last prompt token is always evaluated: its logits choose the first new token. The prompt
  // cache is only a cache: when it fails, the run computes what it would have given.
  uint32_t n_reused = 0;
  if (prompt_cache) {
    auto loaded = context->LoadPrefix(std::span(tokens).first(tokens.size() - 1));
    if (loaded.ok()) {
      n_reused = *loaded;
    } else {
      fmt::print(stderr, "run: prompt cache not used: {}\n", loaded.status().ToString());
    }
  }
  {
    Progress progress("prompt tokens");
    for (size_t first = n_reused; first < tokens.size(); first += options.n_batch) {
      const size_t n = std::min<size_t>(options.n_batch, tokens.size() - first);
      logits = ValueOrThrow(context->Eval(std::span(tokens).subspan(first, n)));
      progress.Update(first + n, tokens.size());
    }
    progress.Done(Seconds(t0));
  }
  const TimeSplit prompt_times = context->times();
  context->ResetTimes();
  int32_t token = sampler.Sample(logits);
  const double ttft = Seconds(t0);
  int n_generated = 0;
  while (n_generated < o.n_predict && !model->tokenizer().IsEndOfGeneration(token)) {
    const std::string piece = model->tokenizer().TokenToPiece(token);
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    if (++n_generated == o.n_predict) break;
    if (context->n_past() == options.n_ctx) {
      fmt::print(stderr, "\nrun: the context of {} tokens is full (-c)", options.n_ctx);
      break;
    }
    logits = ValueOrThrow(context->Eval({&token, 1}));
    token = sampler.Sample(logits);
  }
  // stdout holds exactly the continuation; the line break that ends it on a terminal goes to
  // stderr.
  fmt::print(stderr, "\n");
  // Stored after generation, so the first token does not wait for the disk.
  // The counts hold on error too: a store that fails part way has written some pages.
  PrefixStoreStats stored;
  if (prompt_cache) {
    if (Status status = context->StorePrefix(tokens, stored); !status.ok())
      fmt::print(stderr, "run: prompt pages not stored: {}\n", status.ToString());
  }

  if (o.stats) {
    fmt::print(stderr, "{}\n", model->config().ToString());
    fmt::print(stderr, "time to first token: {:.1f} ms ({} prompt tokens)\n", ttft * 1e3,
               tokens.size());
    if (prompt_cache) {
      fmt::print(stderr,
                 "prompt cache: {} of {} prompt tokens reused, {} pages stored, {} stored already "
                 "({})\n",
                 n_reused, tokens.size(), stored.n_stored, stored.n_present, o.prompt_cache_dir);
      const DiskTierStats store = prompt_cache->stats();
      fmt::print(stderr, "prompt cache: store of {} pages, {} pages read ({:.1f} KiB)\n",
                 store.n_pages, store.n_reads, store.read_bytes / 1024.0);
      if (stored.n_inexact + stored.n_reencoded > 0) {
        fmt::print(stderr,
                   "prompt cache: pages not stored: {} computed inexactly (epsilon, window, sinks "
                   "or lossy pages attended), {} re-encoded since they filled\n",
                   stored.n_inexact, stored.n_reencoded);
      }
    }
    PrintTimeSplit("prompt", prompt_times);
    PrintTimeSplit("decode", context->times());
    PrintCacheStats(context->cache().stats());
    if (auto placement = context->placement_stats()) {
      PrintPlacementStats(*placement, prompt_times.n_tokens + context->times().n_tokens);
    }
    if (remote) PrintRemoteStats(*remote, context->remote_prefix_stats(), tokens.size());
  }
  if (prompt_cache) {
    context.reset();  // the placement engine's erasures are in the journal now
    CompactPromptCache(*prompt_cache, "run");
  }
}

struct EvalOptions {
  ModelOptions model;
  std::string text_path, dump_kv_dir, json_path;
};

// The first window's q, k, v of every layer, written as float32 .npy files
// layerNN_{q,k,v}.npy: q [tokens, n_heads, head_dim], k and v [tokens, n_kv_heads, head_dim].
class QkvDump {
 public:
  QkvDump(const ModelConfig& c, uint32_t n_tokens) : c_(c), n_tokens_(n_tokens) {
    for (uint32_t l = 0; l < c.n_layers; ++l) {
      for (uint32_t heads : {c.n_heads, c.n_kv_heads, c.n_kv_heads}) {
        planes_.push_back(std::vector<float>(size_t{n_tokens} * heads * c.head_dim));
      }
    }
  }

  // Every window starts again at position 0: only the first one's rows are kept.
  void Observe(uint32_t layer, uint32_t first, uint32_t n, const float* q, const float* k,
               const float* v) {
    if (first >= n_tokens_ || full_) return;
    n = std::min(n, n_tokens_ - first);
    full_ = layer + 1 == c_.n_layers && first + n == n_tokens_;
    const float* rows[] = {q, k, v};
    for (int p = 0; p < 3; ++p) {
      const size_t row = size_t{p == 0 ? c_.n_heads : c_.n_kv_heads} * c_.head_dim;
      std::copy_n(rows[p], n * row, &planes_[layer * 3 + p][first * row]);
    }
  }

  void Write(const std::string& dir) const {
    std::filesystem::create_directories(dir);
    for (uint32_t l = 0; l < c_.n_layers; ++l) {
      for (int p = 0; p < 3; ++p) {
        const std::vector<float>& data = planes_[l * 3 + p];
        NpyArray a;
        a.type = NpyType::kFloat32;
        a.shape = {n_tokens_, p == 0 ? c_.n_heads : c_.n_kv_heads, c_.head_dim};
        a.data.resize(data.size() * sizeof(float));
        std::memcpy(a.data.data(), data.data(), a.data.size());
        ThrowIfError(WriteNpy(DumpPath(dir, l, "qkv"[p]), a));
      }
    }
    fmt::print(stderr, "eval: wrote q/k/v of {} layers x {} tokens to {}\n", c_.n_layers, n_tokens_,
               dir);
  }

 private:
  ModelConfig c_;
  uint32_t n_tokens_;
  bool full_ = false;                       // the first window's last rows are in
  std::vector<std::vector<float>> planes_;  // [layer * 3 + {q, k, v}]
};

void Eval(const EvalOptions& o) {
  std::unique_ptr<Model> model = LoadModel(o.model);
  const std::vector<int32_t> tokens = model->tokenizer().Encode(ReadTextFile(o.text_path), true);
  std::unique_ptr<DiskTier> disk = OpenDiskTier(o.model.disk_dir, o.model.DiskBudget());
  // Migrations inside each step: a perplexity is the same number on every run.
  ContextOptions options = ContextOptionsOf(o.model, *model, disk.get(), /*background=*/false);
  if (o.model.n_ctx == 0) options.n_ctx = std::min<uint32_t>(512, model->config().n_ctx_train);
  std::unique_ptr<QkvDump> dump;
  if (!o.dump_kv_dir.empty()) {
    dump = std::make_unique<QkvDump>(model->config(), options.n_ctx);
    options.qkv_observer = [&dump](uint32_t l, uint32_t first, uint32_t n, const float* q,
                                   const float* k,
                                   const float* v) { dump->Observe(l, first, n, q, k, v); };
  }
  // With a placement engine, pages hold the ladder's states, not one codec pair.
  const std::string kv = options.placement
                             ? "profile " + options.placement->profile.name
                             : fmt::format("KV {}/{}", options.k_codec, options.v_codec);
  fmt::print(stderr, "eval: {} tokens, windows of {}, {}\n", tokens.size(), options.n_ctx, kv);
  const auto t0 = Clock::now();
  Progress progress("eval windows");
  const PerplexityResult r =
      ValueOrThrow(Perplexity(*model, options, tokens, [&progress](uint32_t done, uint32_t total) {
        progress.Update(done, total);
      }));
  progress.Done(Seconds(t0));
  fmt::print("perplexity {:.6f} over {} tokens in {} windows of {} ({}, {} bytes)\n", r.perplexity,
             r.n_scored, r.n_windows, options.n_ctx, kv, r.cache.page_bytes);
  PrintTimeSplit("eval", r.times);
  PrintCacheStats(r.cache);
  if (r.placement) PrintPlacementStats(*r.placement, r.times.n_tokens);
  if (dump) dump->Write(o.dump_kv_dir);
  if (!o.json_path.empty()) {
    nlohmann::json j = {{"model", model->config().name},
                        {"profile", o.model.profile},
                        {"k_codec", options.k_codec},
                        {"v_codec", options.v_codec},
                        {"n_ctx", options.n_ctx},
                        {"perplexity", r.perplexity},
                        {"mean_nll", r.mean_nll},
                        {"n_scored", r.n_scored},
                        {"n_windows", r.n_windows},
                        {"kv_page_bytes", r.cache.page_bytes},
                        {"kv_ram_bytes", r.cache.ram_page_bytes},
                        {"kv_disk_bytes", r.cache.disk_page_bytes},
                        {"ram_budget_bytes", r.cache.ram.budget_bytes},
                        {"seconds", r.times.total_s()}};
    if (r.placement) {
      j["placement"] = {{"active", r.placement->active},
                        {"pages_per_state", r.placement->pages_per_state},
                        {"effective_bits_per_value", r.placement->effective_bits_per_value},
                        {"promotions", r.placement->n_promotions},
                        {"demotions", r.placement->n_demotions}};
    }
    const std::string s = j.dump(2) + "\n";
    ThrowIfError(WriteFileBytes(o.json_path, std::as_bytes(std::span(s.data(), s.size()))));
  }
}

struct MakeModelOptions {
  std::string arch, preset = "qwen2.5-0.5b", type = "q8_0", out_path;
  uint64_t seed = 1;
};

void MakeModel(const MakeModelOptions& o) {
  RandomModelOptions options;
  options.config = ValueOrThrow(ModelPreset(o.preset));
  if (!o.arch.empty() && o.arch != ModelArchName(options.config.arch)) {
    throw CommandError{Status::InvalidArgument("--arch " + o.arch + " does not match preset " +
                                               o.preset + ", a " +
                                               std::string(ModelArchName(options.config.arch)))};
  }
  options.seed = o.seed;
  const std::pair<const char*, GgmlType> types[] = {{"f32", GgmlType::kF32},
                                                    {"f16", GgmlType::kF16},
                                                    {"bf16", GgmlType::kBF16},
                                                    {"q8_0", GgmlType::kQ8_0},
                                                    {"q4_0", GgmlType::kQ4_0}};
  const auto it = std::find_if(std::begin(types), std::end(types),
                               [&](const auto& t) { return o.type == t.first; });
  if (it == std::end(types)) {
    throw CommandError{
        Status::InvalidArgument("--type '" + o.type + "': expected f32, f16, bf16, q8_0 or q4_0")};
  }
  options.type = it->second;
  fmt::print(stderr, "make-model: {} with {} weights -> {}\n", options.config.ToString(), o.type,
             o.out_path);
  const auto t0 = Clock::now();
  Progress progress("make-model: weight matrices");
  options.progress = [&progress](uint32_t done, uint32_t total) { progress.Update(done, total); };
  ThrowIfError(WriteRandomModel(options, o.out_path));
  progress.Done(Seconds(t0));
  fmt::print(stderr, "make-model: wrote {:.1f} MiB in {:.1f} s\n",
             std::filesystem::file_size(o.out_path) / 1048576.0, Seconds(t0));
}

}  // namespace

void AddModelCommands(CLI::App& app) {
  auto* run = app.add_subcommand("run", "Generate text with a GGUF model, its KV in ARGUS");
  auto r = std::make_shared<RunOptions>();
  AddModelOptions(*run, r->model);
  run->add_option("-p,--prompt", r->prompt, "Prompt text");
  run->add_option("-f,--file", r->prompt_file, "Read the prompt from a file")
      ->check(CLI::ExistingFile);
  run->add_option("-n,--n-predict", r->n_predict, "Tokens to generate")
      ->capture_default_str()
      ->check(CLI::Range(0, std::numeric_limits<int>::max()));
  run->add_option("--seed", r->sampler.seed, "Sampling seed")->capture_default_str();
  run->add_option("--temp", r->sampler.temperature, "Temperature (0: greedy)")
      ->capture_default_str()
      ->check(FiniteRange(0, 1e6));
  run->add_option("--top-k", r->sampler.top_k, "Top-k cut (0: none)")->capture_default_str();
  run->add_option("--top-p", r->sampler.top_p, "Nucleus cut (1: none)")
      ->capture_default_str()
      ->check(FiniteRange(0, 1));
  run->add_flag("--stats", r->stats,
                "Print time to first token, time per token and KV bytes to stderr at the end");
  run->add_option("--prompt-cache", r->prompt_cache_dir,
                  "Keep the prompt's full KV pages in a disk store in this directory; a later "
                  "run whose prompt shares a prefix loads them instead of computing them");
  AsByteSize(run->add_option("--prompt-cache-budget", r->prompt_cache_bytes,
                             "Disk bytes the prompt cache may use, e.g. 4G"))
      ->capture_default_str();
  AddRemoteOptions(*run, r->remote);
  run->callback([r] { Run(*r); });

  auto* eval = app.add_subcommand("eval", "Perplexity of a GGUF model over a text file");
  auto e = std::make_shared<EvalOptions>();
  AddModelOptions(*eval, e->model);
  eval->add_option("-f,--file", e->text_path, "Text file")->required()->check(CLI::ExistingFile);
  eval->add_option("--dump-kv", e->dump_kv_dir,
                   "Write the first window's q/k/v of every layer as .npy files to this folder");
  eval->add_option("--json", e->json_path, "Write the result as JSON to this file");
  eval->callback([e] { Eval(*e); });

  auto* make =
      app.add_subcommand("make-model", "Write a random-weight GGUF model of a real geometry");
  auto m = std::make_shared<MakeModelOptions>();
  make->add_option("--arch", m->arch, "Architecture (checked against the preset): qwen2, llama");
  make->add_option("--preset", m->preset,
                   "Geometry: " + fmt::format("{}", fmt::join(ModelPresetNames(), ", ")))
      ->capture_default_str();
  make->add_option("--type", m->type, "Weight type: f32, f16, bf16, q8_0, q4_0")
      ->capture_default_str();
  make->add_option("--seed", m->seed, "Seed of the weights")->capture_default_str();
  make->add_option("-o,--output", m->out_path, "Output .gguf file")->required();
  make->callback([m] { MakeModel(*m); });
}

}  // namespace argus::cli

// argus attend: one decode attention step over dense K/V files, through a KvCache and the
// AttentionEngine, optionally checked against the double-precision reference.
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "argus/attention.h"
#include "argus/cache.h"
#include "argus/core.h"
#include "cli/commands.h"
#include "cli/stats_json.h"
#include "core/npy.h"

namespace argus::cli {
namespace {

struct AttendOptions {
  std::string q_path, k_path, v_path, out_path;
  uint32_t kv_heads = 0;  // 0: from k's shape
  std::string k_codec = "f16", v_codec = "f16";
  uint32_t page_tokens = 256;
  uint32_t window = 0, sinks = 0;
  double epsilon = 0;
  float scale = 0;
  unsigned threads = 0;
  bool json = false, reference = false;
};

NpyArray ReadFloatNpy(const std::string& path) {
  NpyArray array = ValueOrThrow(ReadNpy(path));
  if (array.type == NpyType::kUint8)
    throw Invalid(path + ": dtype uint8; expected float32 or float16");
  return array;
}

// The geometry the three files describe, or an error naming the file and the mismatch.
// q: [n_q_heads, head_dim]; k, v: [tokens, n_kv_heads, head_dim] (or [tokens, n_kv_heads *
// head_dim], split by --kv-heads or by q's head_dim).
CacheGeometry CheckShapes(const AttendOptions& o, const NpyArray& q, const NpyArray& k,
                          const NpyArray& v) {
  if (q.shape.size() != 2 || q.shape[0] == 0 || q.shape[1] == 0) {
    throw Invalid(
        fmt::format("{}: expected [n_q_heads, head_dim], got {}", o.q_path, NpyShapeText(q.shape)));
  }
  const size_t head_dim = q.shape[1];
  size_t n_kv = 0;
  if (k.shape.size() == 3) {
    n_kv = k.shape[1];
    if (k.shape[2] != head_dim) {
      throw Invalid(fmt::format("{}: shape {} has head_dim {}, {} has {}", o.k_path,
                                NpyShapeText(k.shape), k.shape[2], o.q_path, head_dim));
    }
  } else if (k.shape.size() == 2) {
    n_kv = o.kv_heads ? o.kv_heads : k.shape[1] / head_dim;
    if (n_kv == 0 || k.shape[1] != n_kv * head_dim) {
      throw Invalid(fmt::format("{}: shape {} is not [tokens, {} kv heads x head_dim {}]", o.k_path,
                                NpyShapeText(k.shape), n_kv, head_dim));
    }
  } else {
    throw Invalid(fmt::format("{}: expected [tokens, n_kv_heads, head_dim], got {}", o.k_path,
                              NpyShapeText(k.shape)));
  }
  if (o.kv_heads != 0 && n_kv != o.kv_heads) {
    throw Invalid(fmt::format("{}: shape {} has {} kv heads, --kv-heads says {}", o.k_path,
                              NpyShapeText(k.shape), n_kv, o.kv_heads));
  }
  if (v.shape != k.shape) {
    throw Invalid(fmt::format("{}: shape {} differs from {}'s {}", o.v_path, NpyShapeText(v.shape),
                              o.k_path, NpyShapeText(k.shape)));
  }
  if (k.shape[0] == 0 || k.shape[0] > UINT32_MAX) {
    throw Invalid(fmt::format("{}: {} tokens; expected 1 to {}", o.k_path, k.shape[0], UINT32_MAX));
  }
  if (n_kv == 0 || q.shape[0] % n_kv != 0) {
    throw Invalid(fmt::format("{}: {} query heads is not a multiple of {}'s {} kv heads", o.q_path,
                              q.shape[0], o.k_path, n_kv));
  }
  if (q.shape[0] > UINT32_MAX || head_dim > UINT32_MAX) throw Invalid(o.q_path + ": too large");
  CacheGeometry g{.n_layers = 1,
                  .n_q_heads = static_cast<uint32_t>(q.shape[0]),
                  .n_kv_heads = static_cast<uint32_t>(n_kv),
                  .head_dim = static_cast<uint32_t>(head_dim)};
  ThrowIfError(g.Validate().WithContext(o.q_path + ", " + o.k_path));
  return g;
}

// Per query head: max |out - ref| / max |ref| over the head's values.
std::vector<double> MaxRelativeErrors(const std::vector<float>& out, const std::vector<double>& ref,
                                      const CacheGeometry& g) {
  std::vector<double> errors(g.n_q_heads);
  for (uint32_t h = 0; h < g.n_q_heads; ++h) {
    double max_err = 0, max_ref = 0;
    for (uint32_t d = 0; d < g.head_dim; ++d) {
      const size_t i = size_t{h} * g.head_dim + d;
      max_err = std::max(max_err, std::fabs(out[i] - ref[i]));
      max_ref = std::max(max_ref, std::fabs(ref[i]));
    }
    errors[h] = max_ref > 0 ? max_err / max_ref : max_err;
  }
  return errors;
}

void RunAttend(const AttendOptions& o) {
  const NpyArray q_array = ReadFloatNpy(o.q_path);
  const NpyArray k_array = ReadFloatNpy(o.k_path);
  const NpyArray v_array = ReadFloatNpy(o.v_path);
  const CacheGeometry g = CheckShapes(o, q_array, k_array, v_array);
  const uint32_t n_tokens = static_cast<uint32_t>(k_array.shape[0]);
  const std::vector<float> q = q_array.ToFloat(), k = k_array.ToFloat(), v = v_array.ToFloat();

  CacheOptions cache_options{
      .geometry = g, .page_tokens = o.page_tokens, .k_codec = o.k_codec, .v_codec = o.v_codec};
  cache_options.ram_budget_bytes = ValueOrThrow(KvCache::RequiredRamBytes(cache_options, n_tokens));
  std::unique_ptr<KvCache> cache = ValueOrThrow(KvCache::Create(cache_options));
  const SeqId seq = ValueOrThrow(cache->CreateSequence());
  ThrowIfError(cache->Append(seq, 0, k, v).WithContext(o.k_path + ", " + o.v_path));

  const AttentionOptions attention{
      .window = o.window, .sinks = o.sinks, .scale = o.scale, .epsilon = o.epsilon};
  ThreadPool pool(o.threads);
  AttentionEngine engine(pool);
  std::vector<float> out(size_t{g.n_q_heads} * g.head_dim);
  const AttentionStats stats =
      ValueOrThrow(engine.Decode(*cache, seq, 0, q.data(), out.data(), attention));
  ThrowIfError(WriteNpy(o.out_path, NpyArray::FromFloat({g.n_q_heads, g.head_dim}, out)));
  const CacheStats cache_stats = cache->stats();

  std::vector<double> errors;
  if (o.reference) {
    const std::vector<double> ref =
        ReferenceAttention(g, q.data(), 1, n_tokens - 1, k.data(), v.data(), n_tokens, attention);
    errors = MaxRelativeErrors(out, ref, g);
  }
  const double max_error = errors.empty() ? 0 : *std::max_element(errors.begin(), errors.end());

  if (o.json) {
    nlohmann::json by_codec = cache_stats.by_codec;
    nlohmann::json j = {
        {"out", o.out_path},
        {"tokens", n_tokens},
        {"geometry",
         {{"n_q_heads", g.n_q_heads}, {"n_kv_heads", g.n_kv_heads}, {"head_dim", g.head_dim}}},
        {"k_codec", o.k_codec},
        {"v_codec", o.v_codec},
        {"page_tokens", o.page_tokens},
        {"options",
         {{"window", o.window}, {"sinks", o.sinks}, {"epsilon", o.epsilon}, {"scale", o.scale}}},
        {"stats",
         {{"n_pages", stats.n_pages},
          {"n_pages_masked", stats.n_pages_masked},
          {"n_tiles", stats.n_tiles},
          {"n_tiles_skipped", stats.n_tiles_skipped},
          {"bytes_read", stats.bytes_read},
          {"bytes_skipped", stats.bytes_skipped},
          {"skipped_mass_bound", stats.skipped_mass_bound}}},
        {"cache",
         {{"page_bytes", cache_stats.page_bytes},
          {"metadata_bytes", cache_stats.metadata_bytes},
          {"budget_bytes", cache_options.ram_budget_bytes},
          {"by_codec", by_codec}}},
    };
    if (o.reference) {
      j["reference"] = {{"max_rel_error_per_head", errors}, {"max_rel_error", max_error}};
    }
    fmt::print("{}\n", j.dump(2));
    return;
  }
  fmt::print(stderr,
             "attend: {} tokens, {} q heads, {} kv heads, head_dim {}; K {}, V {}, pages of {} "
             "tokens -> {}\n",
             n_tokens, g.n_q_heads, g.n_kv_heads, g.head_dim, o.k_codec, o.v_codec, o.page_tokens,
             o.out_path);
  fmt::print(stderr,
             "pages {} ({} masked), tiles {} ({} skipped), bytes read {} ({} skipped), skipped "
             "mass bound {:.3e}\n",
             stats.n_pages, stats.n_pages_masked, stats.n_tiles, stats.n_tiles_skipped,
             stats.bytes_read, stats.bytes_skipped, stats.skipped_mass_bound);
  for (const CodecBytes& c : cache_stats.by_codec) {
    fmt::print(stderr, "cache {}: K {} bytes ({} pages), V {} bytes ({} pages)\n", c.codec,
               c.k_bytes, c.n_k_pages, c.v_bytes, c.n_v_pages);
  }
  fmt::print(stderr, "cache: {} page bytes, {} metadata bytes\n", cache_stats.page_bytes,
             cache_stats.metadata_bytes);
  if (o.reference) {
    std::string per_head;
    for (double e : errors) per_head += fmt::format(" {:.2e}", e);
    fmt::print(stderr,
               "reference (double): max relative error per head (max |out - ref| / max |ref|):{}; "
               "max {:.2e}\n",
               per_head, max_error);
  }
}

}  // namespace

void AddAttendCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "attend", "One decode attention step over dense q, k, v .npy files through a KvCache");
  auto o = std::make_shared<AttendOptions>();
  cmd->add_option("--q", o->q_path, "Query .npy [n_q_heads, head_dim] (float32 or float16)")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--k", o->k_path, "Keys .npy [tokens, n_kv_heads, head_dim]")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--v", o->v_path, "Values .npy, the shape of the keys")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--kv-heads", o->kv_heads,
                  "KV heads (checked against k's shape; splits a 2-D k [tokens, heads x dim])");
  cmd->add_option("--codec-k", o->k_codec, "Codec spec of full K pages")->capture_default_str();
  cmd->add_option("--codec-v", o->v_codec, "Codec spec of full V pages")->capture_default_str();
  cmd->add_option("--page-tokens", o->page_tokens, "Tokens per page (a power of two)")
      ->capture_default_str();
  cmd->add_option("--window", o->window, "Sliding window in tokens (0: none)")
      ->capture_default_str();
  cmd->add_option("--sinks", o->sinks, "First positions always attended")->capture_default_str();
  cmd->add_option("--epsilon", o->epsilon,
                  "Certified page skipping: skipped attention mass at most this (0: exact)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--scale", o->scale, "Score scale (0: 1/sqrt(head_dim))")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  AddThreadsOption(*cmd, o->threads);
  cmd->add_flag("--json", o->json, "Print the statistics as JSON on stdout");
  cmd->add_flag("--reference", o->reference,
                "Also compute attention in double precision and report the error per head");
  cmd->add_option("out", o->out_path, "Output .npy [n_q_heads, head_dim] float32")->required();
  cmd->callback([o] { RunAttend(*o); });
}

}  // namespace argus::cli

// The C API of the cache: codecs, cache options, sequences, attention, placement, the disk tier.
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <tuple>

#include "argus/attention.h"
#include "argus/cache.h"
#include "argus/codec.h"
#include "argus/core.h"
#include "argus/policy.h"
#include "capi/capi_internal.h"
#include "core/checked.h"

using namespace argus;        // NOLINT: the C API's implementation file
using namespace argus::capi;  // NOLINT

struct argus_cache_options_t {
  static constexpr HandleKind kKind = HandleKind::kCacheOptions;
  CacheGeometry geometry;
  uint32_t page_tokens = 256;
  uint64_t ram_budget_bytes = 0;  // 0: unlimited
  std::string k_codec, v_codec;   // empty: f16, or the profile's
  std::string active_codec = "f16";
  uint32_t n_threads = 0;
  AttentionOptions attention;
  std::string disk_dir;
  uint64_t disk_budget_bytes = 0;
  std::string profile;
  bool placement_sync = false;
};

struct argus_cache_t {
  static constexpr HandleKind kKind = HandleKind::kCache;
  // Members in construction order; destroyed in reverse, so the placement engine goes before
  // the cache, the cache before its disk tier, and the pool last.
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<AttentionEngine> engine;
  std::unique_ptr<DiskTier> disk;
  std::unique_ptr<KvCache> cache;
  std::unique_ptr<PlacementEngine> placement;
  AttentionOptions attention;
  std::optional<SeqId> request;  // the sequence under the placement engine
  AttentionStats last;
};

namespace {

constexpr const char* kVersion = ARGUS_VERSION;

const std::vector<CodecInfo>& Codecs() {
  static const auto* codecs = new std::vector<CodecInfo>(CodecRegistry::Default().List());
  return *codecs;
}

// The options' cache as the C++ API takes it (budget 0: unlimited).
CacheOptions CacheOptionsOf(const argus_cache_options_t& o, const PlacementChoice& choice,
                            DiskTier* disk) {
  CacheOptions c;
  c.geometry = o.geometry;
  c.page_tokens = o.page_tokens;
  c.ram_budget_bytes =
      o.ram_budget_bytes ? o.ram_budget_bytes : std::numeric_limits<size_t>::max() / 4;
  c.k_codec = choice.k_codec;
  c.v_codec = choice.v_codec;
  c.active_codec = o.active_codec;
  c.disk = disk;
  return c;
}

Result<SeqId> SeqOf(int64_t seq) {
  if (seq < 0 || seq > int64_t{std::numeric_limits<SeqId>::max()}) {
    return Status::InvalidArgument("sequence " + std::to_string(seq) + " does not exist");
  }
  return static_cast<SeqId>(seq);
}

Status CheckLayer(const argus_cache_t* h, uint32_t layer) {
  const uint32_t n = h->cache->geometry().n_layers;
  if (layer >= n) {
    return Status::InvalidArgument("layer " + std::to_string(layer) +
                                   " out of range (the cache has " + std::to_string(n) +
                                   " layers)");
  }
  return Status::Ok();
}

// Values in `n_rows` rows of `row` values each, checked for overflow.
Result<size_t> Values(uint64_t n_rows, size_t row, std::string_view what) {
  return CheckedMul(static_cast<size_t>(n_rows), row, what);
}

Status CheckBuffer(const void* p, std::string_view name) {
  return p ? Status::Ok() : Status::InvalidArgument(std::string(name) + " is NULL");
}

bool UnderRequest(const argus_cache_t* h, SeqId seq) {
  return h->placement && h->request && *h->request == seq;
}

template <typename Row>
Status Append(argus_cache_t* h, int64_t seq_id, uint32_t layer, const Row* k, const Row* v,
              uint32_t n_tokens, const char* function) {
  ARGUS_RETURN_IF_ERROR(CheckHandle(h, HandleKind::kCache, function));
  ARGUS_ASSIGN_OR_RETURN(SeqId seq, SeqOf(seq_id));
  ARGUS_RETURN_IF_ERROR(CheckLayer(h, layer));
  ARGUS_RETURN_IF_ERROR(CheckBuffer(k, "k"));
  ARGUS_RETURN_IF_ERROR(CheckBuffer(v, "v"));
  const CacheGeometry& g = h->cache->geometry();
  ARGUS_ASSIGN_OR_RETURN(size_t n, Values(n_tokens, size_t{g.n_kv_heads} * g.head_dim, "k/v rows"));
  if constexpr (std::is_same_v<Row, float>) {
    if (UnderRequest(h, seq)) return h->placement->Append(layer, {k, n}, {v, n});
    return h->cache->Append(seq, layer, {k, n}, {v, n});
  } else {
    if (UnderRequest(h, seq)) {
      // The engine appends floats: f16 widens exactly.
      std::vector<float> kf(n), vf(n);
      for (size_t i = 0; i < n; ++i) kf[i] = HalfToFloat(k[i]), vf[i] = HalfToFloat(v[i]);
      return h->placement->Append(layer, kf, vf);
    }
    return h->cache->AppendF16(seq, layer, {k, n}, {v, n});
  }
}

Status Attend(argus_cache_t* h, int64_t seq_id, uint32_t layer, const float* q, uint32_t n_queries,
              float* out, bool prefill, const char* function) {
  ARGUS_RETURN_IF_ERROR(CheckHandle(h, HandleKind::kCache, function));
  ARGUS_ASSIGN_OR_RETURN(SeqId seq, SeqOf(seq_id));
  ARGUS_RETURN_IF_ERROR(CheckLayer(h, layer));
  ARGUS_RETURN_IF_ERROR(CheckBuffer(q, "q"));
  ARGUS_RETURN_IF_ERROR(CheckBuffer(out, "out"));
  if (n_queries == 0) return Status::InvalidArgument("n_queries is 0");
  Result<AttentionStats> stats = Status::Internal("unset");
  if (UnderRequest(h, seq)) {
    stats = prefill ? h->placement->Prefill(layer, q, n_queries, out)
                    : h->placement->Decode(layer, q, out);
  } else {
    stats = prefill ? h->engine->Prefill(*h->cache, seq, layer, q, n_queries, out, h->attention)
                    : h->engine->Decode(*h->cache, seq, layer, q, out, h->attention);
  }
  if (!stats.ok()) return stats.status();
  h->last = std::move(stats).value();
  return Status::Ok();
}

// Moves the full pages of seq lying inside [first, first + n) of every layer to `tier`.
Result<int64_t> MovePages(argus_cache_t* h, int64_t seq_id, uint32_t first, uint32_t n_tokens,
                          TierKind tier, const char* function) {
  ARGUS_RETURN_IF_ERROR(CheckHandle(h, HandleKind::kCache, function));
  ARGUS_ASSIGN_OR_RETURN(SeqId seq, SeqOf(seq_id));
  if (h->cache->disk() == nullptr) {
    return Status::InvalidArgument(std::string(function) + ": the cache has no disk tier");
  }
  const uint64_t end = uint64_t{first} + n_tokens;
  int64_t n_moved = 0;
  for (uint32_t layer = 0; layer < h->cache->geometry().n_layers; ++layer) {
    ARGUS_ASSIGN_OR_RETURN(std::vector<PageView> pages, h->cache->Pages(seq, layer));
    std::vector<PageId> ids;
    for (const PageView& p : pages) {
      const bool inside = p.first_token >= first && uint64_t{p.first_token} + p.n_tokens <= end;
      if (inside && p.key_min != nullptr && p.tier != tier) ids.push_back(p.id);
    }
    for (PageId id : ids) {  // a page shared by several layers' lists moves once
      Status moved = tier == TierKind::kDisk ? h->cache->MoveToDisk(id) : h->cache->MoveToRam(id);
      ARGUS_RETURN_IF_ERROR(moved);
      ++n_moved;
    }
  }
  return n_moved;
}

// Decodes rows [first, first + n) of a layer into k, v ([n, n_kv_heads, head_dim]).
Status ReadRows(const argus_cache_t* h, SeqId seq, uint32_t layer, uint32_t first, uint32_t n,
                float* k, float* v) {
  const CacheGeometry& g = h->cache->geometry();
  ARGUS_ASSIGN_OR_RETURN(uint32_t length, h->cache->Length(seq, layer));
  if (uint64_t{first} + n > length) {
    return Status::InvalidArgument(
        "rows [" + std::to_string(first) + ", " + std::to_string(uint64_t{first} + n) +
        ") of layer " + std::to_string(layer) + ", which holds " + std::to_string(length));
  }
  ARGUS_ASSIGN_OR_RETURN(std::vector<PageView> pages, h->cache->Pages(seq, layer));
  std::vector<float> tile;
  const size_t row = size_t{g.n_kv_heads} * g.head_dim;
  for (const PageView& page : pages) {
    const uint32_t begin = std::max(first, page.first_token);
    const uint32_t end = std::min(first + n, page.first_token + page.n_tokens);
    if (begin >= end) continue;
    if (page.bytes == nullptr) {
      return Status::Unsupported("page of tokens " + std::to_string(page.first_token) +
                                 ".. is on disk: move it to RAM to read it");
    }
    const TileShape shape{page.n_tokens, g.head_dim};
    tile.resize(shape.n_values());
    for (uint32_t head = 0; head < g.n_kv_heads; ++head) {
      for (auto [codec, bytes, out] : {std::tuple{page.k_codec, page.k_tile(head), k},
                                       std::tuple{page.v_codec, page.v_tile(head), v}}) {
        ARGUS_RETURN_IF_ERROR(codec->decode(bytes, shape, tile.data()));
        for (uint32_t t = begin; t < end; ++t) {
          std::copy_n(&tile[size_t{t - page.first_token} * g.head_dim], g.head_dim,
                      out + (t - first) * row + size_t{head} * g.head_dim);
        }
      }
    }
  }
  return Status::Ok();
}

Result<std::span<const int32_t>> TokensOf(const int32_t* tokens, size_t n_tokens) {
  if (tokens == nullptr && n_tokens != 0) return Status::InvalidArgument("tokens is NULL");
  return std::span<const int32_t>(tokens, n_tokens);
}

Result<std::string_view> NameOf(const char* name, std::string_view what) {
  if (name == nullptr) return Status::InvalidArgument(std::string(what) + " is NULL");
  return std::string_view(name);
}

}  // namespace

extern "C" {

const char* argus_version(void) { return kVersion; }

void argus_free(void* p) { std::free(p); }

size_t argus_codec_count(void) { return Codecs().size(); }

const char* argus_codec_name(size_t index) {
  return index < Codecs().size() ? Codecs()[index].name.c_str() : nullptr;
}

double argus_codec_bits_per_value(size_t index) {
  return index < Codecs().size() ? Codecs()[index].bits_per_value : -1;
}

int argus_codec_is_lossless(size_t index) {
  return index < Codecs().size() ? (Codecs()[index].lossless ? 1 : 0) : -1;
}

double argus_codec_spec_bits_per_value(const char* spec, uint32_t head_dim, char** errptr) {
  return Guard<double>(errptr, -1.0, [&]() -> Result<double> {
    ARGUS_ASSIGN_OR_RETURN(std::string_view text, NameOf(spec, "spec"));
    ARGUS_ASSIGN_OR_RETURN(std::unique_ptr<Codec> codec, CodecRegistry::Default().Create(text));
    const TileShape shape{256, head_dim};
    ARGUS_RETURN_IF_ERROR(ValidateShape(shape));
    ARGUS_ASSIGN_OR_RETURN(size_t bytes, codec->encoded_size(shape));
    return 8.0 * static_cast<double>(bytes) / static_cast<double>(shape.n_values());
  });
}

argus_cache_options_t* argus_cache_options_create(void) {
  return CreateHandle<argus_cache_options_t>();
}

void argus_cache_options_destroy(argus_cache_options_t* o) { DestroyHandle(o); }

void argus_cache_options_set_geometry(argus_cache_options_t* o, uint32_t n_layers,
                                      uint32_t n_q_heads, uint32_t n_kv_heads, uint32_t head_dim) {
  SetOption(o, [&](auto& x) { x.geometry = {n_layers, n_q_heads, n_kv_heads, head_dim}; });
}

void argus_cache_options_set_codecs(argus_cache_options_t* o, const char* k_codec,
                                    const char* v_codec) {
  SetOption(o, [&](auto& x) {
    if (k_codec) x.k_codec = k_codec;
    if (v_codec) x.v_codec = v_codec;
  });
}

void argus_cache_options_set_page_tokens(argus_cache_options_t* o, uint32_t page_tokens) {
  SetOption(o, [&](auto& x) { x.page_tokens = page_tokens; });
}

void argus_cache_options_set_ram_budget(argus_cache_options_t* o, uint64_t bytes) {
  SetOption(o, [&](auto& x) { x.ram_budget_bytes = bytes; });
}

void argus_cache_options_set_active_codec(argus_cache_options_t* o, const char* codec) {
  SetOption(o, [&](auto& x) { x.active_codec = codec ? codec : "f16"; });
}

void argus_cache_options_set_threads(argus_cache_options_t* o, uint32_t n_threads) {
  SetOption(o, [&](auto& x) { x.n_threads = n_threads; });
}

void argus_cache_options_set_attention(argus_cache_options_t* o, uint32_t window, uint32_t sinks,
                                       double epsilon) {
  SetOption(o, [&](auto& x) {
    x.attention.window = window;
    x.attention.sinks = sinks;
    x.attention.epsilon = epsilon;
  });
}

void argus_cache_options_set_disk(argus_cache_options_t* o, const char* dir,
                                  uint64_t budget_bytes) {
  SetOption(o, [&](auto& x) {
    x.disk_dir = dir ? dir : "";
    x.disk_budget_bytes = budget_bytes;
  });
}

void argus_cache_options_set_profile(argus_cache_options_t* o, const char* profile) {
  SetOption(o, [&](auto& x) { x.profile = profile ? profile : ""; });
}

void argus_cache_options_set_placement_sync(argus_cache_options_t* o, int synchronous) {
  SetOption(o, [&](auto& x) { x.placement_sync = synchronous != 0; });
}

argus_cache_t* argus_cache_open(const argus_cache_options_t* o, char** errptr) {
  return Guard<argus_cache_t*>(errptr, nullptr, [&]() -> Result<argus_cache_t*> {
    ARGUS_RETURN_IF_ERROR(CheckHandle(o, HandleKind::kCacheOptions, "argus_cache_open"));
    ARGUS_RETURN_IF_ERROR(CheckThreadCount(o->n_threads, "argus_cache_open"));
    if (!(o->attention.epsilon >= 0 && o->attention.epsilon < 1)) {
      return Status::InvalidArgument("attention epsilon must be in [0, 1), got " +
                                     std::to_string(o->attention.epsilon));
    }
    ARGUS_ASSIGN_OR_RETURN(
        PlacementChoice choice,
        ChoosePlacement(o->profile, o->k_codec, o->v_codec, !o->disk_dir.empty()));
    if (choice.placement && o->ram_budget_bytes == 0) {
      return Status::InvalidArgument("the placement engine (profile '" + o->profile +
                                     "') needs a RAM budget to keep");
    }
    auto h = std::make_unique<argus_cache_t>();
    ARGUS_ASSIGN_OR_RETURN(h->disk, OpenDisk(o->disk_dir, o->disk_budget_bytes));
    ARGUS_ASSIGN_OR_RETURN(h->cache, KvCache::Create(CacheOptionsOf(*o, choice, h->disk.get())));
    h->pool = std::make_unique<ThreadPool>(o->n_threads);
    h->engine = std::make_unique<AttentionEngine>(*h->pool);
    h->attention = o->attention;
    if (choice.placement) {
      if (o->attention.epsilon != 0) choice.placement->profile.epsilon = o->attention.epsilon;
      if (o->placement_sync) {
        choice.placement->background = false;
        choice.placement->disk_time_share = 0;
      }
      h->attention = {};
      ARGUS_ASSIGN_OR_RETURN(h->placement,
                             PlacementEngine::Create(*h->cache, *h->pool, *choice.placement));
    }
    return Adopt(std::move(h));
  });
}

void argus_cache_close(argus_cache_t* h) { DestroyHandle(h); }

int64_t argus_seq_create(argus_cache_t* h, char** errptr) {
  return Guard<int64_t>(errptr, -1, [&]() -> Result<int64_t> {
    ARGUS_RETURN_IF_ERROR(CheckHandle(h, HandleKind::kCache, "argus_seq_create"));
    ARGUS_ASSIGN_OR_RETURN(SeqId seq, h->cache->CreateSequence());
    return int64_t{seq};
  });
}

void argus_seq_release(argus_cache_t* h, int64_t seq_id, char** errptr) {
  GuardVoid(errptr, [&]() -> Status {
    ARGUS_RETURN_IF_ERROR(CheckHandle(h, HandleKind::kCache, "argus_seq_release"));
    ARGUS_ASSIGN_OR_RETURN(SeqId seq, SeqOf(seq_id));
    if (UnderRequest(h, seq)) {
      // The request ends with its sequence: no migration may still hold its pages.
      ARGUS_RETURN_IF_ERROR(h->placement->Drain());
      h->request.reset();
    }
    return h->cache->Release(seq);
  });
}

int64_t argus_seq_fork(argus_cache_t* h, int64_t seq_id, char** errptr) {
  return Guard<int64_t>(errptr, -1, [&]() -> Result<int64_t> {
    ARGUS_RETURN_IF_ERROR(CheckHandle(h, HandleKind::kCache, "argus_seq_fork"));
    ARGUS_ASSIGN_OR_RETURN(SeqId seq, SeqOf(seq_id));
    if (UnderRequest(h, seq)) ARGUS_RETURN_IF_ERROR(h->placement->Drain());
    ARGUS_ASSIGN_OR_RETURN(SeqId child, h->cache->Fork(seq));
    return int64_t{child};
  });
}

void argus_seq_crop(argus_cache_t* h, int64_t seq_id, uint32_t n_tokens, char** errptr) {
  GuardVoid(errptr, [&]() -> Status {
    ARGUS_RETURN_IF_ERROR(CheckHandle(h, HandleKind::kCache, "argus_seq_crop"));
    ARGUS_ASSIGN_OR_RETURN(SeqId seq, SeqOf(seq_id));
    return UnderRequest(h, seq) ? h->placement->Crop(n_tokens) : h->cache->Crop(seq, n_tokens);
  });
}

int64_t argus_seq_length(argus_cache_t* h, int64_t seq_id, uint32_t layer, char** errptr) {
  return Guard<int64_t>(errptr, -1, [&]() -> Result<int64_t> {
    ARGUS_RETURN_IF_ERROR(CheckHandle(h, HandleKind::kCache, "argus_seq_length"));
    ARGUS_ASSIGN_OR_RETURN(SeqId seq, SeqOf(seq_id));
    ARGUS_RETURN_IF_ERROR(CheckLayer(h, layer));
    ARGUS_ASSIGN_OR_RETURN(uint32_t n, h->cache->Length(seq, layer));
    return int64_t{n};
  });
}

void argus_seq_append_f32(argus_cache_t* h, int64_t seq, uint32_t layer, const float* k,
                          const float* v, uint32_t n_tokens, char** errptr) {
  GuardVoid(errptr, [&] { return Append(h, seq, layer, k, v, n_tokens, "argus_seq_append_f32"); });
}

void argus_seq_append_f16(argus_cache_t* h, int64_t seq, uint32_t layer, const uint16_t* k,
                          const uint16_t* v, uint32_t n_tokens, char** errptr) {
  GuardVoid(errptr, [&] { return Append(h, seq, layer, k, v, n_tokens, "argus_seq_append_f16"); });
}

void argus_attend_decode_f32(argus_cache_t* h, int64_t seq, uint32_t layer, const float* q,
                             float* out, char** errptr) {
  GuardVoid(errptr,
            [&] { return Attend(h, seq, layer, q, 1, out, false, "argus_attend_decode_f32"); });
}

void argus_attend_prefill_f32(argus_cache_t* h, int64_t seq, uint32_t layer, const float* q,
                              uint32_t n_queries, float* out, char** errptr) {
  GuardVoid(errptr, [&] {
    return Attend(h, seq, layer, q, n_queries, out, true, "argus_attend_prefill_f32");
  });
}

void argus_seq_read_f32(argus_cache_t* h, int64_t seq_id, uint32_t layer, uint32_t first,
                        uint32_t n_tokens, float* k, float* v, char** errptr) {
  GuardVoid(errptr, [&]() -> Status {
    ARGUS_RETURN_IF_ERROR(CheckHandle(h, HandleKind::kCache, "argus_seq_read_f32"));
    ARGUS_ASSIGN_OR_RETURN(SeqId seq, SeqOf(seq_id));
    ARGUS_RETURN_IF_ERROR(CheckLayer(h, layer));
    ARGUS_RETURN_IF_ERROR(CheckBuffer(k, "k"));
    ARGUS_RETURN_IF_ERROR(CheckBuffer(v, "v"));
    return ReadRows(h, seq, layer, first, n_tokens, k, v);
  });
}

void argus_cache_last_attention_stats(const argus_cache_t* h, argus_attention_stats_t* out,
                                      char** errptr) {
  GuardVoid(errptr, [&]() -> Status {
    ARGUS_RETURN_IF_ERROR(CheckHandle(h, HandleKind::kCache, "argus_cache_last_attention_stats"));
    ARGUS_RETURN_IF_ERROR(CheckBuffer(out, "stats"));
    const AttentionStats& s = h->last;
    *out = {s.n_pages,           s.n_pages_masked,  s.n_tiles,
            s.n_tiles_skipped,   s.bytes_read,      s.bytes_skipped,
            s.n_disk_pages_read, s.disk_bytes_read, s.skipped_mass_bound};
    return Status::Ok();
  });
}

void argus_placement_begin(argus_cache_t* h, int64_t seq_id, uint32_t expected_tokens,
                           char** errptr) {
  GuardVoid(errptr, [&]() -> Status {
    ARGUS_RETURN_IF_ERROR(CheckHandle(h, HandleKind::kCache, "argus_placement_begin"));
    ARGUS_ASSIGN_OR_RETURN(SeqId seq, SeqOf(seq_id));
    if (!h->placement) {
      return Status::InvalidArgument(
          "argus_placement_begin: the cache has no placement engine "
          "(argus_cache_options_set_profile)");
    }
    ARGUS_RETURN_IF_ERROR(h->placement->BeginRequest(seq, expected_tokens));
    h->request = seq;
    return Status::Ok();
  });
}

void argus_placement_end_step(argus_cache_t* h, char** errptr) {
  GuardVoid(errptr, [&]() -> Status {
    ARGUS_RETURN_IF_ERROR(CheckHandle(h, HandleKind::kCache, "argus_placement_end_step"));
    if (!h->placement || !h->request) {
      return Status::InvalidArgument("argus_placement_end_step: no placement request begun");
    }
    return h->placement->EndStep();
  });
}

int64_t argus_seq_move_to_disk(argus_cache_t* h, int64_t seq, uint32_t first, uint32_t n_tokens,
                               char** errptr) {
  return Guard<int64_t>(errptr, -1, [&] {
    return MovePages(h, seq, first, n_tokens, TierKind::kDisk, "argus_seq_move_to_disk");
  });
}

int64_t argus_seq_move_to_ram(argus_cache_t* h, int64_t seq, uint32_t first, uint32_t n_tokens,
                              char** errptr) {
  return Guard<int64_t>(errptr, -1, [&] {
    return MovePages(h, seq, first, n_tokens, TierKind::kRam, "argus_seq_move_to_ram");
  });
}

void argus_seq_save(argus_cache_t* h, int64_t seq_id, const char* name, char** errptr) {
  GuardVoid(errptr, [&]() -> Status {
    ARGUS_RETURN_IF_ERROR(CheckHandle(h, HandleKind::kCache, "argus_seq_save"));
    ARGUS_ASSIGN_OR_RETURN(SeqId seq, SeqOf(seq_id));
    ARGUS_ASSIGN_OR_RETURN(std::string_view n, NameOf(name, "name"));
    return h->cache->Save(seq, n);
  });
}

int64_t argus_seq_restore(argus_cache_t* h, const char* name, char** errptr) {
  return Guard<int64_t>(errptr, -1, [&]() -> Result<int64_t> {
    ARGUS_RETURN_IF_ERROR(CheckHandle(h, HandleKind::kCache, "argus_seq_restore"));
    ARGUS_ASSIGN_OR_RETURN(std::string_view n, NameOf(name, "name"));
    ARGUS_ASSIGN_OR_RETURN(SeqId seq, h->cache->Restore(n));
    return int64_t{seq};
  });
}

void argus_save_erase(argus_cache_t* h, const char* name, char** errptr) {
  GuardVoid(errptr, [&]() -> Status {
    ARGUS_RETURN_IF_ERROR(CheckHandle(h, HandleKind::kCache, "argus_save_erase"));
    ARGUS_ASSIGN_OR_RETURN(std::string_view n, NameOf(name, "name"));
    return h->cache->EraseSave(n);
  });
}

int64_t argus_prefix_store(argus_cache_t* h, int64_t seq_id, const char* fingerprint,
                           const int32_t* tokens, size_t n_tokens, char** errptr) {
  return Guard<int64_t>(errptr, -1, [&]() -> Result<int64_t> {
    ARGUS_RETURN_IF_ERROR(CheckHandle(h, HandleKind::kCache, "argus_prefix_store"));
    ARGUS_ASSIGN_OR_RETURN(SeqId seq, SeqOf(seq_id));
    ARGUS_ASSIGN_OR_RETURN(std::string_view f, NameOf(fingerprint, "fingerprint"));
    ARGUS_ASSIGN_OR_RETURN(auto t, TokensOf(tokens, n_tokens));
    // Attention with a tolerance, a mask or a lossy placement ladder made later layers' K/V
    // differ from an exact computation's: such pages are not what their keys promise.
    const AttentionOptions& a = h->attention;
    const bool approximate = a.epsilon != 0 || a.window != 0 || a.sinks != 0 ||
                             (UnderRequest(h, seq) && h->placement->active());
    PrefixStoreStats stats;
    ARGUS_RETURN_IF_ERROR(h->cache->StorePrefix(
        seq, f, t, approximate ? 0 : std::numeric_limits<uint32_t>::max(), stats));
    return static_cast<int64_t>(stats.n_stored);
  });
}

int64_t argus_prefix_load(argus_cache_t* h, int64_t seq_id, const char* fingerprint,
                          const int32_t* tokens, size_t n_tokens, char** errptr) {
  return Guard<int64_t>(errptr, -1, [&]() -> Result<int64_t> {
    ARGUS_RETURN_IF_ERROR(CheckHandle(h, HandleKind::kCache, "argus_prefix_load"));
    ARGUS_ASSIGN_OR_RETURN(SeqId seq, SeqOf(seq_id));
    ARGUS_ASSIGN_OR_RETURN(std::string_view f, NameOf(fingerprint, "fingerprint"));
    ARGUS_ASSIGN_OR_RETURN(auto t, TokensOf(tokens, n_tokens));
    ARGUS_ASSIGN_OR_RETURN(uint32_t n, h->cache->LoadPrefix(seq, f, t));
    return int64_t{n};
  });
}

char* argus_cache_stats_json(const argus_cache_t* h, char** errptr) {
  return Guard<char*>(errptr, nullptr, [&]() -> Result<char*> {
    ARGUS_RETURN_IF_ERROR(CheckHandle(h, HandleKind::kCache, "argus_cache_stats_json"));
    std::optional<PlacementStats> placement;
    if (h->placement) placement = h->placement->stats();
    return OwnedString(StatsJson(h->cache->stats(), placement));
  });
}

uint64_t argus_cache_required_ram(const argus_cache_options_t* o, uint32_t n_tokens,
                                  char** errptr) {
  return Guard<uint64_t>(errptr, 0, [&]() -> Result<uint64_t> {
    ARGUS_RETURN_IF_ERROR(CheckHandle(o, HandleKind::kCacheOptions, "argus_cache_required_ram"));
    ARGUS_ASSIGN_OR_RETURN(PlacementChoice choice,
                           ChoosePlacement(o->profile, o->k_codec, o->v_codec, true));
    ARGUS_ASSIGN_OR_RETURN(
        size_t n, KvCache::RequiredRamBytes(CacheOptionsOf(*o, choice, nullptr), n_tokens));
    return uint64_t{n};
  });
}

}  // extern "C"

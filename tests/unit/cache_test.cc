// The paged KV cache: creation checks, append through every page state, fork, crop, release,
// re-encoding, budgets (all or nothing) and byte accounting, against references computed tile
// by tile through the public codec API.
#include "argus/cache.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "argus/core.h"
#include "cache/placement_access.h"
#include "core/checksum.h"
#include "test_util.h"

namespace argus {
namespace {

using testing::DecodeTile;
using testing::EncodeTile;
using testing::MakeCodec;
using testing::RandomValues;

struct Shape {
  uint32_t n_layers = 1, n_kv_heads = 2, head_dim = 64, page_tokens = 16;
  size_t row_values() const { return size_t{n_kv_heads} * head_dim; }
};

CacheOptions Options(const Shape& s, const std::string& k = "f16", const std::string& v = "f16",
                     size_t budget = size_t{64} << 20, const std::string& active = "f16") {
  CacheOptions o;
  o.geometry = {s.n_layers, 2 * s.n_kv_heads, s.n_kv_heads, s.head_dim};
  o.page_tokens = s.page_tokens;
  o.ram_budget_bytes = budget;
  o.k_codec = k;
  o.v_codec = v;
  o.active_codec = active;
  return o;
}

std::unique_ptr<KvCache> Make(const CacheOptions& options) {
  auto cache = KvCache::Create(options);
  EXPECT_TRUE(cache.ok()) << cache.status().ToString();
  return cache.ok() ? std::move(cache).value() : nullptr;
}

using testing::ContainsText;

std::vector<float> RoundF16(const std::vector<float>& x) {
  std::vector<float> r(x.size());
  for (size_t i = 0; i < x.size(); ++i) r[i] = HalfToFloat(FloatToHalf(x[i]));
  return r;
}

// Values of tokens [first, first + n) of x [n_tokens, n_kv_heads, head_dim].
std::vector<float> Slice(const std::vector<float>& x, const Shape& s, size_t first, size_t n) {
  return {x.begin() + first * s.row_values(), x.begin() + (first + n) * s.row_values()};
}

enum class Plane { kK, kV };

// The layer's keys or values decoded page by page through each page's codec:
// [n_tokens, n_kv_heads, head_dim].
std::vector<float> DecodeLayer(const KvCache& cache, SeqId seq, uint32_t layer, Plane plane) {
  const uint32_t H = cache.geometry().n_kv_heads, D = cache.geometry().head_dim;
  auto pages = cache.Pages(seq, layer);
  auto length = cache.Length(seq, layer);
  EXPECT_TRUE(pages.ok() && length.ok());
  if (!pages.ok() || !length.ok()) return {};
  std::vector<float> out(size_t{*length} * H * D, NAN);
  for (const PageView& page : *pages) {
    const Codec* codec = plane == Plane::kK ? page.k_codec : page.v_codec;
    for (uint32_t h = 0; h < H; ++h) {
      auto tile = DecodeTile(*codec, plane == Plane::kK ? page.k_tile(h) : page.v_tile(h),
                             {page.n_tokens, D});
      for (uint32_t t = 0; t < page.n_tokens; ++t) {
        std::copy_n(tile.data() + size_t{t} * D, D,
                    out.data() + ((size_t{page.first_token} + t) * H + h) * D);
      }
    }
  }
  return out;
}

// What a layer holding x [n_tokens, ...] should decode to: each full page's tiles encoded and
// decoded by `codec` from the f16-rounded input, the partial last page the rounded input.
std::vector<float> ExpectedLayer(const std::vector<float>& x, const Shape& s, const Codec& codec) {
  std::vector<float> out = RoundF16(x);
  const uint32_t H = s.n_kv_heads, D = s.head_dim, P = s.page_tokens;
  const size_t n_tokens = x.size() / s.row_values();
  for (size_t first = 0; first + P <= n_tokens; first += P) {
    for (uint32_t h = 0; h < H; ++h) {
      std::vector<float> tile(size_t{P} * D);
      for (uint32_t t = 0; t < P; ++t) {
        std::copy_n(out.data() + ((first + t) * H + h) * D, D, tile.data() + size_t{t} * D);
      }
      auto back = DecodeTile(codec, EncodeTile(codec, tile, {P, D}), {P, D});
      for (uint32_t t = 0; t < P; ++t) {
        std::copy_n(back.data() + size_t{t} * D, D, out.data() + ((first + t) * H + h) * D);
      }
    }
  }
  return out;
}

double RelRmse(const std::vector<float>& got, const std::vector<float>& want) {
  double err = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    err += (double{got[i]} - want[i]) * (double{got[i]} - want[i]);
    norm += double{want[i]} * want[i];
  }
  return std::sqrt(err / norm);
}

size_t PageSlotBytes(const PageView& page, uint32_t n_kv_heads) {
  return page.v_offset + size_t{n_kv_heads} * page.v_stride;
}

// Every full page's key summary is exactly the per-channel min and max of its decoded keys and
// bounds its largest decoded key norm within a float rounding; its checksum is that of its bytes.
void ExpectSummariesAndChecksums(const KvCache& cache, SeqId seq, uint32_t layer) {
  const uint32_t H = cache.geometry().n_kv_heads, D = cache.geometry().head_dim;
  const PageTable& table = PageTableOf(cache);
  const std::vector<PageView> pages = *cache.Pages(seq, layer);
  for (const PageView& page : pages) {
    if (table.state[page.id] != PageState::kFull) {
      EXPECT_EQ(page.key_min, nullptr);
      EXPECT_EQ(page.key_norm_max, nullptr);
      continue;
    }
    ASSERT_NE(page.key_min, nullptr);
    const size_t n_bytes = PageSlotBytes(page, H);
    EXPECT_EQ(n_bytes, table.n_bytes[page.id]);
    EXPECT_EQ(Checksum64({page.bytes, n_bytes}), table.checksum[page.id]) << "page " << page.id;
    for (uint32_t h = 0; h < H; ++h) {
      auto keys = DecodeTile(*page.k_codec, page.k_tile(h), {page.n_tokens, D});
      double max_norm = 0;
      for (uint32_t t = 0; t < page.n_tokens; ++t) {
        double sq = 0;
        for (uint32_t d = 0; d < D; ++d) sq += double{keys[t * D + d]} * keys[t * D + d];
        max_norm = std::max(max_norm, std::sqrt(sq));
      }
      for (uint32_t d = 0; d < D; ++d) {
        float lo = keys[d], hi = keys[d];
        for (uint32_t t = 1; t < page.n_tokens; ++t) {
          lo = std::min(lo, keys[t * D + d]);
          hi = std::max(hi, keys[t * D + d]);
        }
        ASSERT_EQ(page.key_min[h * D + d], lo) << "page " << page.id << " head " << h;
        ASSERT_EQ(page.key_max[h * D + d], hi) << "page " << page.id << " head " << h;
      }
      EXPECT_GE(double{page.key_norm_max[h]}, max_norm);
      EXPECT_LE(double{page.key_norm_max[h]}, max_norm * (1 + 1e-6));
    }
  }
}

void ExpectAccounted(const KvCache& cache) {
  const CacheStats s = cache.stats();
  EXPECT_EQ(s.page_bytes, s.ram.used_bytes);
  EXPECT_LE(s.ram.used_bytes, s.ram.budget_bytes);
  EXPECT_EQ(s.n_pages, s.n_full_pages + s.n_active_pages);
}

void ExpectSameStats(const CacheStats& a, const CacheStats& b) {
  EXPECT_EQ(a.n_sequences, b.n_sequences);
  EXPECT_EQ(a.n_pages, b.n_pages);
  EXPECT_EQ(a.n_full_pages, b.n_full_pages);
  EXPECT_EQ(a.n_active_pages, b.n_active_pages);
  EXPECT_EQ(a.page_bytes, b.page_bytes);
  EXPECT_EQ(a.metadata_bytes, b.metadata_bytes);
  ASSERT_EQ(a.by_codec.size(), b.by_codec.size());
  for (size_t i = 0; i < a.by_codec.size(); ++i) {
    EXPECT_EQ(a.by_codec[i].codec, b.by_codec[i].codec);
    EXPECT_EQ(a.by_codec[i].k_bytes, b.by_codec[i].k_bytes);
    EXPECT_EQ(a.by_codec[i].v_bytes, b.by_codec[i].v_bytes);
    EXPECT_EQ(a.by_codec[i].n_k_pages, b.by_codec[i].n_k_pages);
    EXPECT_EQ(a.by_codec[i].n_v_pages, b.by_codec[i].n_v_pages);
  }
  EXPECT_EQ(a.ram.used_bytes, b.ram.used_bytes);
  EXPECT_EQ(a.ram.reserved_bytes, b.ram.reserved_bytes);
  EXPECT_EQ(a.ram.n_slots, b.ram.n_slots);
}

// One page as the attention engine sees it: placement, state, codecs and visible tile bytes.
struct PageImage {
  PageId id;
  uint32_t first_token, n_tokens;
  PageState state;
  std::string k_codec, v_codec;
  std::vector<std::byte> bytes;  // K tiles then V tiles, the visible rows only
  bool SameContent(const PageImage& o) const {
    return first_token == o.first_token && n_tokens == o.n_tokens && state == o.state &&
           k_codec == o.k_codec && v_codec == o.v_codec && bytes == o.bytes;
  }
};

std::vector<PageImage> Images(const KvCache& cache, SeqId seq, uint32_t layer) {
  std::vector<PageImage> images;
  const std::vector<PageView> pages = *cache.Pages(seq, layer);
  for (const PageView& page : pages) {
    PageImage image{page.id,
                    page.first_token,
                    page.n_tokens,
                    PageTableOf(cache).state[page.id],
                    page.k_codec->info().name,
                    page.v_codec->info().name,
                    {}};
    for (uint32_t h = 0; h < cache.geometry().n_kv_heads; ++h) {
      auto k = page.k_tile(h);
      image.bytes.insert(image.bytes.end(), k.begin(), k.end());
    }
    for (uint32_t h = 0; h < cache.geometry().n_kv_heads; ++h) {
      auto v = page.v_tile(h);
      image.bytes.insert(image.bytes.end(), v.begin(), v.end());
    }
    images.push_back(std::move(image));
  }
  return images;
}

void ExpectSameContent(const std::vector<PageImage>& a, const std::vector<PageImage>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i].SameContent(b[i])) << "page " << i;
}

// Everything a failed call must leave as it was: stats, and every page of the sequences.
struct Snapshot {
  CacheStats stats;
  std::vector<std::vector<PageImage>> layers;
};

Snapshot Take(const KvCache& cache, const std::vector<SeqId>& seqs) {
  Snapshot s{cache.stats(), {}};
  for (SeqId seq : seqs) {
    for (uint32_t l = 0; l < cache.geometry().n_layers; ++l)
      s.layers.push_back(Images(cache, seq, l));
  }
  return s;
}

void ExpectUnchanged(const Snapshot& before, const Snapshot& after) {
  ExpectSameStats(before.stats, after.stats);
  ASSERT_EQ(before.layers.size(), after.layers.size());
  for (size_t i = 0; i < before.layers.size(); ++i) {
    ASSERT_EQ(before.layers[i].size(), after.layers[i].size());
    for (size_t p = 0; p < before.layers[i].size(); ++p) {
      EXPECT_EQ(before.layers[i][p].id, after.layers[i][p].id);
      EXPECT_TRUE(before.layers[i][p].SameContent(after.layers[i][p]));
    }
  }
}

Status AppendRows(KvCache& cache, SeqId seq, uint32_t layer, const std::vector<float>& k,
                  const std::vector<float>& v) {
  return cache.Append(seq, layer, k, v);
}

size_t TileBytes(const std::string& codec, uint32_t tokens, uint32_t dim) {
  return *MakeCodec(codec)->encoded_size({tokens, dim});
}

// ---- Creation --------------------------------------------------------------------------------

TEST(CacheGeometry, ToStringNamesEveryCount) {
  CacheGeometry g{32, 32, 8, 128};
  EXPECT_EQ(g.ToString(), "32 layers, 32 q heads, 8 kv heads, head_dim 128");
  EXPECT_TRUE(g.Validate().ok());
  EXPECT_EQ(g.gqa(), 4u);
}

TEST(KvCacheCreate, BadGeometryIsInvalidArgument) {
  const CacheGeometry bad[] = {
      {0, 8, 8, 64},    // no layers
      {2, 8, 3, 64},    // kv heads do not divide q heads
      {2, 130, 2, 64},  // a group of 65 query heads
      {2, 8, 8, 0},     // no head_dim
      {2, 8, 8, 2048},  // head_dim above kMaxTileDim
  };
  for (const CacheGeometry& g : bad) {
    CacheOptions o = Options({});
    o.geometry = g;
    auto cache = KvCache::Create(o);
    ASSERT_FALSE(cache.ok()) << g.ToString();
    EXPECT_EQ(cache.status().code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(ContainsText(cache.status().message(), g.ToString())) << cache.status().message();
  }
}

TEST(KvCacheCreate, PageTokensNotAPowerOfTwoUpTo4096IsInvalidArgument) {
  for (uint32_t page : {0u, 3u, 24u, 8192u}) {
    CacheOptions o = Options({});
    o.page_tokens = page;
    auto cache = KvCache::Create(o);
    ASSERT_FALSE(cache.ok()) << page;
    EXPECT_EQ(cache.status().code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(ContainsText(cache.status().message(), "page_tokens " + std::to_string(page)));
  }
  for (uint32_t page : {1u, 4096u}) {
    CacheOptions o = Options({});
    o.page_tokens = page;
    EXPECT_TRUE(KvCache::Create(o).ok()) << page;
  }
}

TEST(KvCacheCreate, ZeroBudgetIsInvalidArgument) {
  auto cache = KvCache::Create(Options({}, "f16", "f16", 0));
  ASSERT_FALSE(cache.ok());
  EXPECT_EQ(cache.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(ContainsText(cache.status().message(), "ram_budget_bytes"));
}

TEST(KvCacheCreate, UnknownOrMalformedCodecIsInvalidArgumentNamingIt) {
  for (auto [k, v, named] : {std::tuple{"nope", "f16", "k codec 'nope'"},
                             std::tuple{"f16", "q4_0+spin", "v codec 'q4_0+spin'"},
                             std::tuple{"q8_0:channel", "f16", "k codec 'q8_0:channel'"}}) {
    auto cache = KvCache::Create(Options({}, k, v));
    ASSERT_FALSE(cache.ok()) << k << " " << v;
    EXPECT_EQ(cache.status().code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(ContainsText(cache.status().message(), named)) << cache.status().message();
  }
}

TEST(KvCacheCreate, KeysOnlyCodecIsRefusedForValuesOnly) {
  auto cache = KvCache::Create(Options({}, "f16", "int1"));
  ASSERT_FALSE(cache.ok());
  EXPECT_EQ(cache.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(ContainsText(cache.status().message(), "v codec 'int1'")) << cache.status().message();
  EXPECT_TRUE(ContainsText(cache.status().message(), "keys-only")) << cache.status().message();
  EXPECT_TRUE(KvCache::Create(Options({}, "int1", "f16")).ok());
}

TEST(KvCacheCreate, ActiveCodecMustBeF16OrF32) {
  auto cache = KvCache::Create(Options({}, "f16", "f16", 1 << 20, "bf16"));
  ASSERT_FALSE(cache.ok());
  EXPECT_EQ(cache.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(ContainsText(cache.status().message(), "bf16"));
  EXPECT_TRUE(KvCache::Create(Options({}, "f16", "f16", 1 << 20, "f32")).ok());
}

// ---- Append ----------------------------------------------------------------------------------

// f16 pages hold the f16-rounded input exactly; q8_0 pages hold exactly what the codec makes of
// each rounded tile, within 1.5% relative RMSE of the input (q8_0 on rows with outliers, as in
// codec_ggml_test); every page state and length.
TEST(KvCacheAppend, PagesDecodeToTheInputThroughEachCodec) {
  for (uint32_t page : {16u, 256u}) {
    for (uint32_t dim : {64u, 80u, 128u}) {
      for (uint32_t heads : {1u, 2u, 8u}) {
        const Shape s{1, heads, dim, page};
        const auto k_all = RandomValues((3 * page + 5) * s.row_values(), page + dim + heads);
        const auto v_all = RandomValues(k_all.size(), page + dim + heads + 1);
        for (uint32_t n : {1u, page - 1, page, page + 1, 3 * page + 5}) {
          const auto k = Slice(k_all, s, 0, n), v = Slice(v_all, s, 0, n);
          for (const char* codec_name : {"f16", "q8_0"}) {
            SCOPED_TRACE(std::string(codec_name) + " page " + std::to_string(page) + " dim " +
                         std::to_string(dim) + " heads " + std::to_string(heads) + " tokens " +
                         std::to_string(n));
            auto cache = Make(Options(s, codec_name, codec_name));
            ASSERT_NE(cache, nullptr);
            const SeqId seq = *cache->CreateSequence();
            ASSERT_TRUE(AppendRows(*cache, seq, 0, k, v).ok());
            EXPECT_EQ(*cache->Length(seq, 0), n);

            auto pages = *cache->Pages(seq, 0);
            ASSERT_EQ(pages.size(), (n + page - 1) / page);
            for (size_t i = 0; i < pages.size(); ++i) {
              EXPECT_EQ(pages[i].first_token, i * page);
              EXPECT_EQ(pages[i].n_tokens, std::min<uint32_t>(page, n - i * page));
              EXPECT_EQ(PageTableOf(*cache).state[pages[i].id],
                        pages[i].n_tokens == page ? PageState::kFull : PageState::kActive);
            }
            auto codec = MakeCodec(codec_name);
            const auto got_k = DecodeLayer(*cache, seq, 0, Plane::kK);
            const auto got_v = DecodeLayer(*cache, seq, 0, Plane::kV);
            ASSERT_EQ(got_k, ExpectedLayer(k, s, *codec));
            ASSERT_EQ(got_v, ExpectedLayer(v, s, *codec));
            if (std::string(codec_name) == "q8_0") {
              EXPECT_LT(RelRmse(got_k, k), 0.015);
              EXPECT_LT(RelRmse(got_v, v), 0.015);
            }
            ExpectSummariesAndChecksums(*cache, seq, 0);
            ExpectAccounted(*cache);
          }
        }
      }
    }
  }
}

// The summary is taken from what the codec decodes, not from the input.
TEST(KvCacheAppend, KeySummaryBoundsTheDecodedLossyKeysTightly) {
  const Shape s{1, 2, 64, 16};
  auto cache = Make(Options(s, "q4_0", "q4_0"));
  ASSERT_NE(cache, nullptr);
  const SeqId seq = *cache->CreateSequence();
  const auto k = RandomValues(2 * 16 * s.row_values(), 11);
  ASSERT_TRUE(AppendRows(*cache, seq, 0, k, RandomValues(k.size(), 12)).ok());
  ExpectSummariesAndChecksums(*cache, seq, 0);
  // The input's own minimum of some channel differs from the decoded one.
  const PageView page = cache->Pages(seq, 0)->front();
  bool differs = false;
  for (uint32_t d = 0; d < s.head_dim; ++d) {
    float lo = k[d];
    for (uint32_t t = 0; t < 16; ++t) lo = std::min(lo, k[t * s.row_values() + d]);
    differs |= lo != page.key_min[d];
  }
  EXPECT_TRUE(differs);
}

TEST(KvCacheAppend, F16BitsGiveTheSamePagesAsTheirFloats) {
  const Shape s{1, 2, 64, 16};
  for (const char* active : {"f16", "f32"}) {
    SCOPED_TRACE(active);
    auto a = Make(Options(s, "q4_0", "q8_0", 1 << 20, active));
    auto b = Make(Options(s, "q4_0", "q8_0", 1 << 20, active));
    ASSERT_TRUE(a && b);
    const SeqId sa = *a->CreateSequence(), sb = *b->CreateSequence();
    for (uint32_t n : {5u, 20u, 30u}) {
      const auto k = RandomValues(n * s.row_values(), n), v = RandomValues(k.size(), n + 1);
      std::vector<uint16_t> kh(k.size()), vh(v.size());
      std::vector<float> kf(k.size()), vf(v.size());
      for (size_t i = 0; i < k.size(); ++i) {
        kh[i] = FloatToHalf(k[i]);
        vh[i] = FloatToHalf(v[i]);
        kf[i] = HalfToFloat(kh[i]);
        vf[i] = HalfToFloat(vh[i]);
      }
      ASSERT_TRUE(a->AppendF16(sa, 0, kh, vh).ok());
      ASSERT_TRUE(b->Append(sb, 0, kf, vf).ok());
    }
    ExpectSameContent(Images(*a, sa, 0), Images(*b, sb, 0));
    EXPECT_EQ(a->Pages(sa, 0)->size(), 4u);
  }
}

// Pages do not depend on how the tokens were split into calls.
TEST(KvCacheAppend, ChunkedAppendsGiveTheSameBytesAsOneAppend) {
  const Shape s{1, 2, 80, 16};
  const uint32_t n = 5 * 16 + 7;
  const auto k = RandomValues(n * s.row_values(), 21), v = RandomValues(k.size(), 22);
  auto whole = Make(Options(s, "q4_0", "q8_0"));
  auto chunked = Make(Options(s, "q4_0", "q8_0"));
  ASSERT_TRUE(whole && chunked);
  const SeqId a = *whole->CreateSequence(), b = *chunked->CreateSequence();
  ASSERT_TRUE(AppendRows(*whole, a, 0, k, v).ok());
  std::mt19937 rng(static_cast<uint32_t>(testing::TestSeed()));
  for (uint32_t t = 0; t < n;) {
    const uint32_t c = std::min<uint32_t>(n - t, 1 + rng() % 40);
    ASSERT_TRUE(AppendRows(*chunked, b, 0, Slice(k, s, t, c), Slice(v, s, t, c)).ok());
    t += c;
  }
  ExpectSameContent(Images(*whole, a, 0), Images(*chunked, b, 0));
  ExpectSummariesAndChecksums(*chunked, b, 0);
}

TEST(KvCacheAppend, NonFiniteOrUnstorableValuesAreRefusedAndChangeNothing) {
  const Shape s{2, 2, 64, 16};
  auto cache = Make(Options(s));
  ASSERT_NE(cache, nullptr);
  const SeqId seq = *cache->CreateSequence();
  ASSERT_TRUE(AppendRows(*cache, seq, 1, RandomValues(5 * s.row_values(), 1),
                         RandomValues(5 * s.row_values(), 2))
                  .ok());
  const Snapshot before = Take(*cache, {seq});
  const auto good = RandomValues(20 * s.row_values(), 3);
  for (float bad : {NAN, INFINITY, -INFINITY, 1e6f}) {
    auto k = good, v = good;
    // token 17, head 1, channel 3: past a page fill, so nothing before it may stay written
    (bad == INFINITY ? v : k)[17 * s.row_values() + 64 + 3] = bad;
    Status status = AppendRows(*cache, seq, 1, k, v);
    ASSERT_EQ(status.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_TRUE(ContainsText(status.message(), "sequence 0 layer 1")) << status.message();
    EXPECT_TRUE(ContainsText(status.message(), "token 17, head 1, channel 3")) << status.message();
    ExpectUnchanged(before, Take(*cache, {seq}));
  }
  std::vector<uint16_t> kh(20 * s.row_values(), FloatToHalf(1.0f)), vh = kh;
  vh[40] = 0x7e00;  // NaN
  EXPECT_EQ(cache->AppendF16(seq, 1, kh, vh).code(), StatusCode::kInvalidArgument);
  ExpectUnchanged(before, Take(*cache, {seq}));

  // 1e6 is beyond f16 but fits an f32 active page.
  auto f32 = Make(Options(s, "f32", "f32", 1 << 20, "f32"));
  ASSERT_NE(f32, nullptr);
  const SeqId s32 = *f32->CreateSequence();
  auto k = good;
  k[7] = 1e6f;
  ASSERT_TRUE(AppendRows(*f32, s32, 0, k, good).ok());
  EXPECT_EQ(DecodeLayer(*f32, s32, 0, Plane::kK)[7], 1e6f);
}

TEST(KvCacheAppend, BadShapesSequencesAndLayersAreRefused) {
  const Shape s{2, 2, 64, 16};
  auto cache = Make(Options(s));
  ASSERT_NE(cache, nullptr);
  const SeqId seq = *cache->CreateSequence();
  const auto x = RandomValues(3 * s.row_values(), 5);
  EXPECT_EQ(cache->Append(seq, 0, x, std::span(x).first(x.size() - 64)).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(cache->Append(seq, 0, std::span(x).first(100), std::span(x).first(100)).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(cache->Append(seq, 0, {}, {}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cache->Append(seq, 2, x, x).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cache->Append(seq + 1, 0, x, x).code(), StatusCode::kNotFound);
  EXPECT_EQ(cache->Length(seq + 1, 0).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(cache->Pages(seq, 5).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(*cache->Length(seq, 0), 0u);
  EXPECT_EQ(cache->stats().n_pages, 0u);
}

// ---- Fork, crop, release ---------------------------------------------------------------------

TEST(KvCacheFork, ChildSharesFullPagesCopiesTheActiveOneAndLeavesTheParentAlone) {
  const Shape s{2, 2, 64, 16};
  auto cache = Make(Options(s, "q8_0", "q8_0"));
  ASSERT_NE(cache, nullptr);
  const SeqId parent = *cache->CreateSequence();
  const uint32_t n = 2 * 16 + 3;
  std::vector<float> k[2], v[2];
  for (uint32_t l = 0; l < 2; ++l) {
    k[l] = RandomValues(n * s.row_values(), 30 + l);
    v[l] = RandomValues(n * s.row_values(), 40 + l);
    ASSERT_TRUE(AppendRows(*cache, parent, l, k[l], v[l]).ok());
  }
  const CacheStats alone = cache->stats();
  const auto parent_pages = Images(*cache, parent, 0);
  const SeqId child = *cache->Fork(parent);
  EXPECT_NE(child, parent);

  const CacheStats forked = cache->stats();
  const size_t active_bytes = 2 * 2 * TileBytes("f16", 16, 64);
  EXPECT_EQ(forked.n_sequences, 2u);
  EXPECT_EQ(forked.page_bytes, alone.page_bytes + 2 * active_bytes);  // full pages not copied
  EXPECT_EQ(forked.n_full_pages, alone.n_full_pages);
  EXPECT_EQ(forked.n_active_pages, alone.n_active_pages + 2);
  for (uint32_t l = 0; l < 2; ++l) {
    auto pp = *cache->Pages(parent, l), cp = *cache->Pages(child, l);
    ASSERT_EQ(pp.size(), 3u);
    ASSERT_EQ(cp.size(), 3u);
    for (int i = 0; i < 2; ++i) {
      EXPECT_EQ(pp[i].id, cp[i].id);
      EXPECT_EQ(PageTableOf(*cache).ref_count[pp[i].id], 2u);
    }
    EXPECT_NE(pp[2].id, cp[2].id);
    EXPECT_EQ(PageTableOf(*cache).owner[cp[2].id], child);
    EXPECT_EQ(DecodeLayer(*cache, child, l, Plane::kK), DecodeLayer(*cache, parent, l, Plane::kK));
  }
  ExpectAccounted(*cache);

  // The child's appends fill its copy of the active page; the parent sees none of it.
  const auto more_k = RandomValues(20 * s.row_values(), 50),
             more_v = RandomValues(20 * s.row_values(), 51);
  ASSERT_TRUE(AppendRows(*cache, child, 0, more_k, more_v).ok());
  EXPECT_EQ(*cache->Length(parent, 0), n);
  EXPECT_EQ(*cache->Length(child, 0), n + 20);
  ExpectSameContent(Images(*cache, parent, 0), parent_pages);
  auto codec = MakeCodec("q8_0");
  auto all_k = k[0];
  all_k.insert(all_k.end(), more_k.begin(), more_k.end());
  EXPECT_EQ(DecodeLayer(*cache, child, 0, Plane::kK), ExpectedLayer(all_k, s, *codec));
  ExpectSummariesAndChecksums(*cache, child, 0);
  ExpectAccounted(*cache);
}

// Crop then append gives the pages that appending the shorter data from scratch gives
// (bit-identical with f16 pages), for a cut inside a full page, inside the active page, at a page
// boundary, at 0 and at the full length.
TEST(KvCacheCrop, ThenAppendEqualsAppendingTheShorterData) {
  const Shape s{2, 2, 64, 16};
  const uint32_t n = 3 * 16 + 5, extra = 21;
  const auto k = RandomValues((n + extra) * s.row_values(), 60);
  const auto v = RandomValues((n + extra) * s.row_values(), 61);
  for (uint32_t cut : {24u, 50u, 32u, 0u, n}) {
    SCOPED_TRACE("crop to " + std::to_string(cut));
    auto cropped = Make(Options(s));
    auto fresh = Make(Options(s));
    ASSERT_TRUE(cropped && fresh);
    const SeqId a = *cropped->CreateSequence(), b = *fresh->CreateSequence();
    std::vector<float> tail_k = Slice(k, s, n, extra), tail_v = Slice(v, s, n, extra);
    for (uint32_t l = 0; l < 2; ++l) {
      ASSERT_TRUE(AppendRows(*cropped, a, l, Slice(k, s, 0, n), Slice(v, s, 0, n)).ok());
      if (cut > 0) {
        ASSERT_TRUE(AppendRows(*fresh, b, l, Slice(k, s, 0, cut), Slice(v, s, 0, cut)).ok());
      }
    }
    ASSERT_TRUE(cropped->Crop(a, cut).ok());
    for (uint32_t l = 0; l < 2; ++l) {
      EXPECT_EQ(*cropped->Length(a, l), cut);
      auto pages = *cropped->Pages(a, l);
      EXPECT_EQ(pages.size(), (cut + 15) / 16);  // a cut at a boundary leaves no active page
      ExpectSameContent(Images(*cropped, a, l), Images(*fresh, b, l));
      ExpectAccounted(*cropped);
      ASSERT_TRUE(AppendRows(*cropped, a, l, tail_k, tail_v).ok());
      ASSERT_TRUE(AppendRows(*fresh, b, l, tail_k, tail_v).ok());
      ExpectSameContent(Images(*cropped, a, l), Images(*fresh, b, l));
      ExpectSummariesAndChecksums(*cropped, a, l);
    }
    EXPECT_EQ(cropped->stats().page_bytes, fresh->stats().page_bytes);
    ExpectAccounted(*cropped);
  }
}

// A lossy full page cut in two becomes an f16 active page of its decoded rows.
TEST(KvCacheCrop, LossyPageCutInTwoKeepsItsDecodedRows) {
  const Shape s{1, 2, 64, 16};
  auto cache = Make(Options(s, "q4_0", "q8_0"));
  ASSERT_NE(cache, nullptr);
  const SeqId seq = *cache->CreateSequence();
  ASSERT_TRUE(AppendRows(*cache, seq, 0, RandomValues(40 * s.row_values(), 70),
                         RandomValues(40 * s.row_values(), 71))
                  .ok());
  const auto k = DecodeLayer(*cache, seq, 0, Plane::kK);
  const auto v = DecodeLayer(*cache, seq, 0, Plane::kV);
  ASSERT_TRUE(cache->Crop(seq, 21).ok());
  auto pages = *cache->Pages(seq, 0);
  ASSERT_EQ(pages.size(), 2u);
  EXPECT_EQ(PageTableOf(*cache).state[pages[1].id], PageState::kActive);
  EXPECT_EQ(pages[1].k_codec->info().name, "f16");
  // The first page is untouched; the cut one holds its decoded rows rounded to f16.
  for (auto [plane, x] : {std::pair{Plane::kK, &k}, std::pair{Plane::kV, &v}}) {
    auto want = Slice(*x, s, 0, 16);
    const auto cut = RoundF16(Slice(*x, s, 16, 5));
    want.insert(want.end(), cut.begin(), cut.end());
    EXPECT_EQ(DecodeLayer(*cache, seq, 0, plane), want);
  }
  ExpectAccounted(*cache);
}

TEST(KvCacheCrop, SharedPageCutIsCopiedNeverWritten) {
  const Shape s{1, 2, 64, 16};
  auto cache = Make(Options(s, "q8_0", "q8_0"));
  ASSERT_NE(cache, nullptr);
  const SeqId parent = *cache->CreateSequence();
  ASSERT_TRUE(AppendRows(*cache, parent, 0, RandomValues(40 * s.row_values(), 80),
                         RandomValues(40 * s.row_values(), 81))
                  .ok());
  const auto before = Images(*cache, parent, 0);
  const auto checksum = PageTableOf(*cache).checksum[before[0].id];
  const SeqId child = *cache->Fork(parent);
  ASSERT_TRUE(cache->Crop(child, 10).ok());
  ExpectSameContent(Images(*cache, parent, 0), before);
  EXPECT_EQ(PageTableOf(*cache).checksum[before[0].id], checksum);
  EXPECT_EQ(PageTableOf(*cache).ref_count[before[0].id], 1u);
  EXPECT_EQ(PageTableOf(*cache).ref_count[before[1].id], 1u);
  EXPECT_EQ(*cache->Length(child, 0), 10u);
  EXPECT_EQ(DecodeLayer(*cache, child, 0, Plane::kK),
            RoundF16(Slice(DecodeLayer(*cache, parent, 0, Plane::kK), s, 0, 10)));
  ExpectAccounted(*cache);
}

TEST(KvCacheCrop, BeyondALayersLengthIsInvalidArgumentAndChangesNothing) {
  const Shape s{2, 2, 64, 16};
  auto cache = Make(Options(s));
  ASSERT_NE(cache, nullptr);
  const SeqId seq = *cache->CreateSequence();
  ASSERT_TRUE(AppendRows(*cache, seq, 0, RandomValues(30 * s.row_values(), 1),
                         RandomValues(30 * s.row_values(), 2))
                  .ok());
  ASSERT_TRUE(AppendRows(*cache, seq, 1, RandomValues(10 * s.row_values(), 3),
                         RandomValues(10 * s.row_values(), 4))
                  .ok());
  const Snapshot before = Take(*cache, {seq});
  Status status = cache->Crop(seq, 20);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(ContainsText(status.message(), "layer 1 has only 10")) << status.message();
  ExpectUnchanged(before, Take(*cache, {seq}));
  EXPECT_EQ(cache->Crop(seq + 1, 0).code(), StatusCode::kNotFound);
}

TEST(KvCacheRelease, ParentAndChildInEitherOrderReturnEveryByte) {
  const Shape s{2, 2, 64, 16};
  for (bool parent_first : {true, false}) {
    SCOPED_TRACE(parent_first ? "parent first" : "child first");
    auto cache = Make(Options(s, "q4_0", "f16"));
    ASSERT_NE(cache, nullptr);
    const SeqId parent = *cache->CreateSequence();
    for (uint32_t l = 0; l < 2; ++l) {
      ASSERT_TRUE(AppendRows(*cache, parent, l, RandomValues(37 * s.row_values(), l),
                             RandomValues(37 * s.row_values(), l + 9))
                      .ok());
    }
    const SeqId child = *cache->Fork(parent);
    ASSERT_TRUE(AppendRows(*cache, child, 0, RandomValues(30 * s.row_values(), 5),
                           RandomValues(30 * s.row_values(), 6))
                    .ok());
    ASSERT_TRUE(cache->Release(parent_first ? parent : child).ok());
    ExpectAccounted(*cache);
    const SeqId survivor = parent_first ? child : parent;
    EXPECT_EQ(*cache->Length(survivor, 1), 37u);
    ExpectSummariesAndChecksums(*cache, survivor, 0);
    ASSERT_TRUE(cache->Release(survivor).ok());
    const CacheStats end = cache->stats();
    EXPECT_EQ(end.n_sequences, 0u);
    EXPECT_EQ(end.n_pages, 0u);
    EXPECT_EQ(end.page_bytes, 0u);
    EXPECT_EQ(end.ram.used_bytes, 0u);
    EXPECT_EQ(end.ram.reserved_bytes, 0u);
    EXPECT_TRUE(end.by_codec.empty());
    EXPECT_EQ(cache->Release(survivor).code(), StatusCode::kNotFound);
  }
}

// ---- Budgets ---------------------------------------------------------------------------------

// An append that fills the active page and two more and starts a new one needs exactly the
// bytes of its end state; one byte less and nothing changes.
TEST(KvCacheBudget, AppendAcrossSeveralFillsIsAllOrNothing) {
  const Shape s{1, 2, 64, 16};
  const size_t active = 2 * 2 * TileBytes("f16", 16, 64);  // 8192
  const size_t full = 2 * 2 * TileBytes("q4_0", 16, 64);   // 2304
  ASSERT_EQ(active, 8192u);
  ASSERT_EQ(full, 2304u);
  const auto k = RandomValues(51 * s.row_values(), 90), v = RandomValues(k.size(), 91);
  for (size_t budget : {3 * full + active - 1, 3 * full + active}) {
    auto cache = Make(Options(s, "q4_0", "q4_0", budget));
    ASSERT_NE(cache, nullptr);
    const SeqId seq = *cache->CreateSequence();
    ASSERT_TRUE(AppendRows(*cache, seq, 0, Slice(k, s, 0, 5), Slice(v, s, 0, 5)).ok());
    const Snapshot before = Take(*cache, {seq});
    Status status =
        AppendRows(*cache, seq, 0, Slice(k, s, 5, 11 + 32 + 3), Slice(v, s, 5, 11 + 32 + 3));
    if (budget < 3 * full + active) {
      ASSERT_EQ(status.code(), StatusCode::kResourceExhausted);
      EXPECT_TRUE(ContainsText(status.message(), "RAM budget of " + std::to_string(budget)))
          << status.message();
      EXPECT_TRUE(ContainsText(status.message(), "append of 46 tokens to sequence 0 layer 0"))
          << status.message();
      ExpectUnchanged(before, Take(*cache, {seq}));
    } else {
      ASSERT_TRUE(status.ok()) << status.ToString();
      EXPECT_EQ(*cache->Length(seq, 0), 51u);
      EXPECT_EQ(cache->stats().page_bytes, budget);
      auto codec = MakeCodec("q4_0");
      EXPECT_EQ(DecodeLayer(*cache, seq, 0, Plane::kK),
                ExpectedLayer(Slice(k, s, 0, 51), s, *codec));
    }
    ExpectAccounted(*cache);
  }
}

// RequiredRamBytes is the smallest budget that lets a sequence grow token by token to n tokens
// in every layer: with it the growth succeeds, with one byte less some append is refused.
// Covered: ragged and page-boundary lengths, a codec smaller than the active page (q4_0) and
// one equal to it (f16).
TEST(KvCacheBudget, RequiredRamBytesIsTheSmallestBudgetForGrowth) {
  const Shape s{2, 2, 64, 16};
  const size_t active = 2 * 2 * TileBytes("f16", 16, 64), full = 2 * 2 * TileBytes("q4_0", 16, 64);
  const auto k = RandomValues(48 * s.row_values(), 92), v = RandomValues(k.size(), 93);
  struct Case {
    std::string codec;
    uint32_t n_tokens;
    size_t expected_per_layer;
  };
  for (const Case& c : {Case{"q4_0", 37, 2 * full + active}, Case{"q4_0", 48, 2 * full + active},
                        Case{"f16", 48, 3 * active}, Case{"f16", 5, active}}) {
    SCOPED_TRACE(c.codec + ", " + std::to_string(c.n_tokens) + " tokens");
    auto required = KvCache::RequiredRamBytes(Options(s, c.codec, c.codec), c.n_tokens);
    ASSERT_TRUE(required.ok()) << required.status().ToString();
    EXPECT_EQ(*required, s.n_layers * c.expected_per_layer);
    for (size_t budget : {*required - 1, *required}) {
      auto cache = Make(Options(s, c.codec, c.codec, budget));
      ASSERT_NE(cache, nullptr);
      const SeqId seq = *cache->CreateSequence();
      Status status = Status::Ok();
      for (uint32_t t = 0; t < c.n_tokens && status.ok(); ++t)
        for (uint32_t layer = 0; layer < s.n_layers && status.ok(); ++layer)
          status = AppendRows(*cache, seq, layer, Slice(k, s, t, 1), Slice(v, s, t, 1));
      if (budget < *required) {
        EXPECT_EQ(status.code(), StatusCode::kResourceExhausted) << status.ToString();
      } else {
        EXPECT_TRUE(status.ok()) << status.ToString();
      }
      ExpectAccounted(*cache);
    }
  }
  EXPECT_EQ(KvCache::RequiredRamBytes(Options(s, "nope", "f16"), 10).status().code(),
            StatusCode::kInvalidArgument);
}

// The placement engine asks before it appends: AppendFitsRam is false exactly when the append is
// refused for the RAM budget. Covered: appends inside a page, filling one and spanning several,
// with a codec smaller than the active page (q4_0) and one equal to it (f16).
TEST(KvCacheBudget, AppendFitsRamIsFalseExactlyWhenTheAppendIsRefused) {
  const Shape s{1, 2, 64, 16};
  const size_t active = 2 * 2 * TileBytes("f16", 16, 64);
  const auto k = RandomValues(64 * s.row_values(), 94), v = RandomValues(k.size(), 95);
  size_t n_refused = 0, n_appended = 0;
  for (const std::string codec : {"q4_0", "f16"}) {
    for (size_t budget : {active - 1, active, 2 * active + 100, 3 * active, 5 * active}) {
      auto cache = Make(Options(s, codec, codec, budget));
      ASSERT_NE(cache, nullptr);
      const SeqId seq = *cache->CreateSequence();
      uint32_t length = 0;
      for (uint32_t n : {1u, 3u, 12u, 16u, 20u, 1u, 7u}) {
        SCOPED_TRACE(codec + ", budget " + std::to_string(budget) + ", " + std::to_string(n) +
                     " tokens after " + std::to_string(length));
        const Result<bool> fits = AppendFitsRam(*cache, seq, 0, n);
        ASSERT_TRUE(fits.ok()) << fits.status().ToString();
        const Status status =
            AppendRows(*cache, seq, 0, Slice(k, s, length, n), Slice(v, s, length, n));
        EXPECT_EQ(*fits, status.ok()) << status.ToString();
        if (!status.ok()) {
          EXPECT_EQ(status.code(), StatusCode::kResourceExhausted) << status.ToString();
          ++n_refused;
          continue;
        }
        length += n;
        ++n_appended;
      }
    }
    EXPECT_EQ(AppendFitsRam(*Make(Options(s, codec, codec)), 7, 0, 1).status().code(),
              StatusCode::kNotFound);
  }
  EXPECT_GT(n_refused, 0u);
  EXPECT_GT(n_appended, 0u);
}

TEST(KvCacheBudget, ForkOverBudgetChangesNothing) {
  const Shape s{2, 2, 64, 16};
  const size_t page = 2 * 2 * TileBytes("f16", 16, 64);
  for (size_t budget : {5 * page, 6 * page}) {
    auto cache = Make(Options(s, "f16", "f16", budget));
    ASSERT_NE(cache, nullptr);
    const SeqId parent = *cache->CreateSequence();
    for (uint32_t l = 0; l < 2; ++l) {
      ASSERT_TRUE(AppendRows(*cache, parent, l, RandomValues(19 * s.row_values(), l),
                             RandomValues(19 * s.row_values(), l + 2))
                      .ok());
    }
    const Snapshot before = Take(*cache, {parent});
    auto child = cache->Fork(parent);  // needs a copy of both active pages
    if (budget == 5 * page) {
      ASSERT_EQ(child.status().code(), StatusCode::kResourceExhausted);
      EXPECT_TRUE(ContainsText(child.status().message(), "fork of sequence 0"));
      ExpectUnchanged(before, Take(*cache, {parent}));
    } else {
      ASSERT_TRUE(child.ok()) << child.status().ToString();
      EXPECT_EQ(cache->stats().page_bytes, 6 * page);
    }
    ExpectAccounted(*cache);
  }
}

// Cutting a q4_0 page needs an f16 active page; the cut page's own bytes count as freed unless
// another sequence shares it.
TEST(KvCacheBudget, CropOverBudgetChangesNothing) {
  const Shape s{1, 2, 64, 16};
  const size_t active = 2 * 2 * TileBytes("f16", 16, 64);
  const size_t full = 2 * 2 * TileBytes("q4_0", 16, 64);
  for (size_t budget : {full + active - 1, full + active}) {
    auto cache = Make(Options(s, "q4_0", "q4_0", budget));
    ASSERT_NE(cache, nullptr);
    const SeqId seq = *cache->CreateSequence();
    ASSERT_TRUE(AppendRows(*cache, seq, 0, RandomValues(32 * s.row_values(), 1),
                           RandomValues(32 * s.row_values(), 2))
                    .ok());
    const Snapshot before = Take(*cache, {seq});
    Status status = cache->Crop(seq, 24);
    if (budget < full + active) {
      ASSERT_EQ(status.code(), StatusCode::kResourceExhausted);
      EXPECT_TRUE(ContainsText(status.message(), "crop of sequence 0 to 24 tokens"));
      ExpectUnchanged(before, Take(*cache, {seq}));
    } else {
      ASSERT_TRUE(status.ok()) << status.ToString();
      EXPECT_EQ(cache->stats().page_bytes, full + active);
    }
    ExpectAccounted(*cache);
  }
  // Shared: the child's cut frees nothing, so it needs a whole active page more.
  auto cache = Make(Options(s, "q4_0", "q4_0", 2 * full + active - 1));
  ASSERT_NE(cache, nullptr);
  const SeqId parent = *cache->CreateSequence();
  ASSERT_TRUE(AppendRows(*cache, parent, 0, RandomValues(32 * s.row_values(), 1),
                         RandomValues(32 * s.row_values(), 2))
                  .ok());
  const SeqId child = *cache->Fork(parent);
  const Snapshot before = Take(*cache, {parent, child});
  EXPECT_EQ(cache->Crop(child, 24).code(), StatusCode::kResourceExhausted);
  ExpectUnchanged(before, Take(*cache, {parent, child}));
  EXPECT_TRUE(cache->Crop(child, 16).ok());  // a boundary: only frees
  ExpectAccounted(*cache);
}

TEST(KvCacheBudget, ReencodeOverBudgetChangesNothing) {
  const Shape s{1, 2, 64, 16};
  const size_t f16 = 2 * 2 * TileBytes("f16", 16, 64);
  for (size_t budget : {2 * f16 - 1, 2 * f16}) {
    auto cache = Make(Options(s, "f16", "f16", budget));
    ASSERT_NE(cache, nullptr);
    const SeqId seq = *cache->CreateSequence();
    ASSERT_TRUE(AppendRows(*cache, seq, 0, RandomValues(16 * s.row_values(), 1),
                           RandomValues(16 * s.row_values(), 2))
                    .ok());
    const PageId page = cache->Pages(seq, 0)->front().id;
    const Snapshot before = Take(*cache, {seq});
    Status status = cache->Reencode(page, "f32", "f32");  // replaces f16 bytes by 2x as many
    if (budget < 2 * f16) {
      ASSERT_EQ(status.code(), StatusCode::kResourceExhausted);
      EXPECT_TRUE(ContainsText(status.message(), "re-encoding page " + std::to_string(page)));
      ExpectUnchanged(before, Take(*cache, {seq}));
      ExpectSummariesAndChecksums(*cache, seq, 0);
    } else {
      ASSERT_TRUE(status.ok()) << status.ToString();
      EXPECT_EQ(cache->stats().page_bytes, 2 * f16);
    }
    ExpectAccounted(*cache);
  }
}

// ---- Reencode --------------------------------------------------------------------------------

TEST(KvCacheReencode, F16ToQ4ToF16MovesBytesBetweenCodecsByTheEncodedSizes) {
  const Shape s{1, 2, 64, 16};
  const uint32_t H = 2;
  const size_t f16_tile = TileBytes("f16", 16, 64), q4_tile = TileBytes("q4_0", 16, 64);
  auto cache = Make(Options(s));
  ASSERT_NE(cache, nullptr);
  const SeqId seq = *cache->CreateSequence();
  const auto k = RandomValues(35 * s.row_values(), 100), v = RandomValues(k.size(), 101);
  ASSERT_TRUE(AppendRows(*cache, seq, 0, k, v).ok());
  auto by_codec = [&](const std::string& name) {
    for (const CodecBytes& c : cache->stats().by_codec) {
      if (c.codec == name) return c;
    }
    return CodecBytes{name};
  };
  const CodecBytes f16_before = by_codec("f16");
  EXPECT_EQ(f16_before.k_bytes, 3 * H * f16_tile);  // two full pages and the active one
  EXPECT_EQ(f16_before.n_k_pages, 3u);

  const PageId page = cache->Pages(seq, 0)->front().id;
  ASSERT_TRUE(cache->Reencode(page, "q4_0", "q4_0").ok());
  const CodecBytes f16_mid = by_codec("f16"), q4 = by_codec("q4_0");
  EXPECT_EQ(f16_mid.k_bytes, f16_before.k_bytes - H * f16_tile);
  EXPECT_EQ(f16_mid.v_bytes, f16_before.v_bytes - H * f16_tile);
  EXPECT_EQ(q4.k_bytes, H * q4_tile);
  EXPECT_EQ(q4.v_bytes, H * q4_tile);
  EXPECT_EQ(q4.n_k_pages, 1u);
  EXPECT_EQ(q4.n_v_pages, 1u);
  ExpectAccounted(*cache);
  ExpectSummariesAndChecksums(*cache, seq, 0);
  auto codec = MakeCodec("q4_0");
  const auto page0_k = Slice(k, s, 0, 16);
  const auto q4_k = Slice(DecodeLayer(*cache, seq, 0, Plane::kK), s, 0, 16);
  EXPECT_EQ(q4_k, ExpectedLayer(page0_k, Shape{1, 2, 64, 16}, *codec));
  EXPECT_LT(RelRmse(q4_k, page0_k), 0.25);  // q4_0 on rows with outliers, as in codec_ggml_test

  ASSERT_TRUE(cache->Reencode(page, "f16", "f16").ok());
  const CodecBytes f16_after = by_codec("f16");
  EXPECT_EQ(f16_after.k_bytes, f16_before.k_bytes);
  EXPECT_EQ(f16_after.v_bytes, f16_before.v_bytes);
  EXPECT_EQ(by_codec("q4_0").n_k_pages, 0u);  // gone from the stats
  // Decoded first, so the page stays as lossy as it was.
  EXPECT_EQ(Slice(DecodeLayer(*cache, seq, 0, Plane::kK), s, 0, 16), RoundF16(q4_k));
  ExpectSummariesAndChecksums(*cache, seq, 0);
  ExpectAccounted(*cache);
}

TEST(KvCacheReencode, ActivePageOrUnusableCodecIsRefusedAndChangesNothing) {
  const Shape s{1, 2, 64, 16};
  auto cache = Make(Options(s));
  ASSERT_NE(cache, nullptr);
  const SeqId seq = *cache->CreateSequence();
  ASSERT_TRUE(AppendRows(*cache, seq, 0, RandomValues(20 * s.row_values(), 1),
                         RandomValues(20 * s.row_values(), 2))
                  .ok());
  auto pages = *cache->Pages(seq, 0);
  const Snapshot before = Take(*cache, {seq});
  EXPECT_EQ(cache->Reencode(pages[1].id, "q4_0", "q4_0").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cache->Reencode(999, "q4_0", "q4_0").code(), StatusCode::kInvalidArgument);
  Status keys_only = cache->Reencode(pages[0].id, "q4_0", "int1");
  EXPECT_EQ(keys_only.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(ContainsText(keys_only.message(), "keys-only")) << keys_only.message();
  EXPECT_EQ(cache->Reencode(pages[0].id, "nope", "f16").code(), StatusCode::kInvalidArgument);
  ExpectUnchanged(before, Take(*cache, {seq}));
}

// ---- Attention records -----------------------------------------------------------------------

TEST(KvCacheRecordAttention, SetsMassAndTicksTheClockOncePerCall) {
  const Shape s{1, 2, 64, 16};
  auto cache = Make(Options(s));
  ASSERT_NE(cache, nullptr);
  const SeqId seq = *cache->CreateSequence();
  ASSERT_TRUE(AppendRows(*cache, seq, 0, RandomValues(40 * s.row_values(), 1),
                         RandomValues(40 * s.row_values(), 2))
                  .ok());
  auto pages = *cache->Pages(seq, 0);
  const PageId ids[] = {pages[0].id, pages[2].id};
  const float mass[] = {0.25f, 0.75f};
  RecordAttention(*cache, ids, mass);
  const PageTable& t = PageTableOf(*cache);
  EXPECT_EQ(t.mass[pages[0].id], 0.25f);
  EXPECT_EQ(t.mass[pages[2].id], 0.75f);
  EXPECT_EQ(t.last_use[pages[0].id], 1u);
  EXPECT_EQ(t.last_use[pages[1].id], 0u);
  const PageId one[] = {pages[1].id};
  const float m1[] = {1.0f};
  RecordAttention(*cache, one, m1);
  EXPECT_EQ(t.last_use[pages[1].id], 2u);
  EXPECT_EQ(t.last_use[pages[2].id], 1u);
  // A released page's row is reused with its mass and clock cleared.
  ASSERT_TRUE(cache->Release(seq).ok());
  const SeqId again = *cache->CreateSequence();
  ASSERT_TRUE(AppendRows(*cache, again, 0, RandomValues(16 * s.row_values(), 3),
                         RandomValues(16 * s.row_values(), 4))
                  .ok());
  const PageId reused = cache->Pages(again, 0)->front().id;
  EXPECT_LT(reused, t.size());
  EXPECT_EQ(t.size(), 3u);
  EXPECT_EQ(t.mass[reused], 0.0f);
  EXPECT_EQ(t.last_use[reused], 0u);
}

// ---- Randomised ------------------------------------------------------------------------------

// Random appends, forks, crops, releases and lossless re-encodes under a tight budget: after
// every operation the page bytes equal the RAM tier's bytes in use, reference counts equal the
// sequences holding each page, a refused operation changes nothing, and every sequence decodes
// to exactly what was appended to it.
TEST(KvCacheRandomised, AccountingAndContentsHoldThroughRandomOperations) {
  std::mt19937_64 rng(testing::TestSeed());
  const Shape s{2, 2, 32, 8};
  const size_t page_bytes = 2 * 2 * TileBytes("f16", 8, 32);
  auto cache = Make(Options(s, "f16", "f16", 24 * page_bytes));
  ASSERT_NE(cache, nullptr);
  struct Shadow {
    std::vector<float> k[2], v[2];
  };
  std::map<SeqId, Shadow> shadow;
  auto pick = [&]() {
    auto it = shadow.begin();
    std::advance(it, rng() % shadow.size());
    return it->first;
  };
  const char* codecs[] = {"f16", "f32"};
  int n_refused = 0;
  for (int step = 0; step < 400; ++step) {
    const int op = shadow.empty() ? 0 : static_cast<int>(rng() % 8);
    SCOPED_TRACE("step " + std::to_string(step) + " op " + std::to_string(op));
    const CacheStats before = cache->stats();
    Status status;
    if (op == 0 || (op == 1 && shadow.size() < 4)) {
      auto seq = cache->CreateSequence();
      ASSERT_TRUE(seq.ok());
      shadow.emplace(*seq, Shadow{});
    } else if (op <= 3) {
      const SeqId seq = pick();
      const uint32_t layer = rng() % 2, n = 1 + rng() % 19;
      const auto k = RandomValues(n * s.row_values(), step * 2);
      const auto v = RandomValues(n * s.row_values(), step * 2 + 1);
      status = AppendRows(*cache, seq, layer, k, v);
      if (status.ok()) {
        const auto rk = RoundF16(k), rv = RoundF16(v);
        shadow[seq].k[layer].insert(shadow[seq].k[layer].end(), rk.begin(), rk.end());
        shadow[seq].v[layer].insert(shadow[seq].v[layer].end(), rv.begin(), rv.end());
      }
    } else if (op == 4) {
      const SeqId seq = pick();
      auto child = cache->Fork(seq);
      status = child.status();
      if (child.ok()) shadow[*child] = shadow[seq];
    } else if (op == 5) {
      const SeqId seq = pick();
      const size_t shortest =
          std::min(shadow[seq].k[0].size(), shadow[seq].k[1].size()) / s.row_values();
      const uint32_t n = static_cast<uint32_t>(rng() % (shortest + 1));
      status = cache->Crop(seq, n);
      if (status.ok()) {
        for (int l = 0; l < 2; ++l) {
          shadow[seq].k[l].resize(n * s.row_values());
          shadow[seq].v[l].resize(n * s.row_values());
        }
      }
    } else if (op == 6) {
      const SeqId seq = pick();
      ASSERT_TRUE(cache->Release(seq).ok());
      shadow.erase(seq);
    } else {
      std::vector<PageId> full;
      for (PageId p = 0; p < PageTableOf(*cache).size(); ++p) {
        if (PageTableOf(*cache).state[p] == PageState::kFull) full.push_back(p);
      }
      if (!full.empty()) {
        status = cache->Reencode(full[rng() % full.size()], codecs[rng() % 2], codecs[rng() % 2]);
      }
    }
    if (!status.ok()) {
      ASSERT_EQ(status.code(), StatusCode::kResourceExhausted) << status.ToString();
      ExpectSameStats(before, cache->stats());
      ++n_refused;
    }

    ExpectAccounted(*cache);
    std::map<PageId, uint32_t> refs;
    for (const auto& [seq, sh] : shadow) {
      for (uint32_t l = 0; l < 2; ++l) {
        ASSERT_EQ(*cache->Length(seq, l), sh.k[l].size() / s.row_values());
        ASSERT_EQ(DecodeLayer(*cache, seq, l, Plane::kK), sh.k[l]) << "seq " << seq;
        ASSERT_EQ(DecodeLayer(*cache, seq, l, Plane::kV), sh.v[l]) << "seq " << seq;
        uint32_t next = 0;
        const std::vector<PageView> pages = *cache->Pages(seq, l);
        for (const PageView& page : pages) {
          ASSERT_EQ(page.first_token, next);
          next += page.n_tokens;
          ++refs[page.id];
        }
      }
    }
    const CacheStats now = cache->stats();
    ASSERT_EQ(now.n_pages, refs.size());
    ASSERT_EQ(now.n_sequences, shadow.size());
    for (const auto& [page, n] : refs) ASSERT_EQ(PageTableOf(*cache).ref_count[page], n);
  }
  EXPECT_GT(n_refused, 0) << "the budget never bound: the test did not cover refusals";
  for (const auto& entry : shadow) ASSERT_TRUE(cache->Release(entry.first).ok());
  const CacheStats end = cache->stats();
  EXPECT_EQ(end.page_bytes, 0u);
  EXPECT_EQ(end.ram.used_bytes, 0u);
  EXPECT_EQ(end.ram.reserved_bytes, 0u);
}

}  // namespace
}  // namespace argus

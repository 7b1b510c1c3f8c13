// Synthetic traces (determinism, the file format and its damage, where the attention really
// falls) and the offline optimum against an exhaustive search.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "argus/core.h"
#include "argus/eval.h"
#include "argus/policy.h"
#include "core/files.h"
#include "test_util.h"

namespace argus {
namespace {

using testing::ContainsText;

// Small enough to generate in milliseconds; head_dim 64 keeps the background scores (about
// focus / sqrt(head_dim) wide) well below a target's.
TraceOptions SmallOptions(TraceKind kind) {
  TraceOptions o;
  o.kind = kind;
  o.geometry = {2, 4, 2, 64};
  o.n_prefix_tokens = 512;
  o.n_steps = 16;
  o.recent_tokens = 32;
  o.seed = 7;
  return o;
}

Trace Generate(const TraceOptions& o) {
  auto trace = GenerateTrace(o);
  EXPECT_TRUE(trace.ok()) << trace.status().ToString();
  return trace.ok() ? std::move(trace).value() : Trace{};
}

// Exact attention weights in double of query head h at step s over positions 0 .. pos.
std::vector<double> Weights(const Trace& trace, uint32_t step, uint32_t layer, uint32_t h) {
  const CacheGeometry& g = trace.options.geometry;
  const uint32_t d = g.head_dim, kv_head = h / g.gqa();
  const uint32_t n_keys = trace.options.n_prefix_tokens + step + 1;
  const std::span<const float> q = trace.Q(step, layer).subspan(size_t{h} * d, d);
  const std::span<const uint16_t> k = trace.K(layer, 0, n_keys);
  std::vector<double> w(n_keys);
  for (uint32_t j = 0; j < n_keys; ++j) {
    double dot = 0;
    for (uint32_t c = 0; c < d; ++c) {
      dot += double{q[c]} * HalfToFloat(k[(size_t{j} * g.n_kv_heads + kv_head) * d + c]);
    }
    w[j] = dot / std::sqrt(static_cast<double>(d));
  }
  const double top = *std::max_element(w.begin(), w.end());
  double sum = 0;
  for (double& x : w) sum += (x = std::exp(x - top));
  for (double& x : w) x /= sum;
  return w;
}

std::vector<std::byte> ReadAll(const std::string& path) {
  auto bytes = ReadFileBytes(path);
  EXPECT_TRUE(bytes.ok()) << bytes.status().ToString();
  return bytes.ok() ? *bytes : std::vector<std::byte>{};
}

void ExpectCorruptionNaming(const std::string& path, const std::string& what) {
  auto read = ReadTrace(path);
  ASSERT_FALSE(read.ok()) << what;
  EXPECT_EQ(read.status().code(), StatusCode::kCorruption)
      << what << ": " << read.status().ToString();
  EXPECT_TRUE(ContainsText(read.status().message(), path)) << what << ": " << read.status().ToString();
}

TEST(Trace, SameSeedGivesSameBytesOtherSeedOthers) {
  for (TraceKind kind : {TraceKind::kRecency, TraceKind::kRecall, TraceKind::kNeedle}) {
    const TraceOptions o = SmallOptions(kind);
    const Trace a = Generate(o), b = Generate(o);
    EXPECT_EQ(a.k, b.k);
    EXPECT_EQ(a.v, b.v);
    EXPECT_EQ(a.q, b.q);
    EXPECT_EQ(a.target, b.target);
    TraceOptions other = o;
    other.seed = o.seed + 1;
    const Trace c = Generate(other);
    EXPECT_NE(a.k, c.k);
    EXPECT_NE(a.v, c.v);
    EXPECT_NE(a.q, c.q);
  }
}

TEST(Trace, LayoutAndScheduleFollowTheOptions) {
  const TraceOptions o = SmallOptions(TraceKind::kRecall);
  const Trace t = Generate(o);
  const CacheGeometry& g = o.geometry;
  const size_t row = size_t{g.n_kv_heads} * g.head_dim;
  ASSERT_EQ(t.k.size(), size_t{g.n_layers} * t.n_tokens() * row);
  ASSERT_EQ(t.q.size(), size_t{o.n_steps} * g.n_layers * g.n_q_heads * g.head_dim);
  const auto k = t.K(1, 100, 3);
  ASSERT_EQ(k.size(), 3 * row);
  EXPECT_EQ(k.data(), t.k.data() + (size_t{t.n_tokens()} + 100) * row);
  EXPECT_EQ(t.V(1, 100, 3).data(), t.v.data() + (size_t{t.n_tokens()} + 100) * row);
  EXPECT_EQ(t.Q(3, 1).data(), t.q.data() + (3 * 2 + 1) * size_t{g.n_q_heads} * g.head_dim);

  // 4 targets spread over [n_sinks, n_prefix - recent) = [4, 480): 476 tokens, at the middles
  // of 4 equal parts; recalled in turn at steps 0, 8 (recall_period 8).
  std::vector<int64_t> expected(16, -1);
  expected[0] = 4 + 476 / 8;
  expected[8] = 4 + 3 * 476 / 8;
  EXPECT_EQ(t.target, expected);

  TraceOptions needle = SmallOptions(TraceKind::kNeedle);
  needle.needle_depth = 0.25;
  const Trace n = Generate(needle);
  std::vector<int64_t> seeks(16, -1);
  seeks[7] = seeks[15] = 128;  // round(0.25 * 511); from step needle_period - 1, every 8
  EXPECT_EQ(n.target, seeks);
  EXPECT_EQ(Generate(SmallOptions(TraceKind::kRecency)).target, std::vector<int64_t>(16, -1));
}

TEST(Trace, InvalidOptionsAreInvalidArgument) {
  auto expect_invalid = [](const TraceOptions& o, const std::string& what) {
    auto t = GenerateTrace(o);
    ASSERT_FALSE(t.ok()) << what;
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument) << what;
    EXPECT_TRUE(ContainsText(t.status().message(), what)) << t.status().ToString();
  };
  TraceOptions o = SmallOptions(TraceKind::kNeedle);
  o.n_steps = 0;
  expect_invalid(o, "n_steps");
  o = SmallOptions(TraceKind::kNeedle);
  o.n_prefix_tokens = 0;
  expect_invalid(o, "n_prefix_tokens");
  for (double depth : {-0.1, 1.5, std::numeric_limits<double>::quiet_NaN()}) {
    o = SmallOptions(TraceKind::kNeedle);
    o.needle_depth = depth;
    expect_invalid(o, "needle_depth");
  }
  for (float focus : {0.0f, -1.0f, std::numeric_limits<float>::infinity()}) {
    o = SmallOptions(TraceKind::kRecall);
    o.focus = focus;
    expect_invalid(o, "focus");
  }
  o = SmallOptions(TraceKind::kRecall);
  o.geometry.n_kv_heads = 3;  // does not divide 4 query heads
  expect_invalid(o, "geometry");
  o = SmallOptions(TraceKind::kRecall);
  o.n_recall_targets = 512 - 4 - 32 + 1;  // one more than the positions between
  expect_invalid(o, "do not fit");
  o = SmallOptions(TraceKind::kRecall);
  o.n_recall_targets = 512 - 4 - 32;  // exactly fits
  EXPECT_TRUE(GenerateTrace(o).ok());
  o = SmallOptions(TraceKind::kRecall);
  o.recall_period = 0;
  expect_invalid(o, "recall_period");
  o = SmallOptions(TraceKind::kNeedle);
  o.needle_period = 0;
  expect_invalid(o, "needle_period");
  o = SmallOptions(TraceKind::kRecency);
  o.geometry = {32, 32, 8, 128};
  o.n_prefix_tokens = 1u << 20;  // 32 GiB of K/V
  expect_invalid(o, "8 GiB");
}

TEST(Trace, WriteReadRoundTripsFieldByField) {
  testing::TempDir dir;
  TraceOptions o = SmallOptions(TraceKind::kNeedle);
  o.needle_depth = 0.3;
  o.focus = 10.5f;
  o.n_sinks = 2;
  o.needle_period = 5;
  const Trace t = Generate(o);
  const std::string path = dir / "needle.trace";
  ASSERT_TRUE(WriteTrace(t, path).ok());
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  auto r = ReadTrace(path);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const TraceOptions& ro = r->options;
  EXPECT_EQ(ro.kind, o.kind);
  EXPECT_EQ(ro.geometry.n_layers, o.geometry.n_layers);
  EXPECT_EQ(ro.geometry.n_q_heads, o.geometry.n_q_heads);
  EXPECT_EQ(ro.geometry.n_kv_heads, o.geometry.n_kv_heads);
  EXPECT_EQ(ro.geometry.head_dim, o.geometry.head_dim);
  EXPECT_EQ(ro.n_prefix_tokens, o.n_prefix_tokens);
  EXPECT_EQ(ro.n_steps, o.n_steps);
  EXPECT_EQ(ro.seed, o.seed);
  EXPECT_EQ(ro.n_sinks, o.n_sinks);
  EXPECT_EQ(ro.recent_tokens, o.recent_tokens);
  EXPECT_EQ(ro.n_recall_targets, o.n_recall_targets);
  EXPECT_EQ(ro.recall_period, o.recall_period);
  EXPECT_EQ(ro.needle_depth, o.needle_depth);
  EXPECT_EQ(ro.needle_period, o.needle_period);
  EXPECT_EQ(ro.focus, o.focus);
  EXPECT_EQ(r->k, t.k);
  EXPECT_EQ(r->v, t.v);
  ASSERT_EQ(r->q.size(), t.q.size());
  EXPECT_EQ(std::memcmp(r->q.data(), t.q.data(), t.q.size() * sizeof(float)), 0);
  EXPECT_EQ(r->target, t.target);
  // The file is the header, the arrays and the checksum, nothing more.
  EXPECT_EQ(std::filesystem::file_size(path),
            112 + 2 * t.k.size() * 2 + t.q.size() * 4 + t.target.size() * 8 + 8);
}

TEST(Trace, DamagedFilesAreCorruptionNamingThePath) {
  testing::TempDir dir;
  const Trace t = Generate(SmallOptions(TraceKind::kRecall));
  const std::string good = dir / "good.trace", bad = dir / "bad.trace";
  ASSERT_TRUE(WriteTrace(t, good).ok());
  const std::vector<std::byte> bytes = ReadAll(good);
  ASSERT_GT(bytes.size(), 1000u);
  auto write_bad = [&](std::span<const std::byte> b) { ASSERT_TRUE(WriteFileBytes(bad, b).ok()); };

  // One flipped byte anywhere: the magic, the version, an option, a count, each array, the
  // checksum itself.
  const size_t k_at = 112, v_at = k_at + t.k.size() * 2, q_at = v_at + t.v.size() * 2;
  for (size_t at : {size_t{0}, size_t{8}, size_t{40}, size_t{64}, size_t{80}, k_at + 7, v_at + 3,
                    q_at + 1000, bytes.size() - 20, bytes.size() - 1}) {
    std::vector<std::byte> flipped = bytes;
    flipped[at] ^= std::byte{0x10};
    write_bad(flipped);
    ExpectCorruptionNaming(bad, "byte " + std::to_string(at) + " flipped");
  }
  // Truncated at several offsets, and one byte too many.
  for (size_t n : {size_t{0}, size_t{5}, size_t{8}, size_t{60}, size_t{111}, size_t{112}, q_at,
                   bytes.size() - 8, bytes.size() - 1}) {
    write_bad(std::span(bytes).first(n));
    ExpectCorruptionNaming(bad, "truncated at " + std::to_string(n));
  }
  std::vector<std::byte> longer = bytes;
  longer.push_back(std::byte{0});
  write_bad(longer);
  ExpectCorruptionNaming(bad, "a trailing byte");

  std::vector<std::byte> magic = bytes;
  magic[3] = std::byte{'X'};
  write_bad(magic);
  auto r = ReadTrace(bad);
  EXPECT_TRUE(ContainsText(r.status().message(), "bad magic")) << r.status().ToString();
  std::vector<std::byte> version = bytes;
  version[8] = std::byte{2};
  write_bad(version);
  r = ReadTrace(bad);
  EXPECT_TRUE(ContainsText(r.status().message(), "version")) << r.status().ToString();

  EXPECT_EQ(ReadTrace(dir / "missing.trace").status().code(), StatusCode::kNotFound);
}

// For every target step, layer and query head, the key with the largest exact attention weight
// is the target, and the target holds a real share of the mass.
void ExpectPeaksAtTargets(const Trace& t) {
  size_t n_checked = 0;
  double min_mass = 1;
  for (uint32_t s = 0; s < t.options.n_steps; ++s) {
    if (t.target[s] < 0) continue;
    for (uint32_t layer = 0; layer < t.options.geometry.n_layers; ++layer) {
      for (uint32_t h = 0; h < t.options.geometry.n_q_heads; ++h) {
        const std::vector<double> w = Weights(t, s, layer, h);
        const auto top = std::max_element(w.begin(), w.end()) - w.begin();
        EXPECT_EQ(top, t.target[s]) << "step " << s << " layer " << layer << " head " << h;
        min_mass = std::min(min_mass, w[t.target[s]]);
        ++n_checked;
      }
    }
  }
  EXPECT_GT(n_checked, 0u);
  EXPECT_GT(min_mass, 0.3);
}

TEST(Trace, NeedleAndRecallStepsAttendMostToTheTarget) {
  ExpectPeaksAtTargets(Generate(SmallOptions(TraceKind::kNeedle)));
  ExpectPeaksAtTargets(Generate(SmallOptions(TraceKind::kRecall)));
}

TEST(Trace, WithoutSinkAndRecentAimsTheTargetStillPeaks) {
  TraceOptions o = SmallOptions(TraceKind::kRecall);
  o.n_sinks = 0;
  o.recent_tokens = 0;
  ExpectPeaksAtTargets(Generate(o));
}

TEST(Trace, RecencyMassFallsOnSinksAndTheRecentWindow) {
  const TraceOptions o = SmallOptions(TraceKind::kRecency);
  const Trace t = Generate(o);
  for (uint32_t s = 0; s < o.n_steps; ++s) {
    const uint32_t pos = o.n_prefix_tokens + s;
    for (uint32_t layer = 0; layer < o.geometry.n_layers; ++layer) {
      for (uint32_t h = 0; h < o.geometry.n_q_heads; ++h) {
        const std::vector<double> w = Weights(t, s, layer, h);
        double mass = 0;
        for (uint32_t j = 0; j <= pos; ++j) {
          if (j < o.n_sinks || pos - j < o.recent_tokens) mass += w[j];
        }
        EXPECT_GT(mass, 0.5) << "step " << s << " layer " << layer << " head " << h;
      }
    }
  }
}

// ---- OptimalMisses --------------------------------------------------------------------------

// The optimum by exhaustive search over what the tier keeps after each step (pages 0..7). A
// step whose pages fit must hold them all at once, beside some of the pages it already held; a
// step that cannot keeps any `capacity` of the pages it held or read.
uint64_t BruteForceMisses(const std::vector<std::vector<uint32_t>>& needed, size_t capacity,
                          uint32_t initial_mask) {
  std::map<std::pair<size_t, uint32_t>, uint64_t> memo;
  auto best = [&](auto& self, size_t t, uint32_t resident) -> uint64_t {
    if (t == needed.size()) return 0;
    if (auto it = memo.find({t, resident}); it != memo.end()) return it->second;
    uint32_t need = 0;
    for (uint32_t p : needed[t]) need |= 1u << p;
    const uint64_t misses = std::popcount(need & ~resident);
    const bool fits = static_cast<size_t>(std::popcount(need)) <= capacity;
    const uint32_t pool = resident | need;
    uint64_t rest = std::numeric_limits<uint64_t>::max();
    for (uint32_t keep = 0; keep < 256; ++keep) {
      if ((keep & ~pool) != 0 || static_cast<size_t>(std::popcount(keep)) > capacity) continue;
      if (fits && (keep & need) != need) continue;
      rest = std::min(rest, self(self, t + 1, keep));
    }
    return memo[{t, resident}] = misses + rest;
  };
  return best(best, 0, initial_mask);
}

TEST(Trace, OptimalMissesMatchesExhaustiveSearch) {
  std::mt19937_64 rng(testing::TestSeed());
  for (int instance = 0; instance < 300; ++instance) {
    const size_t capacity = 1 + rng() % 3;  // 1..3, with steps of 1..3 pages: some exceed it
    std::vector<std::vector<uint32_t>> needed(4 + rng() % 8);
    for (auto& step : needed) {
      const size_t n = 1 + rng() % 3;
      for (size_t i = 0; i < n; ++i) step.push_back(static_cast<uint32_t>(rng() % 6));
    }
    std::vector<uint32_t> initial;
    uint32_t initial_mask = 0;
    for (size_t i = 0, n = rng() % (capacity + 1); i < n; ++i) {
      const auto p = static_cast<uint32_t>(rng() % 6);
      initial.push_back(p);
      initial_mask |= 1u << p;
    }
    EXPECT_EQ(OptimalMisses(needed, capacity, initial),
              BruteForceMisses(needed, capacity, initial_mask))
        << "instance " << instance << " (seed " << testing::TestSeed() << ")";
  }
}

TEST(Trace, OptimalMissesOnACycleOneLargerThanTheTier) {
  // Pages 0..3 in turn, 12 steps, 3 slots: LRU misses all 12. MIN: 4 cold misses, then on
  // each miss it evicts the page needed farthest ahead: miss 2 at step 6 (evicting 1), miss 1
  // at step 9 (evicting 0, never needed again). 6 in all.
  std::vector<std::vector<uint32_t>> cycle;
  for (uint32_t t = 0; t < 12; ++t) cycle.push_back({t % 4});
  EXPECT_EQ(OptimalMisses(cycle, 3, {}), 6u);
  EXPECT_EQ(OptimalMisses(cycle, 4, {}), 4u);  // everything fits: cold misses only
  const std::vector<uint32_t> warm = {0, 1, 2, 3};
  EXPECT_EQ(OptimalMisses(cycle, 4, warm), 0u);
}

TEST(Trace, OptimalMissesEdgeCases) {
  using Steps = std::vector<std::vector<uint32_t>>;
  EXPECT_EQ(OptimalMisses(Steps{}, 3, {}), 0u);
  // A page needed twice in one step is fetched once; ids need not be small.
  EXPECT_EQ(OptimalMisses(Steps{{7, 7, 1000000}, {1000000}}, 2, {}), 2u);
  // A tier of no pages misses every distinct page of every step.
  EXPECT_EQ(OptimalMisses(Steps{{1, 2, 2}, {1}, {1}}, 0, {}), 4u);
  // Initial pages are hits; beyond the capacity only the first `capacity` are held.
  const std::vector<uint32_t> initial = {5, 6, 7};
  EXPECT_EQ(OptimalMisses(Steps{{5}, {6}}, 2, initial), 0u);
  EXPECT_EQ(OptimalMisses(Steps{{7}}, 2, initial), 1u);
  // A step needing more pages than the tier holds misses each one it lacks, then keeps those
  // needed soonest: 1 (step 1) here, or 2 (step 1), and page 9, held before, over both.
  EXPECT_EQ(OptimalMisses(Steps{{1, 2}, {1}}, 1, {}), 2u);
  EXPECT_EQ(OptimalMisses(Steps{{1, 2}, {2}}, 1, {}), 2u);
  const std::vector<uint32_t> nine = {9};
  EXPECT_EQ(OptimalMisses(Steps{{1, 2}, {9}}, 1, nine), 2u);
}

}  // namespace
}  // namespace argus

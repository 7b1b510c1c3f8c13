// The C API against the C++ API: c_api_scenario.c (C11) drives a cache through argus.h, the same
// work runs here through KvCache / AttentionEngine / PlacementEngine, and the outputs must be
// identical bit for bit; hostile calls must all report errors; the model runner's generation
// must equal `argus run`'s.
#include <cstdlib>
#include <limits>
#include <optional>

#include "argus/argus.h"
#include "argus/attention.h"
#include "argus/cache.h"
#include "argus/model.h"
#include "argus/policy.h"
#include "capi/c_api_scenario.h"
#include "cli_run.h"
#include "test_util.h"

// tests/fuzz/capi_fuzz.cc, linked in: the fuzz target's program of C API calls.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace argus {
namespace {

struct Outputs {
  std::vector<float> prefill, decode, fork;
  uint64_t n_demotions = 0, n_promotions = 0;  // the C++ run's placement engine
};

// Inputs of a scenario: seeded normal K/V and queries.
struct Inputs {
  std::vector<float> k, v, q_prefill, q_decode;
};

Inputs MakeInputs(const capi_scenario& s, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const auto fill = [&](size_t n) {
    std::vector<float> x(n);
    for (float& value : x) value = normal(rng);
    return x;
  };
  const size_t row = size_t{s.n_kv_heads} * s.head_dim, q_row = size_t{s.n_q_heads} * s.head_dim;
  const size_t n_total = s.n_prefix + s.n_steps;
  Inputs in;
  in.k = fill(s.n_layers * n_total * row);
  in.v = fill(s.n_layers * n_total * row);
  in.q_prefill = fill(size_t{s.n_layers} * s.n_prefill * q_row);
  in.q_decode = fill(size_t{s.n_steps} * s.n_layers * q_row);
  return in;
}

Outputs Allocate(const capi_scenario& s) {
  const size_t q_row = size_t{s.n_q_heads} * s.head_dim;
  return {std::vector<float>(size_t{s.n_layers} * s.n_prefill * q_row),
          std::vector<float>(size_t{s.n_steps} * s.n_layers * q_row),
          std::vector<float>(size_t{s.n_layers} * q_row)};
}

Outputs RunThroughC(const capi_scenario& s) {
  Outputs out = Allocate(s);
  capi_outputs o{out.prefill.data(), out.decode.data(), out.fork.data()};
  char* error = nullptr;
  const int rc = capi_run_scenario(&s, &o, &error);
  EXPECT_EQ(rc, 0) << (error ? error : "");
  argus_free(error);
  return out;
}

#define ASSERT_OK(expr)                              \
  do {                                               \
    const ::argus::Status status_ = (expr);          \
    ASSERT_TRUE(status_.ok()) << status_.ToString(); \
  } while (0)

// The same work through the C++ API.
void RunThroughCpp(const capi_scenario& s, Outputs& out) {
  const CacheGeometry g{s.n_layers, s.n_q_heads, s.n_kv_heads, s.head_dim};
  std::unique_ptr<DiskTier> disk;
  if (s.disk_dir != nullptr) {
    DiskTierOptions d;
    d.dir = s.disk_dir;
    d.disk_budget_bytes = size_t{1} << 30;
    auto opened = DiskTier::Open(d);
    ASSERT_OK(opened.status());
    disk = std::move(*opened);
  }
  CacheOptions options;
  options.geometry = g;
  options.page_tokens = s.page_tokens;
  options.ram_budget_bytes = s.ram_budget ? s.ram_budget : std::numeric_limits<size_t>::max() / 4;
  options.k_codec = s.k_codec;
  options.v_codec = s.v_codec;
  options.disk = disk.get();
  auto created = KvCache::Create(options);
  ASSERT_OK(created.status());
  KvCache& cache = **created;
  ThreadPool pool(2);
  AttentionEngine engine(pool);
  std::unique_ptr<PlacementEngine> placement;
  if (s.profile != nullptr) {
    PlacementOptions p;
    auto profile = Profile::Load(s.profile);
    ASSERT_OK(profile.status());
    p.profile = *profile;
    p.background = false;  // as argus_cache_options_set_placement_sync(options, 1)
    p.disk_time_share = 0;
    auto made = PlacementEngine::Create(cache, pool, p);
    ASSERT_OK(made.status());
    placement = std::move(*made);
  }
  const size_t row = size_t{s.n_kv_heads} * s.head_dim, q_row = size_t{s.n_q_heads} * s.head_dim;
  const uint32_t n_total = s.n_prefix + s.n_steps;
  auto seq = cache.CreateSequence();
  ASSERT_OK(seq.status());
  if (placement) ASSERT_OK(placement->BeginRequest(*seq, n_total));
  const auto append = [&](SeqId id, uint32_t layer, uint32_t first, uint32_t n, bool engine_path) {
    const size_t at = (size_t{layer} * n_total + first) * row;
    std::span<const float> k(s.k + at, n * row), v(s.v + at, n * row);
    return engine_path ? placement->Append(layer, k, v) : cache.Append(id, layer, k, v);
  };
  for (uint32_t layer = 0; layer < s.n_layers; ++layer) {
    for (uint32_t t = 0; t < s.n_prefix; t += s.chunk) {
      ASSERT_OK(append(*seq, layer, t, std::min(s.chunk, s.n_prefix - t), placement != nullptr));
    }
    if (s.n_prefill == 0) continue;
    const size_t offset = size_t{layer} * s.n_prefill * q_row;
    auto stats = placement ? placement->Prefill(layer, s.q_prefill + offset, s.n_prefill,
                                                out.prefill.data() + offset)
                           : engine.Prefill(cache, *seq, layer, s.q_prefill + offset, s.n_prefill,
                                            out.prefill.data() + offset);
    ASSERT_OK(stats.status());
  }
  for (uint32_t step = 0; step < s.n_steps; ++step) {
    for (uint32_t layer = 0; layer < s.n_layers; ++layer) {
      const size_t offset = (size_t{step} * s.n_layers + layer) * q_row;
      ASSERT_OK(append(*seq, layer, s.n_prefix + step, 1, placement != nullptr));
      auto stats =
          placement
              ? placement->Decode(layer, s.q_decode + offset, out.decode.data() + offset)
              : engine.Decode(cache, *seq, layer, s.q_decode + offset, out.decode.data() + offset);
      ASSERT_OK(stats.status());
    }
    if (placement) ASSERT_OK(placement->EndStep());
  }
  if (placement) {
    ASSERT_OK(placement->Drain());
    out.n_demotions = placement->stats().n_demotions;
    out.n_promotions = placement->stats().n_promotions;
  }
  auto child = cache.Fork(*seq);
  ASSERT_OK(child.status());
  ASSERT_OK(cache.Release(*seq));
  ASSERT_OK(cache.Crop(*child, s.crop_to));
  for (uint32_t layer = 0; layer < s.n_layers; ++layer) {
    const size_t offset = (size_t{s.n_steps - 1} * s.n_layers + layer) * q_row;
    ASSERT_OK(append(*child, layer, s.crop_to, n_total - s.crop_to, false));
    ASSERT_OK(engine
                  .Decode(cache, *child, layer, s.q_decode + offset,
                          out.fork.data() + size_t{layer} * q_row)
                  .status());
  }
}

capi_scenario Scenario(const Inputs& in, const char* k_codec, const char* v_codec) {
  capi_scenario s{};
  s.n_layers = 2;
  s.n_q_heads = 8;
  s.n_kv_heads = 2;  // GQA 4
  s.head_dim = 64;
  s.page_tokens = 16;
  s.k_codec = k_codec;
  s.v_codec = v_codec;
  s.n_prefix = 53;  // three full pages and a partial one
  s.chunk = 20;
  s.n_prefill = 7;
  s.n_steps = 12;  // the partial page fills during decode
  s.crop_to = 41;  // mid-page, shared pages before it
  s.k = in.k.data();
  s.v = in.v.data();
  s.q_prefill = in.q_prefill.data();
  s.q_decode = in.q_decode.data();
  return s;
}

void ExpectBitIdentical(const Outputs& c, const Outputs& cpp) {
  const auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  EXPECT_TRUE(same(c.prefill, cpp.prefill)) << "prefill";
  EXPECT_TRUE(same(c.decode, cpp.decode)) << "decode";
  EXPECT_TRUE(same(c.fork, cpp.fork)) << "fork";
  const auto finite = [](const std::vector<float>& x) {
    return std::all_of(x.begin(), x.end(), [](float f) { return std::isfinite(f); });
  };
  EXPECT_TRUE(finite(c.decode) && finite(c.prefill) && finite(c.fork));
}

// Every codec family for K (keys-only ones with f16 V) and for V, GQA 4, prefill, decode, a
// fork cropped mid-page and regrown.
TEST(CApi, EveryCodecFamilyMatchesTheCppApiBitForBit) {
  capi_scenario shape = Scenario({}, "f16", "f16");
  const Inputs in = MakeInputs(shape, testing::TestSeed());
  std::vector<std::pair<std::string, std::string>> pairs;
  for (const CodecInfo& info : CodecRegistry::Default().List()) {
    const bool values = info.role != CodecRole::kKeys;
    pairs.emplace_back(info.name, values ? info.name : "f16");
  }
  pairs.emplace_back("int4:channel", "int4");
  pairs.emplace_back("q4_0+rot+center", "q4_0");
  ASSERT_GE(pairs.size(), 12u);
  for (const auto& [k, v] : pairs) {
    SCOPED_TRACE(k + " / " + v);
    const capi_scenario s = Scenario(in, k.c_str(), v.c_str());
    Outputs c = RunThroughC(s);
    Outputs cpp = Allocate(s);
    RunThroughCpp(s, cpp);
    ExpectBitIdentical(c, cpp);
  }
}

// Through the C API alone: attention over each codec pair's stored rows (read back with
// argus_seq_read_f32) is within the pair's stated fused-kernel bound of the double-precision
// reference over those rows. Per query head: the score error moves each weight by at most
// e^(2 delta), delta = fused_k * ||q|| * max ||k'|| * scale; the accumulate adds fused_v times
// max ||v'||.
TEST(CApi, DecodeMatchesTheReferenceOverItsStoredRowsWithinTheStatedBound) {
  const CacheGeometry g{1, 8, 2, 64};
  const uint32_t n = 53, d = g.head_dim, gqa = g.gqa();
  capi_scenario shape = Scenario({}, "f16", "f16");
  shape.n_layers = 1;
  shape.n_prefix = n;
  shape.n_steps = 1;
  const Inputs in = MakeInputs(shape, testing::TestSeed() + 2);
  size_t n_checked = 0;
  for (const CodecInfo& info : CodecRegistry::Default().List()) {
    const std::string v_spec = info.role == CodecRole::kKeys ? "f16" : info.name;
    SCOPED_TRACE(info.name + " / " + v_spec);
    char* error = nullptr;
    argus_cache_options_t* o = argus_cache_options_create();
    argus_cache_options_set_geometry(o, g.n_layers, g.n_q_heads, g.n_kv_heads, d);
    argus_cache_options_set_codecs(o, info.name.c_str(), v_spec.c_str());
    argus_cache_options_set_page_tokens(o, 16);
    argus_cache_t* cache = argus_cache_open(o, &error);
    argus_cache_options_destroy(o);
    ASSERT_NE(cache, nullptr) << error;
    const int64_t seq = argus_seq_create(cache, &error);
    argus_seq_append_f32(cache, seq, 0, in.k.data(), in.v.data(), n, &error);
    ASSERT_EQ(error, nullptr) << error;
    std::vector<float> k(in.k.size()), v(in.v.size()), out(g.n_q_heads * d);
    const float* q = in.q_decode.data();
    argus_attend_decode_f32(cache, seq, 0, q, out.data(), &error);
    ASSERT_EQ(error, nullptr) << error;
    argus_seq_read_f32(cache, seq, 0, 0, n, k.data(), v.data(), &error);
    argus_cache_close(cache);
    if (error != nullptr) {  // a sketch (jl) cannot be read back: its bound is not per row
      EXPECT_NE(std::string(error).find("Unsupported"), std::string::npos) << error;
      argus_free(error);
      continue;
    }
    const auto fused = [](const std::string& spec) {
      return CodecRegistry::Default().Create(spec).value()->info().fused_rel_error;
    };
    const std::vector<double> ref = ReferenceAttention(g, q, 1, n - 1, k.data(), v.data(), n, {});
    for (uint32_t i = 0; i < g.n_q_heads; ++i) {
      double q_norm = 0, k_max = 0, v_max = 0, err = 0;
      for (uint32_t c = 0; c < d; ++c) q_norm += double{q[i * d + c]} * q[i * d + c];
      for (uint32_t t = 0; t < n; ++t) {
        double kk = 0, vv = 0;
        for (uint32_t c = 0; c < d; ++c) {
          const size_t at = (size_t{t} * g.n_kv_heads + i / gqa) * d + c;
          kk += double{k[at]} * k[at];
          vv += double{v[at]} * v[at];
        }
        k_max = std::max(k_max, std::sqrt(kk));
        v_max = std::max(v_max, std::sqrt(vv));
      }
      for (uint32_t c = 0; c < d; ++c) {
        err += std::pow(out[i * d + c] - ref[i * d + c], 2);
      }
      const double delta =
          fused(info.name) * std::sqrt(q_norm) * k_max / std::sqrt(static_cast<double>(d));
      const double bound = std::expm1(2 * delta) * v_max + fused(v_spec) * v_max + 1e-5;
      EXPECT_LE(std::sqrt(err), bound) << "head " << i;
    }
    ++n_checked;
  }
  EXPECT_GE(n_checked, 14u);
}

// The placement engine on: a RAM budget 40% of what the sequence needs, so pages are demoted
// (lossy, and to disk) and promoted while decoding; the same work through both APIs.
TEST(CApi, PlacementEngineMatchesTheCppApiBitForBit) {
  for (const char* profile : {"balanced", "research"}) {
    SCOPED_TRACE(profile);
    const auto resize = [](capi_scenario s) {
      s.n_prefix = 1000;
      s.chunk = 128;
      s.n_steps = 24;
      s.crop_to = 1008;  // a page boundary: the branch needs no more RAM than its parent
      return s;
    };
    const Inputs in = MakeInputs(resize(Scenario({}, "f16", "f16")), testing::TestSeed() + 1);
    capi_scenario s = resize(Scenario(in, "f16", "f16"));
    s.profile = profile;
    CacheOptions options;
    options.geometry = {s.n_layers, s.n_q_heads, s.n_kv_heads, s.head_dim};
    options.page_tokens = s.page_tokens;
    auto need = KvCache::RequiredRamBytes(options, s.n_prefix + s.n_steps);
    ASSERT_TRUE(need.ok());
    s.ram_budget = *need * 2 / 5;
    testing::TempDir c_dir, cpp_dir;
    s.disk_dir = c_dir.path().c_str();
    Outputs c = RunThroughC(s);
    s.disk_dir = cpp_dir.path().c_str();
    Outputs cpp = Allocate(s);
    RunThroughCpp(s, cpp);
    ExpectBitIdentical(c, cpp);
    EXPECT_GT(cpp.n_demotions, 0u) << "the budget should have made the engine demote pages";
  }
}

TEST(CApi, HostileCallsAllReportErrors) {
  const std::string model =
      testing::SharedDir().empty() ? "" : testing::SharedDir() + "/models/stories260K.gguf";
  EXPECT_EQ(capi_hostile_calls(model.empty() ? nullptr : model.c_str()), 0);
}

// The fuzz target's call programs on seeded random inputs, so every build (ASan/UBSan included)
// runs them; the fuzz preset explores further.
TEST(CApi, RandomCallProgramsNeverCrash) {
  std::mt19937_64 rng(testing::TestSeed());
  for (int i = 0; i < 300; ++i) {
    std::vector<uint8_t> input(rng() % 600);
    for (uint8_t& b : input) b = static_cast<uint8_t>(rng());
    EXPECT_EQ(LLVMFuzzerTestOneInput(input.data(), input.size()), 0);
  }
}

TEST(CApi, VersionAndCodecRegistry) {
  EXPECT_STREQ(argus_version(), "0.2.0");
  const std::vector<CodecInfo> codecs = CodecRegistry::Default().List();
  const size_t n = argus_codec_count();
  ASSERT_EQ(n, codecs.size());
  for (size_t i = 0; i < n; ++i) {
    const CodecInfo& info = codecs[i];
    EXPECT_STREQ(argus_codec_name(i), info.name.c_str());
    EXPECT_EQ(argus_codec_bits_per_value(i), info.bits_per_value);
    EXPECT_EQ(argus_codec_is_lossless(i), info.lossless ? 1 : 0);
  }
  EXPECT_EQ(argus_codec_name(n), nullptr);
  EXPECT_EQ(argus_codec_bits_per_value(n), -1);
  char* error = nullptr;
  EXPECT_DOUBLE_EQ(argus_codec_spec_bits_per_value("q4_0", 128, &error), 4.5);
  EXPECT_DOUBLE_EQ(argus_codec_spec_bits_per_value("f16", 64, &error), 16.0);
  EXPECT_EQ(error, nullptr);
}

// Greedy and seeded sampling through argus_generate print what `argus run` prints.
TEST(CApi, GenerateEqualsTheCommandLine) {
  ARGUS_SKIP_WITHOUT_SHARED();
  const std::string model = testing::SharedDir() + "/models/stories260K.gguf";
  char* error = nullptr;
  argus_model_t* m = argus_model_load(model.c_str(), &error);
  ASSERT_NE(m, nullptr) << error;
  for (const auto& [temp, k_codec] : {std::pair<float, const char*>{0.0f, "f16"}, {1.0f, "q8_0"}}) {
    argus_context_options_t* o = argus_context_options_create();
    argus_context_options_set_n_ctx(o, 256);
    argus_context_options_set_codecs(o, k_codec, k_codec);
    argus_context_options_set_page_tokens(o, 16);
    argus_context_t* context = argus_context_create(m, o, &error);
    argus_context_options_destroy(o);
    ASSERT_NE(context, nullptr) << error;
    argus_sampler_t* sampler = argus_sampler_create(temp, 40, 0.95f, 3, &error);
    ASSERT_NE(sampler, nullptr) << error;
    char* text = argus_generate(context, "Once upon a time", 60, sampler, &error);
    ASSERT_NE(text, nullptr) << error;
    const testing::CliRun run = testing::RunArgus(
        "run -m " + model + " -p 'Once upon a time' -n 60 -c 256 --page-tokens 16 --temp " +
        std::to_string(temp) + " --seed 3 --cache-type-k " + k_codec + " --cache-type-v " +
        k_codec);
    ASSERT_EQ(run.exit_code, 0) << run.err;
    EXPECT_EQ(std::string(text), run.out);
    EXPECT_GT(std::string(text).size(), 20u);
    argus_free(text);
    argus_sampler_destroy(sampler);
    argus_context_close(context);
  }
  argus_model_close(m);
}

}  // namespace
}  // namespace argus

// Profiles: the built-ins, the JSON form and its errors, validation, loading.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "argus/policy.h"
#include "test_util.h"

namespace argus {
namespace {

void ExpectSameProfile(const Profile& a, const Profile& b) {
  EXPECT_EQ(a.name, b.name);
  ASSERT_EQ(a.ladder.size(), b.ladder.size()) << a.name;
  for (size_t i = 0; i < a.ladder.size(); ++i) {
    EXPECT_EQ(a.ladder[i].k_codec, b.ladder[i].k_codec) << a.name << " state " << i;
    EXPECT_EQ(a.ladder[i].v_codec, b.ladder[i].v_codec) << a.name << " state " << i;
    EXPECT_EQ(a.ladder[i].tier, b.ladder[i].tier) << a.name << " state " << i;
  }
  EXPECT_EQ(a.masters, b.masters);
  EXPECT_EQ(a.pin_sinks, b.pin_sinks);
  EXPECT_EQ(a.pin_recent, b.pin_recent);
  ASSERT_EQ(a.layer_overrides.size(), b.layer_overrides.size());
  for (size_t i = 0; i < a.layer_overrides.size(); ++i) {
    EXPECT_EQ(a.layer_overrides[i].layers, b.layer_overrides[i].layers);
    EXPECT_EQ(a.layer_overrides[i].max_state, b.layer_overrides[i].max_state);
  }
  EXPECT_EQ(a.ranking, b.ranking);
  EXPECT_EQ(a.promote, b.promote);
  EXPECT_EQ(a.heat_decay, b.heat_decay);
  EXPECT_EQ(a.replan_every, b.replan_every);
  EXPECT_EQ(a.promote_mass, b.promote_mass);
  EXPECT_EQ(a.epsilon, b.epsilon);
  EXPECT_EQ(a.activate_ratio, b.activate_ratio);
  EXPECT_EQ(a.deactivate_ratio, b.deactivate_ratio);
}

// "k/v@tier" per state: compact enough to compare whole ladders with hand-written ones.
std::vector<std::string> LadderText(const Profile& p) {
  std::vector<std::string> out;
  for (const LadderState& s : p.ladder) {
    out.push_back(s.tier == TierKind::kDisk ? "disk" : s.k_codec + "/" + s.v_codec);
  }
  return out;
}

Profile MustBuiltIn(const std::string& name) {
  auto p = Profile::BuiltIn(name);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return p.ok() ? *p : Profile{};
}

TEST(Profile, EveryBuiltInValidatesAndRoundTripsThroughJson) {
  EXPECT_EQ(Profile::BuiltInNames(),
            (std::vector<std::string>{"exact", "balanced", "research", "capacity", "cascade"}));
  for (const std::string& name : Profile::BuiltInNames()) {
    Profile p = MustBuiltIn(name);
    EXPECT_EQ(p.name, name);
    EXPECT_TRUE(p.Validate().ok()) << p.Validate().ToString();
    auto back = Profile::FromJson(p.ToJson(), name + ".json");
    ASSERT_TRUE(back.ok()) << back.status().ToString() << "\n" << p.ToJson();
    ExpectSameProfile(p, *back);
  }
}

TEST(Profile, BuiltInsHaveTheDocumentedLaddersAndRules) {
  using V = std::vector<std::string>;
  Profile exact = MustBuiltIn("exact");
  EXPECT_EQ(LadderText(exact), (V{"f16/f16", "disk"}));
  EXPECT_EQ(exact.masters, MasterRule::kAlways);
  Profile balanced = MustBuiltIn("balanced");
  EXPECT_EQ(LadderText(balanced), (V{"f16/f16", "fp8_e4m3/fp8_e4m3", "disk"}));
  EXPECT_EQ(balanced.masters, MasterRule::kLossy);
  Profile research = MustBuiltIn("research");
  ASSERT_EQ(research.ladder.size(), 7u);
  EXPECT_EQ(research.ladder.back().tier, TierKind::kDisk);
  EXPECT_EQ(LadderText(research),
            (V{"f16/f16", "fp8_e4m3/fp8_e4m3", "int8:channel/int8:token", "int4:channel/int4:token",
               "int2:channel/int2:token", "jl/int2:token", "disk"}));
  Profile capacity = MustBuiltIn("capacity");
  EXPECT_EQ(LadderText(capacity),
            (V{"f16/f16", "int4:channel/int4:token", "int4:channel/int2:token",
               "int2:channel/int2:token", "int1/plane8/2", "disk"}));
  EXPECT_EQ(capacity.epsilon, 1e-3);
  Profile cascade = MustBuiltIn("cascade");
  EXPECT_EQ(LadderText(cascade), (V{"f16/f16", "disk"}));
  EXPECT_EQ(cascade.masters, MasterRule::kNever);
  EXPECT_EQ(cascade.ranking, Ranking::kRecency);
  EXPECT_FALSE(cascade.promote);
  const Profile defaults;  // the fields no built-in sets keep the struct's defaults
  for (const Profile& p : {exact, balanced, research, capacity, cascade}) {
    EXPECT_EQ(p.pin_sinks, 4u) << p.name;
    EXPECT_EQ(p.pin_recent, 256u) << p.name;
    EXPECT_EQ(p.heat_decay, defaults.heat_decay) << p.name;
    EXPECT_EQ(p.replan_every, defaults.replan_every) << p.name;
    EXPECT_EQ(p.promote_mass, defaults.promote_mass) << p.name;
    EXPECT_EQ(p.activate_ratio, defaults.activate_ratio) << p.name;
    EXPECT_EQ(p.deactivate_ratio, defaults.deactivate_ratio) << p.name;
    EXPECT_TRUE(p.layer_overrides.empty()) << p.name;
    if (p.name != "capacity") {
      EXPECT_EQ(p.epsilon, 0.0) << p.name;
    }
    if (p.name != "cascade") {
      EXPECT_EQ(p.ranking, Ranking::kHeat) << p.name;
      EXPECT_TRUE(p.promote) << p.name;
    }
  }
}

TEST(Profile, UnknownBuiltInIsInvalidArgumentNamingTheKnownOnes) {
  auto p = Profile::BuiltIn("fastest");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find("fastest"), std::string::npos);
  for (const std::string& name : Profile::BuiltInNames()) {
    EXPECT_NE(p.status().message().find(name), std::string::npos) << name;
  }
}

TEST(Profile, SchemaExampleParsesEveryField) {
  auto p = Profile::FromJson(R"({
    "name": "my-profile",
    "ladder": [ {"k": "f16", "v": "f16", "tier": "ram"}, {"k": "int4:channel", "v": "int4:token"},
                {"tier": "disk"} ],
    "masters": "lossy",
    "pins": {"sinks": 2, "recent": 64},
    "layer_overrides": [ {"layers": [0, 1], "max_state": 0}, {"layers": [5], "max_state": 1} ],
    "ranking": "recency",
    "promote": false,
    "heat_decay": 0.5, "replan_every": 8, "promote_mass": 0.05, "epsilon": 0.001,
    "activation": {"activate": 0.95, "deactivate": 0.6}
  })",
                             "my.json");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->name, "my-profile");
  EXPECT_EQ(LadderText(*p),
            (std::vector<std::string>{"f16/f16", "int4:channel/int4:token", "disk"}));
  EXPECT_EQ(p->ladder[1].tier, TierKind::kRam);  // the default tier
  EXPECT_EQ(p->masters, MasterRule::kLossy);
  EXPECT_EQ(p->pin_sinks, 2u);
  EXPECT_EQ(p->pin_recent, 64u);
  ASSERT_EQ(p->layer_overrides.size(), 2u);
  EXPECT_EQ(p->layer_overrides[0].layers, (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(p->layer_overrides[0].max_state, 0u);
  EXPECT_EQ(p->layer_overrides[1].layers, (std::vector<uint32_t>{5}));
  EXPECT_EQ(p->layer_overrides[1].max_state, 1u);
  EXPECT_EQ(p->ranking, Ranking::kRecency);
  EXPECT_FALSE(p->promote);
  EXPECT_EQ(p->heat_decay, 0.5);
  EXPECT_EQ(p->replan_every, 8u);
  EXPECT_EQ(p->promote_mass, 0.05);
  EXPECT_EQ(p->epsilon, 0.001);
  EXPECT_EQ(p->activate_ratio, 0.95);
  EXPECT_EQ(p->deactivate_ratio, 0.6);
  auto back = Profile::FromJson(p->ToJson(), "my.json again");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ExpectSameProfile(*p, *back);
}

TEST(Profile, BaseKeepsTheFieldsTheFileDoesNotGive) {
  auto p = Profile::FromJson(
      R"({"name": "research-lean", "base": "research", "pins": {"sinks": 0}, "epsilon": 0.01})",
      "lean.json");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  Profile expected = MustBuiltIn("research");
  expected.name = "research-lean";
  expected.pin_sinks = 0;  // pin_recent stays the base's 256
  expected.epsilon = 0.01;
  ExpectSameProfile(*p, expected);

  auto replaced = Profile::FromJson(
      R"({"name": "short", "base": "capacity", "ladder": [{"k": "f16", "v": "f16"}]})", "s.json");
  ASSERT_TRUE(replaced.ok()) << replaced.status().ToString();
  EXPECT_EQ(LadderText(*replaced), (std::vector<std::string>{"f16/f16"}));
  EXPECT_EQ(replaced->epsilon, 1e-3);  // the rest is the base's
}

TEST(Profile, JsonErrorsNameTheSourceAndTheFieldPointer) {
  struct Case {
    const char* what;
    std::string json;
    std::string expected;  // a part of the message, after "profile test.json: "
  };
  const std::string ladder = R"("ladder": [{"k": "f16", "v": "f16"}, {"tier": "disk"}])";
  const std::vector<Case> cases = {
      // '}' is the 15th byte: a value is missing after the comma.
      {"bad JSON", R"({"name": "a", })", "not valid JSON at byte 15"},
      {"number beyond a double", R"({"name": "a", "base": "exact", "epsilon": 1e500})",
       "not valid JSON: number overflow"},
      {"not an object", R"([1, 2])", "expected an object, got array"},
      {"unknown top-level key", R"({"name": "a", "base": "exact", "ranknig": "heat"})",
       "/ranknig: unknown key"},
      {"unknown nested key", R"({"name": "a", "base": "exact", "pins": {"sink": 4}})",
       "/pins/sink: unknown key"},
      {"unknown key in a state", R"({"name": "a", "ladder": [{"k": "f16", "v": "f16", "t": 1}]})",
       "/ladder/0/t: unknown key"},
      {"no name", R"({"base": "exact"})", "/name: is required"},
      {"neither ladder nor base", R"({"name": "a"})", "/ladder: is required"},
      {"unknown base", R"({"name": "a", "base": "fastest"})", "/base: profile 'fastest'"},
      {"name of the wrong type", R"({"name": 7, "base": "exact"})",
       "/name: expected a string, got 7"},
      {"count of the wrong type", R"({"name": "a", "base": "exact", "replan_every": "16"})",
       "/replan_every: expected an integer"},
      {"negative count", R"({"name": "a", "base": "exact", "pins": {"recent": -1}})",
       "/pins/recent: expected an integer in [0, 4294967295], got -1"},
      {"count too large", R"({"name": "a", "base": "exact", "replan_every": 4294967296})",
       "/replan_every: expected an integer"},
      {"fractional count", R"({"name": "a", "base": "exact", "pins": {"sinks": 1.5}})",
       "/pins/sinks: expected an integer"},
      {"number of the wrong type", R"({"name": "a", "base": "exact", "heat_decay": true})",
       "/heat_decay: expected a number, got boolean"},
      {"flag of the wrong type", R"({"name": "a", "base": "exact", "promote": 1})",
       "/promote: expected a boolean"},
      {"ladder of the wrong type", R"({"name": "a", "ladder": {"k": "f16"}})",
       "/ladder: expected an array, got object"},
      {"unknown enum value", R"({"name": "a", "base": "exact", "masters": "sometimes"})",
       "/masters: 'sometimes' is not one of: always, never, lossy"},
      {"unknown tier", R"({"name": "a", "ladder": [{"k": "f16", "v": "f16", "tier": "nvme"}]})",
       "/ladder/0/tier: 'nvme' is not one of: ram, disk"},
      {"RAM state without V", R"({"name": "a", "ladder": [{"k": "f16"}]})",
       "/ladder/0/v: is required"},
      {"disk state with codecs",
       R"({"name": "a", "ladder": [{"k": "f16", "v": "f16"}, {"k": "f16", "tier": "disk"}]})",
       "/ladder/1/k: a disk state takes no codecs"},
      {"unknown codec",
       R"({"name": "a", "ladder": [{"k": "f16", "v": "f16"}, {"k": "int9", "v": "int4"}]})",
       "/ladder/1/k: codec 'int9' is not registered"},
      {"keys-only codec as V",
       R"({"name": "a", "ladder": [{"k": "f16", "v": "f16"}, {"k": "jl", "v": "jl"}]})",
       "/ladder/1/v: codec 'jl' cannot hold values"},
      {"malformed codec spec",
       R"({"name": "a", "ladder": [{"k": "f16", "v": "f16"}, {"k": "int4:diagonal", "v": "f16"}]})",
       "/ladder/1/k: codec spec 'int4:diagonal'"},
      {"disk state not last",
       R"({"name": "a", "ladder": [{"k": "f16", "v": "f16"}, {"tier": "disk"},
           {"k": "int4", "v": "int4"}]})",
       "/ladder/1/tier: a disk state must be the last state"},
      {"ratios out of order",
       R"({"name": "a", "base": "exact", "activation": {"activate": 0.5, "deactivate": 0.8}})",
       "/activation/deactivate: 0.8 must be above 0 and at most activate (0.5)"},
      {"override beyond the ladder",
       "{\"name\": \"a\", " + ladder + R"(, "layer_overrides": [{"layers": [3], "max_state": 2}]})",
       "/layer_overrides/0/max_state: state 2 is beyond the ladder's 2 states"},
      {"override without layers",
       "{\"name\": \"a\", " + ladder + R"(, "layer_overrides": [{"layers": [], "max_state": 1}]})",
       "/layer_overrides/0/layers: is empty"},
      {"a key with a slash is escaped", R"({"name": "a", "base": "exact", "pins/sinks": 4})",
       "/pins~1sinks: unknown key"},
  };
  for (const Case& c : cases) {
    auto p = Profile::FromJson(c.json, "test.json");
    ASSERT_FALSE(p.ok()) << c.what;
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument) << c.what;
    EXPECT_NE(p.status().message().find("profile test.json: " + c.expected), std::string::npos)
        << c.what << ": " << p.status().message();
  }
}

TEST(Profile, ValidateRejectsEachBrokenRuleNamingTheField) {
  struct Case {
    const char* what;
    void (*edit)(Profile&);
    const char* expected;
  };
  const Case cases[] = {
      {"empty ladder", [](Profile& p) { p.ladder.clear(); }, "/ladder: is empty"},
      {"disk first", [](Profile& p) { p.ladder.erase(p.ladder.begin(), p.ladder.end() - 1); },
       "/ladder/0/tier: the best state must be a RAM state"},
      {"two disk states", [](Profile& p) { p.ladder.push_back(p.ladder.back()); },
       "/ladder/6/tier: a disk state must be the last"},
      {"repeated state spelled differently",
       [](Profile& p) {
         p.ladder[3] = {"int8:channel", "int8", TierKind::kRam};
       },
       "/ladder/3: repeats state 2"},
      {"keys-only codec as V", [](Profile& p) { p.ladder[1].v_codec = "int1"; },
       "/ladder/1/v: codec 'int1' cannot hold values"},
      {"heat decay of 1", [](Profile& p) { p.heat_decay = 1; }, "/heat_decay: 1 is outside (0, 1)"},
      {"NaN heat decay", [](Profile& p) { p.heat_decay = std::nan(""); }, "/heat_decay"},
      {"zero replan period", [](Profile& p) { p.replan_every = 0; }, "/replan_every"},
      {"promote mass above 1", [](Profile& p) { p.promote_mass = 1.5; }, "/promote_mass"},
      {"epsilon of 1", [](Profile& p) { p.epsilon = 1; }, "/epsilon"},
      {"negative epsilon", [](Profile& p) { p.epsilon = -1e-9; }, "/epsilon"},
      {"zero deactivate", [](Profile& p) { p.deactivate_ratio = 0; }, "/activation/deactivate"},
      {"infinite activate", [](Profile& p) { p.activate_ratio = INFINITY; },
       "/activation/activate"},
      {"layer in two overrides",
       [](Profile& p) {
         p.layer_overrides = {{{0, 1}, 0}, {{2, 1}, 3}};
       },
       "/layer_overrides/1/layers/1: layer 1 is already in /layer_overrides/0"},
      {"empty name", [](Profile& p) { p.name.clear(); }, "/name: is empty"},
  };
  for (const Case& c : cases) {
    Profile p = MustBuiltIn("research");
    c.edit(p);
    Status s = p.Validate();
    ASSERT_FALSE(s.ok()) << c.what;
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.what;
    EXPECT_NE(s.message().find(c.expected), std::string::npos) << c.what << ": " << s.message();
  }
  // The same edits' neighbours are fine: the checks are not over-eager.
  Profile p = MustBuiltIn("research");
  p.activate_ratio = p.deactivate_ratio = 2.0;  // activation above the budget: allowed
  p.promote_mass = 0;
  p.layer_overrides = {{{0, 1}, 0}, {{2, 4000000000u}, 6}};  // layer ids are not bounded here
  EXPECT_TRUE(p.Validate().ok()) << p.Validate().ToString();
}

TEST(Profile, LoadTakesBuiltInNamesAndFiles) {
  auto exact = Profile::Load("exact");
  ASSERT_TRUE(exact.ok()) << exact.status().ToString();
  ExpectSameProfile(*exact, MustBuiltIn("exact"));

  testing::TempDir dir;
  std::string path = dir / "mine.json";
  FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs(R"({"name": "mine", "base": "balanced", "replan_every": 4})", f);
  std::fclose(f);
  auto mine = Profile::Load(path);
  ASSERT_TRUE(mine.ok()) << mine.status().ToString();
  EXPECT_EQ(mine->name, "mine");
  EXPECT_EQ(mine->replan_every, 4u);
  EXPECT_EQ(mine->masters, MasterRule::kLossy);

  std::string missing = dir / "absent.json";
  auto absent = Profile::Load(missing);
  ASSERT_FALSE(absent.ok());
  EXPECT_EQ(absent.status().code(), StatusCode::kNotFound);
  EXPECT_NE(absent.status().message().find(missing), std::string::npos)
      << absent.status().message();

  // A file's errors carry its path as the source.
  f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs(R"({"name": "mine", "base": "balanced", "replan_every": 0})", f);
  std::fclose(f);
  auto bad = Profile::Load(path);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("profile " + path + ": /replan_every"), std::string::npos)
      << bad.status().message();
}

}  // namespace
}  // namespace argus

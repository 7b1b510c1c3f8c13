// Profiles: the built-in ladders, the JSON form (docs/profiles.md) and validation.
//
// Parsing is strict: every key is known, every value has the documented type, and every error
// names the source and the field as a JSON pointer, because a typo in a profile silently taking
// a default would change placement without anyone noticing.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "argus/codec.h"
#include "argus/policy.h"
#include "argus/store.h"
#include "core/files.h"

namespace argus {
namespace {

using Json = nlohmann::json;

std::string_view MasterRuleName(MasterRule rule) {
  switch (rule) {
    case MasterRule::kAlways:
      return "always";
    case MasterRule::kNever:
      return "never";
    case MasterRule::kLossy:
      return "lossy";
  }
  return "unknown";
}

std::string_view RankingName(Ranking ranking) {
  switch (ranking) {
    case Ranking::kHeat:
      return "heat";
    case Ranking::kRecency:
      return "recency";
  }
  return "unknown";
}

constexpr std::initializer_list<MasterRule> kMasterRules = {MasterRule::kAlways, MasterRule::kNever,
                                                            MasterRule::kLossy};
constexpr std::initializer_list<Ranking> kRankings = {Ranking::kHeat, Ranking::kRecency};
constexpr std::initializer_list<TierKind> kTiers = {TierKind::kRam, TierKind::kDisk};

// "a, b, c"
template <typename Range, typename ToName>
std::string JoinNames(const Range& items, ToName to_name) {
  std::string s;
  for (const auto& item : items) {
    if (!s.empty()) s += ", ";
    s += to_name(item);
  }
  return s;
}

// ---- Built-ins --------------------------------------------------------------------------------

LadderState Ram(std::string k, std::string v) {
  return {std::move(k), std::move(v), TierKind::kRam};
}

LadderState Disk() {
  LadderState state;
  state.tier = TierKind::kDisk;
  return state;
}

Profile Pinned(std::string name, std::vector<LadderState> ladder, MasterRule masters) {
  Profile p;
  p.name = std::move(name);
  p.ladder = std::move(ladder);
  p.masters = masters;
  p.pin_sinks = 4;
  p.pin_recent = 256;
  return p;
}

// Every ladder starts at f16/f16 in RAM: the cache stores full pages in f16.
std::vector<Profile> BuiltIns() {
  std::vector<Profile> all;
  all.push_back(Pinned("exact", {Ram("f16", "f16"), Disk()}, MasterRule::kAlways));
  all.push_back(Pinned("balanced", {Ram("f16", "f16"), Ram("fp8_e4m3", "fp8_e4m3"), Disk()},
                       MasterRule::kLossy));
  all.push_back(Pinned("research",
                       {Ram("f16", "f16"), Ram("fp8_e4m3", "fp8_e4m3"),
                        Ram("int8:channel", "int8:token"), Ram("int4:channel", "int4:token"),
                        Ram("int2:channel", "int2:token"), Ram("jl", "int2:token"), Disk()},
                       MasterRule::kAlways));
  Profile capacity = Pinned(
      "capacity",
      {Ram("f16", "f16"), Ram("int4:channel", "int4:token"), Ram("int4:channel", "int2:token"),
       Ram("int2:channel", "int2:token"), Ram("int1", "plane8/2"), Disk()},
      MasterRule::kAlways);
  capacity.epsilon = 1e-3;  // a stated, certified error bound traded for tokens
  all.push_back(std::move(capacity));
  // The earlier prototype's cascade: newest pages in RAM, the rest on disk, nothing comes back.
  Profile cascade = Pinned("cascade", {Ram("f16", "f16"), Disk()}, MasterRule::kNever);
  cascade.ranking = Ranking::kRecency;
  cascade.promote = false;
  all.push_back(std::move(cascade));
  return all;
}

// ---- Validation -------------------------------------------------------------------------------

std::string Num(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", x);
  return buf;
}

// The pointer of the whole document is "": then only `what` is said.
Status FieldError(std::string_view pointer, std::string_view what) {
  if (pointer.empty()) return Status::InvalidArgument(std::string(what));
  return Status::InvalidArgument(std::string(pointer) + ": " + std::string(what));
}

// Parses `spec` and builds it, requiring a codec that can hold keys (or values).
Result<CodecSpec> CheckCodec(const std::string& spec, bool keys, const std::string& pointer) {
  auto parsed = CodecSpec::Parse(spec);
  if (!parsed.ok()) return FieldError(pointer, parsed.status().message());
  auto codec = CodecRegistry::Default().Create(*parsed);
  if (!codec.ok()) return FieldError(pointer, codec.status().message());
  CodecRole role = (*codec)->info().role;
  CodecRole needed = keys ? CodecRole::kKeys : CodecRole::kValues;
  if ((static_cast<uint8_t>(role) & static_cast<uint8_t>(needed)) == 0) {
    return FieldError(pointer, "codec '" + spec + "' cannot hold " + (keys ? "keys" : "values") +
                                   " (it is a " + (keys ? "values" : "keys") + "-only codec)");
  }
  return std::move(parsed).value();
}

// Same codec, however the spec spells it ("int4" and "int4:token" are one codec).
bool SameCodec(const CodecSpec& a, const CodecSpec& b) {
  return a.name == b.name && a.grouping == b.grouping && a.rotate == b.rotate &&
         a.center == b.center;
}

// Errors as "<pointer>: <what>"; callers add which profile.
Status CheckProfile(const Profile& p) {
  if (p.name.empty()) return FieldError("/name", "is empty");
  if (p.ladder.empty()) return FieldError("/ladder", "is empty: a profile needs one state");
  if (p.ladder[0].tier != TierKind::kRam) {
    return FieldError("/ladder/0/tier", "the best state must be a RAM state");
  }
  CodecSpec prev_k, prev_v;
  for (size_t i = 0; i < p.ladder.size(); ++i) {
    const LadderState& state = p.ladder[i];
    std::string at = "/ladder/" + std::to_string(i);
    if (state.tier == TierKind::kDisk) {
      if (i + 1 != p.ladder.size()) {
        return FieldError(at + "/tier", "a disk state must be the last state (the ladder has " +
                                            std::to_string(p.ladder.size()) + ")");
      }
      continue;
    }
    ARGUS_ASSIGN_OR_RETURN(CodecSpec k, CheckCodec(state.k_codec, true, at + "/k"));
    ARGUS_ASSIGN_OR_RETURN(CodecSpec v, CheckCodec(state.v_codec, false, at + "/v"));
    if (i > 0 && SameCodec(k, prev_k) && SameCodec(v, prev_v)) {
      return FieldError(at, "repeats state " + std::to_string(i - 1) + " (" + state.k_codec + "/" +
                                state.v_codec + ")");
    }
    prev_k = std::move(k);
    prev_v = std::move(v);
  }
  // Written so that NaN fails every range.
  if (!(p.heat_decay > 0 && p.heat_decay < 1)) {
    return FieldError("/heat_decay", Num(p.heat_decay) + " is outside (0, 1)");
  }
  if (p.replan_every < 1) return FieldError("/replan_every", "must be at least 1");
  if (!(p.promote_mass >= 0 && p.promote_mass <= 1)) {
    return FieldError("/promote_mass", Num(p.promote_mass) + " is outside [0, 1]");
  }
  if (!(p.epsilon >= 0 && p.epsilon < 1)) {
    return FieldError("/epsilon", Num(p.epsilon) + " is outside [0, 1)");
  }
  if (!std::isfinite(p.activate_ratio)) {
    return FieldError("/activation/activate", "must be a finite number");
  }
  if (!(p.deactivate_ratio > 0 && p.deactivate_ratio <= p.activate_ratio)) {
    return FieldError("/activation/deactivate", Num(p.deactivate_ratio) +
                                                    " must be above 0 and at most activate (" +
                                                    Num(p.activate_ratio) + ")");
  }
  std::map<uint32_t, size_t> override_of;  // layer -> the override naming it (layers are sparse)
  for (size_t i = 0; i < p.layer_overrides.size(); ++i) {
    const LayerOverride& o = p.layer_overrides[i];
    std::string at = "/layer_overrides/" + std::to_string(i);
    if (o.layers.empty()) return FieldError(at + "/layers", "is empty");
    if (o.max_state >= p.ladder.size()) {
      return FieldError(at + "/max_state", "state " + std::to_string(o.max_state) +
                                               " is beyond the ladder's " +
                                               std::to_string(p.ladder.size()) + " states");
    }
    for (size_t j = 0; j < o.layers.size(); ++j) {
      auto [it, added] = override_of.emplace(o.layers[j], i);
      if (!added) {
        return FieldError(at + "/layers/" + std::to_string(j),
                          "layer " + std::to_string(o.layers[j]) +
                              " is already in /layer_overrides/" + std::to_string(it->second));
      }
    }
  }
  return Status::Ok();
}

// ---- JSON -------------------------------------------------------------------------------------

// Reads typed fields of a parsed document; errors name the source and the field's pointer.
class Reader {
 public:
  explicit Reader(std::string_view source) : source_(source) {}

  Status Error(std::string_view pointer, std::string_view what) const {
    return FieldError(pointer, what).WithContext("profile " + source_);
  }

  // An object whose keys are all among `known`.
  Status Object(const Json& j, const std::string& pointer,
                std::initializer_list<std::string_view> known) const {
    if (!j.is_object()) return Expected(j, pointer, "an object");
    for (const auto& item : j.items()) {
      bool ok = false;
      for (std::string_view k : known) ok = ok || item.key() == k;
      if (!ok) {
        return Error(pointer + "/" + Escape(item.key()),
                     "unknown key (expected one of: " + JoinNames(known, [](std::string_view k) {
                       return std::string(k);
                     }) + ")");
      }
    }
    return Status::Ok();
  }

  Result<std::string> String(const Json& j, const std::string& pointer) const {
    if (!j.is_string()) return Expected(j, pointer, "a string");
    return j.get<std::string>();
  }

  Result<bool> Bool(const Json& j, const std::string& pointer) const {
    if (!j.is_boolean()) return Expected(j, pointer, "a boolean");
    return j.get<bool>();
  }

  Result<double> Number(const Json& j, const std::string& pointer) const {
    if (!j.is_number()) return Expected(j, pointer, "a number");
    return j.get<double>();
  }

  Result<uint32_t> Uint32(const Json& j, const std::string& pointer) const {
    constexpr uint64_t kMax = std::numeric_limits<uint32_t>::max();
    if (!j.is_number_unsigned() || j.get<uint64_t>() > kMax) {
      return Expected(j, pointer, "an integer in [0, " + std::to_string(kMax) + "]");
    }
    return static_cast<uint32_t>(j.get<uint64_t>());
  }

  // One of `values`, spelled as `name` spells them.
  template <typename E>
  Result<E> Enum(const Json& j, const std::string& pointer, std::initializer_list<E> values,
                 std::string_view (*name)(E)) const {
    ARGUS_ASSIGN_OR_RETURN(std::string s, String(j, pointer));
    for (E value : values) {
      if (name(value) == s) return value;
    }
    return Error(pointer, "'" + s + "' is not one of: " + JoinNames(values, [&](E e) {
                            return std::string(name(e));
                          }));
  }

 private:
  Status Expected(const Json& j, const std::string& pointer, std::string_view what) const {
    std::string got = j.is_number() ? j.dump() : std::string(j.type_name());
    return Error(pointer, "expected " + std::string(what) + ", got " + got);
  }

  // RFC 6901: '~' and '/' in a key are written ~0 and ~1.
  static std::string Escape(const std::string& key) {
    std::string s;
    for (char c : key) {
      if (c == '~') {
        s += "~0";
      } else if (c == '/') {
        s += "~1";
      } else {
        s += c;
      }
    }
    return s;
  }

  std::string source_;
};

Result<LadderState> ParseState(const Reader& r, const Json& j, const std::string& at) {
  ARGUS_RETURN_IF_ERROR(r.Object(j, at, {"k", "v", "tier"}));
  LadderState state;
  if (auto it = j.find("tier"); it != j.end()) {
    ARGUS_ASSIGN_OR_RETURN(state.tier, r.Enum(*it, at + "/tier", kTiers, &TierName));
  }
  for (const char* key : {"k", "v"}) {
    std::string field = at + "/" + key;
    auto it = j.find(key);
    if (state.tier == TierKind::kDisk) {
      // A disk state holds the master, in the best state's codecs: codecs here would mislead.
      if (it != j.end())
        return r.Error(field, "a disk state takes no codecs (it holds the master)");
      continue;
    }
    if (it == j.end()) return r.Error(field, "is required for a RAM state");
    ARGUS_ASSIGN_OR_RETURN(std::string spec, r.String(*it, field));
    (key[0] == 'k' ? state.k_codec : state.v_codec) = std::move(spec);
  }
  return state;
}

Result<LayerOverride> ParseOverride(const Reader& r, const Json& j, const std::string& at) {
  ARGUS_RETURN_IF_ERROR(r.Object(j, at, {"layers", "max_state"}));
  LayerOverride o;
  auto layers = j.find("layers");
  if (layers == j.end()) return r.Error(at + "/layers", "is required");
  if (!layers->is_array()) {
    return r.Error(at + "/layers", std::string("expected an array, got ") + layers->type_name());
  }
  for (size_t i = 0; i < layers->size(); ++i) {
    ARGUS_ASSIGN_OR_RETURN(uint32_t layer,
                           r.Uint32((*layers)[i], at + "/layers/" + std::to_string(i)));
    o.layers.push_back(layer);
  }
  auto max_state = j.find("max_state");
  if (max_state == j.end()) return r.Error(at + "/max_state", "is required");
  ARGUS_ASSIGN_OR_RETURN(o.max_state, r.Uint32(*max_state, at + "/max_state"));
  return o;
}

// An array field: each element parsed by `parse(reader, element, pointer)`.
template <typename T, typename Parse>
Result<std::vector<T>> ParseArray(const Reader& r, const Json& j, const std::string& at,
                                  Parse parse) {
  if (!j.is_array()) return r.Error(at, std::string("expected an array, got ") + j.type_name());
  std::vector<T> out;
  for (size_t i = 0; i < j.size(); ++i) {
    ARGUS_ASSIGN_OR_RETURN(T item, parse(r, j[i], at + "/" + std::to_string(i)));
    out.push_back(std::move(item));
  }
  return out;
}

Result<Profile> ParseProfile(const Reader& r, const Json& j) {
  ARGUS_RETURN_IF_ERROR(
      r.Object(j, "",
               {"name", "base", "ladder", "masters", "pins", "layer_overrides", "ranking",
                "promote", "heat_decay", "replan_every", "promote_mass", "epsilon", "activation"}));
  Profile p;
  auto base = j.find("base");
  if (base != j.end()) {
    ARGUS_ASSIGN_OR_RETURN(std::string base_name, r.String(*base, "/base"));
    auto built_in = Profile::BuiltIn(base_name);
    if (!built_in.ok()) return r.Error("/base", built_in.status().message());
    p = std::move(built_in).value();
  } else if (!j.contains("ladder")) {
    return r.Error("/ladder", "is required when no base is given");
  }
  auto name = j.find("name");
  if (name == j.end()) return r.Error("/name", "is required");
  ARGUS_ASSIGN_OR_RETURN(p.name, r.String(*name, "/name"));

  if (auto it = j.find("ladder"); it != j.end()) {
    ARGUS_ASSIGN_OR_RETURN(p.ladder, ParseArray<LadderState>(r, *it, "/ladder", ParseState));
  }
  if (auto it = j.find("masters"); it != j.end()) {
    ARGUS_ASSIGN_OR_RETURN(p.masters, r.Enum(*it, "/masters", kMasterRules, &MasterRuleName));
  }
  if (auto it = j.find("pins"); it != j.end()) {
    ARGUS_RETURN_IF_ERROR(r.Object(*it, "/pins", {"sinks", "recent"}));
    if (auto f = it->find("sinks"); f != it->end()) {
      ARGUS_ASSIGN_OR_RETURN(p.pin_sinks, r.Uint32(*f, "/pins/sinks"));
    }
    if (auto f = it->find("recent"); f != it->end()) {
      ARGUS_ASSIGN_OR_RETURN(p.pin_recent, r.Uint32(*f, "/pins/recent"));
    }
  }
  if (auto it = j.find("layer_overrides"); it != j.end()) {
    ARGUS_ASSIGN_OR_RETURN(p.layer_overrides,
                           ParseArray<LayerOverride>(r, *it, "/layer_overrides", ParseOverride));
  }
  if (auto it = j.find("ranking"); it != j.end()) {
    ARGUS_ASSIGN_OR_RETURN(p.ranking, r.Enum(*it, "/ranking", kRankings, &RankingName));
  }
  if (auto it = j.find("promote"); it != j.end()) {
    ARGUS_ASSIGN_OR_RETURN(p.promote, r.Bool(*it, "/promote"));
  }
  if (auto it = j.find("replan_every"); it != j.end()) {
    ARGUS_ASSIGN_OR_RETURN(p.replan_every, r.Uint32(*it, "/replan_every"));
  }
  for (auto [key, field] : {std::pair{"heat_decay", &Profile::heat_decay},
                            std::pair{"promote_mass", &Profile::promote_mass},
                            std::pair{"epsilon", &Profile::epsilon}}) {
    if (auto it = j.find(key); it != j.end()) {
      ARGUS_ASSIGN_OR_RETURN(p.*field, r.Number(*it, std::string("/") + key));
    }
  }
  if (auto it = j.find("activation"); it != j.end()) {
    ARGUS_RETURN_IF_ERROR(r.Object(*it, "/activation", {"activate", "deactivate"}));
    if (auto f = it->find("activate"); f != it->end()) {
      ARGUS_ASSIGN_OR_RETURN(p.activate_ratio, r.Number(*f, "/activation/activate"));
    }
    if (auto f = it->find("deactivate"); f != it->end()) {
      ARGUS_ASSIGN_OR_RETURN(p.deactivate_ratio, r.Number(*f, "/activation/deactivate"));
    }
  }
  return p;
}

}  // namespace

Result<Profile> Profile::BuiltIn(std::string_view name) {
  for (Profile& p : BuiltIns()) {
    if (p.name == name) return std::move(p);
  }
  return Status::InvalidArgument("profile '" + std::string(name) + "' is not built in (known: " +
                                 JoinNames(BuiltInNames(), [](const std::string& s) { return s; }) +
                                 ")");
}

std::vector<std::string> Profile::BuiltInNames() {
  std::vector<std::string> names;
  for (const Profile& p : BuiltIns()) names.push_back(p.name);
  return names;
}

Result<Profile> Profile::FromJson(std::string_view json, std::string_view source) {
  Reader reader(source);
  // what() is "[json.exception.<kind>.<id>] <detail>"; the detail is what a reader needs.
  auto invalid = [&](const Json::exception& e, const std::string& where) {
    std::string what = e.what();
    size_t at = what.find("] ");
    return Status::InvalidArgument("profile " + std::string(source) + ": not valid JSON" + where +
                                   ": " + (at == std::string::npos ? what : what.substr(at + 2)));
  };
  Json j;
  try {
    j = Json::parse(json);
  } catch (const Json::parse_error& e) {
    return invalid(e, " at byte " + std::to_string(e.byte));
  } catch (const Json::exception& e) {  // a number too large for a double: out_of_range.406
    return invalid(e, "");
  }
  ARGUS_ASSIGN_OR_RETURN(Profile p, ParseProfile(reader, j));
  ARGUS_RETURN_IF_ERROR(CheckProfile(p).WithContext("profile " + std::string(source)));
  return p;
}

Result<Profile> Profile::Load(std::string_view name_or_path) {
  std::vector<std::string> names = BuiltInNames();
  for (const std::string& name : names) {
    if (name == name_or_path) return BuiltIn(name);
  }
  std::string path(name_or_path);
  auto bytes = ReadFileBytes(path);
  if (!bytes.ok()) {
    return Status(bytes.status().code(),
                  "profile '" + path + "' is not built in (known: " +
                      JoinNames(names, [](const std::string& s) { return s; }) +
                      ") and cannot be read: " + bytes.status().message());
  }
  return FromJson(std::string_view(reinterpret_cast<const char*>(bytes->data()), bytes->size()),
                  path);
}

std::string Profile::ToJson() const {
  // Insertion order keeps the file in the order docs/profiles.md describes it.
  nlohmann::ordered_json j;
  j["name"] = name;
  nlohmann::ordered_json ladder_json = nlohmann::ordered_json::array();
  for (const LadderState& state : ladder) {
    nlohmann::ordered_json s;
    if (state.tier == TierKind::kRam) {
      s["k"] = state.k_codec;
      s["v"] = state.v_codec;
    }
    s["tier"] = TierName(state.tier);
    ladder_json.push_back(std::move(s));
  }
  j["ladder"] = std::move(ladder_json);
  j["masters"] = MasterRuleName(masters);
  j["pins"] = {{"sinks", pin_sinks}, {"recent", pin_recent}};
  nlohmann::ordered_json overrides = nlohmann::ordered_json::array();
  for (const LayerOverride& o : layer_overrides) {
    overrides.push_back({{"layers", o.layers}, {"max_state", o.max_state}});
  }
  j["layer_overrides"] = std::move(overrides);
  j["ranking"] = RankingName(ranking);
  j["promote"] = promote;
  j["heat_decay"] = heat_decay;
  j["replan_every"] = replan_every;
  j["promote_mass"] = promote_mass;
  j["epsilon"] = epsilon;
  j["activation"] = {{"activate", activate_ratio}, {"deactivate", deactivate_ratio}};
  // Names and specs come from callers: replace invalid UTF-8 rather than throw.
  return j.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
}

Status Profile::Validate() const { return CheckProfile(*this).WithContext("profile " + name); }

bool Profile::NeedsDisk() const {
  return masters != MasterRule::kNever ||
         std::any_of(ladder.begin(), ladder.end(),
                     [](const LadderState& s) { return s.tier == TierKind::kDisk; });
}

}  // namespace argus

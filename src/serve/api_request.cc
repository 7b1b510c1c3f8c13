// Request bodies of the Anthropic Messages and OpenAI chat/completions APIs, read into a
// GenerationRequest. Nothing here throws on bad input: the JSON is parsed without exceptions and
// every value's type is checked before it is read. The first problem found becomes the API's
// invalid_request error, worded "field: what was wrong" like the APIs' own messages.
#include <algorithm>
#include <charconv>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "serve/api.h"

namespace argus::serve {
namespace {

using nlohmann::json;

constexpr uint64_t kMaxU32 = std::numeric_limits<uint32_t>::max();
// OpenAI's max_tokens when a request gives none: chat generates until the model's context ends
// (here: the server's limit, or this when there is none); completions default to 16.
constexpr uint32_t kOpenAiChatUnlimitedMaxTokens = 256;
constexpr uint32_t kOpenAiCompletionDefaultMaxTokens = 16;
constexpr size_t kOpenAiMaxStop = 4;

std::string Concat(std::initializer_list<std::string_view> parts) {
  std::string out;
  for (std::string_view p : parts) out += p;
  return out;
}

std::string NumberText(double v) {
  char buf[32];
  const auto end = std::to_chars(buf, buf + sizeof(buf), v).ptr;
  return std::string(buf, end);
}

std::string NumberText(uint64_t v) {
  char buf[24];
  const auto end = std::to_chars(buf, buf + sizeof(buf), v).ptr;
  return std::string(buf, end);
}

// ---- where a body fails to parse ---------------------------------------------------------------

// Replays a body that failed to parse through nlohmann's SAX interface to learn which field the
// parser was in when it stopped: invalid UTF-8 is reported inside a string, and the client needs
// the field's name ("messages[2].content") rather than only a byte offset.
class ParseErrorLocator : public nlohmann::json_sax<json> {
 public:
  bool null() override { return ValueDone(); }
  bool boolean(bool) override { return ValueDone(); }
  bool number_integer(number_integer_t) override { return ValueDone(); }
  bool number_unsigned(number_unsigned_t) override { return ValueDone(); }
  bool number_float(number_float_t, const string_t&) override { return ValueDone(); }
  bool string(string_t&) override { return ValueDone(); }
  bool binary(binary_t&) override { return ValueDone(); }
  bool start_object(std::size_t) override { return Open(false); }
  bool start_array(std::size_t) override { return Open(true); }
  bool end_object() override { return Close(); }
  bool end_array() override { return Close(); }
  bool key(string_t& k) override {
    if (!frames_.empty()) frames_.back().key = k;
    return true;
  }
  bool parse_error(std::size_t position, const std::string&,
                   const nlohmann::detail::exception& e) override {
    position_ = position;
    what_ = e.what();
    return false;
  }

  // Where the error is: "messages[2].content", empty at the top level.
  std::string Path() const {
    std::string path;
    for (const Frame& f : frames_) {
      if (f.is_array) {
        path += "[" + NumberText(uint64_t{f.n_elements}) + "]";
      } else if (!f.key.empty()) {
        path += (path.empty() ? "" : ".") + f.key;
      }
    }
    return path;
  }
  size_t position() const { return position_; }  // nlohmann's count: the bad byte's offset + 1
  const std::string& what() const { return what_; }

 private:
  struct Frame {
    bool is_array = false;
    size_t n_elements = 0;  // an array's completed elements: the index of the one being read
    std::string key;        // an object's key whose value is being read, empty between members
  };
  bool ValueDone() {
    if (frames_.empty()) return true;
    Frame& f = frames_.back();
    if (f.is_array) {
      ++f.n_elements;
    } else {
      f.key.clear();
    }
    return true;
  }
  bool Open(bool is_array) {
    frames_.push_back({is_array, 0, {}});
    return true;
  }
  bool Close() {
    if (!frames_.empty()) frames_.pop_back();
    return ValueDone();
  }

  std::vector<Frame> frames_;
  size_t position_ = 0;
  std::string what_;
};

// nlohmann's message reads "[json.exception.parse_error.101] parse error at line 1, column 5:
// syntax error while parsing value - <reason>; last read: '<bytes>'": keep the reason, drop the
// bytes read (they may be the invalid ones).
std::string ParseErrorReason(const std::string& what) {
  size_t begin = what.find(" - ");
  if (begin != std::string::npos) {
    begin += 3;
  } else {  // other errors ("[json.exception.out_of_range.406] number overflow parsing '1e999'")
    begin = what.find("] ");
    begin = begin == std::string::npos ? 0 : begin + 2;
  }
  const size_t end = what.find("; last read:", begin);
  return what.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
}

std::string DescribeParseError(std::string_view body) {
  ParseErrorLocator locator;
  json::sax_parse(body.begin(), body.end(), &locator);
  const size_t offset = locator.position() > 0 ? locator.position() - 1 : 0;
  const std::string at_byte = "byte " + NumberText(uint64_t{offset});
  if (offset >= body.size()) return "unexpected end of JSON at " + at_byte;
  const std::string path = locator.Path();
  const std::string field = path.empty() ? "request body" : path;
  const std::string reason = ParseErrorReason(locator.what());
  if (reason.find("UTF-8") != std::string::npos) {
    return Concat({field, ": text is not valid UTF-8 (", at_byte, ")"});
  }
  return Concat({"invalid JSON at ", at_byte, path.empty() ? "" : " in ", path, ": ", reason});
}

// ---- reading fields -------------------------------------------------------------------------

// A member of an object, or nullptr when it is absent or null (clients send null for "unset").
const json* Member(const json& object, std::string_view key) {
  if (!object.is_object()) return nullptr;
  const auto it = object.find(std::string(key));
  return it == object.end() || it->is_null() ? nullptr : &*it;
}

// The roles an API accepts in `messages`, each with the role it renders as.
struct AcceptedRole {
  std::string_view name, renders_as;
};
constexpr AcceptedRole kAnthropicRoles[] = {{"user", "user"}, {"assistant", "assistant"}};
// "developer" is OpenAI's newer name for the system role.
constexpr AcceptedRole kOpenAiRoles[] = {
    {"system", "system"}, {"developer", "system"}, {"user", "user"}, {"assistant", "assistant"}};

// Reads the values of one request, keeping the first problem. Each reader takes a value (nullptr:
// absent, and then it reads nothing) and the name of the field it came from.
class FieldReader {
 public:
  bool ok() const { return !problem_; }
  const std::string& problem() const { return *problem_; }

  void Fail(std::string_view field, std::string_view what) {
    if (!problem_) problem_ = Concat({field, ": ", what});
  }
  void Require(const json* v, std::string_view field) {
    if (v == nullptr) Fail(field, "field required");
  }

  void String(const json* v, std::string_view field, std::string* out) {
    if (v == nullptr) return;
    if (const auto* s = v->get_ptr<const std::string*>()) {
      *out = *s;
    } else {
      Fail(field, "expected a string");
    }
  }

  void Bool(const json* v, std::string_view field, bool* out) {
    if (v == nullptr) return;
    if (const auto* b = v->get_ptr<const bool*>()) {
      *out = *b;
    } else {
      Fail(field, "expected true or false");
    }
  }

  // A number in [lo, hi].
  void Real(const json* v, std::string_view field, double lo, double hi, float* out) {
    if (v == nullptr) return;
    if (!v->is_number() || !(v->get<double>() >= lo && v->get<double>() <= hi)) {
      return Fail(field,
                  Concat({"must be a number from ", NumberText(lo), " to ", NumberText(hi)}));
    }
    *out = static_cast<float>(v->get<double>());
  }

  // An integer in [lo, hi] (hi at most UINT32_MAX).
  void Count(const json* v, std::string_view field, uint64_t lo, uint64_t hi, uint32_t* out) {
    if (v == nullptr) return;
    if (!v->is_number_unsigned() || v->get<uint64_t>() < lo) {
      return Fail(field, "must be an integer of at least " + NumberText(lo));
    }
    const uint64_t x = v->get<uint64_t>();
    if (x > hi) {
      return Fail(field, Concat({NumberText(x), " > ", NumberText(hi), ", the maximum allowed"}));
    }
    *out = static_cast<uint32_t>(x);
  }

  // Any integer; a negative one keeps its two's-complement bits.
  void Seed(const json* v, std::string_view field, std::optional<uint64_t>* out) {
    if (v == nullptr) return;
    if (v->is_number_unsigned()) {
      *out = v->get<uint64_t>();
    } else if (v->is_number_integer()) {
      *out = static_cast<uint64_t>(v->get<int64_t>());
    } else {
      Fail(field, "expected an integer");
    }
  }

  // A string, or an array of text blocks {"type":"text","text":...} whose texts are joined.
  void Text(const json* v, std::string_view field, std::string* out) {
    if (v == nullptr) return;
    if (const auto* s = v->get_ptr<const std::string*>()) {
      *out = *s;
      return;
    }
    if (!v->is_array()) return Fail(field, "expected a string or an array of text blocks");
    out->clear();
    for (size_t i = 0; i < v->size() && ok(); ++i) {
      TextBlock((*v)[i], Concat({field, "[", NumberText(uint64_t{i}), "]"}), out);
    }
  }

  // Stop sequences: an array of non-empty strings, at most `max`; a lone string when
  // `string_allowed` (OpenAI's stop).
  void StopSequences(const json* v, std::string_view field, bool string_allowed, size_t max,
                     std::vector<std::string>* out) {
    if (v == nullptr) return;
    out->clear();
    if (string_allowed && v->is_string()) return StopSequence(*v, field, out);
    if (!v->is_array()) {
      return Fail(field, string_allowed ? "expected a string or an array of strings"
                                        : "expected an array of strings");
    }
    if (v->size() > max) {
      return Fail(field, Concat({"at most ", NumberText(uint64_t{max}), " allowed (got ",
                                 NumberText(uint64_t{v->size()}), ")"}));
    }
    for (size_t i = 0; i < v->size() && ok(); ++i) {
      StopSequence((*v)[i], Concat({field, "[", NumberText(uint64_t{i}), "]"}), out);
    }
  }

  // A non-empty array of {role, content}; a role renders as its `roles` entry says. OpenAI lets
  // an assistant message have null content (it then carried tool calls): read as empty text.
  void Messages(const json* v, std::string_view field, std::span<const AcceptedRole> roles,
                bool assistant_content_optional, std::vector<ChatMessage>* out) {
    if (v == nullptr) return;
    if (!v->is_array() || v->empty()) {
      return Fail(field, "expected a non-empty array of messages");
    }
    for (size_t i = 0; i < v->size() && ok(); ++i) {
      const std::string name = Concat({field, "[", NumberText(uint64_t{i}), "]"});
      const json& m = (*v)[i];
      if (!m.is_object()) return Fail(name, "expected an object with role and content");
      ChatMessage message;
      Role(Member(m, "role"), name + ".role", roles, &message.role);
      const json* content = Member(m, "content");
      if (!(assistant_content_optional && message.role == "assistant")) {
        Require(content, name + ".content");
      }
      Text(content, name + ".content", &message.text);
      out->push_back(std::move(message));
    }
  }

 private:
  void TextBlock(const json& block, const std::string& field, std::string* out) {
    if (!block.is_object())
      return Fail(field, R"(expected a text block {"type":"text","text":...})");
    std::string type, text;
    const json* type_value = Member(block, "type");
    Require(type_value, field + ".type");
    String(type_value, field + ".type", &type);
    if (ok() && type != "text") {
      return Fail(field + ".type",
                  Concat({R"(only "text" blocks are supported (got ")", type, R"("))"}));
    }
    const json* text_value = Member(block, "text");
    Require(text_value, field + ".text");
    String(text_value, field + ".text", &text);
    *out += text;
  }

  void StopSequence(const json& v, std::string_view field, std::vector<std::string>* out) {
    std::string s;
    String(&v, field, &s);
    if (ok() && s.empty()) return Fail(field, "must not be empty");
    out->push_back(std::move(s));
  }

  void Role(const json* v, const std::string& field, std::span<const AcceptedRole> roles,
            std::string* out) {
    Require(v, field);
    std::string role;
    String(v, field, &role);
    if (!ok()) return;
    std::string expected;
    for (const AcceptedRole& r : roles) {
      if (r.name == role) {
        *out = r.renders_as;
        return;
      }
      expected += Concat({expected.empty() ? "" : ", ", "\"", r.name, "\""});
    }
    Fail(field, Concat({"expected one of ", expected, " (got \"", role, "\")"}));
  }

  std::optional<std::string> problem_;
};

// The body as a JSON object; on failure a discarded value and `problem` saying why.
json ParseBody(std::string_view body, std::string* problem) {
  json parsed = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) {
    *problem = DescribeParseError(body);
  } else if (!parsed.is_object()) {
    *problem = "request body: expected a JSON object";
  }
  return parsed;
}

// The largest max_tokens a request may ask for.
uint64_t MaxTokensCap(const ParseLimits& limits) {
  return limits.max_tokens_limit == 0 ? kMaxU32 : limits.max_tokens_limit;
}

// model, system and messages: the part of a Messages body that count_tokens reads too.
void ReadAnthropicConversation(const json& body, FieldReader& reader, GenerationRequest& r) {
  const json* model = Member(body, "model");
  reader.Require(model, "model");
  reader.String(model, "model", &r.model);
  std::string system;
  reader.Text(Member(body, "system"), "system", &system);
  if (!system.empty()) r.messages.push_back({"system", std::move(system)});
  const json* messages = Member(body, "messages");
  reader.Require(messages, "messages");
  reader.Messages(messages, "messages", kAnthropicRoles, false, &r.messages);
}

// temperature (0..max_temperature), top_p, top_k, stream.
void ReadSampling(const json& body, double max_temperature, FieldReader& reader,
                  GenerationRequest& r) {
  reader.Real(Member(body, "temperature"), "temperature", 0.0, max_temperature, &r.temperature);
  reader.Real(Member(body, "top_p"), "top_p", 0.0, 1.0, &r.top_p);
  reader.Count(Member(body, "top_k"), "top_k", 0, kMaxU32, &r.top_k);
  reader.Bool(Member(body, "stream"), "stream", &r.stream);
}

// The OpenAI fields chat and completions share: model, sampling, stop, seed, n.
void ReadOpenAiCommon(const json& body, const ParseLimits& limits, FieldReader& reader,
                      GenerationRequest& r) {
  const json* model = Member(body, "model");
  reader.Require(model, "model");
  reader.String(model, "model", &r.model);
  ReadSampling(body, 2.0, reader, r);
  reader.StopSequences(Member(body, "stop"), "stop", true,
                       std::min(kOpenAiMaxStop, size_t{limits.max_stop_sequences}), &r.stop);
  reader.Seed(Member(body, "seed"), "seed", &r.seed);
  if (const json* options = Member(body, "stream_options")) {
    if (!r.stream) {
      reader.Fail("stream_options", "only allowed when stream is true");
    } else if (!options->is_object()) {
      reader.Fail("stream_options", "expected an object");
    } else {
      reader.Bool(Member(*options, "include_usage"), "stream_options.include_usage",
                  &r.include_usage);
    }
  }
  const json* n = Member(body, "n");
  if (n != nullptr && !(n->is_number_unsigned() && n->get<uint64_t>() == 1)) {
    reader.Fail("n", "only 1 is supported");
  }
}

// max_tokens, or its newer name max_completion_tokens (which wins when both are given).
void ReadOpenAiMaxTokens(const json& body, const ParseLimits& limits, FieldReader& reader,
                         GenerationRequest& r) {
  if (limits.max_tokens_limit == 0) {
    r.max_tokens = r.api == ApiKind::kOpenAiChat ? kOpenAiChatUnlimitedMaxTokens
                                                 : kOpenAiCompletionDefaultMaxTokens;
  } else {
    r.max_tokens = r.api == ApiKind::kOpenAiChat
                       ? limits.max_tokens_limit
                       : std::min(kOpenAiCompletionDefaultMaxTokens, limits.max_tokens_limit);
  }
  reader.Count(Member(body, "max_tokens"), "max_tokens", 1, MaxTokensCap(limits), &r.max_tokens);
  reader.Count(Member(body, "max_completion_tokens"), "max_completion_tokens", 1,
               MaxTokensCap(limits), &r.max_tokens);
}

// One prompt: a string, or an array holding one string (arrays of token ids are not read).
void ReadOpenAiPrompt(const json& body, FieldReader& reader, GenerationRequest& r) {
  const json* prompt = Member(body, "prompt");
  reader.Require(prompt, "prompt");
  if (prompt != nullptr && prompt->is_array() && prompt->size() == 1) prompt = &(*prompt)[0];
  if (prompt != nullptr && !prompt->is_string()) {
    reader.Fail("prompt", "expected a string or an array of one string");
  }
  reader.String(prompt, "prompt", &r.prompt);
}

// Parses `body` and reads it with `read(body, reader, request)`.
template <typename ReadFields>
std::variant<GenerationRequest, ApiError> Parse(ApiKind api, std::string_view body,
                                                ReadFields read) {
  std::string problem;
  const json j = ParseBody(body, &problem);
  if (!problem.empty()) return MakeError(api, ErrorKind::kInvalidRequest, problem);
  FieldReader reader;
  GenerationRequest r;
  r.api = api;
  read(j, reader, r);
  if (!reader.ok()) return MakeError(api, ErrorKind::kInvalidRequest, reader.problem());
  return r;
}

}  // namespace

std::variant<GenerationRequest, ApiError> ParseAnthropicMessages(std::string_view body,
                                                                 const ParseLimits& limits) {
  return Parse(ApiKind::kAnthropicMessages, body,
               [&](const json& j, FieldReader& reader, GenerationRequest& r) {
                 ReadAnthropicConversation(j, reader, r);
                 const json* max_tokens = Member(j, "max_tokens");
                 reader.Require(max_tokens, "max_tokens");
                 reader.Count(max_tokens, "max_tokens", 1, MaxTokensCap(limits), &r.max_tokens);
                 ReadSampling(j, 1.0, reader, r);
                 reader.StopSequences(Member(j, "stop_sequences"), "stop_sequences", false,
                                      limits.max_stop_sequences, &r.stop);
               });
}

// count_tokens reads the conversation only: a Messages body's other fields are ignored.
std::variant<GenerationRequest, ApiError> ParseAnthropicCountTokens(std::string_view body) {
  return Parse(ApiKind::kAnthropicMessages, body, ReadAnthropicConversation);
}

std::variant<GenerationRequest, ApiError> ParseOpenAiChat(std::string_view body,
                                                          const ParseLimits& limits) {
  return Parse(ApiKind::kOpenAiChat, body,
               [&](const json& j, FieldReader& reader, GenerationRequest& r) {
                 ReadOpenAiCommon(j, limits, reader, r);
                 const json* messages = Member(j, "messages");
                 reader.Require(messages, "messages");
                 reader.Messages(messages, "messages", kOpenAiRoles, true, &r.messages);
                 ReadOpenAiMaxTokens(j, limits, reader, r);
               });
}

std::variant<GenerationRequest, ApiError> ParseOpenAiCompletion(std::string_view body,
                                                                const ParseLimits& limits) {
  return Parse(ApiKind::kOpenAiCompletion, body,
               [&](const json& j, FieldReader& reader, GenerationRequest& r) {
                 ReadOpenAiCommon(j, limits, reader, r);
                 ReadOpenAiPrompt(j, reader, r);
                 ReadOpenAiMaxTokens(j, limits, reader, r);
               });
}

}  // namespace argus::serve

// Response bodies and server-sent events in the shapes of Anthropic's Messages API (the Message
// object, the streaming events, the error object) and OpenAI's chat.completion,
// chat.completion.chunk and text_completion objects. Objects keep their keys in the documented
// order (ordered_json) so that bodies read like the APIs' own, and every dump replaces invalid
// UTF-8 (a model name from the command line, say) instead of throwing.
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "serve/api.h"

namespace argus::serve {
namespace {

using Json = nlohmann::ordered_json;

std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

bool IsAnthropic(ApiKind api) { return api == ApiKind::kAnthropicMessages; }

// ---- errors ----------------------------------------------------------------------------------

struct ErrorShape {
  int anthropic_status;
  std::string_view anthropic_type;
  int openai_status;
  std::string_view openai_type, openai_code;  // an empty code is written as null
};

// Anthropic's types and statuses are those of its "Errors" page; OpenAI reports most client
// errors as invalid_request_error (a bad key with code invalid_api_key) and its own failures as
// server_error.
ErrorShape ShapeOf(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidRequest:
      return {400, "invalid_request_error", 400, "invalid_request_error", ""};
    case ErrorKind::kAuthentication:
      return {401, "authentication_error", 401, "invalid_request_error", "invalid_api_key"};
    case ErrorKind::kNotFound:
      return {404, "not_found_error", 404, "invalid_request_error", ""};
    case ErrorKind::kRequestTooLarge:
      return {413, "request_too_large", 413, "invalid_request_error", ""};
    case ErrorKind::kOverloaded:
      return {529, "overloaded_error", 503, "server_error", ""};
    case ErrorKind::kTimeout:
      return {504, "api_error", 504, "server_error", "timeout"};
    case ErrorKind::kInternal:
      break;
  }
  return {500, "api_error", 500, "server_error", ""};
}

Json ErrorObject(ApiKind api, const ErrorShape& shape, std::string_view message) {
  if (IsAnthropic(api)) {
    return {{"type", "error"}, {"error", {{"type", shape.anthropic_type}, {"message", message}}}};
  }
  const Json code = shape.openai_code.empty() ? Json(nullptr) : Json(shape.openai_code);
  return {
      {"error",
       {{"message", message}, {"type", shape.openai_type}, {"param", nullptr}, {"code", code}}}};
}

ApiError ErrorIn(ApiKind api, const ErrorShape& shape, std::string_view message) {
  return {IsAnthropic(api) ? shape.anthropic_status : shape.openai_status,
          Dump(ErrorObject(api, shape, message))};
}

// ---- completions -----------------------------------------------------------------------------

std::string_view AnthropicStopReason(StopReason reason) {
  switch (reason) {
    case StopReason::kMaxTokens:
      return "max_tokens";
    case StopReason::kStopSequence:
      return "stop_sequence";
    case StopReason::kEndTurn:
      break;
  }
  return "end_turn";
}

// OpenAI's finish_reason: "length" at max_tokens, "stop" for an end of turn or a stop sequence.
std::string_view OpenAiFinishReason(StopReason reason) {
  return reason == StopReason::kMaxTokens ? "length" : "stop";
}

// Anthropic's stop_sequence: the one that matched, else null.
Json StopSequenceOf(const Completion& c) {
  return c.stop_reason == StopReason::kStopSequence ? Json(c.stop_sequence) : Json(nullptr);
}

// The Message object; `content` is empty (and stop_reason null) in message_start.
Json AnthropicMessage(const Completion& c, Json content, Json stop_reason, Json stop_sequence) {
  return {{"id", c.id},
          {"type", "message"},
          {"role", "assistant"},
          {"model", c.model},
          {"content", std::move(content)},
          {"stop_reason", std::move(stop_reason)},
          {"stop_sequence", std::move(stop_sequence)},
          {"usage", {{"input_tokens", c.input_tokens}, {"output_tokens", c.output_tokens}}}};
}

Json OpenAiUsage(const Completion& c) {
  return {{"prompt_tokens", c.input_tokens},
          {"completion_tokens", c.output_tokens},
          {"total_tokens", uint64_t{c.input_tokens} + c.output_tokens}};
}

// What every OpenAI object starts with; `object` is chat.completion, chat.completion.chunk or
// text_completion; `choices` an array (of one choice, or none in a usage chunk).
Json OpenAiObject(const Completion& c, std::string_view object, Json choices) {
  return {{"id", c.id},
          {"object", object},
          {"created", c.created},
          {"model", c.model},
          {"choices", std::move(choices)}};
}

// The object of a streamed chunk of the API.
std::string_view ChunkObject(ApiKind api) {
  return api == ApiKind::kOpenAiCompletion ? "text_completion" : "chat.completion.chunk";
}

// A choice of a chat.completion ("message") or chat.completion.chunk ("delta").
Json ChatChoice(std::string_view message_key, Json message, Json finish_reason) {
  return {{"index", 0},
          {message_key, std::move(message)},
          {"logprobs", nullptr},
          {"finish_reason", std::move(finish_reason)}};
}

// A choice of a text_completion, streamed or not.
Json TextChoice(std::string_view text, Json finish_reason) {
  return {{"text", text},
          {"index", 0},
          {"logprobs", nullptr},
          {"finish_reason", std::move(finish_reason)}};
}

// ---- server-sent events ----------------------------------------------------------------------

// An Anthropic event: its name, and data whose "type" repeats the name.
std::string NamedEvent(std::string_view name, const Json& data) {
  std::string out = "event: ";
  out += name;
  out += "\ndata: " + Dump(data) + "\n\n";
  return out;
}

std::string DataEvent(const Json& data) { return "data: " + Dump(data) + "\n\n"; }

// The OpenAI chunk of a stream: chat.completion.chunk with a delta, or text_completion with text.
std::string OpenAiChunk(ApiKind api, const Completion& c, std::string_view text,
                        Json finish_reason) {
  Json choice;
  if (api == ApiKind::kOpenAiCompletion) {
    choice = TextChoice(text, std::move(finish_reason));
  } else {
    Json delta = text.empty() ? Json::object() : Json{{"content", text}};
    choice = ChatChoice("delta", std::move(delta), std::move(finish_reason));
  }
  return DataEvent(OpenAiObject(c, ChunkObject(api), Json::array({std::move(choice)})));
}

// RFC 3339 in UTC, as Anthropic's created_at.
std::string Rfc3339(int64_t unix_seconds) {
  using namespace std::chrono;
  const sys_seconds t{seconds{unix_seconds}};
  const sys_days day = floor<days>(t);
  const year_month_day date{day};
  const hh_mm_ss time{t - day};
  char buf[96];
  std::snprintf(buf, sizeof(buf), "%04d-%02u-%02uT%02d:%02d:%02dZ", static_cast<int>(date.year()),
                static_cast<unsigned>(date.month()), static_cast<unsigned>(date.day()),
                static_cast<int>(time.hours().count()), static_cast<int>(time.minutes().count()),
                static_cast<int>(time.seconds().count()));
  return buf;
}

}  // namespace

ApiError MakeError(ApiKind api, ErrorKind kind, std::string_view message) {
  return ErrorIn(api, ShapeOf(kind), message);
}

ApiError ModelNotFound(ApiKind api, std::string_view requested, std::string_view served) {
  ErrorShape shape = ShapeOf(ErrorKind::kNotFound);
  if (IsAnthropic(api)) {
    // Anthropic's own message is "model: <name>"; the served name tells the client what to ask.
    std::string message = "model: ";
    message += requested;
    message += " (this server serves ";
    message += served;
    message += ")";
    return ErrorIn(api, shape, message);
  }
  shape.openai_code = "model_not_found";
  std::string message = "The model `";
  message += requested;
  message += "` does not exist or you do not have access to it. This server serves `";
  message += served;
  message += "`.";
  return ErrorIn(api, shape, message);
}

std::string CompletionBody(ApiKind api, const Completion& c) {
  const std::string_view finish = OpenAiFinishReason(c.stop_reason);
  switch (api) {
    case ApiKind::kAnthropicMessages:
      return Dump(AnthropicMessage(c, Json::array({{{"type", "text"}, {"text", c.text}}}),
                                   AnthropicStopReason(c.stop_reason), StopSequenceOf(c)));
    case ApiKind::kOpenAiChat: {
      Json body = OpenAiObject(
          c, "chat.completion",
          Json::array(
              {ChatChoice("message", {{"role", "assistant"}, {"content", c.text}}, finish)}));
      body["usage"] = OpenAiUsage(c);
      return Dump(body);
    }
    case ApiKind::kOpenAiCompletion:
      break;
  }
  Json body = OpenAiObject(c, "text_completion", Json::array({TextChoice(c.text, finish)}));
  body["usage"] = OpenAiUsage(c);
  return Dump(body);
}

std::string CountTokensBody(uint32_t input_tokens) {
  return Dump({{"input_tokens", input_tokens}});
}

std::string ModelsBody(std::string_view model, int64_t created) {
  // One body for both SDKs, which share the path: OpenAI's list {"object":"list","data":[model]}
  // and Anthropic's page {"data":[...],"has_more","first_id","last_id"}; each ignores the
  // other's keys.
  const Json entry = {{"id", model},
                      {"object", "model"},
                      {"created", created},
                      {"owned_by", "argus"},
                      {"type", "model"},
                      {"display_name", model},
                      {"created_at", Rfc3339(created)}};
  return Dump({{"object", "list"},
               {"data", Json::array({entry})},
               {"has_more", false},
               {"first_id", model},
               {"last_id", model}});
}

std::string StreamStart(ApiKind api, const Completion& c) {
  switch (api) {
    case ApiKind::kAnthropicMessages:
      return NamedEvent("message_start",
                        {{"type", "message_start"},
                         {"message", AnthropicMessage(c, Json::array(), nullptr, nullptr)}}) +
             NamedEvent("content_block_start",
                        {{"type", "content_block_start"},
                         {"index", 0},
                         {"content_block", {{"type", "text"}, {"text", ""}}}}) +
             NamedEvent("ping", {{"type", "ping"}});
    case ApiKind::kOpenAiChat:
      return DataEvent(OpenAiObject(
          c, ChunkObject(api),
          Json::array({ChatChoice("delta", {{"role", "assistant"}, {"content", ""}}, nullptr)})));
    case ApiKind::kOpenAiCompletion:
      break;
  }
  return {};  // a completions stream starts with its first text
}

std::string StreamDelta(ApiKind api, const Completion& c, std::string_view text) {
  if (text.empty()) return {};
  if (IsAnthropic(api)) {
    return NamedEvent("content_block_delta", {{"type", "content_block_delta"},
                                              {"index", 0},
                                              {"delta", {{"type", "text_delta"}, {"text", text}}}});
  }
  return OpenAiChunk(api, c, text, nullptr);
}

std::string StreamEnd(ApiKind api, const Completion& c, bool include_usage) {
  if (IsAnthropic(api)) {
    return NamedEvent("content_block_stop", {{"type", "content_block_stop"}, {"index", 0}}) +
           NamedEvent("message_delta", {{"type", "message_delta"},
                                        {"delta",
                                         {{"stop_reason", AnthropicStopReason(c.stop_reason)},
                                          {"stop_sequence", StopSequenceOf(c)}}},
                                        {"usage", {{"output_tokens", c.output_tokens}}}}) +
           NamedEvent("message_stop", {{"type", "message_stop"}});
  }
  std::string events = OpenAiChunk(api, c, "", OpenAiFinishReason(c.stop_reason));
  if (include_usage) {
    Json usage = OpenAiObject(c, ChunkObject(api), Json::array());
    usage["usage"] = OpenAiUsage(c);
    events += DataEvent(usage);
  }
  return events + "data: [DONE]\n\n";
}

std::string StreamError(ApiKind api, ErrorKind kind, std::string_view message) {
  const Json error = ErrorObject(api, ShapeOf(kind), message);
  return IsAnthropic(api) ? NamedEvent("error", error) : DataEvent(error);
}

}  // namespace argus::serve

// The HTTP APIs argus serve speaks, as pure functions from request bodies to a neutral request and
// from a generation's events to response bodies: Anthropic Messages (/v1/messages,
// /v1/messages/count_tokens) and OpenAI-compatible (/v1/chat/completions, /v1/completions,
// /v1/models). No I/O here: the routes (routes.cc) call these, the scheduler generates.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace argus::serve {

// ---- chat templates --------------------------------------------------------------------------

enum class ChatTemplate : uint8_t { kNone, kChatMl, kLlama3, kLlama2 };
std::string_view ChatTemplateName(ChatTemplate t);  // "none", "chatml", "llama3", "llama2"
// nullopt for an unknown name.
std::optional<ChatTemplate> ChatTemplateByName(std::string_view name);
// From the GGUF metadata string tokenizer.chat_template (empty when absent): ChatML when it holds
// "<|im_start|>", Llama 3 for "<|start_header_id|>", Llama 2 for "[INST]", else kNone.
ChatTemplate DetectChatTemplate(std::string_view jinja_source);

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string text;
};
// The prompt text for `messages`, ending where the assistant's reply begins. A last message from
// the assistant is a prefill: it stays open (no end-of-turn marker, no new assistant header) and
// the reply continues it. The Llama templates trim each message's text as theirs do; Llama 2
// puts system text inside the next user turn. kNone: the messages' texts concatenated in order
// with no separators.
std::string RenderPrompt(ChatTemplate t, const std::vector<ChatMessage>& messages);
// Whether the rendered prompt holds control tokens to parse as such (every template but kNone).
inline bool HasSpecialTokens(ChatTemplate t) { return t != ChatTemplate::kNone; }

// ---- requests --------------------------------------------------------------------------------

enum class ApiKind : uint8_t { kAnthropicMessages, kOpenAiChat, kOpenAiCompletion };

struct GenerationRequest {
  ApiKind api = ApiKind::kAnthropicMessages;
  std::string model;
  // Chat APIs: Anthropic's system (its text blocks joined) first, then the messages; OpenAI's in
  // the order given, "developer" read as "system". Text blocks are joined with no separator.
  std::vector<ChatMessage> messages;
  std::string prompt;  // /v1/completions: the raw prompt, no template
  // Anthropic: required. OpenAI chat: max_completion_tokens or max_tokens, else the limit (256
  // when there is none); completions: max_tokens, else 16 (OpenAI's default), at most the limit.
  uint32_t max_tokens = 0;
  float temperature = 1.0f;  // each API's default: 1.0 for both
  float top_p = 1.0f;
  uint32_t top_k = 0;             // 0: no cut (OpenAI has no top_k; read as the common extension)
  std::vector<std::string> stop;  // stop_sequences (Anthropic), stop (OpenAI: string or array)
  bool stream = false;
  // OpenAI's stream_options.include_usage: one more chunk before [DONE], with the usage and no
  // choices.
  bool include_usage = false;
  std::optional<uint64_t> seed;  // OpenAI's seed
};

// An error in the API's shape: the HTTP status and the body.
struct ApiError {
  int status = 400;
  std::string body;
};

struct ParseLimits {
  uint32_t max_tokens_limit = 0;  // max_tokens above this: 400 naming both numbers
  uint32_t max_stop_sequences = 16;
};

// Parses and checks a request body: malformed JSON, wrong types, missing or unknown-valued fields,
// non-UTF-8 text, max_tokens 0 or over the limit get the API's invalid_request error (400) naming
// the field ("messages[2].content: expected a string or an array of text blocks"). Unknown fields
// are ignored, and null reads as absent. The model name is returned as given; the caller checks
// it (ModelNotFound).
std::variant<GenerationRequest, ApiError> ParseAnthropicMessages(std::string_view body,
                                                                 const ParseLimits& limits);
std::variant<GenerationRequest, ApiError> ParseOpenAiChat(std::string_view body,
                                                          const ParseLimits& limits);
std::variant<GenerationRequest, ApiError> ParseOpenAiCompletion(std::string_view body,
                                                                const ParseLimits& limits);
// /v1/messages/count_tokens takes the Messages body without max_tokens.
std::variant<GenerationRequest, ApiError> ParseAnthropicCountTokens(std::string_view body);

// ---- errors in each API's shape --------------------------------------------------------------

enum class ErrorKind : uint8_t {
  kInvalidRequest,   // 400
  kAuthentication,   // 401
  kNotFound,         // 404
  kRequestTooLarge,  // 413
  kOverloaded,       // Anthropic 529, OpenAI 503
  kTimeout,          // 504 (Anthropic api_error, OpenAI timeout)
  kInternal,         // 500
};
// Anthropic: {"type":"error","error":{"type":"invalid_request_error","message":...}}.
// OpenAI: {"error":{"message":...,"type":"invalid_request_error","param":null,"code":...}}.
// Status, Anthropic type, OpenAI type/code by kind: 400 invalid_request_error,
// invalid_request_error/null; 401 authentication_error, invalid_request_error/invalid_api_key;
// 404 not_found_error, invalid_request_error/null (ModelNotFound: code model_not_found); 413
// request_too_large, invalid_request_error/null; overloaded 529 overloaded_error | 503
// server_error/null; 504 api_error, server_error/timeout; 500 api_error, server_error/null.
ApiError MakeError(ApiKind api, ErrorKind kind, std::string_view message);
ApiError ModelNotFound(ApiKind api, std::string_view requested, std::string_view served);

// ---- responses -------------------------------------------------------------------------------

enum class StopReason : uint8_t { kEndTurn, kMaxTokens, kStopSequence };

struct Completion {
  std::string id;       // "msg_…", "chatcmpl-…", "cmpl-…": the caller makes it
  std::string model;    // the served model's name
  int64_t created = 0;  // Unix seconds (OpenAI)
  std::string text;
  StopReason stop_reason = StopReason::kEndTurn;
  std::string stop_sequence;  // the one that matched, for kStopSequence
  uint32_t input_tokens = 0, output_tokens = 0;
};

// The non-streamed response body of the request's API.
std::string CompletionBody(ApiKind api, const Completion& c);
// {"input_tokens": n}
std::string CountTokensBody(uint32_t input_tokens);
// GET /v1/models: the one served model, in one body that both SDKs read: OpenAI's list
// {"object":"list","data":[{"id","object":"model","created","owned_by"}]} and Anthropic's page
// {"data":[{"type":"model","id","display_name","created_at"}],"has_more","first_id","last_id"}.
std::string ModelsBody(std::string_view model, int64_t created);

// Server-sent events of a streamed response: each function returns whole events ("event: …\n"
// "data: …\n\n" for Anthropic, "data: …\n\n" for OpenAI), ready to write. `c` carries the ids,
// model, and counts known at that point. StreamDelta returns "" for empty text.
std::string StreamStart(ApiKind api, const Completion& c);  // message_start, content_block_start,
                                                            // ping | the role chunk (chat; "" for
                                                            // completions)
std::string StreamDelta(ApiKind api, const Completion& c, std::string_view text);
// content_block_stop, message_delta, message_stop | the finish chunk, the usage chunk when
// include_usage (OpenAI), [DONE].
std::string StreamEnd(ApiKind api, const Completion& c, bool include_usage = false);
// An error after the stream began: Anthropic's "event: error", OpenAI's data: {"error":…}.
std::string StreamError(ApiKind api, ErrorKind kind, std::string_view message);

}  // namespace argus::serve

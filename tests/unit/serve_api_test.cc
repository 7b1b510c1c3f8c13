// The HTTP API layer of argus serve: chat templates against the models' published layouts, the
// request parsers on good bodies and on each kind of bad one (status 400 naming the field), the
// response bodies and streamed events parsed back and checked against the documented shapes, and
// TextStream's UTF-8 and stop-sequence hold-back.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include "serve/api.h"
#include "serve/text_stream.h"

namespace argus::serve {
namespace {

using ServeApiJson = nlohmann::json;

constexpr std::string_view kServeApiReplacement = "\xEF\xBF\xBD";  // U+FFFD

ParseLimits ServeApiLimits() {
  ParseLimits limits;
  limits.max_tokens_limit = 4096;
  return limits;
}

GenerationRequest ServeApiMustParse(const std::variant<GenerationRequest, ApiError>& result) {
  if (const auto* error = std::get_if<ApiError>(&result)) {
    ADD_FAILURE() << "status " << error->status << ": " << error->body;
    return {};
  }
  return std::get<GenerationRequest>(result);
}

// Parses a body that must be JSON.
ServeApiJson ServeApiJsonOf(const std::string& body) {
  ServeApiJson j = ServeApiJson::parse(body, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(j.is_discarded()) << body;
  return j;
}

// The message of an error body in the API's shape, after checking that shape.
std::string ServeApiErrorMessage(ApiKind api, const ApiError& error, std::string_view type) {
  ServeApiJson body = ServeApiJsonOf(error.body);
  if (api == ApiKind::kAnthropicMessages) {
    EXPECT_EQ(body.value("type", ""), "error") << error.body;
    EXPECT_EQ(body["error"].value("type", ""), type) << error.body;
    return body["error"].value("message", "");
  }
  EXPECT_EQ(body["error"].value("type", ""), type) << error.body;
  EXPECT_TRUE(body["error"].contains("param") && body["error"]["param"].is_null()) << error.body;
  EXPECT_TRUE(body["error"].contains("code")) << error.body;
  return body["error"].value("message", "");
}

// A 400 invalid_request_error whose message contains `what` (it names the field).
void ServeApiExpectInvalid(ApiKind api, const std::variant<GenerationRequest, ApiError>& result,
                           std::string_view what) {
  const auto* error = std::get_if<ApiError>(&result);
  ASSERT_NE(error, nullptr) << "accepted; expected an error naming " << what;
  EXPECT_EQ(error->status, 400);
  const std::string message = ServeApiErrorMessage(api, *error, "invalid_request_error");
  EXPECT_NE(message.find(what), std::string::npos) << message;
}

struct ServeApiBadBody {
  std::string body;
  std::string message_part;
};

// ---- chat templates --------------------------------------------------------------------------

const std::vector<ChatMessage> kServeApiConversation = {
    {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Bye"}};

TEST(ServeApiTemplate, ChatMlMatchesQwen2Layout) {
  EXPECT_EQ(RenderPrompt(ChatTemplate::kChatMl, kServeApiConversation),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(ServeApiTemplate, Llama3HeadersTrimmedTextsAndNoBeginOfText) {
  std::vector<ChatMessage> messages = kServeApiConversation;
  messages[1].text = "  Hi\n";
  EXPECT_EQ(RenderPrompt(ChatTemplate::kLlama3, messages),
            "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ServeApiTemplate, Llama2SystemInsideFirstTurnAndBosBetweenTurns) {
  EXPECT_EQ(RenderPrompt(ChatTemplate::kLlama2, kServeApiConversation),
            "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello! </s><s>[INST] Bye [/INST]");
  EXPECT_EQ(RenderPrompt(ChatTemplate::kLlama2, {{"user", "Hi"}}), "[INST] Hi [/INST]");
  EXPECT_EQ(RenderPrompt(ChatTemplate::kLlama2, {{"system", "S"}}),
            "[INST] <<SYS>>\nS\n<</SYS>>\n\n [/INST]");
}

TEST(ServeApiTemplate, NoneConcatenatesTexts) {
  EXPECT_EQ(RenderPrompt(ChatTemplate::kNone, kServeApiConversation), "Be brief.HiHello!Bye");
}

TEST(ServeApiTemplate, FinalAssistantMessageIsContinued) {
  const std::vector<ChatMessage> prefill = {{"user", "Count"}, {"assistant", "1, 2,"}};
  EXPECT_EQ(RenderPrompt(ChatTemplate::kChatMl, prefill),
            "<|im_start|>user\nCount<|im_end|>\n<|im_start|>assistant\n1, 2,");
  EXPECT_EQ(RenderPrompt(ChatTemplate::kLlama3, prefill),
            "<|start_header_id|>user<|end_header_id|>\n\nCount<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n1, 2,");
  EXPECT_EQ(RenderPrompt(ChatTemplate::kLlama2, prefill), "[INST] Count [/INST] 1, 2,");
}

TEST(ServeApiTemplate, NamesRoundTripAndDetectionFromJinja) {
  for (ChatTemplate t :
       {ChatTemplate::kNone, ChatTemplate::kChatMl, ChatTemplate::kLlama3, ChatTemplate::kLlama2}) {
    EXPECT_EQ(ChatTemplateByName(ChatTemplateName(t)), t);
    EXPECT_EQ(HasSpecialTokens(t), t != ChatTemplate::kNone);
  }
  EXPECT_EQ(ChatTemplateName(ChatTemplate::kChatMl), "chatml");
  EXPECT_FALSE(ChatTemplateByName("vicuna").has_value());
  EXPECT_EQ(DetectChatTemplate("{% for message in messages %}{{'<|im_start|>' + message['role']"),
            ChatTemplate::kChatMl);
  EXPECT_EQ(DetectChatTemplate("{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>"),
            ChatTemplate::kLlama3);
  EXPECT_EQ(DetectChatTemplate("{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"),
            ChatTemplate::kLlama2);
  EXPECT_EQ(DetectChatTemplate(""), ChatTemplate::kNone);
  EXPECT_EQ(DetectChatTemplate("{{ message['content'] }}"), ChatTemplate::kNone);
}

// ---- Anthropic Messages requests --------------------------------------------------------------

TEST(ServeApiAnthropicRequest, ReadsStringAndBlockContentSystemAndSampling) {
  const GenerationRequest r = ServeApiMustParse(ParseAnthropicMessages(R"({
      "model": "qwen", "max_tokens": 64, "system": "Be brief.",
      "messages": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": [{"type": "text", "text": "Hel"},
                                          {"type": "text", "text": "lo"}]},
        {"role": "user", "content": [{"type": "text", "text": "Bye", "cache_control": {}}]}],
      "temperature": 0.5, "top_p": 0.9, "top_k": 40, "stop_sequences": ["END", "\n\n"],
      "stream": true, "metadata": {"user_id": "u"}, "some_future_field": [1, 2]})",
                                                                       ServeApiLimits()));
  EXPECT_EQ(r.api, ApiKind::kAnthropicMessages);
  EXPECT_EQ(r.model, "qwen");
  EXPECT_EQ(r.max_tokens, 64u);
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[0].text, "Be brief.");
  EXPECT_EQ(r.messages[1].role, "user");
  EXPECT_EQ(r.messages[1].text, "Hi");
  EXPECT_EQ(r.messages[2].role, "assistant");
  EXPECT_EQ(r.messages[2].text, "Hello");
  EXPECT_EQ(r.messages[3].text, "Bye");
  EXPECT_FLOAT_EQ(r.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.top_p, 0.9f);
  EXPECT_EQ(r.top_k, 40u);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"END", "\n\n"}));
  EXPECT_TRUE(r.stream);
  EXPECT_FALSE(r.seed.has_value());
}

TEST(ServeApiAnthropicRequest, SystemAsTextBlocksAndDefaults) {
  const GenerationRequest r = ServeApiMustParse(ParseAnthropicMessages(
      R"({"model": "m", "max_tokens": 1, "temperature": null,
          "system": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}],
          "messages": [{"role": "user", "content": "é"}]})",
      ServeApiLimits()));
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[0].text, "AB");
  EXPECT_EQ(r.messages[1].text, "é");
  EXPECT_FLOAT_EQ(r.temperature, 1.0f);
  EXPECT_FLOAT_EQ(r.top_p, 1.0f);
  EXPECT_EQ(r.top_k, 0u);
  EXPECT_TRUE(r.stop.empty());
  EXPECT_FALSE(r.stream);
}

TEST(ServeApiAnthropicRequest, MaxTokensUpToTheLimitOrAnyWithoutOne) {
  const std::string body =
      R"({"model":"m","max_tokens":4096,"messages":[{"role":"user","content":"x"}]})";
  EXPECT_EQ(ServeApiMustParse(ParseAnthropicMessages(body, ServeApiLimits())).max_tokens, 4096u);
  const std::string big =
      R"({"model":"m","max_tokens":4000000000,"messages":[{"role":"user","content":"x"}]})";
  EXPECT_EQ(ServeApiMustParse(ParseAnthropicMessages(big, ParseLimits{})).max_tokens, 4000000000u);
}

TEST(ServeApiAnthropicRequest, EachBadBodyIs400NamingTheField) {
  const std::string msgs = R"("messages":[{"role":"user","content":"Hi"}])";
  const std::string ok_head = R"({"model":"m","max_tokens":8,)" + msgs;
  const std::vector<ServeApiBadBody> cases = {
      {R"({"model":"m","max_tokens":8,"messages":[{"role":"user","co)",
       "unexpected end of JSON at byte 58"},
      {"", "unexpected end of JSON at byte 0"},
      {R"({"model":"m",})", "invalid JSON at byte 13"},
      {R"({"model":"m"} x)", "invalid JSON at byte 14"},
      {R"(["model"])", "request body: expected a JSON object"},
      {R"({"max_tokens":8,)" + msgs + "}", "model: field required"},
      {R"({"model":7,"max_tokens":8,)" + msgs + "}", "model: expected a string"},
      {R"({"model":"m",)" + msgs + "}", "max_tokens: field required"},
      {R"({"model":"m","max_tokens":0,)" + msgs + "}",
       "max_tokens: must be an integer of at least 1"},
      {R"({"model":"m","max_tokens":-5,)" + msgs + "}",
       "max_tokens: must be an integer of at least 1"},
      {R"({"model":"m","max_tokens":2.5,)" + msgs + "}",
       "max_tokens: must be an integer of at least 1"},
      {R"({"model":"m","max_tokens":"8",)" + msgs + "}",
       "max_tokens: must be an integer of at least 1"},
      {R"({"model":"m","max_tokens":100000,)" + msgs + "}", "max_tokens: 100000 > 4096"},
      {R"({"model":"m","max_tokens":99999999999999999999999,)" + msgs + "}",
       "max_tokens: must be an integer of at least 1"},
      {R"({"model":"m","max_tokens":8})", "messages: field required"},
      {R"({"model":"m","max_tokens":8,"messages":[]})",
       "messages: expected a non-empty array of messages"},
      {R"({"model":"m","max_tokens":8,"messages":{"role":"user"}})",
       "messages: expected a non-empty array of messages"},
      {R"({"model":"m","max_tokens":8,"messages":["Hi"]})",
       "messages[0]: expected an object with role and content"},
      {R"({"model":"m","max_tokens":8,"messages":[{"content":"Hi"}]})",
       "messages[0].role: field required"},
      {R"({"model":"m","max_tokens":8,"messages":[{"role":"system","content":"Hi"}]})",
       R"(messages[0].role: expected one of "user", "assistant" (got "system"))"},
      {R"({"model":"m","max_tokens":8,"messages":[{"role":"user"}]})",
       "messages[0].content: field required"},
      {R"({"model":"m","max_tokens":8,"messages":[{"role":"user","content":"a"},)"
       R"({"role":"assistant","content":"b"},{"role":"user","content":5}]})",
       "messages[2].content: expected a string or an array of text blocks"},
      {R"({"model":"m","max_tokens":8,"messages":[{"role":"user","content":[)"
       R"({"type":"text","text":"a"},{"type":"image","source":{}}]}]})",
       R"(messages[0].content[1].type: only "text" blocks are supported (got "image"))"},
      {R"({"model":"m","max_tokens":8,"messages":[{"role":"user","content":[{"type":"text"}]}]})",
       "messages[0].content[0].text: field required"},
      {R"({"model":"m","max_tokens":8,"messages":[{"role":"user","content":["a"]}]})",
       "messages[0].content[0]: expected a text block"},
      {ok_head + R"(,"system":42})", "system: expected a string or an array of text blocks"},
      {ok_head + R"(,"temperature":1.5})", "temperature: must be a number from 0 to 1"},
      {ok_head + R"(,"temperature":"hot"})", "temperature: must be a number from 0 to 1"},
      {ok_head + R"(,"top_p":-0.1})", "top_p: must be a number from 0 to 1"},
      {ok_head + R"(,"top_k":-1})", "top_k: must be an integer of at least 0"},
      {ok_head + R"(,"stream":"yes"})", "stream: expected true or false"},
      {ok_head + R"(,"stop_sequences":"END"})", "stop_sequences: expected an array of strings"},
      {ok_head + R"(,"stop_sequences":["a",""]})", "stop_sequences[1]: must not be empty"},
      {ok_head + R"(,"stop_sequences":["a",3]})", "stop_sequences[1]: expected a string"},
      {ok_head + R"(,"stop_sequences":["1","2","3","4","5","6","7","8","9","10","11","12",)"
                 R"("13","14","15","16","17"]})",
       "stop_sequences: at most 16 allowed (got 17)"},
      {R"({"model":"m","max_tokens":8,"messages":[{"role":"user","content":"a)"
       "\xFF"
       R"(b"}]})",
       "messages[0].content: text is not valid UTF-8 (byte 67)"},
      {R"({"model":"m","max_tokens":8,"messages":[{"role":"user","content":[{"type":"text",)"
       R"("text":")"
       "\xC0\xAF"
       R"("}]}]})",
       "messages[0].content[0].text: text is not valid UTF-8"},
      {R"({"model":"m","max_tokens":8,"messages":[{"role":"user","content":"\ud800"}]})",
       "in messages[0].content"},
  };
  for (const ServeApiBadBody& c : cases) {
    SCOPED_TRACE(c.body);
    ServeApiExpectInvalid(ApiKind::kAnthropicMessages,
                          ParseAnthropicMessages(c.body, ServeApiLimits()), c.message_part);
  }
}

TEST(ServeApiAnthropicRequest, CountTokensReadsTheConversationWithoutMaxTokens) {
  const GenerationRequest r = ServeApiMustParse(ParseAnthropicCountTokens(
      R"({"model":"m","system":"S","messages":[{"role":"user","content":"Hi"}]})"));
  EXPECT_EQ(r.model, "m");
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[0].text, "S");
  EXPECT_EQ(r.messages[1].text, "Hi");
  ServeApiExpectInvalid(ApiKind::kAnthropicMessages, ParseAnthropicCountTokens(R"({"model":"m"})"),
                        "messages: field required");
}

// ---- OpenAI requests -----------------------------------------------------------------------

TEST(ServeApiOpenAiRequest, ChatReadsRolesPartsStopAndSeed) {
  const GenerationRequest r = ServeApiMustParse(ParseOpenAiChat(R"({
      "model": "qwen",
      "messages": [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]},
        {"role": "assistant", "content": null},
        {"role": "system", "content": "Late system."},
        {"role": "user", "content": "Bye", "name": "bob"}],
      "max_completion_tokens": 100, "max_tokens": 50, "temperature": 1.8, "top_p": 0.5,
      "stop": "END", "stream": true, "seed": -1, "n": 1, "stream_options": {"include_usage": true},
      "user": "x"})",
                                                                ServeApiLimits()));
  EXPECT_EQ(r.api, ApiKind::kOpenAiChat);
  EXPECT_EQ(r.model, "qwen");
  ASSERT_EQ(r.messages.size(), 5u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[0].text, "Be brief.");
  EXPECT_EQ(r.messages[1].text, "Hi there");
  EXPECT_EQ(r.messages[2].role, "assistant");
  EXPECT_EQ(r.messages[2].text, "");
  EXPECT_EQ(r.messages[3].role, "system");
  EXPECT_EQ(r.messages[4].text, "Bye");
  EXPECT_EQ(r.max_tokens, 100u);
  EXPECT_FLOAT_EQ(r.temperature, 1.8f);
  EXPECT_FLOAT_EQ(r.top_p, 0.5f);
  EXPECT_EQ(r.stop, std::vector<std::string>{"END"});
  EXPECT_TRUE(r.stream);
  EXPECT_EQ(r.seed, std::optional<uint64_t>(UINT64_MAX));
}

TEST(ServeApiOpenAiRequest, ChatMaxTokensDefaultsToTheLimitOr256) {
  const std::string body =
      R"({"model":"m","messages":[{"role":"user","content":"x"}],"stop":["a","b"]})";
  const GenerationRequest limited = ServeApiMustParse(ParseOpenAiChat(body, ServeApiLimits()));
  EXPECT_EQ(limited.max_tokens, 4096u);
  EXPECT_EQ(limited.stop, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(ServeApiMustParse(ParseOpenAiChat(body, ParseLimits{})).max_tokens, 256u);
  const std::string with_max =
      R"({"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":7})";
  EXPECT_EQ(ServeApiMustParse(ParseOpenAiChat(with_max, ServeApiLimits())).max_tokens, 7u);
}

TEST(ServeApiOpenAiRequest, ChatBadBodiesAre400InOpenAiShape) {
  const std::string msgs = R"("messages":[{"role":"user","content":"Hi"}])";
  const std::vector<ServeApiBadBody> cases = {
      {R"({"model":"m",)" + msgs, "unexpected end of JSON at byte 56"},
      {"{" + msgs + "}", "model: field required"},
      {R"({"model":"m"})", "messages: field required"},
      {R"({"model":"m","messages":[]})", "messages: expected a non-empty array of messages"},
      {R"({"model":"m","messages":[{"role":"tool","content":"x"}]})",
       R"(messages[0].role: expected one of "system", "developer", "user", "assistant" (got "tool"))"},
      {R"({"model":"m","messages":[{"role":"user","content":null}]})",
       "messages[0].content: field required"},
      {R"({"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{}}]}]})",
       R"(messages[0].content[0].type: only "text" blocks are supported (got "image_url"))"},
      {R"({"model":"m","messages":[{"role":"user","content":{"text":"x"}}]})",
       "messages[0].content: expected a string or an array of text blocks"},
      {R"({"model":"m",)" + msgs + R"(,"max_tokens":0})",
       "max_tokens: must be an integer of at least 1"},
      {R"({"model":"m",)" + msgs + R"(,"max_completion_tokens":5000})",
       "max_completion_tokens: 5000 > 4096"},
      {R"({"model":"m",)" + msgs + R"(,"temperature":2.5})",
       "temperature: must be a number from 0 to 2"},
      {R"({"model":"m",)" + msgs + R"(,"stop":["a","b","c","d","e"]})",
       "stop: at most 4 allowed (got 5)"},
      {R"({"model":"m",)" + msgs + R"(,"stop":7})",
       "stop: expected a string or an array of strings"},
      {R"({"model":"m",)" + msgs + R"(,"stop":""})", "stop: must not be empty"},
      {R"({"model":"m",)" + msgs + R"(,"n":2})", "n: only 1 is supported"},
      {R"({"model":"m",)" + msgs + R"(,"seed":"s"})", "seed: expected an integer"},
      {R"({"model":"m","messages":[{"role":"user","content":")"
       "\xE2\x82"
       R"("}]})",
       "messages[0].content: text is not valid UTF-8"},
  };
  for (const ServeApiBadBody& c : cases) {
    SCOPED_TRACE(c.body);
    ServeApiExpectInvalid(ApiKind::kOpenAiChat, ParseOpenAiChat(c.body, ServeApiLimits()),
                          c.message_part);
  }
}

TEST(ServeApiOpenAiRequest, CompletionReadsPromptAndDefaultsTo16Tokens) {
  const GenerationRequest r = ServeApiMustParse(ParseOpenAiCompletion(
      R"({"model":"m","prompt":"Once upon","stop":["\n"],"echo":false})", ServeApiLimits()));
  EXPECT_EQ(r.api, ApiKind::kOpenAiCompletion);
  EXPECT_EQ(r.prompt, "Once upon");
  EXPECT_TRUE(r.messages.empty());
  EXPECT_EQ(r.max_tokens, 16u);
  EXPECT_EQ(r.stop, std::vector<std::string>{"\n"});
  const GenerationRequest array = ServeApiMustParse(
      ParseOpenAiCompletion(R"({"model":"m","prompt":["One"],"max_tokens":3})", ServeApiLimits()));
  EXPECT_EQ(array.prompt, "One");
  EXPECT_EQ(array.max_tokens, 3u);
  ParseLimits small;
  small.max_tokens_limit = 8;
  EXPECT_EQ(
      ServeApiMustParse(ParseOpenAiCompletion(R"({"model":"m","prompt":"x"})", small)).max_tokens,
      8u);
  EXPECT_FALSE(r.include_usage);
  EXPECT_TRUE(ServeApiMustParse(ParseOpenAiCompletion(
                                    R"({"model":"m","prompt":"x","stream":true,
                                        "stream_options":{"include_usage":true}})",
                                    ServeApiLimits()))
                  .include_usage);
}

TEST(ServeApiOpenAiRequest, CompletionBadPromptsAre400) {
  const std::vector<ServeApiBadBody> cases = {
      {R"({"model":"m"})", "prompt: field required"},
      {R"({"model":"m","prompt":["a","b"]})",
       "prompt: expected a string or an array of one string"},
      {R"({"model":"m","prompt":[1,2,3]})", "prompt: expected a string or an array of one string"},
      {R"({"model":"m","prompt":"x","max_tokens":4097})", "max_tokens: 4097 > 4096"},
      {R"({"model":"m","prompt":"x","top_p":2})", "top_p: must be a number from 0 to 1"},
      {R"({"model":"m","prompt":"x","stream_options":{"include_usage":true}})",
       "stream_options: only allowed when stream is true"},
      {R"({"model":"m","prompt":"x","stream":true,"stream_options":true})",
       "stream_options: expected an object"},
      {R"({"model":"m","prompt":"x","stream":true,"stream_options":{"include_usage":1}})",
       "stream_options.include_usage: expected true or false"},
  };
  for (const ServeApiBadBody& c : cases) {
    SCOPED_TRACE(c.body);
    ServeApiExpectInvalid(ApiKind::kOpenAiCompletion,
                          ParseOpenAiCompletion(c.body, ServeApiLimits()), c.message_part);
  }
}

// ---- errors ----------------------------------------------------------------------------------

TEST(ServeApiErrors, AnthropicStatusesAndTypes) {
  const std::vector<std::tuple<ErrorKind, int, std::string>> expected = {
      {ErrorKind::kInvalidRequest, 400, "invalid_request_error"},
      {ErrorKind::kAuthentication, 401, "authentication_error"},
      {ErrorKind::kNotFound, 404, "not_found_error"},
      {ErrorKind::kRequestTooLarge, 413, "request_too_large"},
      {ErrorKind::kOverloaded, 529, "overloaded_error"},
      {ErrorKind::kTimeout, 504, "api_error"},
      {ErrorKind::kInternal, 500, "api_error"},
  };
  for (const auto& [kind, status, type] : expected) {
    SCOPED_TRACE(type);
    const ApiError e = MakeError(ApiKind::kAnthropicMessages, kind, "what \"happened\"");
    EXPECT_EQ(e.status, status);
    EXPECT_EQ(ServeApiErrorMessage(ApiKind::kAnthropicMessages, e, type), "what \"happened\"");
    EXPECT_EQ(ServeApiJsonOf(e.body).size(), 2u);  // type and error only
  }
}

TEST(ServeApiErrors, OpenAiStatusesTypesAndCodes) {
  const std::vector<std::tuple<ErrorKind, int, std::string, ServeApiJson>> expected = {
      {ErrorKind::kInvalidRequest, 400, "invalid_request_error", nullptr},
      {ErrorKind::kAuthentication, 401, "invalid_request_error", "invalid_api_key"},
      {ErrorKind::kNotFound, 404, "invalid_request_error", nullptr},
      {ErrorKind::kRequestTooLarge, 413, "invalid_request_error", nullptr},
      {ErrorKind::kOverloaded, 503, "server_error", nullptr},
      {ErrorKind::kTimeout, 504, "server_error", "timeout"},
      {ErrorKind::kInternal, 500, "server_error", nullptr},
  };
  for (ApiKind api : {ApiKind::kOpenAiChat, ApiKind::kOpenAiCompletion}) {
    for (const auto& [kind, status, type, code] : expected) {
      SCOPED_TRACE(status);
      const ApiError e = MakeError(api, kind, "bad");
      EXPECT_EQ(e.status, status);
      EXPECT_EQ(ServeApiErrorMessage(api, e, type), "bad");
      EXPECT_EQ(ServeApiJsonOf(e.body)["error"]["code"], code);
    }
  }
}

TEST(ServeApiErrors, ModelNotFoundNamesBothModels) {
  const ApiError anthropic = ModelNotFound(ApiKind::kAnthropicMessages, "claude-x", "qwen");
  EXPECT_EQ(anthropic.status, 404);
  const std::string message =
      ServeApiErrorMessage(ApiKind::kAnthropicMessages, anthropic, "not_found_error");
  EXPECT_EQ(message.rfind("model: claude-x", 0), 0u) << message;
  EXPECT_NE(message.find("qwen"), std::string::npos) << message;
  const ApiError openai = ModelNotFound(ApiKind::kOpenAiChat, "gpt-x", "qwen");
  EXPECT_EQ(openai.status, 404);
  EXPECT_NE(ServeApiErrorMessage(ApiKind::kOpenAiChat, openai, "invalid_request_error")
                .find("The model `gpt-x` does not exist"),
            std::string::npos);
  EXPECT_EQ(ServeApiJsonOf(openai.body)["error"]["code"], "model_not_found");
}

// ---- responses -------------------------------------------------------------------------------

Completion ServeApiCompletion(std::string id) {
  Completion c;
  c.id = std::move(id);
  c.model = "qwen";
  c.created = 1700000000;
  c.text = "Hello, \"world\"\n";
  c.stop_reason = StopReason::kEndTurn;
  c.input_tokens = 12;
  c.output_tokens = 5;
  return c;
}

TEST(ServeApiResponse, AnthropicMessageObject) {
  Completion c = ServeApiCompletion("msg_1");
  ServeApiJson body = ServeApiJsonOf(CompletionBody(ApiKind::kAnthropicMessages, c));
  EXPECT_EQ(body["id"], "msg_1");
  EXPECT_EQ(body["type"], "message");
  EXPECT_EQ(body["role"], "assistant");
  EXPECT_EQ(body["model"], "qwen");
  ASSERT_EQ(body["content"].size(), 1u);
  EXPECT_EQ(body["content"][0], (ServeApiJson{{"type", "text"}, {"text", c.text}}));
  EXPECT_EQ(body["stop_reason"], "end_turn");
  EXPECT_TRUE(body["stop_sequence"].is_null());
  EXPECT_EQ(body["usage"], (ServeApiJson{{"input_tokens", 12}, {"output_tokens", 5}}));

  c.stop_reason = StopReason::kMaxTokens;
  EXPECT_EQ(ServeApiJsonOf(CompletionBody(ApiKind::kAnthropicMessages, c))["stop_reason"],
            "max_tokens");
  c.stop_reason = StopReason::kStopSequence;
  c.stop_sequence = "END";
  ServeApiJson stopped = ServeApiJsonOf(CompletionBody(ApiKind::kAnthropicMessages, c));
  EXPECT_EQ(stopped["stop_reason"], "stop_sequence");
  EXPECT_EQ(stopped["stop_sequence"], "END");
}

TEST(ServeApiResponse, OpenAiChatCompletionObject) {
  Completion c = ServeApiCompletion("chatcmpl-1");
  ServeApiJson body = ServeApiJsonOf(CompletionBody(ApiKind::kOpenAiChat, c));
  EXPECT_EQ(body["id"], "chatcmpl-1");
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["created"], 1700000000);
  EXPECT_EQ(body["model"], "qwen");
  ASSERT_EQ(body["choices"].size(), 1u);
  ServeApiJson& choice = body["choices"][0];
  EXPECT_EQ(choice["index"], 0);
  EXPECT_EQ(choice["message"], (ServeApiJson{{"role", "assistant"}, {"content", c.text}}));
  EXPECT_TRUE(choice["logprobs"].is_null());
  EXPECT_EQ(choice["finish_reason"], "stop");
  EXPECT_EQ(body["usage"],
            (ServeApiJson{{"prompt_tokens", 12}, {"completion_tokens", 5}, {"total_tokens", 17}}));
  c.stop_reason = StopReason::kMaxTokens;
  EXPECT_EQ(ServeApiJsonOf(CompletionBody(ApiKind::kOpenAiChat, c))["choices"][0]["finish_reason"],
            "length");
  c.stop_reason = StopReason::kStopSequence;
  EXPECT_EQ(ServeApiJsonOf(CompletionBody(ApiKind::kOpenAiChat, c))["choices"][0]["finish_reason"],
            "stop");
}

TEST(ServeApiResponse, OpenAiTextCompletionObject) {
  Completion c = ServeApiCompletion("cmpl-1");
  c.stop_reason = StopReason::kMaxTokens;
  ServeApiJson body = ServeApiJsonOf(CompletionBody(ApiKind::kOpenAiCompletion, c));
  EXPECT_EQ(body["id"], "cmpl-1");
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["created"], 1700000000);
  EXPECT_EQ(body["model"], "qwen");
  ASSERT_EQ(body["choices"].size(), 1u);
  EXPECT_EQ(
      body["choices"][0],
      (ServeApiJson{
          {"text", c.text}, {"index", 0}, {"logprobs", nullptr}, {"finish_reason", "length"}}));
  EXPECT_EQ(body["usage"]["total_tokens"], 17);
}

TEST(ServeApiResponse, CountTokensAndModels) {
  EXPECT_EQ(ServeApiJsonOf(CountTokensBody(42)), (ServeApiJson{{"input_tokens", 42}}));
  ServeApiJson models = ServeApiJsonOf(ModelsBody("qwen", 1700000000));
  EXPECT_EQ(models["object"], "list");
  ASSERT_EQ(models["data"].size(), 1u);
  ServeApiJson& m = models["data"][0];
  EXPECT_EQ(m["id"], "qwen");
  EXPECT_EQ(m["object"], "model");
  EXPECT_EQ(m["created"], 1700000000);
  EXPECT_TRUE(m["owned_by"].is_string());
  EXPECT_EQ(m["type"], "model");
  EXPECT_EQ(m["display_name"], "qwen");
  EXPECT_EQ(m["created_at"], "2023-11-14T22:13:20Z");
  EXPECT_EQ(models["has_more"], false);
  EXPECT_EQ(models["first_id"], "qwen");
  EXPECT_EQ(models["last_id"], "qwen");
}

TEST(ServeApiResponse, InvalidUtf8InAStringIsReplacedNotThrown) {
  Completion c = ServeApiCompletion("msg_1");
  c.model = "bad\xFFname";
  c.text = "x\xC3";
  for (ApiKind api : {ApiKind::kAnthropicMessages, ApiKind::kOpenAiChat}) {
    ServeApiJson body = ServeApiJsonOf(CompletionBody(api, c));
    EXPECT_EQ(body["model"], "bad" + std::string(kServeApiReplacement) + "name");
  }
  ServeApiJson error =
      ServeApiJsonOf(MakeError(ApiKind::kOpenAiChat, ErrorKind::kInternal, "\xFE").body);
  EXPECT_EQ(error["error"]["message"], std::string(kServeApiReplacement));
}

// ---- streams ---------------------------------------------------------------------------------

struct ServeApiSseEvent {
  std::string name;  // empty for OpenAI's data-only events
  std::string data;
};

// Splits server-sent events at their blank lines; each must end with one.
std::vector<ServeApiSseEvent> ServeApiSplitSse(std::string_view stream) {
  std::vector<ServeApiSseEvent> events;
  while (!stream.empty()) {
    const size_t end = stream.find("\n\n");
    if (end == std::string_view::npos) {
      ADD_FAILURE() << "an event without its blank line: " << stream;
      break;
    }
    std::string_view lines = stream.substr(0, end + 1);
    stream.remove_prefix(end + 2);
    ServeApiSseEvent event;
    while (!lines.empty()) {
      const size_t eol = lines.find('\n');
      const std::string_view line = lines.substr(0, eol);
      lines.remove_prefix(eol + 1);
      if (line.starts_with("event: ")) {
        event.name = line.substr(7);
      } else if (line.starts_with("data: ")) {
        event.data = line.substr(6);
      } else {
        ADD_FAILURE() << "unexpected line: " << line;
      }
    }
    events.push_back(std::move(event));
  }
  return events;
}

TEST(ServeApiStream, AnthropicEventsInDocumentedOrder) {
  constexpr ApiKind kApi = ApiKind::kAnthropicMessages;
  Completion c = ServeApiCompletion("msg_1");
  c.output_tokens = 1;
  std::string stream = StreamStart(kApi, c);
  for (std::string_view piece : {"Hel", "", "lo \"you\"\n"}) stream += StreamDelta(kApi, c, piece);
  c.output_tokens = 7;
  c.stop_reason = StopReason::kStopSequence;
  c.stop_sequence = "END";
  stream += StreamEnd(kApi, c);

  const std::vector<ServeApiSseEvent> events = ServeApiSplitSse(stream);
  const std::vector<std::string> expected_names = {
      "message_start",       "content_block_start", "ping",          "content_block_delta",
      "content_block_delta", "content_block_stop",  "message_delta", "message_stop"};
  ASSERT_EQ(events.size(), expected_names.size()) << stream;
  std::string text;
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i].name, expected_names[i]);
    ServeApiJson data = ServeApiJsonOf(events[i].data);
    EXPECT_EQ(data["type"], expected_names[i]);
    if (events[i].name == "content_block_delta") {
      EXPECT_EQ(data["index"], 0);
      EXPECT_EQ(data["delta"]["type"], "text_delta");
      text += data["delta"]["text"].get<std::string>();
    }
  }
  EXPECT_EQ(text, "Hello \"you\"\n");

  ServeApiJson message = ServeApiJsonOf(events[0].data)["message"];
  EXPECT_EQ(message["id"], "msg_1");
  EXPECT_EQ(message["type"], "message");
  EXPECT_EQ(message["role"], "assistant");
  EXPECT_EQ(message["model"], "qwen");
  EXPECT_EQ(message["content"], ServeApiJson::array());
  EXPECT_TRUE(message["stop_reason"].is_null());
  EXPECT_TRUE(message["stop_sequence"].is_null());
  EXPECT_EQ(message["usage"], (ServeApiJson{{"input_tokens", 12}, {"output_tokens", 1}}));
  EXPECT_EQ(ServeApiJsonOf(events[1].data)["content_block"],
            (ServeApiJson{{"type", "text"}, {"text", ""}}));
  EXPECT_EQ(ServeApiJsonOf(events[5].data)["index"], 0);
  ServeApiJson delta = ServeApiJsonOf(events[6].data);
  EXPECT_EQ(delta["delta"],
            (ServeApiJson{{"stop_reason", "stop_sequence"}, {"stop_sequence", "END"}}));
  EXPECT_EQ(delta["usage"], (ServeApiJson{{"output_tokens", 7}}));
}

TEST(ServeApiStream, OpenAiChatChunksRoleFirstFinishLastThenDone) {
  constexpr ApiKind kApi = ApiKind::kOpenAiChat;
  Completion c = ServeApiCompletion("chatcmpl-1");
  c.stop_reason = StopReason::kMaxTokens;
  std::string stream = StreamStart(kApi, c);
  for (std::string_view piece : {"Hel", "", "lo"}) stream += StreamDelta(kApi, c, piece);
  stream += StreamEnd(kApi, c);

  const std::vector<ServeApiSseEvent> events = ServeApiSplitSse(stream);
  ASSERT_EQ(events.size(), 5u) << stream;  // role, two deltas, finish, [DONE]
  EXPECT_EQ(events.back().data, "[DONE]");
  std::string text;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    EXPECT_EQ(events[i].name, "");
    ServeApiJson chunk = ServeApiJsonOf(events[i].data);
    EXPECT_EQ(chunk["id"], "chatcmpl-1");
    EXPECT_EQ(chunk["object"], "chat.completion.chunk");
    EXPECT_EQ(chunk["created"], 1700000000);
    EXPECT_EQ(chunk["model"], "qwen");
    ASSERT_EQ(chunk["choices"].size(), 1u);
    ServeApiJson& choice = chunk["choices"][0];
    EXPECT_EQ(choice["index"], 0);
    const bool last = i + 2 == events.size();
    EXPECT_EQ(choice["finish_reason"], last ? ServeApiJson("length") : ServeApiJson(nullptr));
    if (i == 0) {
      EXPECT_EQ(choice["delta"], (ServeApiJson{{"role", "assistant"}, {"content", ""}}));
    }
    if (last) {
      EXPECT_EQ(choice["delta"], ServeApiJson::object());
    }
    text += choice["delta"].value("content", "");
  }
  EXPECT_EQ(text, "Hello");
}

TEST(ServeApiStream, OpenAiCompletionChunksAreTextCompletions) {
  constexpr ApiKind kApi = ApiKind::kOpenAiCompletion;
  const Completion c = ServeApiCompletion("cmpl-1");
  EXPECT_EQ(StreamStart(kApi, c), "");
  const std::string stream =
      StreamDelta(kApi, c, "Once") + StreamDelta(kApi, c, " upon") + StreamEnd(kApi, c);
  const std::vector<ServeApiSseEvent> events = ServeApiSplitSse(stream);
  ASSERT_EQ(events.size(), 4u) << stream;
  EXPECT_EQ(events.back().data, "[DONE]");
  std::string text;
  for (size_t i = 0; i < 3; ++i) {
    ServeApiJson chunk = ServeApiJsonOf(events[i].data);
    EXPECT_EQ(chunk["object"], "text_completion");
    EXPECT_EQ(chunk["id"], "cmpl-1");
    ServeApiJson& choice = chunk["choices"][0];
    EXPECT_EQ(choice["finish_reason"], i == 2 ? ServeApiJson("stop") : ServeApiJson(nullptr));
    text += choice["text"].get<std::string>();
  }
  EXPECT_EQ(text, "Once upon");
}

// stream_options.include_usage: a chunk with no choices and the usage, after the finish chunk.
TEST(ServeApiStream, OpenAiUsageChunkComesBeforeDone) {
  for (ApiKind api : {ApiKind::kOpenAiChat, ApiKind::kOpenAiCompletion}) {
    Completion c = ServeApiCompletion("cmpl-1");
    c.output_tokens = 5;
    const std::vector<ServeApiSseEvent> events = ServeApiSplitSse(StreamEnd(api, c, true));
    ASSERT_EQ(events.size(), 3u);  // finish, usage, [DONE]
    EXPECT_EQ(ServeApiJsonOf(events[0].data)["choices"].size(), 1u);
    const ServeApiJson usage = ServeApiJsonOf(events[1].data);
    EXPECT_EQ(usage["choices"], ServeApiJson::array());
    EXPECT_EQ(usage["object"],
              api == ApiKind::kOpenAiChat ? "chat.completion.chunk" : "text_completion");
    EXPECT_EQ(
        usage["usage"],
        (ServeApiJson{{"prompt_tokens", 12}, {"completion_tokens", 5}, {"total_tokens", 17}}));
    EXPECT_EQ(events[2].data, "[DONE]");
    EXPECT_EQ(ServeApiSplitSse(StreamEnd(api, c)).size(), 2u);  // without it: finish, [DONE]
  }
}

TEST(ServeApiStream, ErrorsAfterTheStreamBegan) {
  const std::vector<ServeApiSseEvent> anthropic = ServeApiSplitSse(
      StreamError(ApiKind::kAnthropicMessages, ErrorKind::kOverloaded, "Overloaded"));
  ASSERT_EQ(anthropic.size(), 1u);
  EXPECT_EQ(anthropic[0].name, "error");
  EXPECT_EQ(ServeApiJsonOf(anthropic[0].data),
            (ServeApiJson{{"type", "error"},
                          {"error", {{"type", "overloaded_error"}, {"message", "Overloaded"}}}}));
  const std::vector<ServeApiSseEvent> openai =
      ServeApiSplitSse(StreamError(ApiKind::kOpenAiChat, ErrorKind::kInternal, "boom"));
  ASSERT_EQ(openai.size(), 1u);
  EXPECT_EQ(openai[0].name, "");
  EXPECT_EQ(ServeApiJsonOf(openai[0].data)["error"]["message"], "boom");
  EXPECT_EQ(ServeApiJsonOf(openai[0].data)["error"]["type"], "server_error");
}

// ---- TextStream ------------------------------------------------------------------------------

TEST(TextStream, MultiByteCharacterSplitOverPiecesIsHeldUntilComplete) {
  TextStream s({});
  EXPECT_EQ(s.Push("a\xE2"), "a");  // € is E2 82 AC
  EXPECT_EQ(s.Push("\x82"), "");
  EXPECT_EQ(s.Push("\xAC b"), "\xE2\x82\xAC b");
  EXPECT_EQ(s.Push("\xF0\x9F"), "");  // 😀 is F0 9F 98 80
  EXPECT_EQ(s.Push("\x98\x80"), "\xF0\x9F\x98\x80");
  EXPECT_EQ(s.Finish(), "");
  EXPECT_EQ(s.text(), "a\xE2\x82\xAC b\xF0\x9F\x98\x80");
  EXPECT_FALSE(s.stopped());
}

TEST(TextStream, InvalidBytesBecomeReplacementCharacters) {
  const std::string r(kServeApiReplacement);
  TextStream s({});
  EXPECT_EQ(s.Push("a\xFF"
                   "b"),
            "a" + r + "b");
  EXPECT_EQ(s.Push("\xC0\xAF"), r + r);     // an overlong form: neither byte begins a sequence
  EXPECT_EQ(s.Push("\xE2\x82("), r + "(");  // a sequence cut short by a byte that cannot follow
  EXPECT_EQ(s.Push("\xED\xA0\x80"), r + r + r);  // a surrogate
  EXPECT_EQ(s.Push("\x80"), r);                  // a lone continuation byte
}

TEST(TextStream, StopSequenceSplitOverThreePieces) {
  TextStream s({"<|end|>"});
  EXPECT_EQ(s.Push("Hello <|"), "Hello ");
  EXPECT_EQ(s.Push("en"), "");
  EXPECT_EQ(s.Push("d|> and more"), "");
  EXPECT_TRUE(s.stopped());
  EXPECT_EQ(s.stop_sequence(), "<|end|>");
  EXPECT_EQ(s.Push("ignored"), "");
  EXPECT_EQ(s.Finish(), "");
  EXPECT_EQ(s.text(), "Hello ");
}

TEST(TextStream, StopSequenceInsideOnePieceReturnsTheTextBeforeIt) {
  TextStream s({"bc", "ab", "x"});
  EXPECT_EQ(s.Push("zzabc"), "zz");
  EXPECT_EQ(s.stop_sequence(), "ab");  // starts first
  TextStream tie({"abc", "ab"});
  EXPECT_EQ(tie.Push("_abcd"), "_");
  EXPECT_EQ(tie.stop_sequence(), "abc");  // same start: the one listed first
}

TEST(TextStream, TailThatLookedLikeAStopSequenceIsReleasedLater) {
  TextStream s({"###", "</s>"});
  EXPECT_EQ(s.Push("a#"), "a");
  EXPECT_EQ(s.Push("#"), "");
  EXPECT_EQ(s.Push("b<"), "##b");
  EXPECT_EQ(s.Push("/x"), "</x");
  EXPECT_FALSE(s.stopped());
  EXPECT_EQ(s.text(), "a##b</x");
}

TEST(TextStream, FinishReleasesTheHeldTailAndAnIncompleteCharacter) {
  TextStream s({"END"});
  EXPECT_EQ(s.Push("xEN"), "x");
  EXPECT_EQ(s.Push("\xE2\x82"), "");
  EXPECT_EQ(s.Finish(), "EN" + std::string(kServeApiReplacement));
  EXPECT_FALSE(s.stopped());
  EXPECT_EQ(s.text(), "xEN" + std::string(kServeApiReplacement));
}

TEST(TextStream, StopSequenceWithMultiByteCharactersAcrossBytePieces) {
  const std::string text = "caf\xC3\xA9 \xE2\x80\x94 done\xE2\x80\x94!";
  TextStream s({"\xE2\x80\x94!"});
  std::string sent;
  for (char byte : text) sent += s.Push(std::string_view(&byte, 1));
  EXPECT_TRUE(s.stopped());
  EXPECT_EQ(sent, "caf\xC3\xA9 \xE2\x80\x94 done");
  EXPECT_EQ(s.text(), sent);
}

TEST(TextStream, EmptyStopSequencesAreIgnored) {
  TextStream s({""});
  EXPECT_EQ(s.Push("abc"), "abc");
  EXPECT_FALSE(s.stopped());
}

}  // namespace
}  // namespace argus::serve

// Chat templates: the prompt text each model family was trained on, written out by hand for the
// families argus serves (llama.cpp's llm_chat_apply_template does the same instead of running the
// GGUF's Jinja source). The layouts follow the models' published templates: Qwen2's ChatML,
// Meta's Llama 3 Instruct template and the Llama 2 chat format of Meta's reference code.
#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "serve/api.h"

namespace argus::serve {
namespace {

constexpr std::array<std::pair<ChatTemplate, std::string_view>, 4> kTemplateNames = {{
    {ChatTemplate::kNone, "none"},
    {ChatTemplate::kChatMl, "chatml"},
    {ChatTemplate::kLlama3, "llama3"},
    {ChatTemplate::kLlama2, "llama2"},
}};

// The Llama templates strip each message (Jinja's `| trim`, Python's strip() in Meta's code).
std::string_view Trim(std::string_view s) {
  constexpr std::string_view kSpace = " \t\n\r\f\v";
  const size_t begin = s.find_first_not_of(kSpace);
  if (begin == std::string_view::npos) return {};
  return s.substr(begin, s.find_last_not_of(kSpace) - begin + 1);
}

// A conversation that ends with an assistant message asks to continue it (Anthropic's
// "prefill"): that message stays open and no new assistant header follows.
bool IsPrefill(const std::vector<ChatMessage>& messages, size_t i) {
  return i + 1 == messages.size() && messages[i].role == "assistant";
}

std::string RenderChatMl(const std::vector<ChatMessage>& messages) {
  std::string out;
  for (size_t i = 0; i < messages.size(); ++i) {
    out += "<|im_start|>" + messages[i].role + "\n" + messages[i].text;
    if (IsPrefill(messages, i)) return out;
    out += "<|im_end|>\n";
  }
  return out + "<|im_start|>assistant\n";
}

// No <|begin_of_text|>: the tokenizer adds BOS.
std::string RenderLlama3(const std::vector<ChatMessage>& messages) {
  std::string out;
  for (size_t i = 0; i < messages.size(); ++i) {
    out += "<|start_header_id|>" + messages[i].role + "<|end_header_id|>\n\n";
    out += Trim(messages[i].text);
    if (IsPrefill(messages, i)) return out;
    out += "<|eot_id|>";
  }
  return out + "<|start_header_id|>assistant<|end_header_id|>\n\n";
}

// "[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {assistant} </s><s>[INST] {user} [/INST]":
// the system prompt goes inside the next user turn, and every turn but the first opens with <s>
// (the first one's BOS comes from the tokenizer).
std::string RenderLlama2(const std::vector<ChatMessage>& messages) {
  std::string out, system;
  bool open_with_bos = false;
  const auto open_turn = [&](std::string_view user_text) {
    out += open_with_bos ? "<s>[INST] " : "[INST] ";
    if (!system.empty()) out += "<<SYS>>\n" + system + "\n<</SYS>>\n\n";
    system.clear();
    out += Trim(user_text);
    out += " [/INST]";
  };
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "system") {
      system += system.empty() ? "" : "\n\n";
      system += Trim(m.text);
    } else if (m.role == "user") {
      open_turn(m.text);
    } else {
      out += " ";
      out += Trim(m.text);
      if (IsPrefill(messages, i)) return out;
      out += " </s>";
      open_with_bos = true;
    }
  }
  if (!system.empty()) open_turn("");  // a system prompt with no user turn after it
  return out;
}

}  // namespace

std::string_view ChatTemplateName(ChatTemplate t) {
  for (const auto& [value, name] : kTemplateNames) {
    if (value == t) return name;
  }
  return "none";
}

std::optional<ChatTemplate> ChatTemplateByName(std::string_view name) {
  for (const auto& [value, known] : kTemplateNames) {
    if (known == name) return value;
  }
  return std::nullopt;
}

ChatTemplate DetectChatTemplate(std::string_view jinja_source) {
  const auto contains = [&](std::string_view marker) {
    return jinja_source.find(marker) != std::string_view::npos;
  };
  if (contains("<|im_start|>")) return ChatTemplate::kChatMl;
  if (contains("<|start_header_id|>")) return ChatTemplate::kLlama3;
  if (contains("[INST]")) return ChatTemplate::kLlama2;
  return ChatTemplate::kNone;
}

std::string RenderPrompt(ChatTemplate t, const std::vector<ChatMessage>& messages) {
  switch (t) {
    case ChatTemplate::kChatMl:
      return RenderChatMl(messages);
    case ChatTemplate::kLlama3:
      return RenderLlama3(messages);
    case ChatTemplate::kLlama2:
      return RenderLlama2(messages);
    case ChatTemplate::kNone:
      break;
  }
  std::string out;
  for (const ChatMessage& m : messages) out += m.text;
  return out;
}

}  // namespace argus::serve

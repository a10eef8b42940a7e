#include "tokenizer/chat_format.h"

#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_reader.h"
#include "core/user_file.h"
#include "tokenizer/tokenizer.h"

namespace entropyinfer {
namespace {

constexpr std::string_view kWhitespace = " \t\n\r\f\v";

std::string_view trim(std::string_view text, std::string_view characters = kWhitespace) {
  const size_t begin = text.find_first_not_of(characters);
  if (begin == std::string_view::npos) return {};
  const size_t end = text.find_last_not_of(characters);
  return text.substr(begin, end - begin + 1);
}

std::string_view trim_left(std::string_view text, std::string_view characters) {
  const size_t begin = text.find_first_not_of(characters);
  return begin == std::string_view::npos ? std::string_view() : text.substr(begin);
}

bool contains(std::string_view text, std::string_view marker) {
  return text.find(marker) != std::string_view::npos;
}

[[noreturn]] void unsupported_role(ChatFormat format, const ChatMessage& message, size_t index) {
  throw Error("chat message " + std::to_string(index) + " has role '" + message.role +
              "', which the " + std::string(chat_format_name(format)) +
              " chat format cannot write (it takes system, user and assistant)");
}

std::string format_llama3(const std::vector<ChatMessage>& messages, const ChatOptions& options) {
  // Llama 3's template trims every message and writes BOS before the first header.
  std::string prompt = "<|begin_of_text|>";
  for (const ChatMessage& message : messages) {
    prompt += "<|start_header_id|>";
    prompt += message.role;
    prompt += "<|end_header_id|>\n\n";
    prompt += trim(message.content);
    prompt += "<|eot_id|>";
  }
  if (options.add_generation_prompt) prompt += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return prompt;
}

bool is_tool_response(std::string_view content) {
  return content.starts_with("<tool_response>") && content.ends_with("</tool_response>");
}

// ChatML as the Qwen templates write it. Consecutive tool results are gathered into one user turn,
// each wrapped in <tool_response>. With `qwen3`, assistant answers after the last real user query
// keep their reasoning in a think block and earlier ones lose it, as Qwen3's template does.
std::string format_chatml(const ChatStyle& style, const std::vector<ChatMessage>& messages,
                          const ChatOptions& options, bool qwen3) {
  std::string prompt;
  if (!style.default_system_prompt.empty() && messages.front().role != "system") {
    prompt += "<|im_start|>system\n" + style.default_system_prompt + "<|im_end|>\n";
  }
  size_t last_query_index = messages.size() - 1;
  for (size_t i = messages.size(); i-- > 0;) {
    if (messages[i].role == "user" && !is_tool_response(messages[i].content)) {
      last_query_index = i;
      break;
    }
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& message = messages[i];
    if (message.role == "tool") {
      if (i == 0 || messages[i - 1].role != "tool") prompt += "<|im_start|>user";
      prompt += "\n<tool_response>\n" + message.content + "\n</tool_response>";
      if (i + 1 == messages.size() || messages[i + 1].role != "tool") prompt += "<|im_end|>\n";
      continue;
    }
    prompt += "<|im_start|>" + message.role + "\n";
    if (qwen3 && message.role == "assistant") {
      std::string_view content = message.content;
      std::string_view reasoning;
      const size_t think_end = content.rfind("</think>");
      if (think_end != std::string_view::npos) {
        std::string_view before = content.substr(0, content.find("</think>"));
        const size_t think_start = before.rfind("<think>");
        if (think_start != std::string_view::npos) before.remove_prefix(think_start + 7);
        reasoning = trim(before, "\n");
        content = trim_left(content.substr(think_end + 8), "\n");
      }
      const bool is_last = i + 1 == messages.size();
      if (i > last_query_index && (is_last || !reasoning.empty())) {
        prompt += "<think>\n";
        prompt += reasoning;
        prompt += "\n</think>\n\n";
      }
      prompt += content;
    } else {
      prompt += message.content;
    }
    prompt += "<|im_end|>\n";
  }
  if (options.add_generation_prompt) {
    prompt += "<|im_start|>assistant\n";
    if (qwen3 && !options.enable_thinking) prompt += "<think>\n\n</think>\n\n";
  }
  return prompt;
}

// Mistral's templates fold the system message into the first user message, separated by a blank
// line.
std::vector<ChatMessage> fold_system_into_first_user(ChatFormat format,
                                                     const std::vector<ChatMessage>& messages) {
  std::string system;
  std::vector<ChatMessage> folded;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& message = messages[i];
    if (message.role == "system") {
      if (!system.empty()) system += "\n\n";
      system += message.content;
    } else if (message.role == "user" || message.role == "assistant") {
      folded.push_back(message);
    } else {
      unsupported_role(format, message, i);
    }
  }
  if (!system.empty()) {
    for (ChatMessage& message : folded) {
      if (message.role == "user") {
        message.content = system + "\n\n" + message.content;
        system.clear();
        break;
      }
    }
    if (!system.empty()) {
      throw Error("the " + std::string(chat_format_name(format)) +
                  " chat format needs a user message to carry the system message");
    }
  }
  return folded;
}

std::string format_mistral(ChatFormat format, const std::vector<ChatMessage>& messages) {
  const bool spaced = format == ChatFormat::kMistralV1;
  std::string prompt = "<s>";
  for (const ChatMessage& message : fold_system_into_first_user(format, messages)) {
    if (message.role == "user") {
      prompt += spaced ? "[INST] " : "[INST]";
      prompt += message.content;
      prompt += spaced ? " [/INST]" : "[/INST]";
    } else {
      if (spaced) prompt += ' ';
      prompt += message.content;
      prompt += "</s>";
    }
  }
  return prompt;
}

std::string format_llama2(const std::vector<ChatMessage>& messages) {
  // Meta's chat format: every exchange is its own <s>...</s> sequence; the system message sits in a
  // <<SYS>> block at the start of the first user message.
  std::string system;
  size_t first = 0;
  if (!messages.empty() && messages.front().role == "system") {
    system = messages.front().content;
    first = 1;
  }
  std::string prompt;
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& message = messages[i];
    std::string content = message.content;
    if (i == first && first == 1) content = "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + content;
    if (message.role == "user") {
      prompt += "<s>[INST] ";
      prompt += trim(content);
      prompt += " [/INST]";
    } else if (message.role == "assistant") {
      prompt += ' ';
      prompt += trim(content);
      prompt += " </s>";
    } else {
      unsupported_role(ChatFormat::kLlama2, message, i);
    }
  }
  return prompt;
}

// The literal system prompt a ChatML template writes when the conversation brings none, e.g.
// {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. ...<|im_end|>\n' }}. Only a
// stretch without quotes or Jinja syntax counts, so '<|im_start|>system\n' + message['content']
// gives nothing.
std::string find_default_system_prompt(std::string_view chat_template) {
  constexpr std::string_view kOpen = "<|im_start|>system\\n";
  constexpr std::string_view kClose = "<|im_end|>";
  for (size_t at = chat_template.find(kOpen); at != std::string_view::npos;
       at = chat_template.find(kOpen, at + 1)) {
    const size_t begin = at + kOpen.size();
    const size_t end = chat_template.find(kClose, begin);
    if (end == std::string_view::npos) break;
    const std::string_view literal = chat_template.substr(begin, end - begin);
    if (literal.empty() || literal.find_first_of("'\"{}+") != std::string_view::npos) continue;
    return std::string(literal);
  }
  return {};
}

}  // namespace

std::string_view chat_format_name(ChatFormat format) {
  switch (format) {
    case ChatFormat::kLlama3:
      return "llama3";
    case ChatFormat::kChatML:
      return "chatml";
    case ChatFormat::kQwen3:
      return "qwen3";
    case ChatFormat::kMistral:
      return "mistral";
    case ChatFormat::kMistralV1:
      return "mistral-v1";
    case ChatFormat::kLlama2:
      return "llama2";
  }
  return "unknown";
}

ChatStyle chat_style_from_name(std::string_view name) {
  for (const ChatFormat format :
       {ChatFormat::kLlama3, ChatFormat::kChatML, ChatFormat::kQwen3, ChatFormat::kMistral,
        ChatFormat::kMistralV1, ChatFormat::kLlama2}) {
    if (name == chat_format_name(format)) return ChatStyle{format, {}};
  }
  throw Error("unknown chat format '" + std::string(name) +
              "' (known: llama3, chatml, qwen3, mistral, mistral-v1, llama2)");
}

ChatStyle detect_chat_style(std::string_view chat_template) {
  if (contains(chat_template, "<|start_header_id|>")) return {ChatFormat::kLlama3, {}};
  if (contains(chat_template, "<|im_start|>")) {
    const ChatFormat format =
        contains(chat_template, "<think>") ? ChatFormat::kQwen3 : ChatFormat::kChatML;
    return {format, find_default_system_prompt(chat_template)};
  }
  if (contains(chat_template, "<<SYS>>")) return {ChatFormat::kLlama2, {}};
  if (contains(chat_template, "[INST]")) {
    // Mistral 7B v0.1/v0.2 write ' [/INST]' with a space; the v3 templates write '[/INST]'.
    const bool spaced =
        contains(chat_template, "' [/INST]'") || contains(chat_template, "\" [/INST]\"");
    return {spaced ? ChatFormat::kMistralV1 : ChatFormat::kMistral, {}};
  }
  throw Error(
      "the chat template is none of the recognised formats (Llama 3 <|start_header_id|>, ChatML "
      "<|im_start|>, Mistral/Llama 2 [INST]); choose one explicitly (llama3, chatml, qwen3, "
      "mistral, mistral-v1, llama2)");
}

std::string read_chat_template(const std::string& model_path) {
  namespace fs = std::filesystem;
  std::error_code error;
  const bool is_dir = fs::is_directory(model_path, error);
  const fs::path config_path =
      is_dir ? fs::path(model_path) / "tokenizer_config.json" : fs::path(model_path);
  const fs::path jinja_path = is_dir ? fs::path(model_path) / "chat_template.jinja" : fs::path();

  if (fs::exists(config_path, error)) {
    const nlohmann::json config = read_json_file(config_path.string(), "tokenizer config");
    if (config.is_object() && config.contains("chat_template")) {
      const nlohmann::json& chat_template = config["chat_template"];
      if (chat_template.is_string()) return chat_template.get<std::string>();
      if (chat_template.is_array()) {
        // A list of {"name", "template"}: "default" is what the model uses for plain chat.
        const nlohmann::json* chosen = nullptr;
        for (const nlohmann::json& entry : chat_template) {
          if (!entry.is_object() || !entry.contains("template") || !entry["template"].is_string()) {
            continue;
          }
          if (chosen == nullptr) chosen = &entry;
          if (entry.value("name", "") == "default") chosen = &entry;
        }
        if (chosen != nullptr) return (*chosen)["template"].get<std::string>();
      }
      throw Error("'" + config_path.string() +
                  "' has a chat_template that is neither a string nor a list of named templates");
    }
  }
  if (!jinja_path.empty() && fs::exists(jinja_path, error)) {
    return read_user_file(jinja_path.string(), "chat template");
  }
  throw Error("no chat template found for '" + model_path +
              "': expected a \"chat_template\" in tokenizer_config.json or a chat_template.jinja");
}

ChatStyle select_chat_style(const std::string& model_path, std::string_view override_name) {
  if (!override_name.empty()) return chat_style_from_name(override_name);
  const std::string chat_template = read_chat_template(model_path);
  try {
    return detect_chat_style(chat_template);
  } catch (const Error& error) {
    throw Error("chat template of '" + model_path + "': " + error.what());
  }
}

ChatStyle adapt_chat_style_to_tokenizer(ChatStyle style, const Tokenizer& tokenizer) {
  if (style.format == ChatFormat::kMistral || style.format == ChatFormat::kMistralV1) {
    style.format = tokenizer.token_id("[INST]") ? ChatFormat::kMistral : ChatFormat::kMistralV1;
  }
  return style;
}

std::string format_chat(const ChatStyle& style, const std::vector<ChatMessage>& messages,
                        const ChatOptions& options) {
  if (messages.empty()) throw Error("cannot format a chat prompt with no messages");
  switch (style.format) {
    case ChatFormat::kLlama3:
      return format_llama3(messages, options);
    case ChatFormat::kChatML:
      return format_chatml(style, messages, options, /*qwen3=*/false);
    case ChatFormat::kQwen3:
      return format_chatml(style, messages, options, /*qwen3=*/true);
    case ChatFormat::kMistral:
    case ChatFormat::kMistralV1:
      return format_mistral(style.format, messages);
    case ChatFormat::kLlama2:
      return format_llama2(messages);
  }
  throw Error("unknown chat format");
}

std::vector<std::string> chat_stop_strings(ChatFormat format) {
  switch (format) {
    case ChatFormat::kLlama3:
      return {"<|eot_id|>", "<|end_of_text|>", "<|eom_id|>"};
    case ChatFormat::kChatML:
    case ChatFormat::kQwen3:
      return {"<|im_end|>", "<|endoftext|>"};
    case ChatFormat::kMistral:
    case ChatFormat::kMistralV1:
    case ChatFormat::kLlama2:
      return {"</s>"};
  }
  return {};
}

}  // namespace entropyinfer

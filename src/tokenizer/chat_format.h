// Chat prompts for the instruction-tuned model families the engine runs. Rather than interpreting
// the Jinja `chat_template` of a model's tokenizer_config.json, the template is recognised by its
// markers and a built-in C++ equivalent writes the prompt:
//   Llama 3      <|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>...
//   ChatML       <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n      (Qwen 1.5 - 2.5)
//   Qwen 3       ChatML, plus the empty think block when thinking is switched off, and earlier
//                answers' reasoning left out, as Qwen3's template does
//   Mistral      <s>[INST]Hi[/INST]Hello</s>        (tokenizers with [INST] control tokens: v2, v3)
//   Mistral v1   <s>[INST] Hi [/INST] Hello</s>     (7B v0.1/v0.2: [INST] is plain text)
//   Llama 2      <s>[INST] <<SYS>>\nsys\n<</SYS>>\n\nHi [/INST] Hello </s>
// The text is meant to be encoded with EncodeOptions{.add_bos = false, .parse_special = true}: it
// already holds the BOS text where the family's template writes one. The two Mistral styles differ
// because the SentencePiece encoder puts a dummy-prefix space before every text run that follows a
// control token; with that, both reproduce Mistral's reference tokenization (mistral-common).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace entropyinfer {

class Tokenizer;

enum class ChatFormat {
  kLlama3,
  kChatML,
  kQwen3,
  kMistral,
  kMistralV1,
  kLlama2,
};

struct ChatMessage {
  std::string role;  // "system", "user", "assistant" (ChatML formats also take "tool")
  std::string content;
};

// A recognised template: the format and what the template fills in by itself.
struct ChatStyle {
  ChatFormat format = ChatFormat::kChatML;
  // ChatML: the system message the template writes when the conversation has none (Qwen 2.5's
  // "You are Qwen, created by Alibaba Cloud. ..."); empty for none.
  std::string default_system_prompt;
};

struct ChatOptions {
  // Ends the prompt with the header that opens the assistant's answer (Llama 3, ChatML, Qwen 3).
  // The [INST] formats have none: the closing [/INST] is the cue.
  bool add_generation_prompt = true;
  // Qwen 3 only: false writes "<think>\n\n</think>\n\n" after the generation prompt, which is how
  // Qwen 3's template turns thinking off.
  bool enable_thinking = true;
};

// The prompt text. Throws Error for an empty conversation or a role the format cannot write.
std::string format_chat(const ChatStyle& style, const std::vector<ChatMessage>& messages,
                        const ChatOptions& options = {});

// Recognises a Jinja chat template by its markers. Throws Error when none is recognisable.
ChatStyle detect_chat_style(std::string_view chat_template);

// The style for an explicit format name: "llama3", "chatml", "qwen3", "mistral", "mistral-v1",
// "llama2". Throws Error listing the names for anything else.
ChatStyle chat_style_from_name(std::string_view name);
std::string_view chat_format_name(ChatFormat format);

// The chat template of a model folder: tokenizer_config.json's "chat_template" (a string, or a list
// of named templates of which "default" is taken) or else chat_template.jinja. `model_path` may
// also name the tokenizer_config.json file itself. Throws Error naming what is missing or
// malformed.
std::string read_chat_template(const std::string& model_path);

// The style to use for a model: `override_name` when it is not empty, else the one recognised in
// the model folder's chat template. Throws Error when neither gives one.
ChatStyle select_chat_style(const std::string& model_path, std::string_view override_name = {});

// Picks the Mistral style that matches the tokenizer: "[INST]" as a single (control) token means
// the tight v2/v3 style, otherwise the spaced v1 style. Other formats pass through unchanged.
ChatStyle adapt_chat_style_to_tokenizer(ChatStyle style, const Tokenizer& tokenizer);

// Texts whose appearance ends the assistant's turn: the end-of-turn token first, then other
// end-of-sequence tokens of the family.
std::vector<std::string> chat_stop_strings(ChatFormat format);

}  // namespace entropyinfer

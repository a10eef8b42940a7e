// Chat prompts: exact texts per format (the Llama 3 and Qwen 3 expectations are what the models'
// own Jinja templates render for the same conversations), recognition of templates by their
// markers, and reading templates from model folders.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "test_support.h"
#include "tokenizer/chat_format.h"
#include "tokenizer/sentencepiece_tokenizer.h"

namespace entropyinfer {
namespace {

using ::entropyinfer::testing::asset_path;

const std::vector<ChatMessage> kConversation = {
    {"system", "You are terse."},
    {"user", "  Hi there!\n"},
    {"assistant", "Hello."},
    {"user", "What is 2+2?"},
};

TEST(ChatFormat, Llama3) {
  // Llama 3's template trims each message.
  EXPECT_EQ(format_chat({ChatFormat::kLlama3, {}}, kConversation),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are "
            "terse.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi "
            "there!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|><|"
            "start_header_id|>user<|end_header_id|>\n\nWhat is "
            "2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(
      format_chat({ChatFormat::kLlama3, {}}, {{"user", "Hi"}}, {.add_generation_prompt = false}),
      "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>");
}

TEST(ChatFormat, ChatMLAndQwen3) {
  const std::string expected =
      "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\n  Hi "
      "there!\n<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nWhat is "
      "2+2?<|im_end|>\n<|im_start|>assistant\n";
  EXPECT_EQ(format_chat({ChatFormat::kChatML, {}}, kConversation), expected);
  EXPECT_EQ(format_chat({ChatFormat::kQwen3, {}}, kConversation), expected);
  // Thinking switched off: Qwen 3 opens the answer with an empty think block; plain ChatML does
  // not.
  EXPECT_EQ(format_chat({ChatFormat::kQwen3, {}}, kConversation, {.enable_thinking = false}),
            expected + "<think>\n\n</think>\n\n");
  EXPECT_EQ(format_chat({ChatFormat::kChatML, {}}, kConversation, {.enable_thinking = false}),
            expected);
  EXPECT_EQ(format_chat({ChatFormat::kQwen3, {}}, kConversation, {.add_generation_prompt = false}),
            expected.substr(0, expected.size() - std::string("<|im_start|>assistant\n").size()));
}

TEST(ChatFormat, ChatMLDefaultSystemPrompt) {
  const ChatStyle style{ChatFormat::kChatML, "You are a helpful assistant."};
  EXPECT_EQ(format_chat(style, {{"user", "Hi"}}),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_"
            "end|>\n<|im_start|>assistant\n");
  // A conversation's own system message replaces the default.
  EXPECT_EQ(format_chat(style, {{"system", "Be brief."}, {"user", "Hi"}}),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>"
            "assistant\n");
}

TEST(ChatFormat, Qwen3ReasoningAndToolResults) {
  std::vector<ChatMessage> messages = {
      {"user", "Weather?"},
      {"assistant", "<think>\nI should call the tool.\n</think>\n\nLet me check."},
      {"tool", "22C"},
      {"tool", "sunny"},
      {"assistant", "<think>\nGot it.\n</think>\n\nIt is 22C and sunny."},
  };
  // Answers after the last real user query keep their reasoning; tool results gather in one turn.
  EXPECT_EQ(
      format_chat({ChatFormat::kQwen3, {}}, messages, {.add_generation_prompt = false}),
      "<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n<think>\nI should call "
      "the tool.\n</think>\n\nLet me check.<|im_end|>\n<|im_start|>user\n<tool_response>\n22C\n"
      "</tool_response>\n<tool_response>\nsunny\n</tool_response><|im_end|>\n<|im_start|>"
      "assistant\n<think>\nGot it.\n</think>\n\nIt is 22C and sunny.<|im_end|>\n");
  // Once the user speaks again, earlier reasoning is dropped; the last answer keeps a think block.
  messages.push_back({"user", "Thanks"});
  messages.push_back({"assistant", "<think>old</think>You're welcome."});
  EXPECT_EQ(format_chat({ChatFormat::kQwen3, {}}, messages, {.add_generation_prompt = false}),
            "<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\nLet me "
            "check.<|im_end|>\n<|im_start|>user\n<tool_response>\n22C\n</tool_response>\n<tool_"
            "response>\nsunny\n</tool_response><|im_end|>\n<|im_start|>assistant\nIt is 22C and "
            "sunny.<|im_end|>\n<|im_start|>user\nThanks<|im_end|>\n<|im_start|>assistant\n<think>"
            "\nold\n</think>\n\nYou're welcome.<|im_end|>\n");
}

TEST(ChatFormat, MistralStyles) {
  // The system message joins the first user message.
  EXPECT_EQ(format_chat({ChatFormat::kMistral, {}}, kConversation),
            "<s>[INST]You are terse.\n\n  Hi there!\n[/INST]Hello.</s>[INST]What is 2+2?[/INST]");
  EXPECT_EQ(format_chat({ChatFormat::kMistralV1, {}}, kConversation),
            "<s>[INST] You are terse.\n\n  Hi there!\n [/INST] Hello.</s>[INST] What is 2+2? "
            "[/INST]");
  EXPECT_THROW(format_chat({ChatFormat::kMistral, {}}, {{"tool", "x"}, {"user", "y"}}), Error);
  EXPECT_THROW(format_chat({ChatFormat::kMistral, {}}, {{"system", "only a system message"}}),
               Error);
}

TEST(ChatFormat, Llama2) {
  EXPECT_EQ(format_chat({ChatFormat::kLlama2, {}}, kConversation),
            "<s>[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\n  Hi there! [/INST] Hello. "
            "</s><s>[INST] What is 2+2? [/INST]");
  EXPECT_EQ(format_chat({ChatFormat::kLlama2, {}}, {{"user", "Hi"}}), "<s>[INST] Hi [/INST]");
}

TEST(ChatFormat, EmptyConversationIsAnError) {
  EXPECT_THROW(format_chat({ChatFormat::kChatML, {}}, {}), Error);
}

TEST(ChatFormat, StopStrings) {
  EXPECT_EQ(chat_stop_strings(ChatFormat::kLlama3).front(), "<|eot_id|>");
  EXPECT_EQ(chat_stop_strings(ChatFormat::kChatML).front(), "<|im_end|>");
  EXPECT_EQ(chat_stop_strings(ChatFormat::kQwen3).front(), "<|im_end|>");
  EXPECT_EQ(chat_stop_strings(ChatFormat::kMistral), std::vector<std::string>{"</s>"});
  EXPECT_EQ(chat_stop_strings(ChatFormat::kLlama2), std::vector<std::string>{"</s>"});
}

// --- recognising templates ---

TEST(ChatTemplateDetection, RecognisesFamiliesByMarkers) {
  EXPECT_EQ(detect_chat_style("{% for message in messages %}{{ '<|start_header_id|>' + "
                              "message['role'] + '<|end_header_id|>\\n\\n' }}{% endfor %}")
                .format,
            ChatFormat::kLlama3);
  EXPECT_EQ(detect_chat_style("{{ '<|im_start|>' + message.role + '\\n' }}").format,
            ChatFormat::kChatML);
  EXPECT_EQ(detect_chat_style("{{- '<|im_start|>assistant\\n' }}{%- if enable_thinking is false "
                              "%}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}")
                .format,
            ChatFormat::kQwen3);
  EXPECT_EQ(detect_chat_style("{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% set "
                              "content = '<<SYS>>\\n' + system_message %}")
                .format,
            ChatFormat::kLlama2);
  EXPECT_EQ(detect_chat_style("{{ '[INST] ' + message['content'] + ' [/INST]' }}").format,
            ChatFormat::kMistralV1);
  EXPECT_EQ(detect_chat_style("{{- \"[INST] \" + message[\"content\"] + \"[/INST]\" }}").format,
            ChatFormat::kMistral);
}

TEST(ChatTemplateDetection, FindsQwenDefaultSystemPrompt) {
  const ChatStyle style = detect_chat_style(
      "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + "
      "messages[0]['content'] + '<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nYou are "
      "Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}{%- endif %}");
  EXPECT_EQ(style.format, ChatFormat::kChatML);
  EXPECT_EQ(style.default_system_prompt,
            "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
  EXPECT_EQ(
      detect_chat_style("{{ '<|im_start|>system\\n' + m + '<|im_end|>' }}").default_system_prompt,
      "");
}

TEST(ChatTemplateDetection, UnrecognisedTemplateIsAnError) {
  try {
    detect_chat_style("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}");
    ADD_FAILURE() << "no Error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("recognised"), std::string::npos) << error.what();
  }
}

TEST(ChatTemplateDetection, NamesAndOverrides) {
  for (const ChatFormat format :
       {ChatFormat::kLlama3, ChatFormat::kChatML, ChatFormat::kQwen3, ChatFormat::kMistral,
        ChatFormat::kMistralV1, ChatFormat::kLlama2}) {
    EXPECT_EQ(chat_style_from_name(chat_format_name(format)).format, format);
  }
  EXPECT_THROW(chat_style_from_name("vicuna"), Error);
}

// --- model folders ---

class ChatTemplateFolder : public ::testing::Test {
 protected:
  void SetUp() override {
    folder_ = std::filesystem::temp_directory_path() /
              ("entropyinfer_chat_" + std::to_string(::getpid()) + "_" +
               ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(folder_);
    std::filesystem::create_directories(folder_);
  }
  void TearDown() override { std::filesystem::remove_all(folder_); }
  void write(const std::string& name, const std::string& contents) {
    std::ofstream(folder_ / name, std::ios::binary) << contents;
  }
  std::filesystem::path folder_;
};

TEST_F(ChatTemplateFolder, StringTemplateInTokenizerConfig) {
  write("tokenizer_config.json",
        R"({"bos_token": "<|begin_of_text|>", "chat_template": "{{ '<|start_header_id|>' }}"})");
  EXPECT_EQ(select_chat_style(folder_.string()).format, ChatFormat::kLlama3);
  EXPECT_EQ(select_chat_style((folder_ / "tokenizer_config.json").string()).format,
            ChatFormat::kLlama3);
  // An explicit choice wins over the template.
  EXPECT_EQ(select_chat_style(folder_.string(), "chatml").format, ChatFormat::kChatML);
}

TEST_F(ChatTemplateFolder, ListOfNamedTemplatesTakesDefault) {
  write("tokenizer_config.json",
        R"({"chat_template": [{"name": "tool_use", "template": "{{ '<|start_header_id|>' }}"},
                              {"name": "default", "template": "{{ '<|im_start|>' }}"}]})");
  EXPECT_EQ(select_chat_style(folder_.string()).format, ChatFormat::kChatML);
}

TEST_F(ChatTemplateFolder, JinjaFileBesideConfig) {
  write("tokenizer_config.json", R"({"bos_token": "<s>"})");
  write("chat_template.jinja", "{{ '[INST] ' + message['content'] + ' [/INST]' }}");
  EXPECT_EQ(select_chat_style(folder_.string()).format, ChatFormat::kMistralV1);
}

TEST_F(ChatTemplateFolder, MissingTemplateIsAnError) {
  write("tokenizer_config.json", R"({"bos_token": "<s>"})");
  try {
    select_chat_style(folder_.string());
    ADD_FAILURE() << "no Error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find(folder_.string()), std::string::npos) << error.what();
  }
  // ...but an explicit format needs no template.
  EXPECT_EQ(select_chat_style(folder_.string(), "mistral").format, ChatFormat::kMistral);
}

TEST_F(ChatTemplateFolder, MalformedConfigIsAnError) {
  write("tokenizer_config.json", "{\"chat_template\": ");
  EXPECT_THROW(select_chat_style(folder_.string()), Error);
  write("tokenizer_config.json", R"({"chat_template": 42})");
  EXPECT_THROW(select_chat_style(folder_.string()), Error);
}

TEST_F(ChatTemplateFolder, UnrecognisedTemplateNamesTheFolder) {
  write("tokenizer_config.json", R"({"chat_template": "{{ messages }}"})");
  try {
    select_chat_style(folder_.string());
    ADD_FAILURE() << "no Error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find(folder_.string()), std::string::npos) << error.what();
  }
}

TEST(ChatFormatTokenizer, MistralStyleFollowsTheTokenizer) {
  const char* v1 = "tokenizers/mistral/tokenizer.model.v1";
  const char* v3 = "tokenizers/mistral/mistral_instruct_tokenizer_240323.model.v3";
  ENTROPYINFER_REQUIRE_ASSET(v1);
  ENTROPYINFER_REQUIRE_ASSET(v3);
  const auto v1_tokenizer = load_sentencepiece_tokenizer(asset_path(v1));
  const auto v3_tokenizer = load_sentencepiece_tokenizer(asset_path(v3));
  EXPECT_EQ(adapt_chat_style_to_tokenizer({ChatFormat::kMistral, {}}, *v1_tokenizer).format,
            ChatFormat::kMistralV1);
  EXPECT_EQ(adapt_chat_style_to_tokenizer({ChatFormat::kMistralV1, {}}, *v3_tokenizer).format,
            ChatFormat::kMistral);
  EXPECT_EQ(adapt_chat_style_to_tokenizer({ChatFormat::kLlama3, {}}, *v3_tokenizer).format,
            ChatFormat::kLlama3);
  // The Mistral prompt for a v3 tokenizer encodes its markup as control tokens.
  const std::string prompt = format_chat({ChatFormat::kMistral, {}}, {{"user", "Hi"}});
  EXPECT_EQ(v3_tokenizer->encode(prompt, {.parse_special = true}),
            (std::vector<int32_t>{1, 3, v3_tokenizer->token_id("\xE2\x96\x81Hi").value_or(-1), 4}));
}

}  // namespace
}  // namespace entropyinfer

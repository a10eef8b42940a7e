// The OpenAI request parser and response builders of `entropyinfer serve`: every class of bad
// request is one ApiError with the right status, type and param and a message naming the problem;
// good requests give the fields they say; responses and stream chunks have the shapes OpenAI's
// clients read.
#include <gtest/gtest.h>

#include <cmath>
#include <initializer_list>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "serve/openai_protocol.h"

namespace entropyinfer::serve {
namespace {

using json = nlohmann::json;

ServedModel served_model() {
  ServedModel served;
  served.id = "needle-llama-11m";
  served.vocab_size = 4096;
  served.prompt_vocab_size = 4000;  // fewer than logit_bias may name: a padded model's rows
  served.default_attention.prefill = PrefillMethod::kEntropy;
  served.default_attention.prefill_params.segment_size = 64;
  served.default_attention.prefill_params.block_size = 8;
  return served;
}

CompletionRequest parse(Endpoint endpoint, std::string_view body) {
  return parse_completion_request(endpoint, body, served_model());
}

CompletionRequest parse_completion(const json& body) {
  return parse(Endpoint::kCompletions, body.dump());
}

CompletionRequest parse_chat(const json& body) {
  return parse(Endpoint::kChatCompletions, body.dump());
}

struct Expected {
  int status;
  std::string type;
  std::string param;  // empty: null
  std::vector<std::string> named;
};

// A 400 invalid_request_error about `param` whose message names each of `named`.
Expected refused(std::string param, std::vector<std::string> named) {
  return {400, "invalid_request_error", std::move(param), std::move(named)};
}

void expect_refused(Endpoint endpoint, std::string_view body, const Expected& expected) {
  try {
    parse(endpoint, body);
  } catch (const ApiError& error) {
    EXPECT_EQ(error.status, expected.status) << error.message;
    EXPECT_EQ(error.type, expected.type) << error.message;
    EXPECT_EQ(error.param, expected.param) << error.message;
    for (const std::string& part : expected.named) {
      EXPECT_NE(error.message.find(part), std::string::npos)
          << "'" << part << "' is not named in: " << error.message;
    }
    // The body a client gets is OpenAI's error object.
    const json body_json = json::parse(error_body(error));
    EXPECT_EQ(body_json["error"]["message"], error.message);
    EXPECT_EQ(body_json["error"]["type"], expected.type);
    if (expected.param.empty()) {
      EXPECT_TRUE(body_json["error"]["param"].is_null());
    } else {
      EXPECT_EQ(body_json["error"]["param"], expected.param);
    }
    return;
  } catch (const std::exception& error) {
    ADD_FAILURE() << "not an ApiError: " << error.what() << " for " << body;
    return;
  }
  ADD_FAILURE() << "accepted: " << body;
}

void expect_completion_refused(const json& body, const Expected& expected) {
  expect_refused(Endpoint::kCompletions, body.dump(), expected);
}

void expect_chat_refused(const json& body, const Expected& expected) {
  expect_refused(Endpoint::kChatCompletions, body.dump(), expected);
}

const json kUserTurn = json::array({{{"role", "user"}, {"content", "Hi"}}});

TEST(OpenAiRequest, CompletionFieldsParseToTheirValues) {
  const CompletionRequest request = parse_completion({{"model", "needle-llama-11m"},
                                                      {"prompt", "Once upon a time"},
                                                      {"max_tokens", 7},
                                                      {"temperature", 0.5},
                                                      {"top_p", 0.9},
                                                      {"top_k", 40},
                                                      {"seed", 1234},
                                                      {"stop", {"\n", "The end"}},
                                                      {"stream", true},
                                                      {"stream_options", {{"include_usage", true}}},
                                                      {"n", 1},
                                                      {"user", "someone"},
                                                      {"frequency_penalty", 0},
                                                      {"presence_penalty", 0.0}});
  EXPECT_EQ(request.endpoint, Endpoint::kCompletions);
  EXPECT_EQ(request.prompt, "Once upon a time");
  EXPECT_EQ(request.max_tokens, 7);
  EXPECT_FLOAT_EQ(request.sampler.temperature, 0.5f);
  EXPECT_FLOAT_EQ(request.sampler.top_p, 0.9f);
  EXPECT_EQ(request.sampler.top_k, 40);
  EXPECT_EQ(request.seed, 1234u);
  EXPECT_EQ(request.stop, (std::vector<std::string>{"\n", "The end"}));
  EXPECT_TRUE(request.stream);
  EXPECT_TRUE(request.include_usage);
  EXPECT_EQ(request.model, "needle-llama-11m");
  // The server's default attention, untouched.
  EXPECT_EQ(request.attention.prefill, PrefillMethod::kEntropy);
  EXPECT_EQ(request.attention.prefill_params.segment_size, 64);
}

TEST(OpenAiRequest, DefaultsAreOpenAisAndNullMeansAbsent) {
  const CompletionRequest request = parse_completion({{"prompt", "x"},
                                                      {"model", nullptr},
                                                      {"temperature", nullptr},
                                                      {"stop", nullptr},
                                                      {"seed", nullptr},
                                                      {"n", nullptr},
                                                      {"logprobs", nullptr},
                                                      {"stream", nullptr}});
  EXPECT_FLOAT_EQ(request.sampler.temperature, 1.0f);
  EXPECT_FLOAT_EQ(request.sampler.top_p, 1.0f);
  EXPECT_EQ(request.sampler.top_k, 0);
  EXPECT_FALSE(request.max_tokens.has_value());
  EXPECT_FALSE(request.seed.has_value());
  EXPECT_TRUE(request.stop.empty());
  EXPECT_FALSE(request.stream);
  EXPECT_FALSE(request.include_usage);
  EXPECT_EQ(request.model, "needle-llama-11m");
}

TEST(OpenAiRequest, PromptMayBeAnArrayOfOneStringAndStopOneString) {
  const CompletionRequest request =
      parse_completion({{"prompt", {"only one"}}, {"stop", "END"}, {"seed", -1}});
  EXPECT_EQ(request.prompt, "only one");
  EXPECT_EQ(request.stop, std::vector<std::string>{"END"});
  EXPECT_EQ(request.seed, UINT64_MAX);  // OpenAI's signed seeds map onto 64 bits
}

// The exact refusal of a completions body: 400 about `param` with `message`.
void expect_completion_message(std::string_view body, const std::string& param,
                               const std::string& message) {
  try {
    parse(Endpoint::kCompletions, body);
    ADD_FAILURE() << "accepted: " << body;
  } catch (const ApiError& error) {
    EXPECT_EQ(error.status, 400) << body;
    EXPECT_EQ(error.type, "invalid_request_error") << body;
    EXPECT_EQ(error.param, param) << body;
    EXPECT_EQ(error.message, message) << body;
  }
}

TEST(OpenAiRequest, TokenIdPromptsAreTheirIdsExactly) {
  const CompletionRequest flat = parse(Endpoint::kCompletions, R"({"prompt": [1, 0, 3999, 17]})");
  ASSERT_TRUE(flat.prompt_token_ids.has_value());
  EXPECT_EQ(*flat.prompt_token_ids, (std::vector<int32_t>{1, 0, 3999, 17}));
  EXPECT_EQ(flat.prompt, "");
  const CompletionRequest nested = parse(Endpoint::kCompletions, R"({"prompt": [[42]]})");
  ASSERT_TRUE(nested.prompt_token_ids.has_value());
  EXPECT_EQ(*nested.prompt_token_ids, std::vector<int32_t>{42});
  // lm-evaluation-harness's loglikelihood request: context and continuation ids, scored alone.
  const CompletionRequest scoring =
      parse(Endpoint::kCompletions,
            R"({"model": "needle-llama-11m", "prompt": [[5, 6, 7]], "echo": true, "max_tokens": 0,
          "logprobs": 1, "temperature": 0, "seed": 1234})");
  EXPECT_EQ(scoring.prompt_token_ids, (std::vector<int32_t>{5, 6, 7}));
  EXPECT_TRUE(scoring.echo);
  EXPECT_EQ(scoring.max_tokens, 0);
  EXPECT_EQ(scoring.top_logprobs, 1);
  // Text prompts carry no ids.
  EXPECT_FALSE(parse_completion({{"prompt", {"text"}}}).prompt_token_ids.has_value());
  EXPECT_FALSE(parse_completion({{"prompt", "text"}}).prompt_token_ids.has_value());
  // The context check counts the ids.
  EXPECT_EQ(resolve_max_tokens(flat, static_cast<int64_t>(flat.prompt_token_ids->size()), 20),
            kDefaultCompletionTokens);
  EXPECT_THROW(resolve_max_tokens(flat, 4, 4), ApiError);
}

TEST(OpenAiRequest, TokenIdsOutsideThePromptVocabularyNameTheIdAndTheRange) {
  expect_completion_message(R"({"prompt": [1, 4000]})", "prompt[1]",
                            "'prompt[1]' is token id 4000, outside the vocabulary: ids are 0 to "
                            "3999");
  expect_completion_message(
      R"({"prompt": [-1]})", "prompt[0]",
      "'prompt[0]' is token id -1, outside the vocabulary: ids are 0 to 3999");
  expect_completion_message(R"({"prompt": [[2, 3, 18446744073709551615]]})", "prompt[0][2]",
                            "'prompt[0][2]' is token id 18446744073709551615, outside the "
                            "vocabulary: ids are 0 to 3999");
  expect_completion_message(R"({"prompt": [-9223372036854775808]})", "prompt[0]",
                            "'prompt[0]' is token id -9223372036854775808, outside the "
                            "vocabulary: ids are 0 to 3999");
  // Without a bound the ids are those an int32 holds.
  ServedModel unbounded = served_model();
  unbounded.prompt_vocab_size = 0;
  EXPECT_EQ(
      parse_completion_request(Endpoint::kCompletions, R"({"prompt": [2147483647]})", unbounded)
          .prompt_token_ids,
      std::vector<int32_t>{2147483647});
  EXPECT_THROW(
      parse_completion_request(Endpoint::kCompletions, R"({"prompt": [2147483648]})", unbounded),
      ApiError);
}

TEST(OpenAiRequest, MalformedTokenIdPromptsAreRefusedNamingTheElement) {
  expect_completion_message(R"({"prompt": []})", "prompt",
                            "'prompt' is an empty array; send a string or at least one token id");
  expect_completion_message(R"({"prompt": [[]]})", "prompt[0]",
                            "'prompt[0]' is an empty token array; send at least one token id");
  expect_completion_message(R"({"prompt": [1.5]})", "prompt[0]",
                            "'prompt[0]' must be a string, an integer token id or an array of "
                            "token ids, got a number");
  expect_completion_message(R"({"prompt": [1, 2.0]})", "prompt[1]",
                            "'prompt[1]' must be an integer token id, got a number");
  expect_completion_message(R"({"prompt": [1, "a"]})", "prompt[1]",
                            "'prompt[1]' must be an integer token id, got a string");
  expect_completion_message(R"({"prompt": ["a", 1]})", "prompt[1]",
                            "'prompt[1]' must be a string, got an integer");
  expect_completion_message(R"({"prompt": [true]})", "prompt[0]",
                            "'prompt[0]' must be a string, an integer token id or an array of "
                            "token ids, got a boolean");
  expect_completion_message(R"({"prompt": [1, false]})", "prompt[1]",
                            "'prompt[1]' must be an integer token id, got a boolean");
  expect_completion_message(R"({"prompt": [null]})", "prompt[0]",
                            "'prompt[0]' must be a string, an integer token id or an array of "
                            "token ids, got null");
  expect_completion_message(R"({"prompt": [[[1]]]})", "prompt[0][0]",
                            "'prompt[0][0]' must be an integer token id, got an array");
  expect_completion_message(R"({"prompt": [[1, [2]]]})", "prompt[0][1]",
                            "'prompt[0][1]' must be an integer token id, got an array");
  expect_completion_message(R"({"prompt": [1, [2]]})", "prompt[1]",
                            "'prompt[1]' must be an integer token id, got an array");
  expect_completion_message(R"({"prompt": [[1], "a"]})", "prompt[1]",
                            "'prompt[1]' must be an array of token ids, got a string");
  expect_completion_message(R"({"prompt": {"ids": [1]}})", "prompt",
                            "'prompt' must be a string, an array of token ids or an array of one "
                            "of those, got an object");
}

TEST(OpenAiRequest, BatchedPromptsAreRefusedAsSuch) {
  expect_completion_message(R"({"prompt": [[1, 2], [3]]})", "prompt",
                            "only one prompt per request is supported, got 2 prompts");
  expect_completion_message(R"({"prompt": ["a", "b", "c"]})", "prompt",
                            "only one prompt per request is supported, got 3 prompts");
  // A batch whose later prompt is bad is still refused (either way, never run).
  expect_completion_message(R"({"prompt": [[1], [4000]]})", "prompt",
                            "only one prompt per request is supported, got 2 prompts");
}

TEST(OpenAiRequest, ChatMessagesWithStringAndTextPartContent) {
  const CompletionRequest request = parse_chat(
      {{"messages",
        {{{"role", "developer"}, {"content", "Be brief."}},
         {{"role", "user"},
          {"content",
           {{{"type", "text"}, {"text", "Hello"}}, {{"type", "text"}, {"text", "there"}}}},
          {"name", "ann"}},
         {{"role", "assistant"}, {"content", nullptr}},
         {{"role", "user"}, {"content", "And?"}}}},
       {"max_completion_tokens", 12},
       {"tools", json::array()},
       {"response_format", {{"type", "text"}}},
       {"logprobs", false}});
  ASSERT_EQ(request.messages.size(), 4u);
  EXPECT_EQ(request.messages[0].role, "system");  // OpenAI's newer name for it
  EXPECT_EQ(request.messages[0].content, "Be brief.");
  EXPECT_EQ(request.messages[1].role, "user");
  EXPECT_EQ(request.messages[1].content, "Hello\nthere");
  EXPECT_EQ(request.messages[2].role, "assistant");
  EXPECT_EQ(request.messages[2].content, "");
  EXPECT_EQ(request.max_tokens, 12);
}

TEST(OpenAiRequest, NeutralValuesOfUnsupportedFieldsAreAccepted) {
  EXPECT_NO_THROW(
      parse_completion({{"prompt", "x"}, {"echo", false}, {"best_of", 1}, {"suffix", ""}}));
  EXPECT_FALSE(parse_completion({{"prompt", "x"}, {"echo", false}}).echo);
  EXPECT_NO_THROW(parse_chat({{"messages", kUserTurn},
                              {"tool_choice", "none"},
                              {"functions", json::array()},
                              {"top_logprobs", 0},
                              {"parallel_tool_calls", false}}));
}

TEST(TokenEndpoints, TokenizeTakesAPromptOrMessagesAndDetokenizeIdsInTheVocabulary) {
  const CompletionRequest prompt =
      parse_tokenize_request(R"({"model": "needle-llama-11m", "prompt": "Hi"})", served_model());
  EXPECT_EQ(prompt.endpoint, Endpoint::kCompletions);
  EXPECT_EQ(prompt.prompt, "Hi");
  // A token-id prompt tokenizes to its ids, as a completion with it holds them.
  const CompletionRequest ids = parse_tokenize_request(R"({"prompt": [[9, 8]]})", served_model());
  EXPECT_EQ(ids.endpoint, Endpoint::kCompletions);
  EXPECT_EQ(ids.prompt_token_ids, (std::vector<int32_t>{9, 8}));
  const CompletionRequest chat = parse_tokenize_request(
      R"({"messages": [{"role": "user", "content": "Hi"}]})", served_model());
  EXPECT_EQ(chat.endpoint, Endpoint::kChatCompletions);
  ASSERT_EQ(chat.messages.size(), 1u);
  EXPECT_EQ(parse_detokenize_request(R"({"tokens": [0, 17, 4095]})", served_model()),
            (std::vector<int32_t>{0, 17, 4095}));
  EXPECT_TRUE(parse_detokenize_request(R"({"tokens": []})", served_model()).empty());

  const auto tokenize_refused = [](std::string_view body, const Expected& expected) {
    try {
      parse_tokenize_request(body, served_model());
      ADD_FAILURE() << "accepted: " << body;
    } catch (const ApiError& error) {
      EXPECT_EQ(error.status, expected.status) << error.message;
      EXPECT_EQ(error.param, expected.param) << error.message;
    }
  };
  tokenize_refused("{}", refused("prompt", {}));
  tokenize_refused(R"({"prompt": "a", "messages": []})", refused("messages", {}));
  tokenize_refused(R"({"prompt": "a", "stream": true})", refused("stream", {}));
  tokenize_refused(R"({"prompt": "a", "model": "gpt-4"})", {404, "not_found_error", "model", {}});
  tokenize_refused(R"({"prompt": [4000]})", refused("prompt[0]", {}));
  tokenize_refused(R"({"prompt": [[1], [2]]})", refused("prompt", {}));
  const auto detokenize_refused = [](std::string_view body, const std::string& param) {
    try {
      parse_detokenize_request(body, served_model());
      ADD_FAILURE() << "accepted: " << body;
    } catch (const ApiError& error) {
      EXPECT_EQ(error.status, 400) << error.message;
      EXPECT_EQ(error.param, param) << error.message;
    }
  };
  detokenize_refused("{}", "tokens");
  detokenize_refused(R"({"tokens": [4096]})", "tokens[0]");
  detokenize_refused(R"({"tokens": [1, 2.5]})", "tokens[1]");
  detokenize_refused(R"({"tokens": {"0": 1}})", "tokens");
  detokenize_refused(R"({"tokens": [1], "prompt": "x"})", "prompt");
}

TEST(OpenAiRequest, EchoIsACompletionsField) {
  EXPECT_TRUE(parse_completion({{"prompt", "x"}, {"echo", true}}).echo);
  expect_completion_refused({{"prompt", "x"}, {"echo", "yes"}}, refused("echo", {"a boolean"}));
  expect_chat_refused({{"messages", kUserTurn}, {"echo", true}}, refused("echo", {"unrecognized"}));
}

TEST(OpenAiRequest, LogprobsAreReadPerEndpoint) {
  EXPECT_FALSE(parse_completion({{"prompt", "x"}}).top_logprobs.has_value());
  EXPECT_EQ(parse_completion({{"prompt", "x"}, {"logprobs", 0}}).top_logprobs, 0);
  EXPECT_EQ(parse_completion({{"prompt", "x"}, {"logprobs", 5}}).top_logprobs, 5);
  EXPECT_FALSE(parse_completion({{"prompt", "x"}, {"logprobs", nullptr}}).top_logprobs);
  EXPECT_FALSE(parse_chat({{"messages", kUserTurn}, {"logprobs", false}}).top_logprobs);
  EXPECT_EQ(parse_chat({{"messages", kUserTurn}, {"logprobs", true}}).top_logprobs, 0);
  EXPECT_EQ(
      parse_chat({{"messages", kUserTurn}, {"logprobs", true}, {"top_logprobs", 20}}).top_logprobs,
      20);
  expect_completion_refused({{"prompt", "x"}, {"logprobs", 21}},
                            refused("logprobs", {"from 0 to 20", "21"}));
  expect_completion_refused({{"prompt", "x"}, {"logprobs", true}},
                            refused("logprobs", {"an integer"}));
  expect_chat_refused({{"messages", kUserTurn}, {"logprobs", 3}}, refused("logprobs", {"boolean"}));
  expect_chat_refused({{"messages", kUserTurn}, {"logprobs", true}, {"top_logprobs", -1}},
                      refused("top_logprobs", {"from 0 to 20"}));
  expect_chat_refused({{"messages", kUserTurn}, {"top_logprobs", 3}},
                      refused("top_logprobs", {"'logprobs' to be true"}));
  // Completions have no top_logprobs field.
  expect_completion_refused({{"prompt", "x"}, {"top_logprobs", 3}},
                            refused("top_logprobs", {"unrecognized"}));
}

TEST(OpenAiRequest, AttentionObjectOverridesTheServerDefaults) {
  const CompletionRequest request =
      parse_completion({{"prompt", "x"},
                        {"attention",
                         {{"decode", "latent"},
                          {"budget", 256},
                          {"window", 16},
                          {"gap", 8},
                          {"prefill_params", {{"base_budget", 128}}}}}});
  EXPECT_EQ(request.attention.prefill, PrefillMethod::kEntropy);  // the server's, kept
  EXPECT_EQ(request.attention.prefill_params.segment_size, 64);   // the server's, kept
  EXPECT_EQ(request.attention.prefill_params.base_budget, 128);
  EXPECT_EQ(request.attention.decode, DecodeMethod::kLatent);
  EXPECT_EQ(request.attention.decode_params.budget, 256);
  EXPECT_EQ(request.attention.decode_params.window, 16);
  EXPECT_EQ(request.attention.decode_params.gap, 8);

  const CompletionRequest methods =
      parse_completion({{"prompt", "x"}, {"attention", "critiprefill+snapkv"}});
  EXPECT_EQ(methods.attention.prefill, PrefillMethod::kCritiPrefill);
  EXPECT_EQ(methods.attention.decode, DecodeMethod::kSnapKV);
  EXPECT_EQ(methods.attention.prefill_params.segment_size, 64);
}

TEST(OpenAiRequest, BodiesThatAreNotOneJsonObjectAreRefused) {
  expect_refused(Endpoint::kCompletions, "", refused("", {"empty"}));
  expect_refused(Endpoint::kCompletions, "{\"prompt\": \"x\"", refused("", {"not valid JSON"}));
  expect_refused(Endpoint::kCompletions, "{prompt: 1}", refused("", {"not valid JSON"}));
  expect_refused(Endpoint::kCompletions, "[1, 2]", refused("", {"JSON object", "an array"}));
  expect_refused(Endpoint::kCompletions, "\"text\"", refused("", {"JSON object", "a string"}));
  expect_refused(Endpoint::kCompletions, "{\"prompt\": \"x\"} trailing",
                 refused("", {"not valid JSON"}));
  expect_refused(Endpoint::kCompletions, "{\"prompt\": \"x\", \"max_tokens\": 1e400}",
                 refused("", {"not valid JSON"}));
}

TEST(OpenAiRequest, InvalidUtf8AnywhereIsRefused) {
  expect_refused(Endpoint::kCompletions, "{\"prompt\": \"caf\xC3\"}",
                 refused("", {"UTF-8", "byte 15"}));
  expect_refused(Endpoint::kChatCompletions,
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"\xED\xA0\x80\"}]}",
                 refused("", {"UTF-8"}));
  expect_refused(Endpoint::kCompletions, "{\"prompt\": \"\xFF\"}", refused("", {"UTF-8"}));
  // An escaped lone surrogate is not a character either.
  expect_refused(Endpoint::kCompletions, "{\"prompt\": \"\\ud800\"}", refused("", {"JSON"}));
}

TEST(OpenAiRequest, NestingPastTheBoundIsRefusedBeforeItIsBuilt) {
  auto nested = [](int levels) {
    return "{\"prompt\": \"x\", \"user\": " + std::string(levels - 1, '[') +
           std::string(levels - 1, ']') + "}";
  };
  // 64 levels parse (and fail on the type); 65 do not parse at all.
  expect_refused(Endpoint::kCompletions, nested(64), refused("user", {"a string"}));
  expect_refused(Endpoint::kCompletions, nested(65), refused("", {"nests deeper than 64"}));
  expect_refused(Endpoint::kCompletions, std::string(100000, '['), refused("", {"nests deeper"}));
}

TEST(OpenAiRequest, RepeatedKeysAreRefusedAtAnyDepth) {
  expect_refused(Endpoint::kCompletions, R"({"prompt": "a", "prompt": "b"})",
                 refused("prompt", {"'prompt' appears twice"}));
  expect_refused(Endpoint::kCompletions,
                 R"({"prompt": "a", "attention": {"decode": "latent", "decode": "full"}})",
                 refused("decode", {"'decode' appears twice"}));
  // The same key in two different objects is fine.
  EXPECT_NO_THROW(parse(Endpoint::kChatCompletions,
                        R"({"messages": [{"role": "user", "content": "a"},
                                         {"role": "user", "content": "b"}]})"));
}

TEST(OpenAiRequest, MissingInputIsRefused) {
  expect_completion_refused({{"max_tokens", 3}}, refused("prompt", {"'prompt' is missing"}));
  expect_completion_refused({{"prompt", nullptr}}, refused("prompt", {"missing"}));
  expect_chat_refused({{"model", "needle-llama-11m"}},
                      refused("messages", {"'messages' is missing"}));
}

TEST(OpenAiRequest, WrongTypesNameTheFieldAndTheExpectedType) {
  expect_completion_refused({{"prompt", 5}}, refused("prompt", {"'prompt'", "a string"}));
  expect_completion_refused({{"prompt", "x"}, {"temperature", "hot"}},
                            refused("temperature", {"'temperature'", "a number", "a string"}));
  expect_completion_refused({{"prompt", "x"}, {"max_tokens", 2.5}},
                            refused("max_tokens", {"'max_tokens'", "an integer"}));
  expect_completion_refused({{"prompt", "x"}, {"stream", "yes"}},
                            refused("stream", {"'stream'", "a boolean"}));
  expect_completion_refused({{"prompt", "x"}, {"stop", 3}},
                            refused("stop", {"'stop'", "a string or an array"}));
  expect_completion_refused({{"prompt", "x"}, {"stop", {"a", 3}}},
                            refused("stop[1]", {"'stop[1]'", "a string"}));
  expect_completion_refused({{"prompt", "x"}, {"seed", 1.5}},
                            refused("seed", {"'seed'", "an integer"}));
  expect_completion_refused({{"prompt", "x"}, {"n", "1"}}, refused("n", {"'n'", "an integer"}));
  expect_completion_refused({{"prompt", "x"}, {"user", 7}},
                            refused("user", {"'user'", "a string"}));
  expect_completion_refused({{"prompt", "x"}, {"model", true}},
                            refused("model", {"'model'", "a string"}));
  expect_completion_refused({{"prompt", "x"}, {"stream", true}, {"stream_options", 1}},
                            refused("stream_options", {"an object"}));
  expect_completion_refused(
      {{"prompt", "x"}, {"stream", true}, {"stream_options", {{"include_usage", 1}}}},
      refused("stream_options.include_usage", {"a boolean"}));
  expect_chat_refused({{"messages", json::array({"hi"})}},
                      refused("messages[0]", {"'messages[0]'", "an object"}));
  expect_chat_refused({{"messages", "hi"}}, refused("messages", {"an array"}));
  expect_chat_refused({{"messages", {{{"role", "user"}, {"content", 3}}}}},
                      refused("messages[0].content", {"a string or an array of text parts"}));
  expect_chat_refused({{"messages", {{{"role", 1}, {"content", "x"}}}}},
                      refused("messages[0].role", {"a string"}));
}

TEST(OpenAiRequest, ValuesOutOfRangeNameTheFieldAndTheRange) {
  expect_completion_refused({{"prompt", "x"}, {"temperature", 2.5}},
                            refused("temperature", {"between 0 and 2", "2.5"}));
  expect_completion_refused({{"prompt", "x"}, {"temperature", -0.1}},
                            refused("temperature", {"between 0 and 2"}));
  expect_completion_refused({{"prompt", "x"}, {"top_p", 0}}, refused("top_p", {"above 0"}));
  expect_completion_refused({{"prompt", "x"}, {"top_p", 1.5}}, refused("top_p", {"at most 1"}));
  expect_completion_refused({{"prompt", "x"}, {"max_tokens", 0}},
                            refused("max_tokens", {"from 1", "got 0"}));
  expect_completion_refused({{"prompt", "x"}, {"max_tokens", int64_t{1} << 31}},
                            refused("max_tokens", {"1073741824"}));
  expect_completion_refused({{"prompt", "x"}, {"max_tokens", UINT64_MAX}},
                            refused("max_tokens", {"max_tokens"}));
  expect_completion_refused({{"prompt", "x"}, {"top_k", -2}}, refused("top_k", {"top_k"}));
  expect_completion_refused({{"prompt", "x"}, {"stop", {"a", "b", "c", "d", "e"}}},
                            refused("stop", {"at most 4", "got 5"}));
  expect_completion_refused({{"prompt", "x"}, {"stop", ""}}, refused("stop", {"empty"}));
  expect_chat_refused({{"messages", kUserTurn}, {"max_tokens", 3}, {"max_completion_tokens", 4}},
                      refused("max_completion_tokens", {"disagree"}));
}

TEST(OpenAiRequest, OnlyOneChoiceAndTheServedModel) {
  expect_completion_refused({{"prompt", "x"}, {"n", 2}}, refused("n", {"n = 1", "got 2"}));
  expect_completion_refused(
      {{"prompt", "x"}, {"model", "gpt-4o"}},
      Expected{404, "not_found_error", "model", {"'gpt-4o' not found", "needle-llama-11m"}});
  try {
    parse_chat({{"messages", kUserTurn}, {"model", "other"}});
    ADD_FAILURE() << "another model was accepted";
  } catch (const ApiError& error) {
    EXPECT_EQ(error.code, "model_not_found");
  }
}

TEST(OpenAiRequest, PenaltiesAndLogitBiasReachTheSampler) {
  const CompletionRequest request =
      parse_chat({{"messages", kUserTurn},
                  {"presence_penalty", 0.5},
                  {"frequency_penalty", -1.25},
                  {"logit_bias", {{"0", -100}, {"17", 2.5}, {"4095", 100}}}});
  EXPECT_FLOAT_EQ(request.sampler.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(request.sampler.frequency_penalty, -1.25f);
  const std::map<int32_t, float> expected = {{0, -100.0f}, {17, 2.5f}, {4095, 100.0f}};
  EXPECT_EQ(request.sampler.logit_bias, expected);
  EXPECT_TRUE(parse_completion({{"prompt", "x"}, {"logit_bias", json::object()}})
                  .sampler.logit_bias.empty());
}

TEST(OpenAiRequest, BadPenaltiesAndLogitBiasesNameTheField) {
  expect_completion_refused({{"prompt", "x"}, {"presence_penalty", 2.5}},
                            refused("presence_penalty", {"between -2 and 2", "2.5"}));
  expect_completion_refused({{"prompt", "x"}, {"frequency_penalty", "high"}},
                            refused("frequency_penalty", {"a number"}));
  expect_completion_refused({{"prompt", "x"}, {"logit_bias", {1, 2}}},
                            refused("logit_bias", {"an object"}));
  expect_completion_refused({{"prompt", "x"}, {"logit_bias", {{"abc", 1}}}},
                            refused("logit_bias.abc", {"token ids from 0 to 4095", "'abc'"}));
  expect_completion_refused({{"prompt", "x"}, {"logit_bias", {{"-3", 1}}}},
                            refused("logit_bias.-3", {"token ids"}));
  expect_completion_refused({{"prompt", "x"}, {"logit_bias", {{"4096", 1}}}},
                            refused("logit_bias.4096", {"from 0 to 4095", "'4096'"}));
  expect_completion_refused({{"prompt", "x"}, {"logit_bias", {{"99999999999999", 1}}}},
                            refused("logit_bias.99999999999999", {"token ids"}));
  expect_completion_refused({{"prompt", "x"}, {"logit_bias", {{"5", 101}}}},
                            refused("logit_bias.5", {"between -100 and 100", "101"}));
  expect_completion_refused({{"prompt", "x"}, {"logit_bias", {{"5", "up"}}}},
                            refused("logit_bias.5", {"a number"}));
  json many = json::object();
  for (int id = 0; id <= kMaxLogitBiasEntries; ++id) many[std::to_string(id)] = 1;
  expect_completion_refused({{"prompt", "x"}, {"logit_bias", many}},
                            refused("logit_bias", {"at most 300"}));
}

TEST(OpenAiRequest, UnsupportedFeaturesNameTheField) {
  auto unsupported = [](const std::string& field) {
    return refused(field, {"'" + field + "'", "not supported"});
  };
  expect_completion_refused({{"prompt", "x"}, {"best_of", 3}}, unsupported("best_of"));
  expect_completion_refused({{"prompt", "x"}, {"suffix", "end"}}, unsupported("suffix"));
  expect_chat_refused({{"messages", kUserTurn}, {"tools", {{{"type", "function"}}}}},
                      unsupported("tools"));
  expect_chat_refused({{"messages", kUserTurn}, {"tool_choice", "auto"}},
                      unsupported("tool_choice"));
  expect_chat_refused({{"messages", kUserTurn}, {"functions", {{{"name", "f"}}}}},
                      unsupported("functions"));
  expect_chat_refused({{"messages", kUserTurn}, {"response_format", {{"type", "json_object"}}}},
                      unsupported("response_format"));
  expect_completion_refused({{"prompt", {"a", "b"}}}, refused("prompt", {"one prompt", "got 2"}));
  expect_chat_refused({{"messages",
                        {{{"role", "user"},
                          {"content", {{{"type", "image_url"}, {"image_url", {{"url", "x"}}}}}}}}}},
                      refused("messages[0].content[0].type", {"not supported", "image_url"}));
  expect_chat_refused({{"messages", {{{"role", "tool"}, {"content", "42"}}}}},
                      refused("messages[0].role", {"not supported", "tool"}));
  expect_chat_refused(
      {{"messages",
        {{{"role", "assistant"}, {"content", nullptr}, {"tool_calls", {{{"id", "1"}}}}}}}},
      refused("messages[0].tool_calls", {"not supported"}));
}

TEST(OpenAiRequest, UnknownFieldsAreRefusedByName) {
  expect_completion_refused({{"prompt", "x"}, {"temprature", 0.5}},
                            refused("temprature", {"unrecognized", "'temprature'"}));
  // Each endpoint knows only its own input field.
  expect_completion_refused({{"prompt", "x"}, {"messages", kUserTurn}},
                            refused("messages", {"'messages'"}));
  expect_chat_refused({{"messages", kUserTurn}, {"prompt", "x"}}, refused("prompt", {"'prompt'"}));
  expect_chat_refused({{"messages", {{{"role", "user"}, {"content", "x"}, {"mood", "happy"}}}}},
                      refused("messages[0].mood", {"'mood'"}));
  expect_chat_refused(
      {{"messages",
        {{{"role", "user"}, {"content", {{{"type", "text"}, {"text", "a"}, {"x", 1}}}}}}}},
      refused("messages[0].content[0].x", {"'x'"}));
  expect_completion_refused(
      {{"prompt", "x"}, {"stream", true}, {"stream_options", {{"extra", true}}}},
      refused("stream_options.extra", {"stream_options.extra"}));
  // A hostile key is cut short in the message, never echoed whole.
  try {
    parse_completion({{"prompt", "x"}, {std::string(100000, 'k'), 1}});
    ADD_FAILURE() << "a 100,000-byte key was accepted";
  } catch (const ApiError& error) {
    EXPECT_LT(error.message.size(), 200u);
  }
}

TEST(OpenAiRequest, BadMessagesAreRefusedNamingTheMessage) {
  expect_chat_refused({{"messages", json::array()}}, refused("messages", {"empty"}));
  expect_chat_refused({{"messages", {{{"content", "x"}}}}},
                      refused("messages[0].role", {"missing"}));
  expect_chat_refused(
      {{"messages", {{{"role", "user"}, {"content", "x"}}, {{"role", "robot"}, {"content", "x"}}}}},
      refused("messages[1].role", {"system, user or assistant", "robot"}));
  expect_chat_refused({{"messages", {{{"role", "user"}}}}},
                      refused("messages[0].content", {"missing"}));
  expect_chat_refused({{"messages", {{{"role", "user"}, {"content", {{{"text", "a"}}}}}}}},
                      refused("messages[0].content[0].type", {"missing"}));
  expect_chat_refused({{"messages", {{{"role", "user"}, {"content", {{{"type", "text"}}}}}}}},
                      refused("messages[0].content[0].text", {"missing"}));
}

TEST(OpenAiRequest, StreamOptionsNeedStreaming) {
  expect_completion_refused({{"prompt", "x"}, {"stream_options", {{"include_usage", true}}}},
                            refused("stream_options", {"'stream' is true"}));
}

TEST(OpenAiRequest, BadAttentionNamesTheParameter) {
  expect_completion_refused({{"prompt", "x"}, {"attention", {{"segmentsize", 64}}}},
                            refused("attention.segmentsize", {"'segmentsize'"}));
  expect_completion_refused({{"prompt", "x"}, {"attention", {{"decode_params", {{"bugdet", 1}}}}}},
                            refused("attention.decode_params.bugdet", {"'bugdet'"}));
  expect_completion_refused({{"prompt", "x"}, {"attention", {{"segment_size", "big"}}}},
                            refused("attention.segment_size", {"'segment_size'", "integer"}));
  expect_completion_refused({{"prompt", "x"}, {"attention", {{"window", 4096}}}},
                            refused("attention.window", {"window", "4096"}));
  expect_completion_refused({{"prompt", "x"}, {"attention", {{"segment_size", 60}}}},
                            refused("attention.segment_size", {"segment_size", "block_size"}));
  expect_completion_refused({{"prompt", "x"}, {"attention", {{"decode", "lossy"}}}},
                            refused("attention.decode", {"lossy"}));
  expect_completion_refused({{"prompt", "x"}, {"attention", {{"prefill_params", 3}}}},
                            refused("attention.prefill_params", {"an object"}));
  expect_completion_refused({{"prompt", "x"}, {"attention", 3}},
                            refused("attention", {"'attention'", "an object"}));
  expect_completion_refused({{"prompt", "x"}, {"attention", "entropy+lossy"}},
                            refused("attention", {"lossy"}));
}

// Echo with logprobs scores the prompt (lm-evaluation-harness's loglikelihood asks it so);
// max_tokens 0 is the prompt scored alone, which needs echo.
TEST(OpenAiRequest, EchoWithLogprobsScoresThePromptAndAllowsZeroTokens) {
  const CompletionRequest scored =
      parse_completion({{"prompt", "x"}, {"echo", true}, {"logprobs", 1}, {"max_tokens", 0}});
  EXPECT_TRUE(scored.echo);
  EXPECT_EQ(scored.top_logprobs, 1);
  EXPECT_EQ(scored.max_tokens, 0);
  EXPECT_EQ(resolve_max_tokens(scored, 100, 100), 0) << "a prompt filling the context";
  EXPECT_EQ(parse_completion({{"prompt", "x"}, {"echo", true}, {"max_tokens", 0}}).max_tokens, 0);
  expect_completion_refused({{"prompt", "x"}, {"logprobs", 1}, {"max_tokens", 0}},
                            refused("max_tokens", {"from 1", "got 0", "'echo'"}));
  expect_completion_refused({{"prompt", "x"}, {"echo", false}, {"max_tokens", 0}},
                            refused("max_tokens", {"got 0"}));
  expect_completion_refused({{"prompt", "x"}, {"echo", true}, {"max_tokens", -1}},
                            refused("max_tokens", {"got -1"}));
  expect_chat_refused({{"messages", kUserTurn}, {"max_tokens", 0}},
                      refused("max_tokens", {"got 0"}));
  expect_chat_refused({{"messages", kUserTurn}, {"max_completion_tokens", 0}},
                      refused("max_completion_tokens", {"got 0"}));
  try {
    resolve_max_tokens(scored, 101, 100);
    ADD_FAILURE() << "a prompt past the context fits";
  } catch (const ApiError& error) {
    EXPECT_EQ(error.code, "context_length_exceeded");
  }
}

TEST(OpenAiRequest, MaxTokensDefaultsAndTheContext) {
  CompletionRequest completion = parse_completion({{"prompt", "x"}});
  EXPECT_EQ(resolve_max_tokens(completion, 10, 100), kDefaultCompletionTokens);
  EXPECT_EQ(resolve_max_tokens(completion, 90, 100), 10);  // the context ends first
  CompletionRequest chat = parse_chat({{"messages", kUserTurn}});
  EXPECT_EQ(resolve_max_tokens(chat, 10, 100), 90);  // until a stop or the context's end
  chat.max_tokens = 5;
  EXPECT_EQ(resolve_max_tokens(chat, 10, 100), 5);

  auto expect_too_long = [](const CompletionRequest& request, int64_t prompt_tokens, int context,
                            const std::string& param,
                            std::initializer_list<std::string_view> named) {
    try {
      resolve_max_tokens(request, prompt_tokens, context);
      ADD_FAILURE() << "fits: " << prompt_tokens << " in " << context;
    } catch (const ApiError& error) {
      EXPECT_EQ(error.status, 400);
      EXPECT_EQ(error.param, param);
      EXPECT_EQ(error.code, "context_length_exceeded");
      for (std::string_view part : named) {
        EXPECT_NE(error.message.find(part), std::string::npos) << error.message;
      }
    }
  };
  expect_too_long(completion, 40000, 32768, "prompt", {"40000", "32768"});
  expect_too_long(completion, 32768, 32768, "prompt", {"32768", "no room"});
  expect_too_long(chat, 40000, 32768, "messages", {"40000", "32768"});
  completion.max_tokens = 50;
  expect_too_long(completion, 90, 100, "max_tokens", {"50", "90", "100", "at most 10"});
}

TEST(OpenAiResponse, CompletionObjectHasOpenAisFields) {
  RequestStats stats;
  stats.prompt_tokens = 12;
  stats.completion_tokens = 5;
  stats.time_to_first_token = 0.25;
  stats.decode_seconds = 0.5;
  stats.prefill_keys_read = 300;
  stats.prefill_keys_dense = 600;
  stats.cache_entries_before = 100;
  stats.cache_entries_after = 25;
  stats.compressed = true;
  stats.methods = "entropy+latent";
  const ResponseIdentity identity = new_response_identity(Endpoint::kCompletions, "m");
  EXPECT_EQ(identity.id.rfind("cmpl-", 0), 0u);
  EXPECT_EQ(identity.id.size(), 5u + 24u);
  EXPECT_GT(identity.created, 1700000000);
  const json response =
      completion_response(Endpoint::kCompletions, identity, "hello", "length", stats);
  EXPECT_EQ(response["object"], "text_completion");
  EXPECT_EQ(response["id"], identity.id);
  EXPECT_EQ(response["created"], identity.created);
  EXPECT_EQ(response["model"], "m");
  ASSERT_EQ(response["choices"].size(), 1u);
  EXPECT_EQ(response["choices"][0]["text"], "hello");
  EXPECT_EQ(response["choices"][0]["index"], 0);
  EXPECT_TRUE(response["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(response["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(response["usage"]["prompt_tokens"], 12);
  EXPECT_EQ(response["usage"]["completion_tokens"], 5);
  EXPECT_EQ(response["usage"]["total_tokens"], 17);
  const json& ours = response["entropyinfer"];
  EXPECT_EQ(ours["methods"], "entropy+latent");
  EXPECT_DOUBLE_EQ(ours["time_to_first_token"].get<double>(), 0.25);
  EXPECT_DOUBLE_EQ(ours["tokens_per_second"].get<double>(),
                   8.0);  // 4 tokens after the first in 0.5 s
  EXPECT_DOUBLE_EQ(ours["prefill_keys_fraction"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(ours["cache_kept_fraction"].get<double>(), 0.25);
  EXPECT_EQ(ours["compressed"], true);
}

// Token ids to fixed byte strings, one of them half a UTF-8 character.
class PieceTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view, const EncodeOptions&) const override { return {}; }
  std::string token_bytes(int32_t id) const override { return pieces_.at(static_cast<size_t>(id)); }
  int32_t vocab_size() const override { return static_cast<int32_t>(pieces_.size()); }
  std::optional<int32_t> bos_id() const override { return std::nullopt; }
  std::vector<int32_t> eos_ids() const override { return {}; }
  std::optional<int32_t> token_id(std::string_view) const override { return std::nullopt; }

 private:
  std::vector<std::string> pieces_ = {"Hi", " there", "\xE2\x82", "!"};
};

std::vector<TokenLogprob> two_token_logprobs() {
  const float inf = std::numeric_limits<float>::infinity();
  return {{0, -0.25f, {{0, -0.25f}, {3, -1.5f}}}, {2, -inf, {{1, -0.5f}, {3, -2.0f}}}};
}

TEST(OpenAiResponse, CompletionLogprobsHaveTokensOffsetsAndTopMaps) {
  const PieceTokenizer tokenizer;
  int64_t offset = 10;
  const json logprobs =
      logprobs_json(Endpoint::kCompletions, two_token_logprobs(), tokenizer, offset);
  EXPECT_EQ(offset, 14);  // "Hi" and two bytes on from 10
  EXPECT_EQ(logprobs["tokens"][0], "Hi");
  EXPECT_EQ(logprobs["text_offset"], json::array({10, 12}));
  EXPECT_DOUBLE_EQ(logprobs["token_logprobs"][0].get<double>(), -0.25);
  EXPECT_DOUBLE_EQ(logprobs["token_logprobs"][1].get<double>(), kLogprobFloor);  // -inf
  // The alternatives and the chosen token, text to logprob.
  EXPECT_EQ(logprobs["top_logprobs"][0].size(), 2u);
  EXPECT_DOUBLE_EQ(logprobs["top_logprobs"][0]["!"].get<double>(), -1.5);
  EXPECT_EQ(logprobs["top_logprobs"][1].size(), 3u);
  EXPECT_DOUBLE_EQ(logprobs["top_logprobs"][1][" there"].get<double>(), -0.5);
  // Half a character reaches the client as U+FFFD, never as invalid JSON.
  const json reparsed = json::parse(dump_json(logprobs));
  EXPECT_EQ(reparsed["tokens"][1].get<std::string>().rfind("\xEF\xBF\xBD", 0), 0u);

  const json response = completion_response(Endpoint::kCompletions,
                                            new_response_identity(Endpoint::kCompletions, "m"),
                                            "Hi", "length", RequestStats{}, logprobs);
  EXPECT_EQ(response["choices"][0]["logprobs"], logprobs);
}

// The echoed prompt's logprobs: its first token unscored (null, as OpenAI and vLLM give it) and,
// when it is the BOS the echoed text lacks, listed with no text; then the answer's, appended,
// with offsets that follow the echoed text.
TEST(OpenAiResponse, PromptLogprobsLeaveTheFirstTokenUnscoredAndPrecedeTheAnswers) {
  class BosPieceTokenizer final : public Tokenizer {
   public:
    std::vector<int32_t> encode(std::string_view, const EncodeOptions&) const override {
      return {};
    }
    std::string token_bytes(int32_t id) const override {
      return pieces_.at(static_cast<size_t>(id));
    }
    int32_t vocab_size() const override { return static_cast<int32_t>(pieces_.size()); }
    std::optional<int32_t> bos_id() const override { return 0; }
    std::vector<int32_t> eos_ids() const override { return {}; }
    std::optional<int32_t> token_id(std::string_view) const override { return std::nullopt; }

   private:
    std::vector<std::string> pieces_ = {"<s>", "Hi", " there", "!"};
  };
  const BosPieceTokenizer tokenizer;
  const std::vector<int32_t> prompt = {0, 1, 2};
  const std::vector<TokenLogprob> scores = {{1, -2.0f, {{2, -0.5f}}}, {2, -0.75f, {{2, -0.75f}}}};
  int64_t offset = 0;
  json logprobs = prompt_logprobs_json(prompt, scores, tokenizer, offset, /*bos_added=*/true);
  EXPECT_EQ(offset, 8);  // "" + "Hi" + " there"
  EXPECT_EQ(logprobs["tokens"], json::array({"", "Hi", " there"}));
  EXPECT_TRUE(logprobs["token_logprobs"][0].is_null());
  EXPECT_TRUE(logprobs["top_logprobs"][0].is_null());
  EXPECT_DOUBLE_EQ(logprobs["token_logprobs"][1].get<double>(), -2.0);
  EXPECT_EQ(logprobs["top_logprobs"][1], json({{" there", -0.5}, {"Hi", -2.0}}));
  EXPECT_EQ(logprobs["text_offset"], json::array({0, 0, 2}));

  offset = 8;
  const std::vector<TokenLogprob> answer = {{3, -0.125f, {{3, -0.125f}}}};
  append_logprobs(logprobs, logprobs_json(Endpoint::kCompletions, answer, tokenizer, offset));
  EXPECT_EQ(logprobs["tokens"], json::array({"", "Hi", " there", "!"}));
  EXPECT_EQ(logprobs["text_offset"], json::array({0, 0, 2, 8}));
  EXPECT_DOUBLE_EQ(logprobs["token_logprobs"][3].get<double>(), -0.125);
  EXPECT_EQ(logprobs["top_logprobs"].size(), 4u);

  // A prompt without BOS lists its first token's text; one token has no scores at all.
  offset = 0;
  const json lone = prompt_logprobs_json(std::vector<int32_t>{1}, {}, tokenizer, offset, true);
  EXPECT_EQ(lone["tokens"], json::array({"Hi"}));
  EXPECT_EQ(offset, 2);
  EXPECT_THROW(prompt_logprobs_json(prompt, {}, tokenizer, offset, true), Error);

  // A token-id prompt's BOS was the client's: its text is listed, as in the echoed text.
  offset = 0;
  const json ids = prompt_logprobs_json(prompt, scores, tokenizer, offset, /*bos_added=*/false);
  EXPECT_EQ(ids["tokens"], json::array({"<s>", "Hi", " there"}));
  EXPECT_EQ(ids["text_offset"], json::array({0, 3, 5}));
  EXPECT_EQ(offset, 11);
  EXPECT_EQ(ids["token_logprobs"], json::array({nullptr, -2.0, -0.75}));
}

TEST(OpenAiResponse, ChatLogprobsCarryBytesAndTopLists) {
  const PieceTokenizer tokenizer;
  int64_t offset = 0;
  const json logprobs =
      logprobs_json(Endpoint::kChatCompletions, two_token_logprobs(), tokenizer, offset);
  ASSERT_EQ(logprobs["content"].size(), 2u);
  EXPECT_TRUE(logprobs["refusal"].is_null());
  const json& first = logprobs["content"][0];
  EXPECT_EQ(first["token"], "Hi");
  EXPECT_DOUBLE_EQ(first["logprob"].get<double>(), -0.25);
  EXPECT_EQ(first["bytes"], json::array({72, 105}));
  ASSERT_EQ(first["top_logprobs"].size(), 2u);
  EXPECT_EQ(first["top_logprobs"][1]["token"], "!");
  EXPECT_EQ(first["top_logprobs"][1]["bytes"], json::array({33}));
  // The exact bytes of half a character survive in "bytes".
  EXPECT_EQ(logprobs["content"][1]["bytes"], json::array({0xE2, 0x82}));
  const ResponseIdentity identity = new_response_identity(Endpoint::kChatCompletions, "m");
  const json chunk = text_chunk(Endpoint::kChatCompletions, identity, "Hi", false, logprobs);
  EXPECT_EQ(chunk["choices"][0]["logprobs"], logprobs);
  const json last =
      finish_chunk(Endpoint::kChatCompletions, identity, "stop", RequestStats{}, false);
  EXPECT_TRUE(last["choices"][0]["logprobs"].is_null());
}

TEST(OpenAiResponse, ChatCompletionAndChunksHaveOpenAisShapes) {
  RequestStats stats;
  stats.prompt_tokens = 3;
  stats.completion_tokens = 1;
  const ResponseIdentity identity = new_response_identity(Endpoint::kChatCompletions, "m");
  EXPECT_EQ(identity.id.rfind("chatcmpl-", 0), 0u);
  const json whole =
      completion_response(Endpoint::kChatCompletions, identity, "Hi!", "stop", stats);
  EXPECT_EQ(whole["object"], "chat.completion");
  EXPECT_EQ(whole["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(whole["choices"][0]["message"]["content"], "Hi!");
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "stop");
  EXPECT_DOUBLE_EQ(whole["entropyinfer"]["tokens_per_second"].get<double>(), 0.0);  // one token

  const json role = role_chunk(identity, false);
  EXPECT_EQ(role["object"], "chat.completion.chunk");
  EXPECT_EQ(role["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(role["choices"][0]["finish_reason"].is_null());
  EXPECT_FALSE(role.contains("usage"));

  const json text = text_chunk(Endpoint::kChatCompletions, identity, "Hi", true);
  EXPECT_EQ(text["choices"][0]["delta"]["content"], "Hi");
  EXPECT_FALSE(text["choices"][0]["delta"].contains("role"));
  EXPECT_TRUE(text["usage"].is_null());  // announced, as OpenAI does with include_usage

  const json finish = finish_chunk(Endpoint::kChatCompletions, identity, "stop", stats, false);
  EXPECT_EQ(finish["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(finish["choices"][0]["delta"].empty());
  EXPECT_TRUE(finish.contains("entropyinfer"));

  const json usage = usage_chunk(Endpoint::kChatCompletions, identity, stats);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["total_tokens"], 4);
  EXPECT_EQ(usage["id"], identity.id);

  const json completion_text = text_chunk(Endpoint::kCompletions, identity, "x", false);
  EXPECT_EQ(completion_text["object"], "text_completion");
  EXPECT_EQ(completion_text["choices"][0]["text"], "x");
  const json completion_finish =
      finish_chunk(Endpoint::kCompletions, identity, "length", stats, false);
  EXPECT_EQ(completion_finish["choices"][0]["text"], "");
  EXPECT_EQ(completion_finish["choices"][0]["finish_reason"], "length");
}

TEST(OpenAiResponse, FinishReasonsAreOpenAis) {
  EXPECT_STREQ(openai_finish_reason(FinishReason::kStop), "stop");
  EXPECT_STREQ(openai_finish_reason(FinishReason::kLength), "length");
}

TEST(OpenAiResponse, ErrorBodyIsOpenAisErrorObject) {
  const json with_param = json::parse(error_body(
      ApiError(404, "not_found_error", "model 'x' not found", "model", "model_not_found")));
  EXPECT_EQ(with_param, json::parse(R"({"error": {"message": "model 'x' not found",
      "type": "not_found_error", "param": "model", "code": "model_not_found"}})"));
  const json without = json::parse(error_body(ApiError(401, "authentication_error", "no key")));
  EXPECT_TRUE(without["error"]["param"].is_null());
  EXPECT_TRUE(without["error"]["code"].is_null());
  // Bytes that are not UTF-8 in a message (a path, say) are replaced, never thrown on.
  EXPECT_NO_THROW(error_body(ApiError(404, "not_found_error", "no route for /\xFF\xFE")));
}

TEST(OpenAiResponse, ModelsListAndSseFraming) {
  const json list = models_list("needle-llama-11m", 1700000000);
  EXPECT_EQ(list["object"], "list");
  ASSERT_EQ(list["data"].size(), 1u);
  EXPECT_EQ(list["data"][0]["id"], "needle-llama-11m");
  EXPECT_EQ(list["data"][0]["object"], "model");
  EXPECT_EQ(list["data"][0]["created"], 1700000000);
  EXPECT_EQ(list["data"][0]["owned_by"], "entropyinfer");
  EXPECT_EQ(sse_event({{"a", 1}}), "data: {\"a\":1}\n\n");
  EXPECT_EQ(sse_done(), "data: [DONE]\n\n");
}

TEST(Utf8, FindsTheFirstInvalidByte) {
  EXPECT_EQ(find_invalid_utf8("plain ascii"), std::nullopt);
  EXPECT_EQ(find_invalid_utf8("caf\xC3\xA9 \xE6\x97\xA5 \xF0\x9F\x98\x80"), std::nullopt);
  EXPECT_EQ(find_invalid_utf8("ab\x80"), 2u);                // a lone continuation byte
  EXPECT_EQ(find_invalid_utf8("\xC0\x80"), 0u);              // overlong NUL
  EXPECT_EQ(find_invalid_utf8("x\xE0\x80\x80"), 1u);         // overlong three-byte form
  EXPECT_EQ(find_invalid_utf8("\xED\xA0\x80"), 0u);          // a surrogate
  EXPECT_EQ(find_invalid_utf8("\xF4\x90\x80\x80"), 0u);      // past U+10FFFF
  EXPECT_EQ(find_invalid_utf8("ok\xE6\x97"), 2u);            // cut short
  EXPECT_EQ(find_invalid_utf8("\xF8\x88\x80\x80\x80"), 0u);  // five-byte forms are gone
}

}  // namespace
}  // namespace entropyinfer::serve

// The OpenAI-compatible wire format of `entropyinfer serve`: request bodies of POST /v1/completions
// and POST /v1/chat/completions read from untrusted text into a CompletionRequest, the response
// objects and streamed chunks those clients expect, and OpenAI's error body. Every refusal is an
// ApiError carrying the HTTP status, OpenAI's error type and the offending field; nothing else
// escapes the parser.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "attention/attention_config.h"
#include "core/error.h"
#include "engine/sampler.h"
#include "engine/token_logprobs.h"
#include "serve/scheduler.h"
#include "tokenizer/chat_format.h"
#include "tokenizer/tokenizer.h"

namespace entropyinfer::serve {

// A refusal as the client sees it: {"error": {"message", "type", "param", "code"}} with `status`.
// An Error, so that code which only knows Error (the fuzz targets) still catches it.
class ApiError : public Error {
 public:
  ApiError(int status_code, std::string error_type, std::string error_message,
           std::string error_param = {}, std::string error_code = {});

  int status;
  std::string type;     // "invalid_request_error", "not_found_error", "authentication_error", ...
  std::string message;  // says what is wrong and, where one is, names the field
  std::string param;    // the field ("messages[1].content"); empty gives null
  std::string code;     // a machine-readable reason ("model_not_found"); empty gives null
};

// 400 invalid_request_error naming `param`.
ApiError invalid_request(std::string message, std::string param = {}, std::string code = {});

// 404 not_found_error for a model other than the served one, naming both.
ApiError model_not_found(const std::string& model, const std::string& served_id);

// OpenAI's error body for `error`.
std::string error_body(const ApiError& error);

enum class Endpoint { kCompletions, kChatCompletions };

// What the request parser needs to know about the server.
struct ServedModel {
  std::string id;                     // the only model name a request may give
  AttentionConfig default_attention;  // what `attention` keys override
  int vocab_size = 0;                 // token ids logit_bias may name (0: not checked here)
  // Token ids a prompt may hold: those the model embeds and the tokenizer decodes (0: not
  // checked here).
  int prompt_vocab_size = 0;
};

// Nesting the parser accepts: requests are a few levels deep; the bound keeps hostile input from
// building deep trees.
inline constexpr int kMaxRequestDepth = 64;
// OpenAI's limit on stop sequences.
inline constexpr int kMaxStopStrings = 4;
// The most logit_bias entries a request may give (OpenAI's limit).
inline constexpr int kMaxLogitBiasEntries = 300;
// The most tokens a request may ask for (the context caps it further).
inline constexpr int64_t kMaxRequestTokens = int64_t{1} << 30;

struct CompletionRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string prompt;  // completions, given as text
  // Completions given as token ids (OpenAI's and vLLM's array of integers): used exactly as
  // given, with no BOS added; `prompt` is then empty.
  std::optional<std::vector<int32_t>> prompt_token_ids;
  std::vector<ChatMessage> messages;  // chat completions
  // max_tokens (or chat's max_completion_tokens) as given; resolve_max_tokens applies the defaults.
  std::optional<int> max_tokens;
  SamplerOptions sampler;        // OpenAI's defaults: temperature 1, top_p 1
  std::optional<uint64_t> seed;  // absent: the server picks one per request
  std::vector<std::string> stop;
  // Logprobs asked (completions' "logprobs": N, chat's "logprobs": true with "top_logprobs": N):
  // the alternatives per token, 0 to kMaxTopLogprobs; absent when not asked.
  std::optional<int> top_logprobs;
  // Completions: the answer's text starts with the prompt's; with logprobs, its logprobs start
  // with the prompt tokens' (max_tokens may then be 0: the prompt scored alone).
  bool echo = false;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  AttentionConfig attention;   // the server's defaults with the request's `attention` applied
  std::string model;           // the served model's id
};

// Parses and validates a request body. Throws ApiError (400 for malformed or unsupported input,
// 404 for another model) and nothing else.
CompletionRequest parse_completion_request(Endpoint endpoint, std::string_view body,
                                           const ServedModel& served);

// POST /tokenize, as vLLM's: {"model"?, "prompt"} or {"model"?, "messages"}, read as the
// completions or the chat endpoint reads them (the endpoint of the result says which), so that
// the tokens are what a generation request with that input would hold (a token-id prompt's are
// its ids). ApiError as above.
CompletionRequest parse_tokenize_request(std::string_view body, const ServedModel& served);

// The most ids POST /detokenize takes.
inline constexpr int64_t kMaxDetokenizeTokens = int64_t{1} << 22;

// POST /detokenize: {"model"?, "tokens": [ids]}, each id inside the vocabulary (when
// served.vocab_size is set). ApiError as above.
std::vector<int32_t> parse_detokenize_request(std::string_view body, const ServedModel& served);

// OpenAI's max_tokens default for completions.
inline constexpr int kDefaultCompletionTokens = 16;

// The answer's token limit for a prompt of `prompt_tokens` tokens in a `context_length`-token
// context: the request's max_tokens, else 16 for completions (fewer when the context ends first)
// and the rest of the context for chat. ApiError 400 naming the numbers when the prompt leaves no
// room for an answer or the request's max_tokens does not fit beside it; max_tokens 0 (an echoed
// prompt scored alone) needs no room past the prompt.
int resolve_max_tokens(const CompletionRequest& request, int64_t prompt_tokens, int context_length);

// `attention` (an object of method names and parameters, flat or nested as in an
// --attention-config file, or a "prefill[+decode]" string) applied to `defaults`, validated.
// ApiError 400 naming the parameter.
AttentionConfig merge_attention(const nlohmann::json& attention, const AttentionConfig& defaults);

// The first invalid byte's offset, or nullopt for valid UTF-8 (no overlongs, surrogates or code
// points past U+10FFFF).
std::optional<size_t> find_invalid_utf8(std::string_view text);

// OpenAI's finish_reason for a finished stream: "stop" or "length". Cancelled and failed requests
// have none (the server reports those as errors).
const char* openai_finish_reason(FinishReason reason);

// Identity of one response: the same id, creation time and model on every chunk of a stream.
struct ResponseIdentity {
  std::string id;  // "cmpl-..." or "chatcmpl-..."
  int64_t created = 0;
  std::string model;
};

// A fresh id for `endpoint` ("cmpl-" or "chatcmpl-" and 24 random hex digits) at the current time.
ResponseIdentity new_response_identity(Endpoint endpoint, const std::string& model);

nlohmann::json usage_json(const RequestStats& stats);
// The non-standard "entropyinfer" object: methods, timings and work fractions.
nlohmann::json entropyinfer_stats_json(const RequestStats& stats);

// A logprob JSON can carry: OpenAI's -9999 for a token the model rules out (-inf).
inline constexpr double kLogprobFloor = -9999.0;

// OpenAI's logprobs object for `tokens`, each token's text being its exact bytes (JSON output
// turns bytes that are not UTF-8 into U+FFFD; chat's "bytes" keeps them). Completions: "tokens",
// "token_logprobs", "top_logprobs" (the alternatives and the chosen token, text to logprob) and
// "text_offset" (UTF-8 bytes of the answer before each token, counted on from `text_offset`,
// which it advances; chat leaves it alone). Chat: {"content": [{"token", "logprob", "bytes",
// "top_logprobs"}], "refusal": null}.
nlohmann::json logprobs_json(Endpoint endpoint, std::span<const TokenLogprob> tokens,
                             const Tokenizer& tokenizer, int64_t& text_offset);

// The echoed prompt's completions logprobs (echo with logprobs), in logprobs_json's shape: the
// first token has null token_logprobs and top_logprobs (nothing precedes it, as OpenAI and vLLM
// report it); `scores` are prompt tokens 1 .. n-1 (StreamEvent::prompt_logprobs). With
// `bos_added` (a text prompt, to which the server added the tokenizer's BOS) a first token that
// is BOS has no text, as the echoed text does not hold it; a token-id prompt's tokens all keep
// their text. Offsets count on from text_offset, which it advances. Error when the scores do not
// fit the prompt.
nlohmann::json prompt_logprobs_json(std::span<const int32_t> prompt,
                                    std::span<const TokenLogprob> scores,
                                    const Tokenizer& tokenizer, int64_t& text_offset,
                                    bool bos_added);
// Appends completions logprobs `more` to `logprobs` (the prompt's, then the answer's).
void append_logprobs(nlohmann::json& logprobs, const nlohmann::json& more);

// The whole answer: a text_completion or chat.completion object; `logprobs` is the choice's
// (null when not asked).
nlohmann::json completion_response(Endpoint endpoint, const ResponseIdentity& identity,
                                   const std::string& text, const std::string& finish_reason,
                                   const RequestStats& stats,
                                   const nlohmann::json& logprobs = nullptr);

// Streamed chunks (text_completion or chat.completion.chunk objects). With include_usage every
// chunk carries "usage": null until the usage chunk, as OpenAI's do. `logprobs` covers the
// chunk's tokens (null when not asked).
nlohmann::json role_chunk(const ResponseIdentity& identity, bool include_usage);  // chat only
nlohmann::json text_chunk(Endpoint endpoint, const ResponseIdentity& identity,
                          const std::string& text, bool include_usage,
                          const nlohmann::json& logprobs = nullptr);
nlohmann::json finish_chunk(Endpoint endpoint, const ResponseIdentity& identity,
                            const std::string& finish_reason, const RequestStats& stats,
                            bool include_usage, const nlohmann::json& logprobs = nullptr);
nlohmann::json usage_chunk(Endpoint endpoint, const ResponseIdentity& identity,
                           const RequestStats& stats);

// GET /v1/models and /v1/models/{id}.
nlohmann::json model_object(const std::string& model_id, int64_t created);
nlohmann::json models_list(const std::string& model_id, int64_t created);

// Server-sent events framing.
std::string sse_event(const nlohmann::json& payload);
std::string sse_done();

// JSON text that is always valid UTF-8 (any invalid byte becomes U+FFFD) and never throws.
std::string dump_json(const nlohmann::json& value);

}  // namespace entropyinfer::serve

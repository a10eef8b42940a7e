#include "fuzz_inputs.h"

#include <algorithm>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "attention/attention_config.h"
#include "core/error.h"
#include "core/json_reader.h"
#include "eval/eval_report.h"
#include "model/model_config.h"
#include "model/model_weights.h"
#include "model/safetensors.h"
#include "serve/openai_protocol.h"
#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/llama2c_tokenizer.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/sentencepiece_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace entropyinfer::fuzz {
namespace {

// The name every message carries; the parsers only use it for text.
const std::string kSource = "fuzz input";

std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// What a built tokenizer encodes: fixed text that reaches merges, special-token markup, spaces and
// multi-byte characters, then a slice from the middle of the input (where a vocabulary keeps its
// tokens), so that the fuzzer also steers the text.
std::string sample_text(std::string_view input) {
  constexpr std::string_view kFixed =
      "Hello, world! <s>[INST] it's 12345 caf\xC3\xA9  \xE6\x97\xA5\xE6\x9C\xAC\t\n"
      "<|im_start|>user\xE2\x96\x81x</s> ";
  constexpr size_t kMaxSlice = 128;
  const size_t length = std::min(input.size(), kMaxSlice);
  std::string text(kFixed);
  text.append(input.substr((input.size() - length) / 2, length));
  return text;
}

// Encodes and decodes (whole and streamed) with a tokenizer that the parser accepted. Nothing here
// catches Error: encoding never refuses text, so an Error would mean the tokenizer produced an id
// it does not know itself.
void exercise_tokenizer(const Tokenizer& tokenizer, std::string_view input) {
  const std::string text = sample_text(input);
  for (const bool parse_special : {false, true}) {
    const std::vector<int32_t> ids =
        tokenizer.encode(text, {.add_bos = true, .parse_special = parse_special});
    tokenizer.decode(ids);
    StreamingDecoder stream(tokenizer);
    for (const int32_t id : ids) stream.push(id);
    stream.flush();
  }
}

}  // namespace

// model.safetensors: the length prefix, JSON header and tensor table of a downloaded checkpoint are
// checked before any tensor bytes are used in place.
void fuzz_safetensors_header(const uint8_t* data, size_t size) {
  try {
    parse_safetensors_layout(data, size, kSource);
  } catch (const Error&) {
  }
}

// model.safetensors.index.json: names the shard files to open, so it must never escape the folder.
void fuzz_safetensors_index(const uint8_t* data, size_t size) {
  try {
    parse_safetensors_index(as_text(data, size), kSource);
  } catch (const Error&) {
  }
}

// config.json: sizes and RoPE parameters that later size every buffer of the model.
void fuzz_config_json(const uint8_t* data, size_t size) {
  try {
    parse_hf_config(parse_json(as_text(data, size), kSource));
  } catch (const Error&) {
  }
}

// tokenizer.json: a vocabulary, merges and pipeline settings from a model repository.
void fuzz_tokenizer_json(const uint8_t* data, size_t size) {
  std::unique_ptr<Tokenizer> tokenizer;
  try {
    tokenizer = parse_hf_bpe_tokenizer(as_text(data, size), kSource);
  } catch (const Error&) {
    return;
  }
  exercise_tokenizer(*tokenizer, as_text(data, size));
}

// tokenizer.model (SentencePiece): a protobuf read by the in-house wire-format reader.
void fuzz_sentencepiece_model(const uint8_t* data, size_t size) {
  std::unique_ptr<Tokenizer> tokenizer;
  try {
    tokenizer = parse_sentencepiece_tokenizer(as_text(data, size), kSource);
  } catch (const Error&) {
    return;
  }
  exercise_tokenizer(*tokenizer, as_text(data, size));
}

// tiktoken rank files. An unrecognised vocabulary is refused without an explicit pre-tokenizer, so
// the second parse, with GPT-2's, is the one that gets arbitrary rank files built.
void fuzz_tiktoken(const uint8_t* data, size_t size) {
  TiktokenOptions gpt2;
  gpt2.pretokenizer = PretokenizerPattern::kGpt2;
  for (const TiktokenOptions& options : {TiktokenOptions{}, gpt2}) {
    std::unique_ptr<Tokenizer> tokenizer;
    try {
      tokenizer = parse_tiktoken_tokenizer(as_text(data, size), kSource, options);
    } catch (const Error&) {
      continue;
    }
    exercise_tokenizer(*tokenizer, as_text(data, size));
  }
}

// llama2.c checkpoints: the header's sizes decide where every weight view points. Only the layout
// is checked; the weights are views into `data` and are not read.
void fuzz_llama2c_checkpoint(const uint8_t* data, size_t size) {
  try {
    parse_llama2c_checkpoint(data, size, kSource);
  } catch (const Error&) {
  }
}

// llama2.c tokenizer.bin: read to its end (-1, as for a lone tokenizer file) and with the
// vocabulary size a checkpoint's header gives, taken from the first byte: around the 259 tokens the
// format needs at least, or, for the top sixteen values, far more than any file holds (a corrupt
// header).
void fuzz_llama2c_tokenizer(const uint8_t* data, size_t size) {
  std::vector<int> vocab_sizes = {-1};
  if (size > 0) {
    vocab_sizes.push_back(data[0] < 0xF0 ? 256 + 2 * static_cast<int>(data[0])
                                         : std::numeric_limits<int>::max() >> (data[0] - 0xF0));
  }
  for (const int vocab_size : vocab_sizes) {
    std::unique_ptr<Tokenizer> tokenizer;
    try {
      tokenizer = parse_llama2c_tokenizer(as_text(data, size), vocab_size, kSource);
    } catch (const Error&) {
      continue;
    }
    exercise_tokenizer(*tokenizer, as_text(data, size));
  }
}

// --attention-config files: policy names and parameters given by the user.
void fuzz_attention_config(const uint8_t* data, size_t size) {
  try {
    attention_config_from_json(parse_json(as_text(data, size), kSource));
  } catch (const Error&) {
  }
}

// Bodies of POST /v1/completions and /v1/chat/completions, read by `entropyinfer serve` from
// anyone who can reach it; each input is parsed as both. A refusal must also render as OpenAI's
// error body.
void fuzz_openai_request(const uint8_t* data, size_t size) {
  serve::ServedModel served;
  served.id = "needle-llama-11m";
  served.vocab_size = 4096;
  served.prompt_vocab_size = 4096;
  for (const serve::Endpoint endpoint :
       {serve::Endpoint::kCompletions, serve::Endpoint::kChatCompletions}) {
    try {
      const serve::CompletionRequest request =
          serve::parse_completion_request(endpoint, as_text(data, size), served);
      serve::resolve_max_tokens(request, 100, 4096);
    } catch (const serve::ApiError& error) {
      serve::error_body(error);
    }
  }
  // The token endpoints read the same bodies.
  try {
    serve::parse_tokenize_request(as_text(data, size), served);
  } catch (const serve::ApiError& error) {
    serve::error_body(error);
  }
  try {
    serve::parse_detokenize_request(as_text(data, size), served);
  } catch (const serve::ApiError& error) {
    serve::error_body(error);
  }
}

// Reports given by path to `entropyinfer eval-report`. The report is drawn too: its tables,
// intervals and rankings read every value the file holds.
void fuzz_eval_report(const uint8_t* data, size_t size) {
  try {
    const eval::EvalReport report =
        eval::eval_report_from_json(parse_json(as_text(data, size), kSource));
    eval::eval_report_markdown(report);
  } catch (const Error&) {
  }
}

}  // namespace entropyinfer::fuzz

// One entry per parser of untrusted input, shared by the libFuzzer targets in this folder and by
// the regression replay in tests/test_fuzz_regressions.cpp. Each takes arbitrary bytes and returns
// normally when the parser either accepts them or refuses them with entropyinfer::Error; any other
// exception escapes, and a crash, hang or sanitizer report is a bug in the parser.
#pragma once

#include <cstddef>
#include <cstdint>

namespace entropyinfer::fuzz {

void fuzz_safetensors_header(const uint8_t* data, size_t size);
void fuzz_safetensors_index(const uint8_t* data, size_t size);
void fuzz_config_json(const uint8_t* data, size_t size);
void fuzz_tokenizer_json(const uint8_t* data, size_t size);
void fuzz_sentencepiece_model(const uint8_t* data, size_t size);
void fuzz_tiktoken(const uint8_t* data, size_t size);
void fuzz_llama2c_checkpoint(const uint8_t* data, size_t size);
void fuzz_llama2c_tokenizer(const uint8_t* data, size_t size);
void fuzz_attention_config(const uint8_t* data, size_t size);
void fuzz_openai_request(const uint8_t* data, size_t size);
void fuzz_eval_report(const uint8_t* data, size_t size);

}  // namespace entropyinfer::fuzz

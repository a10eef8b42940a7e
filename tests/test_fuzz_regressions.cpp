// Replays the committed fuzz inputs through the fuzz targets' own entry points: every file in
// fuzz/regressions/<target>/ (an input that once crashed a parser, kept so that the bug stays
// fixed) and in fuzz/seeds/<target>/. Each must be accepted or refused with Error; in the sanitizer
// build this also checks them under ASan/UBSan, without clang or libFuzzer.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <ostream>
#include <string>

#include "fuzz_inputs.h"
#include "test_support.h"

namespace entropyinfer {
namespace {

namespace fs = std::filesystem;

struct FuzzTarget {
  const char* name;  // the folder under fuzz/regressions and fuzz/seeds
  void (*run)(const uint8_t* data, size_t size);
};

constexpr FuzzTarget kTargets[] = {
    {"safetensors_header", fuzz::fuzz_safetensors_header},
    {"safetensors_index", fuzz::fuzz_safetensors_index},
    {"config_json", fuzz::fuzz_config_json},
    {"tokenizer_json", fuzz::fuzz_tokenizer_json},
    {"sentencepiece_model", fuzz::fuzz_sentencepiece_model},
    {"tiktoken", fuzz::fuzz_tiktoken},
    {"llama2c_checkpoint", fuzz::fuzz_llama2c_checkpoint},
    {"llama2c_tokenizer", fuzz::fuzz_llama2c_tokenizer},
    {"attention_config", fuzz::fuzz_attention_config},
    {"openai_request", fuzz::fuzz_openai_request},
    {"eval_report", fuzz::fuzz_eval_report},
};

void PrintTo(const FuzzTarget& target, std::ostream* out) { *out << target.name; }

class FuzzRegressions : public ::testing::TestWithParam<FuzzTarget> {};

TEST_P(FuzzRegressions, CommittedInputsAreAcceptedOrRefusedWithError) {
  const FuzzTarget& target = GetParam();
  int replayed = 0;
  for (const char* kind : {"regressions", "seeds"}) {
    const fs::path folder = fs::path(ENTROPYINFER_FUZZ_DIR) / kind / target.name;
    if (!fs::is_directory(folder)) continue;
    for (const fs::directory_entry& entry : fs::directory_iterator(folder)) {
      if (!entry.is_regular_file()) continue;
      const std::string bytes = testing::read_file_bytes(entry.path().string());
      try {
        target.run(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
      } catch (const std::exception& error) {
        ADD_FAILURE() << entry.path() << " let an exception escape: " << error.what();
      } catch (...) {
        ADD_FAILURE() << entry.path() << " let an exception that is no std::exception escape";
      }
      ++replayed;
    }
  }
  RecordProperty("inputs_replayed", replayed);
}

INSTANTIATE_TEST_SUITE_P(, FuzzRegressions, ::testing::ValuesIn(kTargets),
                         [](const ::testing::TestParamInfo<FuzzTarget>& param_info) {
                           return std::string(param_info.param.name);
                         });

}  // namespace
}  // namespace entropyinfer

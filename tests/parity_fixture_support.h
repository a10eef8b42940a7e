// Reading the committed Hugging Face parity fixtures (tests/fixtures/parity/*/, described in its
// README) and measuring how far logits are from them. Shared by the CPU parity test
// (tests/test_hf_parity.cpp) and the CUDA one (tests/gpu/test_cuda_parity_fixtures.cpp); both
// executables define ENTROPYINFER_FIXTURES_DIR.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

namespace entropyinfer::parity {

inline std::string parity_root() { return std::string(ENTROPYINFER_FIXTURES_DIR) + "/parity"; }

// Case names (sub-folders holding an expected.json), sorted so the test list is stable.
inline std::vector<std::string> parity_case_names() {
  namespace fs = std::filesystem;
  std::vector<std::string> names;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(parity_root(), error)) {
    if (entry.is_directory() && fs::exists(entry.path() / "expected.json")) {
      names.push_back(entry.path().filename().string());
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

struct ParityFixture {
  std::string folder;
  nlohmann::json expected;
  std::vector<std::vector<int32_t>> prompts;
  int vocab = 0;
  int rows = 0;
};

inline ParityFixture load_fixture(const std::string& name) {
  ParityFixture fixture;
  fixture.folder = parity_root() + "/" + name;
  std::ifstream stream(fixture.folder + "/expected.json");
  fixture.expected = nlohmann::json::parse(stream);
  for (const auto& prompt : fixture.expected.at("prompts")) {
    fixture.prompts.push_back(prompt.get<std::vector<int32_t>>());
  }
  fixture.rows = fixture.expected.at("logits_shape").at(0).get<int>();
  fixture.vocab = fixture.expected.at("logits_shape").at(1).get<int>();
  return fixture;
}

// Enough positions for the longest prompt plus its greedy continuation.
inline int context_needed(const ParityFixture& fixture) {
  size_t longest = 0;
  for (const auto& prompt : fixture.prompts) longest = std::max(longest, prompt.size());
  size_t continuation = 0;
  for (const auto& tokens : fixture.expected.at("greedy_continuations")) {
    continuation = std::max(continuation, tokens.size());
  }
  return static_cast<int>(longest + continuation + 1);
}

// The little-endian fp32 values in `raw` (a trailing partial value is dropped).
inline std::vector<float> floats_from_bytes(const std::string& raw) {
  std::vector<float> values(raw.size() / sizeof(float));
  std::memcpy(values.data(), raw.data(), values.size() * sizeof(float));
  return values;
}

// Every fp32 value in the file at `path`; none when it cannot be read.
inline std::vector<float> read_f32(const std::string& path) {
  std::ifstream stream(path, std::ios::binary);
  return floats_from_bytes(
      std::string((std::istreambuf_iterator<char>(stream)), std::istreambuf_iterator<char>()));
}

inline int first_argmax(const float* row, int count) {
  return static_cast<int>(std::max_element(row, row + count) - row);
}

struct Deviation {
  double relative = 0.0;  // max |engine - reference| / max |reference|
  double max_abs_diff = 0.0;
  double reference_scale = 0.0;
  int row = 0;  // position within the prompt
  int token = 0;
};

// The largest difference over `rows` x `vocab` logits (a NaN counts as infinite) and where it is.
inline Deviation compare_rows(const float* engine, const float* reference, int rows, int vocab) {
  Deviation deviation;
  for (int64_t i = 0; i < static_cast<int64_t>(rows) * vocab; ++i) {
    deviation.reference_scale =
        std::max(deviation.reference_scale, std::fabs(double(reference[i])));
    const double diff = std::fabs(double(engine[i]) - double(reference[i]));
    if (diff > deviation.max_abs_diff || std::isnan(diff)) {
      deviation.max_abs_diff = std::isnan(diff) ? INFINITY : diff;
      deviation.row = static_cast<int>(i / vocab);
      deviation.token = static_cast<int>(i % vocab);
    }
  }
  deviation.relative = deviation.max_abs_diff / std::max(deviation.reference_scale, 1e-30);
  return deviation;
}

inline std::string describe(const Deviation& deviation) {
  std::ostringstream text;
  text << "max|diff| " << deviation.max_abs_diff << " over max|ref| " << deviation.reference_scale
       << " = " << deviation.relative << " (prompt position " << deviation.row << ", token "
       << deviation.token << ")";
  return text.str();
}

}  // namespace entropyinfer::parity

// The project's shipped model (models/needle-llama-11m) and the reference numbers transformers
// computed for it (tests/fixtures/shipped_model/expected.json, written on the GPU machine by
// scripts/shipped_model_parity.py), shared by the CPU and the CUDA parity tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "parity_fixture_support.h"

namespace entropyinfer::testing {

inline std::string shipped_model_dir() {
  return std::string(ENTROPYINFER_FIXTURES_DIR) + "/../../models/needle-llama-11m";
}

struct ShippedModelCase {
  std::string name;
  int length = 0;
  std::vector<int32_t> prompt;
  std::vector<float> last_logits;  // transformers, float32
  std::vector<int32_t> greedy_continuation;
  double top2_margin = 0.0;
};

inline std::vector<ShippedModelCase> load_shipped_model_cases() {
  const std::string path = std::string(ENTROPYINFER_FIXTURES_DIR) + "/shipped_model/expected.json";
  std::ifstream stream(path);
  if (!stream) return {};
  const nlohmann::json expected = nlohmann::json::parse(stream);
  std::vector<ShippedModelCase> cases;
  for (const auto& entry : expected.at("cases")) {
    ShippedModelCase c;
    c.name = entry.at("name").get<std::string>();
    c.length = entry.at("length").get<int>();
    c.prompt = entry.at("prompt_ids").get<std::vector<int32_t>>();
    c.last_logits = entry.at("last_logits").get<std::vector<float>>();
    c.greedy_continuation = entry.at("greedy_continuation").get<std::vector<int32_t>>();
    c.top2_margin = entry.at("top2_margin").get<double>();
    cases.push_back(std::move(c));
  }
  return cases;
}

// max |engine - reference| over max |reference| of the last-position logits, as the parity
// fixtures measure it (a NaN counts as infinite); logits of another size fail the test.
inline double relative_max_deviation(const std::vector<float>& engine,
                                     const std::vector<float>& reference) {
  EXPECT_EQ(engine.size(), reference.size());
  if (engine.size() != reference.size()) return INFINITY;
  return parity::compare_rows(engine.data(), reference.data(), 1,
                              static_cast<int>(reference.size()))
      .relative;
}

}  // namespace entropyinfer::testing

// The FP8 checkpoint fixtures (tests/fixtures/fp8, written on the GPU machine by
// scripts/make_fp8_fixtures.py): one tiny Llama per FP8 format, quantized by PyTorch, with the
// logits transformers computes when each projection runs as its format defines. Shared by the CPU
// and the CUDA checks.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace entropyinfer::testing {

struct Fp8Fixture {
  std::string name;
  std::string folder;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::vector<float>> last_logits;
  std::vector<std::vector<int32_t>> greedy;
  std::vector<std::vector<double>> top2_margins;
  double activation_effect = 0.0;  // how far input quantization moves the logits
};

inline std::vector<Fp8Fixture> load_fp8_fixtures() {
  const std::filesystem::path root = std::filesystem::path(ENTROPYINFER_FIXTURES_DIR) / "fp8";
  std::vector<Fp8Fixture> fixtures;
  if (!std::filesystem::is_directory(root)) return fixtures;
  for (const auto& entry : std::filesystem::directory_iterator(root)) {
    const std::filesystem::path expected_path = entry.path() / "expected.json";
    if (!std::filesystem::exists(expected_path)) continue;
    std::ifstream stream(expected_path);
    const nlohmann::json expected = nlohmann::json::parse(stream);
    Fp8Fixture fixture;
    fixture.name = expected.at("case").get<std::string>();
    fixture.folder = entry.path().string();
    fixture.prompts = expected.at("prompts").get<std::vector<std::vector<int32_t>>>();
    fixture.last_logits = expected.at("last_logits").get<std::vector<std::vector<float>>>();
    fixture.greedy = expected.at("greedy").get<std::vector<std::vector<int32_t>>>();
    fixture.top2_margins = expected.at("top2_margins").get<std::vector<std::vector<double>>>();
    fixture.activation_effect = expected.at("activation_effect").get<double>();
    fixtures.push_back(std::move(fixture));
  }
  std::sort(fixtures.begin(), fixtures.end(),
            [](const Fp8Fixture& a, const Fp8Fixture& b) { return a.name < b.name; });
  return fixtures;
}

}  // namespace entropyinfer::testing

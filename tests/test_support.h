// Shared helpers for tests: where the real assets and committed fixtures are, and skipping cleanly
// when the assets (which live beside the checkout, not in it) are absent.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace entropyinfer::testing {

inline std::string assets_dir() { return ENTROPYINFER_ASSETS_DIR; }
inline std::string fixtures_dir() { return ENTROPYINFER_FIXTURES_DIR; }
inline std::string cli_path() { return ENTROPYINFER_CLI_PATH; }

inline std::string asset_path(const std::string& relative) { return assets_dir() + "/" + relative; }

// The indices of the `keep` largest scores (all of them when fewer), ties to the lower index, in
// ascending order: the selection rule the policies' own top-k is checked against.
inline std::vector<int32_t> naive_top(const std::vector<double>& scores, int64_t keep) {
  std::vector<int32_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return scores[a] > scores[b]; });
  order.resize(static_cast<size_t>(std::min<int64_t>(keep, static_cast<int64_t>(scores.size()))));
  std::sort(order.begin(), order.end());
  return order;
}

inline std::string read_file_bytes(const std::string& path) {
  std::ifstream stream(path, std::ios::binary);
  std::ostringstream buffer;
  buffer << stream.rdbuf();
  return buffer.str();
}

// Writes `contents` to a file of its own (the tag and the process id keep parallel test processes
// apart) that is removed when the test program exits; returns its path.
inline std::string temp_file(const std::string& tag, const std::string& name,
                             const std::string& contents) {
  struct Cleanup {
    std::vector<std::filesystem::path> paths;
    ~Cleanup() {
      std::error_code error;
      for (const auto& path : paths) std::filesystem::remove(path, error);
    }
  };
  static Cleanup written;
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() /
      ("entropyinfer_" + tag + "_" + std::to_string(::getpid()) + "_" + name);
  std::ofstream(path, std::ios::binary) << contents;
  written.paths.push_back(path);
  return path.string();
}

// Uniform values in [-scale, scale], reproducible from the seed.
inline std::vector<float> random_vector(size_t count, uint32_t seed, float scale = 1.0f) {
  std::mt19937 generator(seed);
  std::uniform_real_distribution<float> uniform(-scale, scale);
  std::vector<float> values(count);
  for (float& value : values) value = uniform(generator);
  return values;
}

}  // namespace entropyinfer::testing

// Skips the current test, naming the missing asset, when it is not there.
#define ENTROPYINFER_REQUIRE_ASSET(relative)                                             \
  do {                                                                                   \
    if (!std::filesystem::exists(::entropyinfer::testing::asset_path(relative))) {       \
      GTEST_SKIP() << "asset missing: " << ::entropyinfer::testing::asset_path(relative) \
                   << " (the shared assets folder is not beside this checkout)";         \
    }                                                                                    \
  } while (0)

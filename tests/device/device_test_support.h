// Tests written once and run on every device (CTranslate2's OpDeviceTest pattern): a test suite
// derived from OnDevice is instantiated with ENTROPYINFER_DEVICE_TESTS, so that the CPU test
// executable runs its bodies on the CPU executor and the GPU test executable runs the same bodies
// on the CUDA executor. A device this build or machine lacks skips with the reason.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "engine/language_model.h"

namespace entropyinfer::testing {

// The devices this executable tests: cpu in entropyinfer_tests, cuda in entropyinfer_gpu_tests
// (ENTROPYINFER_TEST_DEVICE, set per executable in CMakeLists.txt).
inline std::vector<Device> devices_under_test() { return {parse_device(ENTROPYINFER_TEST_DEVICE)}; }

class OnDevice : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override {
    if (!device_available(GetParam())) {
      GTEST_SKIP() << "no " << device_label(GetParam())
                   << " device here; the GPU tests run on the GPU machine (scripts/gpu_round.sh)";
    }
  }

  // `weights` must outlive the model.
  std::unique_ptr<LanguageModel> open(const ModelWeights& weights, int context,
                                      const AttentionConfig& attention = {}) const {
    EngineOptions options;
    options.device = GetParam();
    options.context_length = context;
    options.attention = attention;
    options.decode_room = 256;
    return make_language_model(weights, options);
  }
};

inline std::string device_test_name(const ::testing::TestParamInfo<Device>& info) {
  return device_label(info.param);
}

}  // namespace entropyinfer::testing

namespace entropyinfer {
inline void PrintTo(Device device, std::ostream* out) { *out << device_label(device); }
}  // namespace entropyinfer

#define ENTROPYINFER_DEVICE_TESTS(suite)                                                \
  INSTANTIATE_TEST_SUITE_P(, suite, ::testing::ValuesIn(testing::devices_under_test()), \
                           testing::device_test_name)

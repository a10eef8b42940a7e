#include "engine/language_model.h"

#include "core/error.h"
#include "engine/sampler.h"

namespace entropyinfer {

int32_t LanguageModel::forward_greedy(std::span<const int32_t> tokens) {
  const std::vector<float> logits = forward(tokens);
  check_logits_usable(logits);
  return argmax(logits);
}

Device parse_device(const std::string& name) {
  if (name == "cpu") return Device::kCpu;
  if (name == "cuda") return Device::kCuda;
  throw Error("--device must be cpu or cuda, not '" + name + "'");
}

const char* device_label(Device device) { return device == Device::kCuda ? "cuda" : "cpu"; }

}  // namespace entropyinfer

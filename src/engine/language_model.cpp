#include "engine/language_model.h"

#include "core/error.h"
#include "engine/sampler.h"

namespace entropyinfer {

void AttentionRecording::capture(int layer, const float* queries, int64_t q_width,
                                 const float* keys, int64_t kv_width, int64_t m) {
  CapturedAttentionInputs& inputs = captured[layer];
  inputs.queries.insert(inputs.queries.end(), queries, queries + m * q_width);
  inputs.keys.insert(inputs.keys.end(), keys, keys + m * kv_width);
  inputs.tokens += m;
}

void LanguageModel::set_capture_attention_inputs(bool capture) {
  recording_.capture_inputs = capture;
  recording_.captured.assign(capture ? config().num_layers : 0, CapturedAttentionInputs{});
}

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

PromptAttention parse_prompt_attention(const std::string& name) {
  if (name == "auto") return PromptAttention::kAuto;
  if (name == "bf16") return PromptAttention::kBf16;
  if (name == "fp8") return PromptAttention::kFp8;
  throw Error("--prompt-attention must be auto, bf16 or fp8, not '" + name + "'");
}

}  // namespace entropyinfer

// Builds the policies an AttentionConfig names. The config is validated here too, so a policy never
// runs with parameters that validate() would reject.
#include <memory>

#include "attention/decode_policy.h"
#include "attention/policies.h"
#include "attention/prefill_policy.h"

namespace entropyinfer {

std::unique_ptr<PrefillPolicy> make_prefill_policy(const AttentionConfig& config) {
  config.validate();
  switch (config.prefill) {
    case PrefillMethod::kFull:
      return std::make_unique<FullPrefillPolicy>(config.prefill_params);
    case PrefillMethod::kEntropy:
      return std::make_unique<EntropyPrefillPolicy>(config.prefill_params);
    case PrefillMethod::kCritiPrefill:
      return std::make_unique<CritiPrefillPolicy>(config.prefill_params);
  }
  return std::make_unique<FullPrefillPolicy>(config.prefill_params);
}

std::unique_ptr<DecodePolicy> make_decode_policy(const AttentionConfig& config) {
  config.validate();
  switch (config.decode) {
    case DecodeMethod::kFull:
      return nullptr;
    case DecodeMethod::kLatent:
      return std::make_unique<LatentDecodePolicy>(config.decode_params);
    case DecodeMethod::kSnapKV:
      return std::make_unique<SnapKVPolicy>(config.decode_params);
    case DecodeMethod::kAdaKV:
      return std::make_unique<AdaKVPolicy>(config.decode_params);
    case DecodeMethod::kStreamingLLM:
      return std::make_unique<StreamingLLMPolicy>(config.decode_params);
    case DecodeMethod::kPyramidKV:
      return std::make_unique<PyramidKVPolicy>(config.decode_params);
  }
  return nullptr;
}

}  // namespace entropyinfer

// Decode policies decide, once per generation, which cache entries of each head survive. One file
// per method: latent_decode.cpp (EntropyInfer), snapkv.cpp, adakv.cpp, streaming_llm.cpp,
// pyramidkv.cpp.
#pragma once

#include <memory>
#include <string>

#include "attention/attention_config.h"
#include "attention/decode_plan.h"

namespace entropyinfer {

class DecodePolicy {
 public:
  virtual ~DecodePolicy() = default;
  virtual std::string name() const = 0;
  // How many generated tokens the policy waits for before compressing (0: right after prefill;
  // EntropyInfer's latent decode: G). The window then holds the last W queries the model saw.
  virtual int compress_after_generated() const = 0;
  // Whether the plan needs the window's queries (StreamingLLM does not).
  virtual bool needs_window_queries() const { return true; }
  // Nothing is compressed while the cache holds no more than the budget: returns an empty plan
  // then.
  virtual LayerDecodePlan plan(const DecodeInputs& inputs) const = 0;
};

// Null for DecodeMethod::kFull.
std::unique_ptr<DecodePolicy> make_decode_policy(const AttentionConfig& config);

}  // namespace entropyinfer

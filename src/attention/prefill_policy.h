// Prefill policies decide which key blocks each (KV head, query segment) reads; they never run the
// attention arithmetic. One file per method: full_prefill.cpp, entropy_prefill.cpp,
// critiprefill.cpp.
#pragma once

#include <memory>
#include <string>

#include "attention/attention_config.h"
#include "attention/prefill_plan.h"

namespace entropyinfer {

class PrefillPolicy {
 public:
  virtual ~PrefillPolicy() = default;
  virtual std::string name() const = 0;
  // The plan for one layer of a prompt of inputs.num_tokens tokens (queries and keys after RoPE).
  virtual LayerPrefillPlan plan(const PrefillInputs& inputs) const = 0;
};

std::unique_ptr<PrefillPolicy> make_prefill_policy(const AttentionConfig& config);

}  // namespace entropyinfer

// Full attention: every layer dense. The plan still carries the shape so that work accounting
// (keys_read_dense) and backends see the same prompt.
#include "attention/entropy_prefill.h"
#include "attention/policies.h"

namespace entropyinfer {

LayerPrefillPlan FullPrefillPolicy::plan(const PrefillInputs& inputs) const {
  return dense_prefill_plan(inputs, params_);
}

}  // namespace entropyinfer

// CritiPrefill: EntropyInfer's segment/block criticality estimate and sparse pattern with one fixed
// budget (critiprefill_budget tokens) for every KV head and segment; no entropy, no classification.
#include "attention/entropy_prefill.h"
#include "attention/policies.h"

namespace entropyinfer {

LayerPrefillPlan CritiPrefillPolicy::plan(const PrefillInputs& inputs) const {
  return estimate_prefill_plan(inputs, params_, BudgetRule::kFixed);
}

}  // namespace entropyinfer

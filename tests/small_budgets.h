// Attention budgets small enough that the shipped model's prompts of a few hundred tokens run
// sparse and have their caches compressed, so that tests on short prompts see every method act.
#pragma once

#include <string>

#include "attention/attention_config.h"

namespace entropyinfer::testing {

// `methods` ("prefill[+decode]") at 64-token budgets: segments of 64, blocks of 8, sparse from
// token 64, decode budget 64 with a window of 8 and a latent gap of 4.
inline AttentionConfig small_budgets(const std::string& methods) {
  AttentionConfig config;
  config.prefill_params.segment_size = 64;
  config.prefill_params.block_size = 8;
  config.prefill_params.sparse_threshold = 64;
  config.prefill_params.base_budget = 64;
  config.prefill_params.critiprefill_budget = 64;
  config.prefill_params.dense_layers = 1;
  config.decode_params.budget = 64;
  config.decode_params.window = 8;
  config.decode_params.gap = 4;
  return with_methods(methods, config);
}

}  // namespace entropyinfer::testing

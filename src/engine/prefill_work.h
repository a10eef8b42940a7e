// The unit in which a serving step budgets prefill work: the token-layer, one prompt token through
// one layer's matrix products. Both batch executors cut a prompt into slices (whole layers on the
// CPU; products by rows and attention by query ranges on CUDA) and run slices until a step's
// budget is spent, so the cost of a slice is counted here once for both.
//
// Costs are multiply-adds relative to a token-layer's: attention as dense causal attention, or
// under a block-sparse plan by the keys each segment's rows select.
#pragma once

#include <cstdint>
#include <span>

#include "model/model_config.h"

namespace entropyinfer {

class PrefillWork {
 public:
  explicit PrefillWork(const ModelConfig& config);

  // One token through the q/k/v product, and through the output projection and the MLP; the two
  // add up to 1.
  double qkv_per_token() const { return qkv_per_token_; }
  double mlp_per_token() const { return 1.0 - qkv_per_token_; }
  // Queries at positions [first, end) of one layer, each against every key up to itself.
  double attention(int64_t first, int64_t end) const;
  // The same queries under a block-sparse plan (prefill_plan.h's arrays, as the host holds them):
  // a sparse segment's queries read their row's selected blocks and their own segment up to
  // themselves, a dense segment's every key up to themselves. Error for arrays that do not match.
  double sparse_attention(std::span<const uint8_t> segment_sparse,
                          std::span<const int32_t> row_offsets, int kv_heads, int segment_size,
                          int block_size, int64_t first, int64_t end) const;
  // One whole layer of a `tokens`-token prompt: its products and its attention.
  double layer(int64_t tokens) const;

 private:
  double qkv_per_token_ = 0;
  double per_key_ = 0;  // one query against one key, all query heads
};

}  // namespace entropyinfer

// EntropyInfer's prefill estimate (docs/method.md section 2) on the GPU: block extrema of the keys,
// segment midpoints of the queries, criticality scores, softmax entropy, rigid/dynamic (or
// CritiPrefill's fixed) budgets, top-k block selection and the CSR plan, all in device memory
// without a host round trip. It produces the plan estimate_prefill_plan
// (attention/entropy_prefill.h) makes on the CPU: same rows, same blocks, same budgets; only the
// fp32 dot products are summed in another order, so two blocks whose scores are equal to a few fp32
// ulps may rank the other way round.
#pragma once

#include <cstdint>

#include "attention/attention_config.h"
#include "attention/entropy_prefill.h"
#include "attention/prefill_plan.h"
#include "backends/cuda/cuda_common.h"
#include "backends/cuda/device_plans.h"
#include "backends/cuda/prefill_qkv_epilogue.h"

namespace entropyinfer::cuda {

// One estimator serves every layer of a model in turn: the key-block extrema, the scores and the
// plan are overwritten by the next layer. Not thread-safe; the caller orders record_key_blocks and
// estimate on its streams.
class PrefillEstimator {
 public:
  // Allocates every device buffer up front for prompts of up to max_tokens tokens. head_dim at
  // most 512; num_q_heads a multiple of num_kv_heads.
  PrefillEstimator(int num_q_heads, int num_kv_heads, int head_dim, int64_t max_tokens,
                   const PrefillParams& params, BudgetRule rule);
  PrefillEstimator(const PrefillEstimator&) = delete;
  PrefillEstimator& operator=(const PrefillEstimator&) = delete;

  // Bytes the constructor allocates (for memory planning). The largest items are the score
  // triangle, 4 * num_kv_heads * (S/b) * n_s * (n_s - 1) / 2 bytes with n_s = ceil(max_tokens/S)
  // segments (67 MB at 128k tokens, 8 KV heads, S=512, b=8), and the key-block extrema, bf16,
  // 2 * 2 * num_kv_heads * head_dim * ceil(max_tokens / b) bytes (67 MB likewise).
  static size_t device_bytes(int num_q_heads, int num_kv_heads, int head_dim, int64_t max_tokens,
                             const PrefillParams& params);

  // Records kmax/kmin of the key blocks covering keys [first, first + count) of one layer's bf16
  // key cache (per KV head a slab [cache_stride][head_dim]). first is a multiple of block_size;
  // a call with first == 0 starts a new layer, later calls continue where the last one ended (or
  // overlap it), so a block cut by the end of one call is recorded whole by the next. The extrema
  // are stored as bf16: the max and min of bf16 values are bf16 values, so nothing is rounded.
  void record_key_blocks(const bf16* key_cache, int64_t cache_stride, int64_t first, int64_t count,
                         cudaStream_t stream);

  // Where prefill_qkv_epilogue writes the statistics this estimator would otherwise compute
  // itself: the query midpoints and the key-block extrema, in this estimator's layouts.
  PrefillQkvStats fused_stats();

  // Records that prefill_qkv_epilogue has written the statistics of tokens [first, first + count)
  // of the current layer (keys and queries), with the same rules as record_key_blocks. When the
  // queries of every token of a plan were recorded this way, estimate() does not compute the
  // midpoints again.
  void record_fused(int64_t first, int64_t count);

  // Plans one layer from the whole prompt's post-RoPE queries (token t, query head h at
  // queries + t * q_token_stride + h * head_dim) and the key blocks recorded for keys
  // [0, num_tokens) (at least the keys before the last segment, which are all a plan can select).
  // Enqueues everything on `stream`; no host synchronisation. A dense layer (layer < dense_layers,
  // or no segment is sparse) returns a view with dense = true and launches nothing. The view stays
  // valid until the next estimate().
  DevicePrefillPlan estimate(const bf16* queries, int64_t q_token_stride, int64_t num_tokens,
                             int layer, cudaStream_t stream);

  // Adds the keys the last plan reads (LayerPrefillPlan::keys_read() of that plan) and the full
  // causal count (keys_read_dense()) to two device counters, on `stream`, without a sync. Either
  // pointer may be null.
  void accumulate_keys_read(unsigned long long* keys_read, unsigned long long* keys_read_dense,
                            cudaStream_t stream) const;

  // Synchronous: the last plan as a complete host plan (CSR, and entropy, budget_tokens and
  // rigid_head as estimate_prefill_plan fills them for the rule).
  LayerPrefillPlan download_last(cudaStream_t stream) const;

  // Synchronous, for tests: the recorded extrema of the key blocks of keys [0, num_tokens), in the
  // CPU layout of block_key_extrema().
  HeadExtrema download_key_extrema(int64_t num_tokens, cudaStream_t stream) const;

  const PrefillParams& params() const { return params_; }
  BudgetRule rule() const { return rule_; }
  int64_t max_tokens() const { return max_tokens_; }

 private:
  int num_q_heads_;
  int num_kv_heads_;
  int head_dim_;
  int64_t max_tokens_;
  PrefillParams params_;
  BudgetRule rule_;
  int group_;
  int padded_dim_;        // head_dim rounded up to the score kernel's slice; the pad is zeros
  int64_t block_stride_;  // key blocks per (KV head, kind, dimension) row of key_extrema_
  int64_t row_stride_;    // (segment, group member) rows per (KV head, dimension) of midpoints_

  int64_t recorded_tokens_ = 0;     // keys [0, recorded_tokens_) of the current layer are recorded
  int64_t fused_query_tokens_ = 0;  // queries [0, this) have midpoints from record_fused

  void check_record_range(int64_t first, int64_t count) const;

  // The last plan, as the host knows it.
  bool last_dense_ = true;
  int64_t last_tokens_ = 0;
  int last_segments_ = 0;

  DeviceBuffer<bf16> key_extrema_;  // [kv_head][max, min][padded_dim][block_stride_]
  DeviceBuffer<float> midpoints_;   // [kv_head][padded_dim][row_stride_], row = segment*group + g
  DeviceBuffer<float> scores_;      // per KV head the triangle of rows s >= 1, s * S/b entries each
  DeviceBuffer<double> entropy_;    // [kv_head][segment]
  DeviceBuffer<double> budgets_;    // [kv_head][segment], tokens before flooring
  DeviceBuffer<int32_t> budget_tokens_;
  DeviceBuffer<int32_t> keep_;  // blocks each row selects
  DeviceBuffer<uint8_t> rigid_head_;
  DeviceBuffer<uint8_t> segment_sparse_;
  DeviceBuffer<int32_t> row_offsets_;
  DeviceBuffer<int32_t> block_indices_;
  DeviceBuffer<unsigned long long> keys_read_;  // keys_read() of the last sparse plan
};

}  // namespace entropyinfer::cuda

// The decode-side KV-cache compression on the GPU (docs/method.md sections 3 and 4): the CUDA
// counterpart of the CPU decode policies (attention/latent_decode.cpp, snapkv.cpp, adakv.cpp,
// streaming_llm.cpp, pyramidkv.cpp, with the shared steps of attention/window_scores.h). For the
// same inputs the plan holds the same kept entries as the CPU policy's plan(), up to scores that
// tie within rounding.
//
// Steps, all on the device and without a host synchronisation:
//   1. window scores: per query head, the softmax probabilities (scale 1/sqrt(d), over every key a
//      window query sees, causal within the window) averaged over the window's queries, for the
//      candidates [0, L - W). Two passes of mma.sync tiles, one CTA per (query head, 32 window
//      queries, 512 keys): the first finds each window query's log-sum-exp, the second sums the
//      probabilities per key;
//   2. pooling (avg / max / none, the CPU's padding rules) and the group aggregation (mean / max,
//      or none when per_query_head);
//   3. selection: a radix select per head finds the threshold score of the top-k, and one ordered
//      scan per head keeps every candidate above it plus the lowest-index ones equal to it: the
//      order (score descending, index ascending) of the CPU's partial_sort. AdaKV runs it twice
//      (the per-head floors, then the layer-wide rest over the candidates not yet taken).
//   StreamingLLM needs no scores.
//
// compact_cache() then gathers the kept rows into a new, per-head cache that ragged_decode.h reads.
#pragma once

#include <cstdint>
#include <vector>

#include "attention/attention_config.h"
#include "attention/decode_plan.h"
#include "backends/cuda/cuda_common.h"
#include "backends/cuda/device_plans.h"
#include "backends/cuda/kv_cache_fp8.h"

namespace entropyinfer::cuda {

class DecodeCompressor {
 public:
  // method: kLatent, kSnapKV, kAdaKV, kStreamingLLM or kPyramidKV (Error for kFull). head_dim 64 or
  // 128 (the scoring kernels' tiles). Every plan() call may pass at most params.window window
  // queries and a cache of at most max_cache_length entries. Allocates all device memory here.
  DecodeCompressor(DecodeMethod method, const DecodeParams& params, int num_q_heads,
                   int num_kv_heads, int head_dim, int num_layers, int64_t max_cache_length);

  // Device memory the constructor allocates for these arguments.
  static size_t device_bytes(DecodeMethod method, const DecodeParams& params, int num_q_heads,
                             int num_kv_heads, int head_dim, int num_layers,
                             int64_t max_cache_length);

  // Lists per plan: Hkv, or Hq when params.per_query_head.
  int selection_heads() const { return selection_heads_; }

  // The longest list a plan for (cache_length, layer) can hold, known on the host: exact for every
  // method but AdaKV, whose heads share the layer's budget (there it is min(candidates, floor +
  // every head's share) + window). 0 when the plan would be empty.
  int64_t longest_list_bound(int64_t cache_length, int layer) const;

  // Plans one layer, like the CPU policy's plan() for DecodeInputs{window_queries, window_tokens,
  // key_cache, cache_stride, cache_length, ..., layer}:
  //   window_queries: bf16 [window_tokens][num_q_heads][head_dim] after RoPE, oldest first, the
  //     last one at cache position cache_length - 1 (1 <= window_tokens <= min(params.window,
  //     cache_length)); key_cache: bf16, per KV head a [cache_stride][head_dim] slab holding
  //     cache_length rows. Both 16-byte aligned. StreamingLLM reads neither (they may be null).
  // Returns a view of this compressor's storage: it stays valid until the next plan() call, which
  // overwrites it (on the same stream, kernels queued before that call still read the old plan).
  // When the CPU policy returns an empty plan (the cache does not exceed the layer's budget), the
  // view has heads = 0 and null pointers, and nothing is launched. No host synchronisation.
  DeviceDecodePlan plan(const bf16* window_queries, int window_tokens, const bf16* key_cache,
                        int64_t cache_stride, int64_t cache_length, int layer, cudaStream_t stream);

  // The last plan as the host struct (synchronises the stream). For tests and reports.
  LayerDecodePlan download_last(cudaStream_t stream) const;

  // The last plan's candidate scores (pooled and aggregated, [selection_heads][candidates], what
  // the CPU's candidate_scores() returns); empty when the last plan was empty or StreamingLLM's.
  // Synchronises the stream. For tests.
  std::vector<float> download_last_scores(cudaStream_t stream) const;

 private:
  void compute_candidate_scores(const bf16* window_queries, int window_tokens,
                                const bf16* key_cache, int64_t cache_stride, int64_t cache_length,
                                int64_t candidates, cudaStream_t stream);
  // Radix select of the top `keep` per segment; leaves each segment's threshold in radix_state_.
  void radix_select(const float* scores, const uint8_t* excluded, int64_t segment_length,
                    int segments, int state_offset, int64_t keep, cudaStream_t stream);

  DecodeMethod method_;
  DecodeParams params_;
  int num_q_heads_ = 0;
  int num_kv_heads_ = 0;
  int head_dim_ = 0;
  int num_layers_ = 0;
  int64_t max_cache_length_ = 0;
  int selection_heads_ = 0;

  DeviceBuffer<float2> chunk_stats_;      // per (query head, window query, key chunk): max, sum
  DeviceBuffer<float2> row_stats_;        // per (query head, window query): max, sum
  DeviceBuffer<float> partial_scores_;    // [query groups][num_q_heads][candidates]
  DeviceBuffer<float> candidate_scores_;  // [selection heads][candidates]
  DeviceBuffer<uint8_t> taken_;           // AdaKV: [selection heads][candidates]
  DeviceBuffer<int32_t> counts_;          // AdaKV: per head, greater / equal to the threshold
  DeviceBuffer<uint2> radix_state_;       // per segment (selection heads + 1): threshold, count
  DeviceBuffer<uint32_t> histograms_;     // per segment: 256 bins
  DeviceBuffer<int32_t> kept_offsets_;
  DeviceBuffer<int32_t> kept_indices_;

  DeviceDecodePlan last_;
  int64_t last_candidates_ = 0;
  bool last_scored_ = false;
};

// Gathers the kept rows of every list c of the plan (a KV head, or a query head when
// plan.per_query_head: its source KV head is then c / group) from the old caches (per KV head a
// [cache_stride][head_dim] slab) into new ones [plan.heads][new_stride][head_dim], in the plan's
// ascending order, and writes lengths[c] = the list's length. The new caches must not overlap the
// old ones. plan.heads must be num_kv_heads (or num_kv_heads * group when per_query_head) and
// group must be 1 unless per_query_head. Reads the plan's offsets back once to check new_stride
// against the longest list (Error when it is shorter), so it synchronises the stream.
void compact_cache(const bf16* key_cache, const bf16* value_cache, int64_t cache_stride,
                   int num_kv_heads, int head_dim, const DeviceDecodePlan& plan, int group,
                   bf16* new_keys, bf16* new_values, int64_t new_stride, int32_t* lengths,
                   cudaStream_t stream);

// The same over FP8 caches (kv_cache_fp8.h, both of the same head_dim, a multiple of 16): codes
// and row scales move together.
void compact_cache(const Fp8KvCache& cache, int64_t cache_stride, int num_kv_heads, int head_dim,
                   const DeviceDecodePlan& plan, int group, const Fp8KvCache& new_cache,
                   int64_t new_stride, int32_t* lengths, cudaStream_t stream);

}  // namespace entropyinfer::cuda

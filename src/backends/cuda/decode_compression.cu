// The decode policies' selection on the GPU (see decode_compression.h for the steps). Every
// formula mirrors its CPU counterpart in attention/window_scores.cpp, adakv.cpp, pyramidkv.cpp and
// streaming_llm.cpp; comments name the CPU line a step reproduces where the order of operations
// matters for equal results.
#include <algorithm>
#include <cmath>
#include <string>

#include "attention/decode_selection.h"
#include "backends/cuda/decode_compression.h"
#include "backends/cuda/flash_attention_internal.cuh"

namespace entropyinfer::cuda {
namespace {

// ------------------------------------------------------------------------------------------------
// Window scores
//
// A CTA holds 32 window queries of one query head and walks a chunk of 512 keys in tiles of 64,
// each warp taking 16 keys. The keys are the A operand (rows) of m16n8k16 and the queries the B
// operand (columns), so one thread's accumulators hold two keys (g and g + 8) against eight
// queries, and the sum over the window's queries for one key is a reduction within a quad.

constexpr int kScoreWarps = 4;
constexpr int kScoreThreads = 32 * kScoreWarps;
constexpr int kTileKeys = 16 * kScoreWarps;
constexpr int kChunkKeys = 8 * kTileKeys;
constexpr int kQueryGroup = 32;
constexpr int kQueryTiles = kQueryGroup / 8;  // n-tiles of 8 queries
constexpr int kScoreStages = 2;

template <int kHeadDim>
struct ScoreTile {
  static constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row
  static constexpr int kRowBytes = kHeadDim * 2;
  static constexpr int kQueryBytes = kQueryGroup * kRowBytes;
  static constexpr int kKeyTileBytes = kTileKeys * kRowBytes;
  static constexpr int kSharedBytes = kQueryBytes + kScoreStages * kKeyTileBytes;
};

using detail::swizzled;

struct WindowParams {
  const bf16* queries = nullptr;  // [window_tokens][q_heads][head_dim]
  const bf16* keys = nullptr;     // per KV head [cache_stride][head_dim]
  int64_t cache_stride = 0;
  int q_heads = 0;
  int group = 0;
  int window_tokens = 0;
  int cache_length = 0;  // L: window query i sits at position L - window_tokens + i
  int candidates = 0;    // C: keys [0, C) get scores
  int row_chunks = 0;    // key chunks of the first pass, ceil(L / kChunkKeys)
  float scale = 0.0f;
  float2* chunk_stats = nullptr;    // [q_heads][window_tokens][row_chunks]: (max, sum of exp)
  float2* row_stats = nullptr;      // [q_heads][window_tokens]: (max, sum of exp) over all keys
  float* partial_scores = nullptr;  // [query groups][q_heads][candidates]
};

// (max, sum) of exp(x - max) over a set, merged with another set's.
__device__ __forceinline__ void merge_stats(float& largest, float& sum, float other_largest,
                                            float other_sum) {
  const float merged = fmaxf(largest, other_largest);
  if (merged == -INFINITY) return;  // both sets empty
  sum = sum * expf(largest - merged) + other_sum * expf(other_largest - merged);
  largest = merged;
}

// Streams the keys [key_begin, key_end) of the query head's KV head through shared memory and
// calls consume(first key of this warp's 16, s) per tile, s[n][i] holding the unscaled logits of
// keys (first + g, first + g + 8) against queries n * 8 + 2t + (0, 1) of the group:
// s[n][0] = (key g, query 2t), s[n][1] = (key g, query 2t + 1), s[n][2], s[n][3]: key g + 8.
// Keys past key_end are zero rows. Every thread of the CTA must call it.
template <int kHeadDim, typename Consume>
__device__ __forceinline__ void for_each_logit_tile(const WindowParams& p, uint8_t* shared,
                                                    int head, int query_group, int key_begin,
                                                    int key_end, Consume&& consume) {
  using Tile = ScoreTile<kHeadDim>;
  constexpr int kChunks = Tile::kChunks;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const uint32_t query_tile = detail::shared_address(shared);
  const uint32_t key_tiles = query_tile + Tile::kQueryBytes;
  const bf16* key_head = p.keys + static_cast<int64_t>(head / p.group) * p.cache_stride * kHeadDim;

  for (int index = threadIdx.x; index < kQueryGroup * kChunks; index += kScoreThreads) {
    const int r = index / kChunks, c = index % kChunks;
    const int query = query_group * kQueryGroup + r;
    const bool valid = query < p.window_tokens;
    const bf16* source =
        valid ? p.queries + (static_cast<int64_t>(query) * p.q_heads + head) * kHeadDim + c * 8
              : p.queries;
    detail::cp_async_16(swizzled<kHeadDim>(query_tile, r, c), source, valid ? 16 : 0);
  }
  auto load_keys = [&](int tile, int stage) {
    const uint32_t tile_address = key_tiles + stage * Tile::kKeyTileBytes;
    for (int index = threadIdx.x; index < kTileKeys * kChunks; index += kScoreThreads) {
      const int r = index / kChunks, c = index % kChunks;
      const int key = key_begin + tile * kTileKeys + r;
      const bool valid = key < key_end;
      detail::cp_async_16(swizzled<kHeadDim>(tile_address, r, c),
                          key_head + static_cast<int64_t>(valid ? key : 0) * kHeadDim + c * 8,
                          valid ? 16 : 0);
    }
  };
  const int tiles = (key_end - key_begin + kTileKeys - 1) / kTileKeys;
  // The first group holds the queries and tile 0; the group committed in iteration i holds tile
  // i + kScoreStages - 1.
#pragma unroll
  for (int stage = 0; stage < kScoreStages - 1; ++stage) {
    if (stage < tiles) load_keys(stage, stage);
    detail::cp_async_commit();
  }
  for (int tile = 0; tile < tiles; ++tile) {
    const int ahead = tile + kScoreStages - 1;
    if (ahead < tiles) load_keys(ahead, ahead % kScoreStages);  // the stage read last iteration
    detail::cp_async_commit();
    detail::cp_async_wait<kScoreStages - 1>();
    __syncthreads();
    const uint32_t key_tile = key_tiles + (tile % kScoreStages) * Tile::kKeyTileBytes;
    float s[kQueryTiles][4];
#pragma unroll
    for (int n = 0; n < kQueryTiles; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      uint32_t a[4];
      detail::ldmatrix_x4(
          a, swizzled<kHeadDim>(key_tile, warp * 16 + (lane & 15), 2 * kk + (lane >> 4)));
#pragma unroll
      for (int np = 0; np < kQueryTiles / 2; ++np) {
        uint32_t b[4];
        const int query = np * 16 + (lane & 7) + ((lane >> 4) << 3);
        detail::ldmatrix_x4(b, swizzled<kHeadDim>(query_tile, query, 2 * kk + ((lane >> 3) & 1)));
        detail::mma_bf16_16816(s[2 * np], a, b[0], b[1]);
        detail::mma_bf16_16816(s[2 * np + 1], a, b[2], b[3]);
      }
    }
    consume(key_begin + tile * kTileKeys + warp * 16, s);
    __syncthreads();  // the next iteration's loads overwrite the stage read here
  }
  detail::cp_async_wait<0>();
}

// Cache position of window query (group, n-tile, lane's column e), -1 for the padding queries
// past window_tokens (they see no key).
__device__ __forceinline__ int window_position(const WindowParams& p, int query) {
  return query < p.window_tokens ? p.cache_length - p.window_tokens + query : -1;
}

// First pass: per window query, max and sum of exp(x - max) of its logits x = q.k * scale over
// the keys of this chunk it sees (key <= its position).
template <int kHeadDim>
__global__ void __launch_bounds__(kScoreThreads) window_row_stats_kernel(const WindowParams p) {
  __shared__ __align__(128) uint8_t shared[ScoreTile<kHeadDim>::kSharedBytes];
  __shared__ float2 warp_stats[kScoreWarps][kQueryGroup];
  const int head = blockIdx.x, query_group = blockIdx.y, chunk = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int key_begin = chunk * kChunkKeys;
  const int key_end = min(p.cache_length, key_begin + kChunkKeys);

  int position[kQueryTiles][2];
  float row_max[kQueryTiles][2], row_sum[kQueryTiles][2];
#pragma unroll
  for (int n = 0; n < kQueryTiles; ++n) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      position[n][e] = window_position(p, query_group * kQueryGroup + n * 8 + 2 * t + e);
      row_max[n][e] = -INFINITY;
      row_sum[n][e] = 0.0f;
    }
  }
  for_each_logit_tile<kHeadDim>(
      p, shared, head, query_group, key_begin, key_end,
      [&](int first_key, float(&s)[kQueryTiles][4]) {
        const int key_a = first_key + g, key_b = key_a + 8;
#pragma unroll
        for (int n = 0; n < kQueryTiles; ++n) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            // __fmul_rn: the logit is rounded once like the CPU's dot * scale, never fused.
            const float xa = key_a <= position[n][e] ? __fmul_rn(s[n][e], p.scale) : -INFINITY;
            const float xb = key_b <= position[n][e] ? __fmul_rn(s[n][2 + e], p.scale) : -INFINITY;
            const float merged = fmaxf(row_max[n][e], fmaxf(xa, xb));
            if (merged != -INFINITY) {
              row_sum[n][e] = row_sum[n][e] * expf(row_max[n][e] - merged) + expf(xa - merged) +
                              expf(xb - merged);
              row_max[n][e] = merged;
            }
          }
        }
      });

  // The 8 lanes of a column (same t) hold the same queries for different keys.
#pragma unroll
  for (int n = 0; n < kQueryTiles; ++n) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
#pragma unroll
      for (int offset = 4; offset < 32; offset <<= 1) {
        const float other_max = __shfl_xor_sync(0xffffffffu, row_max[n][e], offset);
        const float other_sum = __shfl_xor_sync(0xffffffffu, row_sum[n][e], offset);
        merge_stats(row_max[n][e], row_sum[n][e], other_max, other_sum);
      }
      if (g == 0) warp_stats[warp][n * 8 + 2 * t + e] = make_float2(row_max[n][e], row_sum[n][e]);
    }
  }
  __syncthreads();
  if (threadIdx.x < kQueryGroup) {
    float largest = -INFINITY, sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kScoreWarps; ++w) {
      merge_stats(largest, sum, warp_stats[w][threadIdx.x].x, warp_stats[w][threadIdx.x].y);
    }
    const int query = query_group * kQueryGroup + threadIdx.x;
    if (query < p.window_tokens) {
      p.chunk_stats[(static_cast<int64_t>(head) * p.window_tokens + query) * p.row_chunks + chunk] =
          make_float2(largest, sum);
    }
  }
}

// One warp per (query head, window query): merges its chunks' (max, sum) in a fixed order.
__global__ void window_row_merge_kernel(const float2* chunk_stats, int chunks, float2* row_stats) {
  const int64_t row = blockIdx.x;
  float largest = -INFINITY, sum = 0.0f;
  for (int c = threadIdx.x; c < chunks; c += 32) {
    const float2 stats = chunk_stats[row * chunks + c];
    merge_stats(largest, sum, stats.x, stats.y);
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float other_max = __shfl_xor_sync(0xffffffffu, largest, offset);
    const float other_sum = __shfl_xor_sync(0xffffffffu, sum, offset);
    merge_stats(largest, sum, other_max, other_sum);
  }
  if (threadIdx.x == 0) row_stats[row] = make_float2(largest, sum);
}

// Second pass: per candidate key, the sum over this group's window queries of their softmax
// probabilities exp(x - max) / sum (0 for a query that does not see the key).
template <int kHeadDim>
__global__ void __launch_bounds__(kScoreThreads) window_scores_kernel(const WindowParams p) {
  __shared__ __align__(128) uint8_t shared[ScoreTile<kHeadDim>::kSharedBytes];
  const int head = blockIdx.x, query_group = blockIdx.y, chunk = blockIdx.z;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int key_begin = chunk * kChunkKeys;
  const int key_end = min(p.candidates, key_begin + kChunkKeys);

  int position[kQueryTiles][2];
  float row_max[kQueryTiles][2], inverse_sum[kQueryTiles][2];
#pragma unroll
  for (int n = 0; n < kQueryTiles; ++n) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int query = query_group * kQueryGroup + n * 8 + 2 * t + e;
      position[n][e] = window_position(p, query);
      row_max[n][e] = 0.0f;
      inverse_sum[n][e] = 0.0f;
      if (query < p.window_tokens) {
        const float2 stats = p.row_stats[static_cast<int64_t>(head) * p.window_tokens + query];
        row_max[n][e] = stats.x;
        inverse_sum[n][e] = 1.0f / stats.y;  // key 0 is always seen: the sum is >= 1
      }
    }
  }
  float* out =
      p.partial_scores + (static_cast<int64_t>(query_group) * p.q_heads + head) * p.candidates;
  for_each_logit_tile<kHeadDim>(
      p, shared, head, query_group, key_begin, key_end,
      [&](int first_key, float(&s)[kQueryTiles][4]) {
        const int key_a = first_key + g, key_b = key_a + 8;
        float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
        for (int n = 0; n < kQueryTiles; ++n) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            if (key_a <= position[n][e]) {
              sum_a += expf(__fmul_rn(s[n][e], p.scale) - row_max[n][e]) * inverse_sum[n][e];
            }
            if (key_b <= position[n][e]) {
              sum_b += expf(__fmul_rn(s[n][2 + e], p.scale) - row_max[n][e]) * inverse_sum[n][e];
            }
          }
        }
        sum_a = detail::quad_sum(sum_a);
        sum_b = detail::quad_sum(sum_b);
        if (t == 0) {
          if (key_a < key_end) out[key_a] = sum_a;
          if (key_b < key_end) out[key_b] = sum_b;
        }
      });
}

// ------------------------------------------------------------------------------------------------
// Pooling and group aggregation (window_scores.cpp: pool_scores, candidate_scores), one thread per
// (selection head, candidate). Sums run in double like the CPU's so that equal raw scores give
// equal candidate scores.

struct CandidateParams {
  const float* partial_scores = nullptr;  // [query_groups][q_heads][candidates]
  float* scores = nullptr;                // [selection_heads][candidates]
  int query_groups = 0;
  int q_heads = 0;
  int group = 0;
  int selection_heads = 0;
  int window_tokens = 0;
  int candidates = 0;
  Pooling pooling = Pooling::kAvg;
  int pool_kernel = 1;
  bool per_query_head = false;
  bool max_aggregation = false;
};

// The mean over the window's queries (window_attention_scores' row[j]).
__device__ float raw_window_score(const CandidateParams& p, int head, int64_t j) {
  float total = 0.0f;
  for (int q = 0; q < p.query_groups; ++q) {
    total += p.partial_scores[(static_cast<int64_t>(q) * p.q_heads + head) * p.candidates + j];
  }
  return static_cast<float>(static_cast<double>(total) / p.window_tokens);
}

__device__ float pooled_score(const CandidateParams& p, int head, int64_t j) {
  const int64_t half = p.pool_kernel / 2;
  const int64_t first = j - half < 0 ? 0 : j - half;
  const int64_t last = j + half > p.candidates - 1 ? p.candidates - 1 : j + half;
  switch (p.pooling) {
    case Pooling::kNone:
      return raw_window_score(p, head, j);
    case Pooling::kAvg: {
      double sum = 0.0;  // the padding outside the row counts as zeros
      for (int64_t k = first; k <= last; ++k) sum += raw_window_score(p, head, k);
      return static_cast<float>(sum / p.pool_kernel);
    }
    case Pooling::kMax: {
      float largest = -INFINITY;
      for (int64_t k = first; k <= last; ++k)
        largest = fmaxf(largest, raw_window_score(p, head, k));
      return largest;
    }
  }
  return 0.0f;
}

__global__ void candidate_scores_kernel(const CandidateParams p) {
  const int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= static_cast<int64_t>(p.selection_heads) * p.candidates) return;
  const int head = static_cast<int>(index / p.candidates);
  const int64_t j = index % p.candidates;
  if (p.per_query_head) {
    p.scores[index] = pooled_score(p, head, j);
    return;
  }
  double mean = 0.0;
  float largest = -INFINITY;
  for (int g = 0; g < p.group; ++g) {
    const float value = pooled_score(p, head * p.group + g, j);
    mean += value;
    largest = fmaxf(largest, value);
  }
  p.scores[index] = p.max_aggregation ? largest : static_cast<float>(mean / p.group);
}

// ------------------------------------------------------------------------------------------------
// Top-k selection. A score's key orders like the float (higher score, higher key); the radix
// select finds per segment the threshold key T, the k-th largest, and how many of the candidates
// equal to T are taken (the lowest indices among them). A segment's state is (T, that count):
// while the passes run, T holds the digits found so far and the count the rank still to reach
// among the candidates that share them.

constexpr int kRadixThreads = 256;
constexpr uint32_t kNoThreshold = 0xffffffffu;  // with count 0: nothing is selected

__device__ __forceinline__ uint32_t order_key(float score) {
  const uint32_t bits = __float_as_uint(score == 0.0f ? 0.0f : score);  // -0 equals +0
  return (bits & 0x80000000u) != 0 ? ~bits : (bits | 0x80000000u);
}

__global__ void radix_init_kernel(uint2* state, uint32_t* histograms, int segments, int64_t keep) {
  for (int i = threadIdx.x; i < segments * 256; i += blockDim.x) histograms[i] = 0;
  for (int s = threadIdx.x; s < segments; s += blockDim.x) {
    state[s] =
        keep > 0 ? make_uint2(0u, static_cast<uint32_t>(keep)) : make_uint2(kNoThreshold, 0u);
  }
}

// Histogram of the digit at `shift` over the candidates of each segment whose higher digits equal
// the ones found so far (and that are not excluded).
__global__ void __launch_bounds__(kRadixThreads)
    radix_histogram_kernel(const float* scores, const uint8_t* excluded, int64_t segment_length,
                           const uint2* state, uint32_t* histograms, int shift) {
  __shared__ uint32_t local[256];
  const int segment = blockIdx.y;
  const int lane = threadIdx.x % 32;
  for (int i = threadIdx.x; i < 256; i += blockDim.x) local[i] = 0;
  __syncthreads();
  const uint2 current = state[segment];
  if (current.y > 0) {
    const uint32_t high_mask = shift == 24 ? 0u : 0xffffffffu << (shift + 8);
    const int64_t offset = static_cast<int64_t>(segment) * segment_length;
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    // base is the same for the whole block, so every lane of a warp runs each iteration.
    for (int64_t base = static_cast<int64_t>(blockIdx.x) * blockDim.x; base < segment_length;
         base += stride) {
      const int64_t index = base + threadIdx.x;
      int bin = -1;
      if (index < segment_length && (excluded == nullptr || excluded[offset + index] == 0)) {
        const uint32_t key = order_key(scores[offset + index]);
        if ((key & high_mask) == (current.x & high_mask))
          bin = static_cast<int>((key >> shift) & 255u);
      }
      // One shared atomic per distinct bin of the warp: scores crowd into few bins.
      const unsigned peers = __match_any_sync(0xffffffffu, bin);
      if (bin >= 0 && lane == __ffs(peers) - 1) atomicAdd(&local[bin], __popc(peers));
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < 256; i += blockDim.x) {
    if (local[i] != 0) atomicAdd(&histograms[segment * 256 + i], local[i]);
  }
}

// One thread per segment: the bin, from the top, where the rank still to reach falls. Clears the
// histogram for the next digit.
__global__ void radix_choose_kernel(uint2* state, uint32_t* histograms, int segments, int shift) {
  const int segment = blockIdx.x * blockDim.x + threadIdx.x;
  if (segment >= segments) return;
  uint2 current = state[segment];
  uint32_t* bins = histograms + segment * 256;
  if (current.y > 0) {
    int64_t above = 0;
    for (int bin = 255; bin >= 0; --bin) {
      const int64_t count = bins[bin];
      if (above + count >= current.y) {
        current.x |= static_cast<uint32_t>(bin) << shift;
        current.y -= static_cast<uint32_t>(above);
        break;
      }
      above += count;
    }
  }
  for (int bin = 0; bin < 256; ++bin) bins[bin] = 0;
  state[segment] = current;
}

// AdaKV's shared part: per head, the candidates not taken by the floors that score above (and at)
// the layer-wide threshold.
__global__ void __launch_bounds__(kRadixThreads)
    threshold_counts_kernel(const float* scores, const uint8_t* taken, int64_t candidates,
                            const uint2* state, int heads, int32_t* counts) {
  const int head = blockIdx.y;
  const uint32_t threshold = state->x;
  const int64_t offset = static_cast<int64_t>(head) * candidates;
  int greater = 0, equal = 0;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < candidates;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (taken[offset + j] != 0) continue;
    const uint32_t key = order_key(scores[offset + j]);
    greater += key > threshold ? 1 : 0;
    equal += key == threshold ? 1 : 0;
  }
  for (int shift = 16; shift > 0; shift >>= 1) {
    greater += __shfl_xor_sync(0xffffffffu, greater, shift);
    equal += __shfl_xor_sync(0xffffffffu, equal, shift);
  }
  if (threadIdx.x % 32 == 0) {
    if (greater != 0) atomicAdd(&counts[head], greater);
    if (equal != 0) atomicAdd(&counts[heads + head], equal);
  }
}

// Exclusive prefix sum over the block (blockDim.x a multiple of 32); total gets the block's sum.
__device__ unsigned long long block_exclusive_scan(unsigned long long value,
                                                   unsigned long long* warp_totals,
                                                   unsigned long long& total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  unsigned long long inclusive = value;
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const unsigned long long other = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive += other;
  }
  if (lane == 31) warp_totals[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    unsigned long long running = lane < warps ? warp_totals[lane] : 0ull;
#pragma unroll
    for (int offset = 1; offset < 32; offset <<= 1) {
      const unsigned long long other = __shfl_up_sync(0xffffffffu, running, offset);
      if (lane >= offset) running += other;
    }
    warp_totals[lane] = running;  // inclusive over warps
  }
  __syncthreads();
  const unsigned long long before = (warp == 0 ? 0ull : warp_totals[warp - 1]) + inclusive - value;
  total = warp_totals[warps - 1];
  __syncthreads();  // warp_totals is rewritten by the next call
  return before;
}

enum class SelectMode {
  kMark,    // AdaKV's floors: flag the top `keep` candidates of each head in `taken`
  kTopK,    // the top `keep` candidates of each head, then the window
  kShared,  // AdaKV: the floors, the shared part above the layer's threshold, then the window
};

struct SelectParams {
  const float* scores = nullptr;  // [heads][candidates]
  const uint2* state = nullptr;   // kMark, kTopK: per head; kShared: the layer's one
  const uint8_t* taken = nullptr;
  uint8_t* taken_out = nullptr;
  const int32_t* counts = nullptr;  // kShared: [heads] above the threshold, [heads] equal to it
  int32_t* kept_offsets = nullptr;
  int32_t* kept_indices = nullptr;
  int heads = 0;
  int candidates = 0;
  int cache_length = 0;
  int keep = 0;  // kMark, kTopK: candidates per head; kShared: each head's floor
};

constexpr int kSelectThreads = 512;
constexpr int kSelectItems = 8;  // consecutive candidates per thread

// One CTA per head walks its candidates in index order: a candidate is kept when its key is above
// the threshold (or it was taken by a floor), or when it equals the threshold and fewer than
// `allowance` equal ones came before it. One scan of packed counts (kept unconditionally << 32 |
// equal to the threshold) gives every candidate's rank in the ascending list.
template <SelectMode kMode>
__global__ void __launch_bounds__(kSelectThreads) select_kernel(const SelectParams p) {
  __shared__ unsigned long long warp_totals[32];
  __shared__ int64_t list_offset;
  __shared__ int64_t list_count;
  __shared__ uint32_t threshold;
  __shared__ uint32_t allowance;
  const int head = blockIdx.x;
  const int window = p.cache_length - p.candidates;
  if (threadIdx.x == 0) {
    if constexpr (kMode == SelectMode::kShared) {
      // Equal scores go to the lower head first (adaptive_head_selection's flat order).
      const uint2 layer = p.state[0];
      threshold = layer.x;
      int64_t need = layer.y, offset = 0;
      for (int h = 0; h < p.heads; ++h) {
        const int64_t granted = min(need, static_cast<int64_t>(p.counts[p.heads + h]));
        need -= granted;
        const int64_t count = p.keep + p.counts[h] + granted;
        if (h == head) {
          list_offset = offset;
          list_count = count;
          allowance = static_cast<uint32_t>(granted);
        }
        if (head == 0) p.kept_offsets[h] = static_cast<int32_t>(offset);
        offset += count + window;
      }
      if (head == 0) p.kept_offsets[p.heads] = static_cast<int32_t>(offset);
    } else {
      const uint2 own = p.state[head];
      threshold = own.x;
      allowance = own.y;
      list_count = p.keep;
      list_offset = static_cast<int64_t>(head) * (p.keep + window);
      if (kMode == SelectMode::kTopK && head == 0) {
        for (int h = 0; h <= p.heads; ++h) {
          p.kept_offsets[h] = static_cast<int32_t>(static_cast<int64_t>(h) * (p.keep + window));
        }
      }
    }
  }
  __syncthreads();
  const float* row = p.scores + static_cast<int64_t>(head) * p.candidates;
  const int64_t row_offset = static_cast<int64_t>(head) * p.candidates;
  constexpr unsigned long long kUnconditional = 1ull << 32;
  unsigned long long carry = 0;  // the counts of the tiles before
  for (int64_t tile = 0; tile < p.candidates; tile += kSelectThreads * kSelectItems) {
    const int64_t first = tile + static_cast<int64_t>(threadIdx.x) * kSelectItems;
    uint8_t kind[kSelectItems];  // 0 dropped, 1 kept unconditionally, 2 equal to the threshold
    unsigned long long local = 0;
#pragma unroll
    for (int k = 0; k < kSelectItems; ++k) {
      const int64_t j = first + k;
      kind[k] = 0;
      if (j < p.candidates) {
        const uint32_t key = order_key(row[j]);
        const bool taken = kMode == SelectMode::kShared && p.taken[row_offset + j] != 0;
        kind[k] = taken || key > threshold ? 1 : key == threshold ? 2 : 0;
      }
      local += kind[k] == 1 ? kUnconditional : kind[k] == 2 ? 1ull : 0ull;
    }
    unsigned long long tile_total;
    unsigned long long before = carry + block_exclusive_scan(local, warp_totals, tile_total);
#pragma unroll
    for (int k = 0; k < kSelectItems; ++k) {
      const int64_t j = first + k;
      if (j < p.candidates) {
        const uint32_t unconditional_before = static_cast<uint32_t>(before >> 32);
        const uint32_t equal_before = static_cast<uint32_t>(before & 0xffffffffull);
        const bool kept = kind[k] == 1 || (kind[k] == 2 && equal_before < allowance);
        if constexpr (kMode == SelectMode::kMark) {
          p.taken_out[row_offset + j] = kept ? 1 : 0;
        } else if (kept) {
          p.kept_indices[list_offset + unconditional_before + min(equal_before, allowance)] =
              static_cast<int32_t>(j);
        }
      }
      before += kind[k] == 1 ? kUnconditional : kind[k] == 2 ? 1ull : 0ull;
    }
    carry += tile_total;
  }
  if constexpr (kMode != SelectMode::kMark) {
    for (int w = threadIdx.x; w < window; w += blockDim.x) {
      p.kept_indices[list_offset + list_count + w] = p.candidates + w;
    }
  }
}

// StreamingLLM: the first `sinks` entries and the most recent budget - sinks, for every head.
__global__ void streaming_kernel(int32_t* kept_offsets, int32_t* kept_indices, int heads,
                                 int budget, int sinks, int cache_length) {
  const int head = blockIdx.x;
  for (int k = threadIdx.x; k < budget; k += blockDim.x) {
    kept_indices[static_cast<int64_t>(head) * budget + k] =
        k < sinks ? k : cache_length - budget + k;
  }
  if (head == 0) {
    for (int h = threadIdx.x; h <= heads; h += blockDim.x) kept_offsets[h] = h * budget;
  }
}

// ------------------------------------------------------------------------------------------------
// Cache compaction: one 16-byte chunk of a kept row per thread.

__global__ void compact_kernel(const bf16* keys, const bf16* values, int64_t cache_stride,
                               int head_dim, const int32_t* kept_offsets,
                               const int32_t* kept_indices, int group, bool per_query_head,
                               bf16* new_keys, bf16* new_values, int64_t new_stride,
                               int32_t* lengths) {
  const int list = blockIdx.y;
  const int begin = kept_offsets[list];
  const int count = kept_offsets[list + 1] - begin;
  const int source_head = per_query_head ? list / group : list;
  const int chunks = head_dim / 8;
  if (blockIdx.x == 0 && threadIdx.x == 0) lengths[list] = count;
  for (int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       index < static_cast<int64_t>(count) * chunks;
       index += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int row = static_cast<int>(index / chunks), chunk = static_cast<int>(index % chunks);
    const int64_t source =
        (static_cast<int64_t>(source_head) * cache_stride + kept_indices[begin + row]) * head_dim +
        chunk * 8;
    const int64_t target = (static_cast<int64_t>(list) * new_stride + row) * head_dim + chunk * 8;
    *reinterpret_cast<uint4*>(new_keys + target) = *reinterpret_cast<const uint4*>(keys + source);
    *reinterpret_cast<uint4*>(new_values + target) =
        *reinterpret_cast<const uint4*>(values + source);
  }
}

// compact_kernel for FP8 caches: a row is head_dim / 16 chunks of codes plus its scale, for keys
// and for values.
__global__ void compact_fp8_kernel(Fp8KvCache cache, int64_t cache_stride, int head_dim,
                                   const int32_t* kept_offsets, const int32_t* kept_indices,
                                   int group, bool per_query_head, Fp8KvCache new_cache,
                                   int64_t new_stride, int32_t* lengths) {
  const int list = blockIdx.y;
  const int begin = kept_offsets[list];
  const int count = kept_offsets[list + 1] - begin;
  const int source_head = per_query_head ? list / group : list;
  const int chunks = head_dim / 16 + 1;  // the last "chunk" of a row is its scales
  if (blockIdx.x == 0 && threadIdx.x == 0) lengths[list] = count;
  for (int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       index < static_cast<int64_t>(count) * chunks;
       index += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int row = static_cast<int>(index / chunks), chunk = static_cast<int>(index % chunks);
    const int64_t source_row =
        static_cast<int64_t>(source_head) * cache_stride + kept_indices[begin + row];
    const int64_t target_row = static_cast<int64_t>(list) * new_stride + row;
    if (chunk == chunks - 1) {
      new_cache.key_scales[target_row] = cache.key_scales[source_row];
      new_cache.value_scales[target_row] = cache.value_scales[source_row];
      continue;
    }
    const int64_t source = source_row * head_dim + chunk * 16;
    const int64_t target = target_row * head_dim + chunk * 16;
    *reinterpret_cast<uint4*>(new_cache.key_codes + target) =
        *reinterpret_cast<const uint4*>(cache.key_codes + source);
    *reinterpret_cast<uint4*>(new_cache.value_codes + target) =
        *reinterpret_cast<const uint4*>(cache.value_codes + source);
  }
}

// ------------------------------------------------------------------------------------------------
// Host side

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

bool aligned16(const void* pointer) { return reinterpret_cast<uintptr_t>(pointer) % 16 == 0; }

bool needs_scores(DecodeMethod method) { return method != DecodeMethod::kStreamingLLM; }

struct BufferSizes {
  size_t chunk_stats = 0, row_stats = 0, partial_scores = 0, candidate_scores = 0, taken = 0,
         counts = 0, radix_state = 0, histograms = 0, kept_offsets = 0, kept_indices = 0;

  size_t bytes() const {
    return (chunk_stats + row_stats) * sizeof(float2) +
           (partial_scores + candidate_scores) * sizeof(float) + taken +
           (counts + kept_offsets + kept_indices) * sizeof(int32_t) + radix_state * sizeof(uint2) +
           histograms * sizeof(uint32_t);
  }
};

int selection_heads_of(const DecodeParams& params, int num_q_heads, int num_kv_heads) {
  return params.per_query_head ? num_q_heads : num_kv_heads;
}

void check_compressor_arguments(DecodeMethod method, const DecodeParams& params, int num_q_heads,
                                int num_kv_heads, int head_dim, int num_layers,
                                int64_t max_cache_length) {
  if (method == DecodeMethod::kFull) {
    throw Error("decode compression: the full cache needs no compressor");
  }
  AttentionConfig config;
  config.decode = method;
  config.decode_params = params;
  config.decode_params.gap = 0;  // the gap only schedules the compression; it is the caller's
  config.validate();
  if (num_kv_heads <= 0 || num_q_heads <= 0 || num_q_heads % num_kv_heads != 0) {
    throw Error("decode compression: query heads (" + std::to_string(num_q_heads) +
                ") must be a positive multiple of KV heads (" + std::to_string(num_kv_heads) + ")");
  }
  if (needs_scores(method) && head_dim != 64 && head_dim != 128) {
    throw Error("decode compression: head_dim " + std::to_string(head_dim) +
                " is not supported (64 or 128)");
  }
  if (num_layers <= 0) throw Error("decode compression: num_layers must be positive");
  const int heads = selection_heads_of(params, num_q_heads, num_kv_heads);
  if (max_cache_length <= 0 || ceil_div(max_cache_length, kChunkKeys) > 65535 ||
      static_cast<int64_t>(heads) * max_cache_length >= (int64_t{1} << 31) ||
      decode_selection_bounds(method, params, num_q_heads, num_kv_heads, num_layers,
                              max_cache_length)
              .entries >= (int64_t{1} << 31)) {
    throw Error(
        "decode compression: a maximum cache of " + std::to_string(max_cache_length) +
        " entries for " + std::to_string(heads) +
        " heads is out of range (positive, at most 65535 * 512, and heads times it below 2^31)");
  }
}

BufferSizes buffer_sizes(DecodeMethod method, const DecodeParams& params, int num_q_heads,
                         int num_kv_heads, int num_layers, int64_t max_cache_length) {
  BufferSizes sizes;
  const int heads = selection_heads_of(params, num_q_heads, num_kv_heads);
  const auto length = static_cast<size_t>(max_cache_length);
  sizes.kept_offsets = static_cast<size_t>(heads) + 1;
  sizes.kept_indices = static_cast<size_t>(
      std::max<int64_t>(1, decode_selection_bounds(method, params, num_q_heads, num_kv_heads,
                                                   num_layers, max_cache_length)
                               .entries));
  if (!needs_scores(method)) return sizes;
  const auto window = static_cast<size_t>(params.window);
  const size_t query_groups = static_cast<size_t>(ceil_div(params.window, kQueryGroup));
  sizes.chunk_stats =
      num_q_heads * window * static_cast<size_t>(ceil_div(max_cache_length, kChunkKeys));
  sizes.row_stats = num_q_heads * window;
  sizes.partial_scores = query_groups * num_q_heads * length;
  sizes.candidate_scores = heads * length;
  sizes.radix_state = static_cast<size_t>(heads) + 1;  // + the layer-wide one of AdaKV
  sizes.histograms = sizes.radix_state * 256;
  if (method == DecodeMethod::kAdaKV) {
    sizes.taken = heads * length;
    sizes.counts = 2 * static_cast<size_t>(heads);
  }
  return sizes;
}

template <int kHeadDim>
void launch_window_scores(const WindowParams& params, int query_groups, cudaStream_t stream) {
  // The query heads of one chunk are neighbours in the grid: the heads of a group read the same
  // keys at about the same time, from L2.
  const dim3 stats_grid(params.q_heads, query_groups, static_cast<unsigned>(params.row_chunks));
  window_row_stats_kernel<kHeadDim><<<stats_grid, kScoreThreads, 0, stream>>>(params);
  check_launch("window_row_stats_kernel");
  window_row_merge_kernel<<<static_cast<unsigned>(params.q_heads * params.window_tokens), 32, 0,
                            stream>>>(params.chunk_stats, params.row_chunks, params.row_stats);
  check_launch("window_row_merge_kernel");
  const dim3 scores_grid(params.q_heads, query_groups,
                         static_cast<unsigned>(ceil_div(params.candidates, kChunkKeys)));
  window_scores_kernel<kHeadDim><<<scores_grid, kScoreThreads, 0, stream>>>(params);
  check_launch("window_scores_kernel");
}

}  // namespace

DecodeCompressor::DecodeCompressor(DecodeMethod method, const DecodeParams& params, int num_q_heads,
                                   int num_kv_heads, int head_dim, int num_layers,
                                   int64_t max_cache_length)
    : method_(method),
      params_(params),
      num_q_heads_(num_q_heads),
      num_kv_heads_(num_kv_heads),
      head_dim_(head_dim),
      num_layers_(num_layers),
      max_cache_length_(max_cache_length) {
  check_compressor_arguments(method, params, num_q_heads, num_kv_heads, head_dim, num_layers,
                             max_cache_length);
  selection_heads_ = selection_heads_of(params, num_q_heads, num_kv_heads);
  const BufferSizes sizes =
      buffer_sizes(method, params, num_q_heads, num_kv_heads, num_layers, max_cache_length);
  chunk_stats_.allocate(sizes.chunk_stats);
  row_stats_.allocate(sizes.row_stats);
  partial_scores_.allocate(sizes.partial_scores);
  candidate_scores_.allocate(sizes.candidate_scores);
  taken_.allocate(sizes.taken);
  counts_.allocate(sizes.counts);
  radix_state_.allocate(sizes.radix_state);
  histograms_.allocate(sizes.histograms);
  kept_offsets_.allocate(sizes.kept_offsets);
  kept_indices_.allocate(sizes.kept_indices);
  last_.per_query_head = params.per_query_head;
}

size_t DecodeCompressor::device_bytes(DecodeMethod method, const DecodeParams& params,
                                      int num_q_heads, int num_kv_heads, int head_dim,
                                      int num_layers, int64_t max_cache_length) {
  check_compressor_arguments(method, params, num_q_heads, num_kv_heads, head_dim, num_layers,
                             max_cache_length);
  return buffer_sizes(method, params, num_q_heads, num_kv_heads, num_layers, max_cache_length)
      .bytes();
}

int64_t DecodeCompressor::longest_list_bound(int64_t cache_length, int layer) const {
  return decode_selection(method_, params_, num_q_heads_, num_kv_heads_, layer, num_layers_,
                          cache_length)
      .longest_list();
}

void DecodeCompressor::compute_candidate_scores(const bf16* window_queries, int window_tokens,
                                                const bf16* key_cache, int64_t cache_stride,
                                                int64_t cache_length, int64_t candidates,
                                                cudaStream_t stream) {
  WindowParams window;
  window.queries = window_queries;
  window.keys = key_cache;
  window.cache_stride = cache_stride;
  window.q_heads = num_q_heads_;
  window.group = num_q_heads_ / num_kv_heads_;
  window.window_tokens = window_tokens;
  window.cache_length = static_cast<int>(cache_length);
  window.candidates = static_cast<int>(candidates);
  window.row_chunks = static_cast<int>(ceil_div(cache_length, kChunkKeys));
  window.scale = 1.0f / std::sqrt(static_cast<float>(head_dim_));  // the CPU's scale
  window.chunk_stats = chunk_stats_.data();
  window.row_stats = row_stats_.data();
  window.partial_scores = partial_scores_.data();
  const int query_groups = static_cast<int>(ceil_div(window_tokens, kQueryGroup));
  if (head_dim_ == 128) {
    launch_window_scores<128>(window, query_groups, stream);
  } else {
    launch_window_scores<64>(window, query_groups, stream);
  }

  CandidateParams candidate;
  candidate.partial_scores = partial_scores_.data();
  candidate.scores = candidate_scores_.data();
  candidate.query_groups = query_groups;
  candidate.q_heads = num_q_heads_;
  candidate.group = num_q_heads_ / num_kv_heads_;
  candidate.selection_heads = selection_heads_;
  candidate.window_tokens = window_tokens;
  candidate.candidates = static_cast<int>(candidates);
  candidate.pooling = params_.pooling;
  candidate.pool_kernel = params_.pool_kernel;
  candidate.per_query_head = params_.per_query_head;
  candidate.max_aggregation = params_.aggregation == GroupAggregation::kMax;
  const int64_t total = static_cast<int64_t>(selection_heads_) * candidates;
  candidate_scores_kernel<<<static_cast<unsigned>(ceil_div(total, 256)), 256, 0, stream>>>(
      candidate);
  check_launch("candidate_scores_kernel");
}

void DecodeCompressor::radix_select(const float* scores, const uint8_t* excluded,
                                    int64_t segment_length, int segments, int state_offset,
                                    int64_t keep, cudaStream_t stream) {
  uint2* state = radix_state_.data() + state_offset;
  uint32_t* histograms = histograms_.data() + static_cast<size_t>(state_offset) * 256;
  radix_init_kernel<<<1, 256, 0, stream>>>(state, histograms, segments, keep);
  check_launch("radix_init_kernel");
  // Enough blocks per segment to fill the GPU, each thread reading at least 16 scores per pass.
  const auto blocks = static_cast<unsigned>(std::clamp<int64_t>(
      ceil_div(segment_length, kRadixThreads * 16), 1, std::max<int64_t>(1, 512 / segments)));
  for (int shift = 24; shift >= 0; shift -= 8) {
    radix_histogram_kernel<<<dim3(blocks, segments), kRadixThreads, 0, stream>>>(
        scores, excluded, segment_length, state, histograms, shift);
    check_launch("radix_histogram_kernel");
    radix_choose_kernel<<<static_cast<unsigned>(ceil_div(segments, 32)), 32, 0, stream>>>(
        state, histograms, segments, shift);
    check_launch("radix_choose_kernel");
  }
}

DeviceDecodePlan DecodeCompressor::plan(const bf16* window_queries, int window_tokens,
                                        const bf16* key_cache, int64_t cache_stride,
                                        int64_t cache_length, int layer, cudaStream_t stream) {
  if (layer < 0 || layer >= num_layers_) {
    throw Error("decode compression: layer " + std::to_string(layer) + " of " +
                std::to_string(num_layers_));
  }
  if (cache_length < 0 || cache_length > max_cache_length_ || cache_stride < cache_length) {
    throw Error("decode compression: cache length " + std::to_string(cache_length) +
                " must lie in [0, " + std::to_string(max_cache_length_) +
                "] and fit the key stride " + std::to_string(cache_stride));
  }
  const bool scored = needs_scores(method_);
  if (scored) {
    if (window_queries == nullptr || key_cache == nullptr) {
      throw Error("decode compression: the policy needs the window's queries and the keys");
    }
    if (!aligned16(window_queries) || !aligned16(key_cache)) {
      throw Error("decode compression: queries and keys must start on 16-byte boundaries");
    }
    if (window_tokens <= 0 || window_tokens > params_.window || window_tokens > cache_length) {
      throw Error("decode compression: " + std::to_string(window_tokens) +
                  " window queries (expected 1 to min(window " + std::to_string(params_.window) +
                  ", cache length " + std::to_string(cache_length) + "))");
    }
  }
  last_ = DeviceDecodePlan{};
  last_.per_query_head = params_.per_query_head;
  last_scored_ = false;
  const DecodeSelection selection = decode_selection(method_, params_, num_q_heads_, num_kv_heads_,
                                                     layer, num_layers_, cache_length);
  if (!selection.compresses) return last_;

  DeviceDecodePlan view;
  view.heads = selection_heads_;
  view.per_query_head = params_.per_query_head;
  view.kept_offsets = kept_offsets_.data();
  view.kept_indices = kept_indices_.data();
  const int heads = selection_heads_;

  if (method_ == DecodeMethod::kStreamingLLM) {
    streaming_kernel<<<heads, 256, 0, stream>>>(
        kept_offsets_.data(), kept_indices_.data(), heads,
        static_cast<int>(selection.sinks + selection.recent), static_cast<int>(selection.sinks),
        static_cast<int>(cache_length));
    check_launch("streaming_kernel");
    last_ = view;
    return view;
  }

  const int64_t candidates = selection.candidates;
  compute_candidate_scores(window_queries, window_tokens, key_cache, cache_stride, cache_length,
                           candidates, stream);
  const float* scores = candidate_scores_.data();
  SelectParams select;
  select.scores = scores;
  select.kept_offsets = kept_offsets_.data();
  select.kept_indices = kept_indices_.data();
  select.heads = heads;
  select.candidates = static_cast<int>(candidates);
  select.cache_length = static_cast<int>(cache_length);
  select.keep = static_cast<int>(selection.keep);
  if (method_ != DecodeMethod::kAdaKV) {
    radix_select(scores, nullptr, candidates, heads, 0, selection.keep, stream);
    select.state = radix_state_.data();
    select_kernel<SelectMode::kTopK><<<heads, kSelectThreads, 0, stream>>>(select);
    check_launch("select_kernel");
  } else {
    // 1. The floors, per head.
    radix_select(scores, nullptr, candidates, heads, 0, selection.keep, stream);
    select.state = radix_state_.data();
    select.taken_out = taken_.data();
    select_kernel<SelectMode::kMark><<<heads, kSelectThreads, 0, stream>>>(select);
    check_launch("select_kernel");
    // 2. The rest over every head's remaining candidates together, as one segment in the order
    // head * candidates + index.
    radix_select(scores, taken_.data(), heads * candidates, 1, heads, selection.shared, stream);
    check(cudaMemsetAsync(counts_.data(), 0, counts_.bytes(), stream), "cudaMemsetAsync");
    const auto blocks =
        static_cast<unsigned>(std::clamp<int64_t>(ceil_div(candidates, kRadixThreads * 16), 1, 64));
    threshold_counts_kernel<<<dim3(blocks, heads), kRadixThreads, 0, stream>>>(
        scores, taken_.data(), candidates, radix_state_.data() + heads, heads, counts_.data());
    check_launch("threshold_counts_kernel");
    select.state = radix_state_.data() + heads;
    select.taken = taken_.data();
    select.taken_out = nullptr;
    select.counts = counts_.data();
    select_kernel<SelectMode::kShared><<<heads, kSelectThreads, 0, stream>>>(select);
    check_launch("select_kernel");
  }
  last_ = view;
  last_candidates_ = candidates;
  last_scored_ = true;
  return view;
}

LayerDecodePlan DecodeCompressor::download_last(cudaStream_t stream) const {
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  if (last_.heads == 0) {
    LayerDecodePlan empty;
    empty.per_query_head = last_.per_query_head;
    return empty;
  }
  return download_decode_plan(last_);
}

std::vector<float> DecodeCompressor::download_last_scores(cudaStream_t stream) const {
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  if (!last_scored_) return {};
  std::vector<float> scores(static_cast<size_t>(selection_heads_) * last_candidates_);
  candidate_scores_.download(scores.data(), scores.size());
  return scores;
}

namespace {

// compact_cache's checks of the plan, then the longest list (read back, which synchronises).
int64_t longest_kept_list(int num_kv_heads, int head_dim, int row_multiple,
                          const DeviceDecodePlan& plan, int group, int64_t new_stride,
                          cudaStream_t stream) {
  if (plan.heads <= 0 || plan.kept_offsets == nullptr || plan.kept_indices == nullptr) {
    throw Error("cache compaction: the plan is empty (the cache is within the budget)");
  }
  if (head_dim <= 0 || head_dim % row_multiple != 0) {
    throw Error("cache compaction: head_dim " + std::to_string(head_dim) +
                " must be a positive multiple of " + std::to_string(row_multiple));
  }
  if (group < 1 || (!plan.per_query_head && group != 1)) {
    throw Error("cache compaction: group must be 1 unless the plan is per query head");
  }
  if (num_kv_heads <= 0 || plan.heads != num_kv_heads * group) {
    throw Error("cache compaction: a plan of " + std::to_string(plan.heads) + " lists for " +
                std::to_string(num_kv_heads) + " KV heads and group " + std::to_string(group));
  }
  std::vector<int32_t> offsets(static_cast<size_t>(plan.heads) + 1);
  check(cudaMemcpyAsync(offsets.data(), plan.kept_offsets, offsets.size() * sizeof(int32_t),
                        cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync (plan offsets)");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  int64_t longest = 0;
  for (int c = 0; c < plan.heads; ++c)
    longest = std::max<int64_t>(longest, offsets[c + 1] - offsets[c]);
  if (longest > new_stride) {
    throw Error("cache compaction: a list of " + std::to_string(longest) +
                " entries does not fit the new stride " + std::to_string(new_stride));
  }
  return longest;
}

}  // namespace

void compact_cache(const bf16* key_cache, const bf16* value_cache, int64_t cache_stride,
                   int num_kv_heads, int head_dim, const DeviceDecodePlan& plan, int group,
                   bf16* new_keys, bf16* new_values, int64_t new_stride, int32_t* lengths,
                   cudaStream_t stream) {
  if (key_cache == nullptr || value_cache == nullptr || new_keys == nullptr ||
      new_values == nullptr || lengths == nullptr || !aligned16(key_cache) ||
      !aligned16(value_cache) || !aligned16(new_keys) || !aligned16(new_values)) {
    throw Error("cache compaction: caches must be non-null and start on 16-byte boundaries");
  }
  const int64_t longest =
      longest_kept_list(num_kv_heads, head_dim, 8, plan, group, new_stride, stream);
  const int64_t chunks = longest * (head_dim / 8);
  const auto blocks = static_cast<unsigned>(std::clamp<int64_t>(ceil_div(chunks, 256), 1, 1024));
  compact_kernel<<<dim3(blocks, plan.heads), 256, 0, stream>>>(
      key_cache, value_cache, cache_stride, head_dim, plan.kept_offsets, plan.kept_indices, group,
      plan.per_query_head, new_keys, new_values, new_stride, lengths);
  check_launch("compact_kernel");
}

void compact_cache(const Fp8KvCache& cache, int64_t cache_stride, int num_kv_heads, int head_dim,
                   const DeviceDecodePlan& plan, int group, const Fp8KvCache& new_cache,
                   int64_t new_stride, int32_t* lengths, cudaStream_t stream) {
  const Fp8KvCache both[] = {cache, new_cache};
  for (const Fp8KvCache& rows : both) {
    if (rows.key_codes == nullptr || rows.value_codes == nullptr || rows.key_scales == nullptr ||
        rows.value_scales == nullptr || !aligned16(rows.key_codes) ||
        !aligned16(rows.value_codes)) {
      throw Error("cache compaction: FP8 codes and scales must be non-null, codes 16-byte aligned");
    }
  }
  if (lengths == nullptr) throw Error("cache compaction: null lengths");
  const int64_t longest =
      longest_kept_list(num_kv_heads, head_dim, 16, plan, group, new_stride, stream);
  const int64_t chunks = longest * (head_dim / 16 + 1);
  const auto blocks = static_cast<unsigned>(std::clamp<int64_t>(ceil_div(chunks, 256), 1, 1024));
  compact_fp8_kernel<<<dim3(blocks, plan.heads), 256, 0, stream>>>(
      cache, cache_stride, head_dim, plan.kept_offsets, plan.kept_indices, group,
      plan.per_query_head, new_cache, new_stride, lengths);
  check_launch("compact_fp8_kernel");
}

}  // namespace entropyinfer::cuda

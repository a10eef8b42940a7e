// The CPU backend's ops: the readable reference every other backend is tested against, and fast
// enough to run small models for real (SIMD micro-kernels, OpenMP over both cores, fp32
// accumulation).
#pragma once

#include <cstdint>
#include <span>

#include "core/fp8.h"
#include "core/half.h"

namespace entropyinfer::cpu {

// A weight matrix as the checkpoint stores it: [out, in] row-major elements of `dtype`.
struct WeightMatrix {
  WeightMatrix() = default;
  WeightMatrix(const void* values, TensorDtype type) : data(values), dtype(type) {}

  const void* data = nullptr;
  TensorDtype dtype = TensorDtype::kF32;
  // FP8 (kF8E4M3): element (o, k) is code(o, k) * scales[o] (scales[0] when scale_count is 1), and
  // the product first quantizes each input row as `activations` says (core/fp8.h), with
  // input_scale as the static scale.
  const float* scales = nullptr;
  int64_t scale_count = 0;
  Fp8Activations activations;
  float input_scale = 0.0f;
};

// y[t][o] = sum_k x[t][k] * w[o][k] (+ bias[o]); x is [tokens, in], w is [out, in] (nn.Linear
// layout), y is [tokens, out]. bias may be null. 16-bit weights are read as stored and widened in
// registers; FP8 ones are widened with their scales a few rows at a time, after x is quantized as
// the matrix says; sums are fp32 either way.
void linear(const float* x, int64_t tokens, int64_t in, WeightMatrix w, const float* bias,
            int64_t out, float* y);
inline void linear(const float* x, int64_t tokens, int64_t in, const float* w, const float* bias,
                   int64_t out, float* y) {
  linear(x, tokens, in, WeightMatrix{w, TensorDtype::kF32}, bias, out, y);
}

// Each row of x ([rows, width]) as an FP8 product's input sees it: quantized with its row's scale
// (dynamic) or `static_scale`, and back, into out (may alias x). Rows are left as they are for
// Kind::kNone.
void fp8_quantize_rows(const float* x, int64_t rows, int64_t width, const Fp8Activations& scheme,
                       float static_scale, float* out);

// out[t] = x[t] / rms(x[t]) * weight, rows of `size`; out may alias x.
void rms_norm(const float* x, const float* weight, int64_t rows, int64_t size, float eps,
              float* out);

// x[i] += y[i]
void add_inplace(float* x, const float* y, int64_t count);

// gate[i] = silu(gate[i]) * up[i]  (SwiGLU's elementwise part)
void swiglu_inplace(float* gate, const float* up, int64_t count);

// Numerically safe softmax over one row, in place.
void softmax_inplace(float* x, int64_t count);

// Rotates each head of x ([tokens, heads, head_dim]) by the angles in cos/sin ([tokens,
// rotary_dim/2]). adjacent_pairs: rotate (x[2i], x[2i+1]) as llama2.c does; otherwise (x[i], x[i +
// rotary_dim/2]) as Hugging Face models do.
void apply_rope(float* x, int64_t tokens, int64_t heads, int64_t head_dim, const float* cos,
                const float* sin, int64_t rotary_dim, bool adjacent_pairs);

// Causal grouped-query attention of new queries over a key/value cache.
//   q:   [tokens, q_heads, head_dim], the queries at positions first_position + t
//   key_cache / value_cache: per KV head a contiguous [cache_stride, head_dim] slab, heads
//   cache_stride
//        rows apart; positions 0 .. first_position + tokens - 1 must be filled.
//   out: [tokens, q_heads, head_dim]
// Query t sees keys 0 .. first_position + t (and, if window > 0, only the last `window` of them).
// Runs in FlashAttention-style tiles (backends/cpu/attention_tile.h): consecutive queries times a
// GQA group read each key and value once, with an online softmax. Results do not depend on the
// thread count. Throws Error unless q_heads is a positive multiple of kv_heads.
struct AttentionShape {
  int64_t tokens = 0;
  int64_t q_heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t first_position = 0;
  int64_t cache_stride = 0;
  int64_t window = 0;
  float scale = 0.0f;
};
void causal_attention(const float* q, const float* key_cache, const float* value_cache,
                      const AttentionShape& shape, float* out);

}  // namespace entropyinfer::cpu

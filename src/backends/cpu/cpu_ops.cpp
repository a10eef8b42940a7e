#include "backends/cpu/cpu_ops.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "backends/cpu/attention_tile.h"
#include "core/error.h"
#include "core/half.h"
#include "core/simd.h"

// Template helpers returning vectors are always inlined (core/simd.h on -Wpsabi); GCC reports
// their instantiations at the end of the file, past any push/pop around them.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace entropyinfer::cpu {
namespace {

// The weight element types a product reads, each turned into eight fp32 lanes at a time. The
// conversions are exact (bf16 and f16 are subsets of fp32), so a 16-bit matrix gives the same sums
// as its widened copy would.
template <TensorDtype Type>
using WeightElement = std::conditional_t<Type == TensorDtype::kF32, float, uint16_t>;

// Eight 16-bit lanes, unaligned.
typedef uint16_t Bits8 __attribute__((vector_size(16), aligned(2)));

template <TensorDtype Type>
[[gnu::always_inline]] inline Float8 load_weights8(const WeightElement<Type>* source) {
  if constexpr (Type == TensorDtype::kF32) {
    return load8(source);
  } else {
    const Int8 bits = __builtin_convertvector(*reinterpret_cast<const Bits8*>(source), Int8);
    if constexpr (Type == TensorDtype::kBF16) {
      return std::bit_cast<Float8>(bits << 16);
    } else {
      // f16: exponent and mantissa moved into fp32's fields, then scaled by 2^(127-15), which is
      // exact for normal and subnormal values; infinities and NaNs get fp32's all-ones exponent.
      const Int8 magnitude = (bits & 0x7fff) << 13;
      const Float8 scaled = std::bit_cast<Float8>(magnitude) * splat8(0x1p112f);
      const Int8 special = magnitude | 0x7f800000;
      const Int8 finite = std::bit_cast<Int8>(scaled);
      const Int8 value = (bits & 0x7c00) == 0x7c00 ? special : finite;
      return std::bit_cast<Float8>(value | ((bits & 0x8000) << 16));
    }
  }
}

template <TensorDtype Type>
[[gnu::always_inline]] inline float load_weight(const WeightElement<Type>* source) {
  if constexpr (Type == TensorDtype::kF32) {
    return *source;
  } else if constexpr (Type == TensorDtype::kBF16) {
    return bf16_to_f32(*source);
  } else {
    return f16_to_f32(*source);
  }
}

// Dot products of `Rows` weight rows with `Tokens` activation rows, each of length `in`. All Rows x
// Tokens sums stay in registers while the shared k loop streams both operands once.
// The helpers below are always inlined into linear_chunk, the function cloned per instruction set:
// a call to a separate function would run that function's portable code (core/simd.h).
template <TensorDtype Type, int Rows, int Tokens>
[[gnu::always_inline]] inline void dot_block(const WeightElement<Type>* const* w_rows,
                                             const float* const* x_rows, int64_t in,
                                             float (&result)[Rows][Tokens]) {
  Float8 acc[Rows][Tokens] = {};
  int64_t k = 0;
  for (; k + 8 <= in; k += 8) {
    Float8 wv[Rows];
    for (int r = 0; r < Rows; ++r) wv[r] = load_weights8<Type>(w_rows[r] + k);
    for (int t = 0; t < Tokens; ++t) {
      Float8 xv = *reinterpret_cast<const Float8*>(x_rows[t] + k);
      for (int r = 0; r < Rows; ++r) acc[r][t] += wv[r] * xv;
    }
  }
  for (int r = 0; r < Rows; ++r) {
    for (int t = 0; t < Tokens; ++t) {
      float sum = horizontal_sum8(acc[r][t]);
      // An explicit fused multiply-add, so that whether the compiler contracts this tail does
      // not depend on how the weight was converted: every weight type sums alike.
      for (int64_t kk = k; kk < in; ++kk)
        sum = __builtin_fmaf(load_weight<Type>(w_rows[r] + kk), x_rows[t][kk], sum);
      result[r][t] = sum;
    }
  }
}

template <TensorDtype Type, int Rows, int Tokens>
[[gnu::always_inline]] inline void linear_tile(const float* x, int64_t t0, int64_t in,
                                               const WeightElement<Type>* w, const float* bias,
                                               int64_t o0, int64_t out, float* y) {
  const WeightElement<Type>* w_rows[Rows];
  const float* x_rows[Tokens];
  for (int r = 0; r < Rows; ++r) w_rows[r] = w + (o0 + r) * in;
  for (int t = 0; t < Tokens; ++t) x_rows[t] = x + (t0 + t) * in;
  float result[Rows][Tokens];
  dot_block<Type, Rows, Tokens>(w_rows, x_rows, in, result);
  for (int r = 0; r < Rows; ++r) {
    float b = bias != nullptr ? bias[o0 + r] : 0.0f;
    for (int t = 0; t < Tokens; ++t) y[(t0 + t) * out + o0 + r] = result[r][t] + b;
  }
}

// Rows of one tile for a given token count: a 3x4 tile keeps 12 accumulators plus the operands
// within 16 vector registers; a single token (decode) reads 4 weight rows per pass.
template <TensorDtype Type, int Tokens>
[[gnu::always_inline]] inline void linear_rows(const float* x, int64_t t0, int64_t in,
                                               const WeightElement<Type>* w, const float* bias,
                                               int64_t row_begin, int64_t row_end, int64_t out,
                                               float* y) {
  constexpr int kRows = Tokens == 1 ? 4 : 3;
  int64_t o = row_begin;
  for (; o + kRows <= row_end; o += kRows)
    linear_tile<Type, kRows, Tokens>(x, t0, in, w, bias, o, out, y);
  for (; o < row_end; ++o) linear_tile<Type, 1, Tokens>(x, t0, in, w, bias, o, out, y);
}

// Output rows [row_begin, row_end) for every token.
template <TensorDtype Type>
[[gnu::always_inline]] inline void linear_chunk(const float* x, int64_t tokens, int64_t in,
                                                const void* w, const float* bias, int64_t out,
                                                float* y, int64_t row_begin, int64_t row_end) {
  const auto* rows = static_cast<const WeightElement<Type>*>(w);
  int64_t t = 0;
  for (; t + 4 <= tokens; t += 4)
    linear_rows<Type, 4>(x, t, in, rows, bias, row_begin, row_end, out, y);
  for (; t < tokens; ++t) linear_rows<Type, 1>(x, t, in, rows, bias, row_begin, row_end, out, y);
}

// One function per weight type, each cloned by CPU features (x86-64-v3 where the CPU has it, on
// Intel and AMD alike), with everything it calls inlined.
ENTROPYINFER_SIMD_CLONES void linear_chunk_f32(const float* x, int64_t tokens, int64_t in,
                                               const void* w, const float* bias, int64_t out,
                                               float* y, int64_t row_begin, int64_t row_end) {
  linear_chunk<TensorDtype::kF32>(x, tokens, in, w, bias, out, y, row_begin, row_end);
}
ENTROPYINFER_SIMD_CLONES void linear_chunk_bf16(const float* x, int64_t tokens, int64_t in,
                                                const void* w, const float* bias, int64_t out,
                                                float* y, int64_t row_begin, int64_t row_end) {
  linear_chunk<TensorDtype::kBF16>(x, tokens, in, w, bias, out, y, row_begin, row_end);
}
ENTROPYINFER_SIMD_CLONES void linear_chunk_f16(const float* x, int64_t tokens, int64_t in,
                                               const void* w, const float* bias, int64_t out,
                                               float* y, int64_t row_begin, int64_t row_end) {
  linear_chunk<TensorDtype::kF16>(x, tokens, in, w, bias, out, y, row_begin, row_end);
}

}  // namespace

namespace {

// Every E4M3 code's value, for widening rows.
const float* fp8_values() {
  static const auto table = [] {
    std::array<float, 256> values{};
    for (int code = 0; code < 256; ++code)
      values[code] = fp8_e4m3_to_f32(static_cast<uint8_t>(code));
    return values;
  }();
  return table.data();
}

void linear_fp8(const float* x, int64_t tokens, int64_t in, const WeightMatrix& w,
                const float* bias, int64_t out, float* y) {
  std::vector<float> quantized;
  if (w.activations.kind != Fp8Activations::Kind::kNone) {
    quantized.resize(static_cast<size_t>(tokens * in));
    fp8_quantize_rows(x, tokens, in, w.activations, w.input_scale, quantized.data());
    x = quantized.data();
  }
  const float* values = fp8_values();
  const auto* codes = static_cast<const uint8_t*>(w.data);
  // Rows are widened a chunk at a time into fp32 and multiplied there.
  const int64_t row_chunk = std::max<int64_t>(4, (1 << 16) / std::max<int64_t>(in, 1));
  const int64_t chunks = (out + row_chunk - 1) / row_chunk;
#pragma omp parallel for schedule(static) if (tokens * in * out > (1 << 16))
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    const int64_t row_begin = chunk * row_chunk;
    const int64_t rows = std::min(out, row_begin + row_chunk) - row_begin;
    std::vector<float> widened(static_cast<size_t>(rows * in));
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t row = row_begin + r;
      const float scale = w.scales[w.scale_count == 1 ? 0 : row];
      const uint8_t* source = codes + row * in;
      float* target = widened.data() + r * in;
      for (int64_t k = 0; k < in; ++k) target[k] = values[source[k]] * scale;
    }
    linear_chunk_f32(x, tokens, in, widened.data(), bias != nullptr ? bias + row_begin : nullptr,
                     out, y + row_begin, 0, rows);
  }
}

}  // namespace

void fp8_quantize_rows(const float* x, int64_t rows, int64_t width, const Fp8Activations& scheme,
                       float static_scale, float* out) {
  if (scheme.kind == Fp8Activations::Kind::kNone) {
    if (out != x) std::memcpy(out, x, sizeof(float) * static_cast<size_t>(rows * width));
    return;
  }
#pragma omp parallel for schedule(static) if (rows > 16)
  for (int64_t row = 0; row < rows; ++row) {
    const float* in_row = x + row * width;
    float* out_row = out + row * width;
    float scale = static_scale;
    if (scheme.kind == Fp8Activations::Kind::kDynamicPerToken) {
      float amax = 0.0f;
      for (int64_t i = 0; i < width; ++i) amax = std::max(amax, std::fabs(in_row[i]));
      scale = fp8_dynamic_scale(amax, scheme.upper_bound);
    }
    for (int64_t i = 0; i < width; ++i) out_row[i] = fp8_round_trip(in_row[i], scale);
  }
}

void linear(const float* x, int64_t tokens, int64_t in, WeightMatrix w, const float* bias,
            int64_t out, float* y) {
  if (w.dtype == TensorDtype::kF8E4M3) return linear_fp8(x, tokens, in, w, bias, out, y);
  auto* chunk_of_rows = w.dtype == TensorDtype::kF32    ? &linear_chunk_f32
                        : w.dtype == TensorDtype::kBF16 ? &linear_chunk_bf16
                                                        : &linear_chunk_f16;
  // Rows are split into chunks small enough that a chunk of weights stays in L2 while every token
  // block passes over it.
  const int64_t row_chunk =
      std::max<int64_t>(12, std::min<int64_t>(96, (1 << 18) / std::max<int64_t>(in, 1) / 12 * 12));
  const int64_t chunks = (out + row_chunk - 1) / row_chunk;
#pragma omp parallel for schedule(static) if (tokens * in * out > (1 << 16))
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    const int64_t row_begin = chunk * row_chunk;
    chunk_of_rows(x, tokens, in, w.data, bias, out, y, row_begin,
                  std::min(out, row_begin + row_chunk));
  }
}

void rms_norm(const float* x, const float* weight, int64_t rows, int64_t size, float eps,
              float* out) {
#pragma omp parallel for schedule(static) if (rows > 16)
  for (int64_t row = 0; row < rows; ++row) {
    const float* in_row = x + row * size;
    float* out_row = out + row * size;
    float sum_squares = 0.0f;
    for (int64_t i = 0; i < size; ++i) sum_squares += in_row[i] * in_row[i];
    const float inverse_rms = 1.0f / std::sqrt(sum_squares / static_cast<float>(size) + eps);
    for (int64_t i = 0; i < size; ++i) out_row[i] = in_row[i] * inverse_rms * weight[i];
  }
}

void add_inplace(float* x, const float* y, int64_t count) {
#pragma omp parallel for simd schedule(static) if (count > (1 << 16))
  for (int64_t i = 0; i < count; ++i) x[i] += y[i];
}

void swiglu_inplace(float* gate, const float* up, int64_t count) {
#pragma omp parallel for schedule(static) if (count > (1 << 15))
  for (int64_t i = 0; i < count; ++i) {
    const float g = gate[i];
    gate[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void softmax_inplace(float* x, int64_t count) {
  float max_value = x[0];
  for (int64_t i = 1; i < count; ++i) max_value = std::max(max_value, x[i]);
  float sum = 0.0f;
  for (int64_t i = 0; i < count; ++i) {
    x[i] = std::exp(x[i] - max_value);
    sum += x[i];
  }
  const float inverse = 1.0f / sum;
  for (int64_t i = 0; i < count; ++i) x[i] *= inverse;
}

void apply_rope(float* x, int64_t tokens, int64_t heads, int64_t head_dim, const float* cos,
                const float* sin, int64_t rotary_dim, bool adjacent_pairs) {
  const int64_t half = rotary_dim / 2;
#pragma omp parallel for schedule(static) if (tokens * heads > 256)
  for (int64_t th = 0; th < tokens * heads; ++th) {
    const int64_t t = th / heads;
    float* head = x + th * head_dim;
    const float* c = cos + t * half;
    const float* s = sin + t * half;
    for (int64_t i = 0; i < half; ++i) {
      const int64_t first = adjacent_pairs ? 2 * i : i;
      const int64_t second = adjacent_pairs ? 2 * i + 1 : i + half;
      const float a = head[first];
      const float b = head[second];
      head[first] = a * c[i] - b * s[i];
      head[second] = b * c[i] + a * s[i];
    }
  }
}

void causal_attention(const float* q, const float* key_cache, const float* value_cache,
                      const AttentionShape& shape, float* out) {
  if (shape.kv_heads <= 0 || shape.q_heads % shape.kv_heads != 0) {
    throw Error("causal attention: query heads (" + std::to_string(shape.q_heads) +
                ") must be a positive multiple of KV heads (" + std::to_string(shape.kv_heads) +
                ")");
  }
  if (shape.tokens <= 0) return;
  const int64_t group = shape.q_heads / shape.kv_heads;
  const int64_t head_dim = shape.head_dim;
  const int64_t tile_tokens = attention_tile_tokens(group);
  const int64_t tiles = (shape.tokens + tile_tokens - 1) / tile_tokens;
  const int64_t tile_groups = tiles * shape.kv_heads;
  // The keys of tile `tile`: from its first query's window start to its last query's position.
  const auto tile_keys = [&](int64_t tile) {
    const int64_t first_token = tile * tile_tokens;
    const int64_t last_token = std::min(shape.tokens, first_token + tile_tokens) - 1;
    const int64_t last_key = shape.first_position + last_token;
    const int64_t first_key =
        shape.window > 0
            ? std::max<int64_t>(0, shape.first_position + first_token - shape.window + 1)
            : 0;
    return KeyRange{first_key, last_key - first_key + 1};
  };
  // Few tiles over many keys (decode, short chunks after a long prompt) would leave cores idle:
  // their keys are split into parts of at least kMinSplitKeys, attended separately and combined.
  // The split depends on the shape only, so results do not depend on the thread count.
  constexpr int64_t kMinWorkItems = 16;
  constexpr int64_t kMinSplitKeys = 512;
  int64_t splits = 1;
  if (tile_groups < kMinWorkItems) {
    splits = std::max<int64_t>(1, std::min((kMinWorkItems + tile_groups - 1) / tile_groups,
                                           tile_keys(tiles - 1).count / kMinSplitKeys));
  }
  // A part holds each row's max, sum and unnormalised output; the last part of a tile to finish
  // combines them, so no thread waits for another.
  const int64_t part_size = tile_tokens * group * (head_dim + 2);
  std::vector<float> parts(splits > 1 ? tile_groups * splits * part_size : 0);
  std::unique_ptr<std::atomic<int64_t>[]> parts_left(
      splits > 1 ? new std::atomic<int64_t>[tile_groups] : nullptr);
  for (int64_t i = 0; i < (splits > 1 ? tile_groups : 0); ++i) parts_left[i] = splits;
  // Threads pay off only when there is enough work to hide their start-up (tiny models decode
  // faster on one core).
  const int64_t work = shape.tokens * shape.q_heads * tile_keys(tiles - 1).count * head_dim;
#pragma omp parallel if (work > (1 << 18))
  {
    AttentionTileState state;
    // Later tiles see more keys; handing them out first, dynamically, balances the causal triangle.
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < tile_groups * splits; ++item) {
      const int64_t tile = tiles - 1 - item / (shape.kv_heads * splits);
      const int64_t kv_head = item / splits % shape.kv_heads;
      const int64_t split = item % splits;
      const int64_t first_token = tile * tile_tokens;
      const int64_t offset = attention_tile_offset(shape, first_token, kv_head);
      const QueryTile query_tile = attention_query_tile(
          q, shape, first_token, std::min(tile_tokens, shape.tokens - first_token), kv_head);
      const KeyRange keys = tile_keys(tile);
      const KeyRange part{keys.first + keys.count * split / splits,
                          keys.count * (split + 1) / splits - keys.count * split / splits};
      const int64_t kv_offset = kv_head * shape.cache_stride * head_dim;
      begin_attention_tile(query_tile, state);
      attend_key_range(key_cache + kv_offset, value_cache + kv_offset, part, state);
      if (splits == 1) {
        finish_attention_tile(state, group, out + offset, query_tile.token_stride);
        continue;
      }
      const int64_t tile_group = tile * shape.kv_heads + kv_head;
      float* tile_parts = parts.data() + tile_group * splits * part_size;
      save_attention_part(state, tile_parts + split * part_size);
      if (parts_left[tile_group].fetch_sub(1, std::memory_order_acq_rel) == 1) {
        combine_attention_parts(tile_parts, splits, part_size, query_tile.tokens, group, head_dim,
                                out + offset, query_tile.token_stride);
      }
    }
  }
}

}  // namespace entropyinfer::cpu

// The FP8 KV cache's kernels against core/fp8.h and the CPU attention:
// - quantize_kv_rows and the FP8 ragged_append give codes and scales equal bit for bit to
//   fp8_kv_quantize_row on the same bf16 rows, the staging rows become what the codes read back as,
//   lengths are set, other rows are untouched; dequantize_kv_rows gives those values back.
// - ragged_decode over FP8 caches against cpu::compressed_decode_attention over the rows the codes
//   stand for (code * scale in fp32): unequal lengths and an empty cache, per KV head and per query
//   head, head sizes 64 and 128, one split, the automatic count and many, value row scales spread
//   over 2^-8 .. 2^8 (so O's unit is raised mid-split), and a 32k cache with 32/8 heads (its speed
//   printed as GB/s of codes and scales read).
// - steps of append and decode queued back to back read each step's appended row.
//
// Tolerance: queries rounded to fp16 (exact for these bf16 values), P times its relative value
// scale rounded to fp16 (2^-11 relative), output bf16 (2^-9): relative L2 <= 5e-3 and max |error|
// <= 5e-3 of the largest |output|.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/compressed_decode_attention.h"
#include "backends/cuda/kv_cache_fp8.h"
#include "backends/cuda/ragged_decode.h"
#include "core/fp8.h"
#include "gpu/gpu_test_support.h"

namespace entropyinfer {
namespace {

constexpr double kMaxRelativeL2 = 5e-3;
constexpr double kMaxRelativeAbs = 5e-3;

// Host FP8 caches: codes and scales by core/fp8.h, and the fp32 rows they stand for.
struct HostFp8Caches {
  int64_t caches = 0, stride = 0, head_dim = 0;
  std::vector<uint8_t> key_codes, value_codes;
  std::vector<float> key_scales, value_scales;
  std::vector<float> keys, values;  // code * scale
  std::vector<int64_t> lengths;

  void resize() {
    const size_t rows = static_cast<size_t>(caches) * stride;
    key_codes.assign(rows * head_dim, 0);
    value_codes.assign(rows * head_dim, 0);
    key_scales.assign(rows, 0.0f);
    value_scales.assign(rows, 0.0f);
    keys.assign(rows * head_dim, 0.0f);
    values.assign(rows * head_dim, 0.0f);
  }

  void store(int64_t cache, int64_t row, const float* key, const float* value) {
    const size_t at = static_cast<size_t>(cache * stride + row);
    key_scales[at] =
        fp8_kv_quantize_row(key, static_cast<int>(head_dim), key_codes.data() + at * head_dim);
    value_scales[at] =
        fp8_kv_quantize_row(value, static_cast<int>(head_dim), value_codes.data() + at * head_dim);
    for (int64_t d = 0; d < head_dim; ++d) {
      keys[at * head_dim + d] = fp8_e4m3_to_f32(key_codes[at * head_dim + d]) * key_scales[at];
      values[at * head_dim + d] =
          fp8_e4m3_to_f32(value_codes[at * head_dim + d]) * value_scales[at];
    }
  }

  std::vector<float> attend(const std::vector<float>& q, const cuda::RaggedShape& shape) const {
    std::vector<const float*> key_heads(caches), value_heads(caches);
    for (int64_t c = 0; c < caches; ++c) {
      key_heads[c] = keys.data() + c * stride * head_dim;
      value_heads[c] = values.data() + c * stride * head_dim;
    }
    cpu::CompressedDecodeShape cpu_shape;
    cpu_shape.q_heads = shape.q_heads;
    cpu_shape.kv_heads = shape.kv_heads;
    cpu_shape.head_dim = shape.head_dim;
    cpu_shape.scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
    cpu_shape.per_query_head = shape.per_query_head;
    std::vector<float> out(static_cast<size_t>(shape.q_heads) * shape.head_dim);
    cpu::compressed_decode_attention(q.data(), key_heads.data(), value_heads.data(), lengths.data(),
                                     cpu_shape, out.data());
    return out;
  }
};

template <typename T>
cuda::DeviceBuffer<T> upload(const std::vector<T>& values) {
  cuda::DeviceBuffer<T> buffer(std::max<size_t>(1, values.size()));
  buffer.upload(values.data(), values.size());
  return buffer;
}

// The host caches' codes, scales and lengths on the GPU, and the view the kernels take.
struct DeviceFp8Caches {
  explicit DeviceFp8Caches(const HostFp8Caches& host)
      : key_codes(upload(host.key_codes)),
        value_codes(upload(host.value_codes)),
        key_scales(upload(host.key_scales)),
        value_scales(upload(host.value_scales)),
        lengths(upload(std::vector<int32_t>(host.lengths.begin(), host.lengths.end()))) {}
  cuda::Fp8KvCache view() {
    return {key_codes.data(), value_codes.data(), key_scales.data(), value_scales.data()};
  }
  cuda::DeviceBuffer<uint8_t> key_codes, value_codes;
  cuda::DeviceBuffer<float> key_scales, value_scales;
  cuda::DeviceBuffer<int32_t> lengths;
};

// Rows of bf16 values whose magnitudes differ by up to 2^spread either way from row to row.
std::vector<float> spread_rows(int64_t rows, int64_t head_dim, uint32_t seed, int spread = 8) {
  std::vector<float> values = gpu_test::random_bf16_values(rows * head_dim, seed);
  std::mt19937 generator(seed + 7);
  std::uniform_int_distribution<int> exponent(-spread, spread);
  for (int64_t r = 0; r < rows; ++r) {
    const float factor = std::ldexp(1.0f, exponent(generator));
    for (int64_t d = 0; d < head_dim; ++d) values[r * head_dim + d] *= factor;  // exact in bf16
  }
  return values;
}

TEST(CudaFp8KvCache, QuantizedRowsEqualTheCoreRuleBitForBit) {
  ENTROPYINFER_REQUIRE_GPU();
  for (const int head_dim : {64, 128}) {
    const int64_t caches = 3, stride = 100, first = 10, count = 50;
    const size_t elements = static_cast<size_t>(caches) * stride * head_dim;
    std::vector<float> keys = spread_rows(caches * stride, head_dim, 11);
    std::vector<float> values = spread_rows(caches * stride, head_dim, 12);
    std::fill_n(keys.begin() + (stride + first + 3) * head_dim, head_dim, 0.0f);  // a zero row
    auto staged_keys = gpu_test::upload_bf16(keys), staged_values = gpu_test::upload_bf16(values);
    cuda::DeviceBuffer<uint8_t> key_codes(elements), value_codes(elements);
    cuda::DeviceBuffer<float> key_scales(caches * stride), value_scales(caches * stride);
    cuda::check(cudaMemset(key_codes.data(), 0x5a, key_codes.bytes()), "memset");
    const cuda::Fp8KvCache cache{key_codes.data(), value_codes.data(), key_scales.data(),
                                 value_scales.data()};
    cuda::DeviceBuffer<int32_t> lengths(caches);
    cuda::quantize_kv_rows(staged_keys.data(), staged_values.data(), caches, stride, head_dim,
                           first, count, cache, lengths.data(), nullptr);
    cuda::check(cudaDeviceSynchronize(), "quantize_kv_rows");
    const auto codes = gpu_test::download(key_codes), vcodes = gpu_test::download(value_codes);
    const auto scales = gpu_test::download(key_scales), vscales = gpu_test::download(value_scales);
    const auto staged_after = gpu_test::download_bf16(staged_keys);
    const auto staged_values_after = gpu_test::download_bf16(staged_values);
    for (int32_t length : gpu_test::download(lengths)) EXPECT_EQ(length, first + count);
    std::vector<uint8_t> expected(head_dim);
    for (int64_t c = 0; c < caches; ++c) {
      for (int64_t row = 0; row < stride; ++row) {
        const size_t at = static_cast<size_t>(c * stride + row);
        const bool inside = row >= first && row < first + count;
        for (int which = 0; which < 2; ++which) {
          const std::vector<float>& source = which == 0 ? keys : values;
          const auto& got_codes = which == 0 ? codes : vcodes;
          const auto& got_staged = which == 0 ? staged_after : staged_values_after;
          if (!inside) {
            if (which == 0) {
              ASSERT_EQ(got_codes[at * head_dim], 0x5a) << "row " << row;
            }
            ASSERT_EQ(got_staged[at * head_dim + 1], source[at * head_dim + 1]) << "row " << row;
            continue;
          }
          const float scale =
              fp8_kv_quantize_row(source.data() + at * head_dim, head_dim, expected.data());
          ASSERT_EQ((which == 0 ? scales : vscales)[at], scale) << "cache " << c << " row " << row;
          for (int d = 0; d < head_dim; ++d) {
            ASSERT_EQ(got_codes[at * head_dim + d], expected[d]) << "row " << row << " d " << d;
            const float widened = bf16_to_f32(f32_to_bf16(fp8_e4m3_to_f32(expected[d]) * scale));
            ASSERT_EQ(got_staged[at * head_dim + d], widened) << "row " << row << " d " << d;
          }
        }
      }
    }
    // Widening gives the staged values back.
    auto widened_keys = gpu_test::upload_bf16(std::vector<float>(elements, 0.0f));
    auto widened_values = gpu_test::upload_bf16(std::vector<float>(elements, 0.0f));
    cuda::dequantize_kv_rows(cache, caches, stride, head_dim, first, count, widened_keys.data(),
                             widened_values.data(), nullptr);
    const auto widened = gpu_test::download_bf16(widened_keys);
    const auto widened_v = gpu_test::download_bf16(widened_values);
    for (int64_t c = 0; c < caches; ++c) {
      for (int64_t row = first; row < first + count; ++row) {
        for (int d = 0; d < head_dim; ++d) {
          const size_t at = (c * stride + row) * head_dim + d;
          ASSERT_EQ(widened[at], staged_after[at]);
          ASSERT_EQ(widened_v[at], staged_values_after[at]);
        }
      }
    }
  }
}

struct Fp8Case {
  int q_heads = 8;
  int kv_heads = 2;
  int head_dim = 128;
  bool per_query_head = false;
  int64_t min_length = 1;
  int64_t max_length = 3000;
  bool empty_first_cache = false;
};

std::string describe(const Fp8Case& c) {
  return std::to_string(c.q_heads) + "/" + std::to_string(c.kv_heads) + " heads, d " +
         std::to_string(c.head_dim) + (c.per_query_head ? ", per query head" : "") + ", lengths " +
         std::to_string(c.min_length) + ".." + std::to_string(c.max_length);
}

void run_case(const Fp8Case& c, const std::vector<int>& splits, uint32_t seed,
              bool print_speed = false) {
  const int group = c.q_heads / c.kv_heads;
  HostFp8Caches host;
  host.caches = c.per_query_head ? c.q_heads : c.kv_heads;
  host.stride = c.max_length + 9;  // room for the appended row, and unread rows after it
  host.head_dim = c.head_dim;
  host.resize();
  // Keys within 2^3 (scores that leave the softmax spread out), values over 2^-8 .. 2^8.
  const std::vector<float> keys = spread_rows(host.caches * host.stride, c.head_dim, seed, 3);
  const std::vector<float> values = spread_rows(host.caches * host.stride, c.head_dim, seed + 1);
  std::mt19937 generator(seed + 2);
  std::uniform_int_distribution<int64_t> draw(c.min_length, c.max_length);
  host.lengths.resize(host.caches);
  for (int64_t cache = 0; cache < host.caches; ++cache) {
    host.lengths[cache] = c.empty_first_cache && cache == 0 ? 0 : draw(generator);
    // Every row is stored, read or not: rows past the length must never count.
    for (int64_t row = 0; row < host.stride; ++row) {
      const size_t at = static_cast<size_t>(cache * host.stride + row) * c.head_dim;
      host.store(cache, row, keys.data() + at, values.data() + at);
    }
  }
  DeviceFp8Caches device(host);
  const cuda::Fp8KvCache cache = device.view();
  auto& lengths = device.lengths;

  cuda::RaggedShape shape;
  shape.q_heads = c.q_heads;
  shape.kv_heads = c.kv_heads;
  shape.head_dim = c.head_dim;
  shape.cache_stride = host.stride;
  shape.max_length = c.max_length + 1;
  shape.per_query_head = c.per_query_head;
  shape.fp8 = true;

  // One new token appended to every non-empty cache (the empty one keeps its length 0).
  const auto k_new = spread_rows(c.kv_heads, c.head_dim, seed + 3, 3);
  const auto v_new = spread_rows(c.kv_heads, c.head_dim, seed + 4);
  const auto q =
      gpu_test::random_bf16_values(static_cast<size_t>(c.q_heads) * c.head_dim, seed + 5, 2.0f);
  auto k_gpu = gpu_test::upload_bf16(k_new), v_gpu = gpu_test::upload_bf16(v_new);
  auto q_gpu = gpu_test::upload_bf16(q);
  if (!c.empty_first_cache) {
    cuda::ragged_append(k_gpu.data(), v_gpu.data(), shape, cache, lengths.data(), nullptr);
    for (int64_t cache_index = 0; cache_index < host.caches; ++cache_index) {
      const int64_t kv = c.per_query_head ? cache_index / group : cache_index;
      host.store(cache_index, host.lengths[cache_index]++, k_new.data() + kv * c.head_dim,
                 v_new.data() + kv * c.head_dim);
    }
    cuda::check(cudaDeviceSynchronize(), "FP8 append");
    EXPECT_EQ(gpu_test::download(device.key_codes), host.key_codes) << describe(c);
    EXPECT_EQ(gpu_test::download(device.value_scales), host.value_scales) << describe(c);
    const auto appended = gpu_test::download(lengths);
    for (int64_t i = 0; i < host.caches; ++i) EXPECT_EQ(appended[i], host.lengths[i]);
  }
  const std::vector<float> expected = host.attend(q, shape);
  float largest = 0.0f;
  for (float value : expected) largest = std::max(largest, std::fabs(value));

  cuda::DeviceBuffer<cuda::bf16> out(static_cast<size_t>(c.q_heads) * c.head_dim);
  for (int requested : splits) {
    const int resolved = cuda::ragged_decode_splits(shape, requested);
    cuda::DeviceBuffer<float> workspace(
        std::max<size_t>(1, cuda::ragged_decode_workspace_floats(shape, resolved)));
    gpu_test::poison(out);
    cuda::ragged_decode(q_gpu.data(), cache, lengths.data(), shape, out.data(), workspace.data(),
                        workspace.size(), nullptr, resolved);
    cuda::check(cudaDeviceSynchronize(), "FP8 ragged decode");
    const std::string what = describe(c) + ", " + std::to_string(resolved) + " splits";
    const auto difference = gpu_test::compare(gpu_test::download_bf16(out), expected);
    std::cout << "[ measure ] FP8 ragged decode, " << what << ": max |error| "
              << difference.max_abs_error << " (largest |output| " << largest << "), relative L2 "
              << difference.relative_l2 << "\n";
    EXPECT_EQ(difference.non_finite, 0) << what;
    EXPECT_LE(difference.relative_l2, kMaxRelativeL2) << what;
    EXPECT_LE(difference.max_abs_error, kMaxRelativeAbs * std::max(largest, 1e-30f)) << what;
    if (print_speed) {
      cudaEvent_t start, stop;
      cuda::check(cudaEventCreate(&start), "cudaEventCreate");
      cuda::check(cudaEventCreate(&stop), "cudaEventCreate");
      const int repeats = 20;
      cuda::check(cudaEventRecord(start), "cudaEventRecord");
      for (int r = 0; r < repeats; ++r) {
        cuda::ragged_decode(q_gpu.data(), cache, lengths.data(), shape, out.data(),
                            workspace.data(), workspace.size(), nullptr, resolved);
      }
      cuda::check(cudaEventRecord(stop), "cudaEventRecord");
      cuda::check(cudaEventSynchronize(stop), "cudaEventSynchronize");
      float milliseconds = 0;
      cuda::check(cudaEventElapsedTime(&milliseconds, start, stop), "cudaEventElapsedTime");
      int64_t rows = 0;
      for (int64_t length : host.lengths) rows += length;
      const double seconds = milliseconds / repeats * 1e-3;
      const double bytes = static_cast<double>(rows) * (c.head_dim + 4) * 2;  // codes, scales
      std::cout << "[ measure ] FP8 ragged decode speed, " << what << ": " << seconds * 1e6
                << " us, " << bytes / seconds / 1e9 << " GB/s of codes and scales\n";
      cudaEventDestroy(start);
      cudaEventDestroy(stop);
    }
  }
}

TEST(CudaFp8KvCache, DecodeMatchesCpuReference) {
  ENTROPYINFER_REQUIRE_GPU();
  const std::vector<Fp8Case> cases = {
      {8, 2, 128, false, 1, 3000}, {32, 8, 128, false, 100, 2500}, {14, 2, 64, false, 1, 700},
      {8, 2, 128, true, 1, 1500},  {8, 4, 64, true, 30, 2100},     {32, 1, 128, false, 1, 999},
      {4, 4, 64, false, 1, 40},    {6, 3, 128, false, 0, 5},
  };
  uint32_t seed = 300;
  for (const Fp8Case& c : cases) run_case(c, {1, 0, 7, 64}, seed += 13);
}

TEST(CudaFp8KvCache, EmptyCacheGivesZeros) {
  ENTROPYINFER_REQUIRE_GPU();
  run_case({4, 4, 128, false, 10, 300, true}, {1, 0, 5}, 900);
  run_case({8, 2, 64, false, 10, 300, true}, {1, 0, 5}, 910);
}

TEST(CudaFp8KvCache, LongCacheMatchesCpuReference) {
  ENTROPYINFER_REQUIRE_GPU();
  run_case({32, 8, 128, false, 30000, 32760}, {0, 1, 200, 400}, 950, /*print_speed=*/true);
}

// Appends and decodes of many steps queued on one stream with no wait between: each decode may be
// launched while the append before it still runs (programmatic dependent launch), and must still
// read that step's row and length, with the split workspace reused step after step. Lengths start
// next to tile edges (32 rows), so that the appended row opens a tile and a warp's share of the
// tiles moves; rows past each length hold other values, which a stale read would see.
void run_back_to_back_steps(int requested_splits, uint32_t seed) {
  const int q_heads = 32, kv_heads = 8, head_dim = 128, steps = 40;
  HostFp8Caches host;
  host.caches = kv_heads;
  host.stride = 1200;
  host.head_dim = head_dim;
  host.resize();
  const std::vector<float> keys = spread_rows(host.caches * host.stride, head_dim, seed, 3);
  const std::vector<float> values = spread_rows(host.caches * host.stride, head_dim, seed + 1);
  for (int64_t cache = 0; cache < host.caches; ++cache) {
    for (int64_t row = 0; row < host.stride; ++row) {
      const size_t at = static_cast<size_t>(cache * host.stride + row) * head_dim;
      host.store(cache, row, keys.data() + at, values.data() + at);
    }
  }
  host.lengths = {30, 31, 32, 63, 64, 95, 223, 1000};
  DeviceFp8Caches device(host);
  const cuda::Fp8KvCache cache = device.view();
  auto& lengths = device.lengths;
  cuda::RaggedShape shape;
  shape.q_heads = q_heads;
  shape.kv_heads = kv_heads;
  shape.head_dim = head_dim;
  shape.cache_stride = host.stride;
  shape.max_length = host.stride;
  shape.fp8 = true;
  // Every step's new rows differ from the rows stored past the lengths.
  const auto k_new = spread_rows(int64_t{steps} * kv_heads, head_dim, seed + 2, 3);
  const auto v_new = spread_rows(int64_t{steps} * kv_heads, head_dim, seed + 3);
  const auto q =
      gpu_test::random_bf16_values(static_cast<size_t>(q_heads) * head_dim, seed + 4, 2.0f);
  auto k_gpu = gpu_test::upload_bf16(k_new), v_gpu = gpu_test::upload_bf16(v_new);
  auto q_gpu = gpu_test::upload_bf16(q);
  const int splits = cuda::ragged_decode_splits(shape, requested_splits);
  cuda::DeviceBuffer<float> workspace(
      std::max<size_t>(1, cuda::ragged_decode_workspace_floats(shape, splits)));
  const size_t out_size = static_cast<size_t>(q_heads) * head_dim;
  cuda::DeviceBuffer<cuda::bf16> out(out_size * steps);
  gpu_test::poison(out);
  cuda::check(cudaDeviceSynchronize(), "poison");  // the stream does not wait for the default one
  cudaStream_t stream;
  cuda::check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  for (int step = 0; step < steps; ++step) {
    const size_t row = static_cast<size_t>(step) * kv_heads * head_dim;
    cuda::ragged_append(k_gpu.data() + row, v_gpu.data() + row, shape, cache, lengths.data(),
                        stream);
    cuda::ragged_decode(q_gpu.data(), cache, lengths.data(), shape, out.data() + step * out_size,
                        workspace.data(), workspace.size(), stream, splits);
  }
  cuda::check(cudaStreamSynchronize(stream), "back-to-back steps");
  cudaStreamDestroy(stream);
  const auto all_out = gpu_test::download_bf16(out);
  for (int step = 0; step < steps; ++step) {
    for (int64_t c = 0; c < host.caches; ++c) {
      const size_t at = (static_cast<size_t>(step) * kv_heads + c) * head_dim;
      host.store(c, host.lengths[c]++, k_new.data() + at, v_new.data() + at);
    }
    const std::vector<float> expected = host.attend(q, shape);
    float largest = 0.0f;
    for (float value : expected) largest = std::max(largest, std::fabs(value));
    const std::vector<float> got(all_out.begin() + step * out_size,
                                 all_out.begin() + (step + 1) * out_size);
    const auto difference = gpu_test::compare(got, expected);
    const std::string what = std::to_string(splits) + " splits, step " + std::to_string(step);
    ASSERT_EQ(difference.non_finite, 0) << what;
    ASSERT_LE(difference.relative_l2, kMaxRelativeL2) << what;
    ASSERT_LE(difference.max_abs_error, kMaxRelativeAbs * std::max(largest, 1e-30f)) << what;
  }
}

TEST(CudaFp8KvCache, BackToBackStepsReadEachStepsAppend) {
  ENTROPYINFER_REQUIRE_GPU();
  run_back_to_back_steps(0, 1300);
  run_back_to_back_steps(9, 1400);
  run_back_to_back_steps(1, 1500);
}

TEST(CudaFp8KvCache, RefusesMismatchedStorage) {
  ENTROPYINFER_REQUIRE_GPU();
  cuda::RaggedShape shape;
  shape.q_heads = 8;
  shape.kv_heads = 2;
  shape.head_dim = 128;
  shape.cache_stride = 100;
  shape.max_length = 100;
  shape.fp8 = true;
  cuda::DeviceBuffer<cuda::bf16> q(8 * 128), bf16_cache(2 * 100 * 128), out(8 * 128);
  cuda::DeviceBuffer<int32_t> lengths(2);
  cuda::DeviceBuffer<float> workspace(1);
  // A shape marked fp8 with bf16 caches, and FP8 caches with a bf16 shape.
  EXPECT_THROW(cuda::ragged_decode(q.data(), bf16_cache.data(), bf16_cache.data(), lengths.data(),
                                   shape, out.data(), workspace.data(), 1, nullptr, 1),
               Error);
  shape.fp8 = false;
  cuda::DeviceBuffer<uint8_t> codes(2 * 100 * 128);
  cuda::DeviceBuffer<float> scales(2 * 100);
  const cuda::Fp8KvCache cache{codes.data(), codes.data(), scales.data(), scales.data()};
  EXPECT_THROW(cuda::ragged_decode(q.data(), cache, lengths.data(), shape, out.data(),
                                   workspace.data(), 1, nullptr, 1),
               Error);
}

}  // namespace
}  // namespace entropyinfer

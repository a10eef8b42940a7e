// Decode attention over per-head caches of different lengths (cuda::ragged_append and
// cuda::ragged_decode) against cpu::compressed_decode_attention on random bf16 inputs: unequal
// lengths (AdaKV-like) and an empty cache, one cache per KV head or per query head, head sizes 64
// and 128, groups 1 to 32 (two mma row blocks), one split, the automatic count and many splits, a
// 32k cache with 32/8 heads, and a captured CUDA graph replayed while the lengths grow.
//
// Tolerance: P is rounded to bf16 before P*V (relative 2^-9) and the output to bf16; scores and
// sums stay fp32. With V uniform in [-1, 1] each case must reach relative L2 error <= 1e-2 and max
// |error| <= 1e-2. Outputs are poisoned with NaN first: every element must be written. The rows
// past each cache's length hold random values that must never be read.
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/compressed_decode_attention.h"
#include "backends/cuda/ragged_decode.h"
#include "gpu/gpu_test_support.h"

namespace entropyinfer {
namespace {

constexpr double kMaxRelativeL2 = 1e-2;
constexpr double kMaxAbsError = 1e-2;

struct RaggedCase {
  int q_heads = 8;
  int kv_heads = 2;
  int head_dim = 128;
  bool per_query_head = false;
  int64_t min_length = 1;  // lengths before the append, drawn in [min_length, max_length]
  int64_t max_length = 3000;
  bool empty_first_cache = false;  // cache 0 holds nothing and gets no append: zeros out
};

std::string describe(const RaggedCase& c) {
  return std::to_string(c.q_heads) + "/" + std::to_string(c.kv_heads) + " heads, d " +
         std::to_string(c.head_dim) + (c.per_query_head ? ", per query head" : "") + ", lengths " +
         std::to_string(c.min_length) + ".." + std::to_string(c.max_length);
}

// Host copy of the caches and their lengths, bf16-rounded, that the CPU reference reads.
struct HostCaches {
  int64_t caches = 0, stride = 0, head_dim = 0;
  std::vector<float> keys, values;
  std::vector<int64_t> lengths;

  void append(const std::vector<float>& k, const std::vector<float>& v, int group,
              bool per_query_head, bool skip_first) {
    for (int64_t c = skip_first ? 1 : 0; c < caches; ++c) {
      const int64_t kv = per_query_head ? c / group : c;
      const int64_t row = lengths[c]++;
      std::copy_n(k.begin() + kv * head_dim, head_dim,
                  keys.begin() + (c * stride + row) * head_dim);
      std::copy_n(v.begin() + kv * head_dim, head_dim,
                  values.begin() + (c * stride + row) * head_dim);
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

void expect_close(const std::vector<float>& actual, const std::vector<float>& expected,
                  const std::string& what) {
  const auto difference = gpu_test::compare(actual, expected);
  std::cout << "[ measure ] ragged decode, " << what << ": max |error| " << difference.max_abs_error
            << ", relative L2 " << difference.relative_l2 << "\n";
  EXPECT_EQ(difference.non_finite, 0) << what;
  EXPECT_LE(difference.relative_l2, kMaxRelativeL2) << what;
  EXPECT_LE(difference.max_abs_error, kMaxAbsError)
      << what << " (worst at " << difference.worst_index << ")";
}

// Appends one token with ragged_append, then decodes it with every split count in `splits`.
void run_case(const RaggedCase& c, const std::vector<int>& splits, uint32_t seed,
              bool print_speed = false) {
  const int group = c.q_heads / c.kv_heads;
  HostCaches host;
  host.caches = c.per_query_head ? c.q_heads : c.kv_heads;
  host.stride = c.max_length + 9;  // room for the appended row, and unread rows after it
  host.head_dim = c.head_dim;
  host.keys = gpu_test::random_bf16_values(
      static_cast<size_t>(host.caches) * host.stride * c.head_dim, seed);
  host.values = gpu_test::random_bf16_values(host.keys.size(), seed + 1, 1.0f, /*uniform=*/true);
  std::mt19937 generator(seed + 2);
  std::uniform_int_distribution<int64_t> draw(c.min_length, c.max_length);
  host.lengths.resize(host.caches);
  for (auto& length : host.lengths) length = draw(generator);
  if (c.empty_first_cache) host.lengths[0] = 0;

  auto keys = gpu_test::upload_bf16(host.keys);
  auto values = gpu_test::upload_bf16(host.values);
  std::vector<int32_t> lengths32(host.lengths.begin(), host.lengths.end());
  cuda::DeviceBuffer<int32_t> lengths(lengths32.size());
  lengths.upload(lengths32.data(), lengths32.size());

  cuda::RaggedShape shape;
  shape.q_heads = c.q_heads;
  shape.kv_heads = c.kv_heads;
  shape.head_dim = c.head_dim;
  shape.cache_stride = host.stride;
  shape.max_length = c.max_length + 1;
  shape.per_query_head = c.per_query_head;

  const auto k_new =
      gpu_test::random_bf16_values(static_cast<size_t>(c.kv_heads) * c.head_dim, seed + 3);
  const auto v_new = gpu_test::random_bf16_values(k_new.size(), seed + 4, 1.0f, true);
  const auto q =
      gpu_test::random_bf16_values(static_cast<size_t>(c.q_heads) * c.head_dim, seed + 5, 2.0f);
  auto k_new_gpu = gpu_test::upload_bf16(k_new), v_new_gpu = gpu_test::upload_bf16(v_new);
  auto q_gpu = gpu_test::upload_bf16(q);
  if (c.empty_first_cache) {
    // Append to every cache but the first: it stays empty. A per-cache append is the same kernel
    // on a shape of one cache, so append to caches 1.. through offset pointers.
    cuda::RaggedShape rest = shape;
    const int64_t skipped_q_heads = c.per_query_head ? 1 : group;
    rest.q_heads -= skipped_q_heads;
    rest.kv_heads -= 1;  // per query head only with group 1: one cache per KV head either way
    ASSERT_TRUE(rest.kv_heads > 0 && rest.q_heads % rest.kv_heads == 0) << describe(c);
    const size_t cache_elements = static_cast<size_t>(host.stride) * c.head_dim;
    // per_query_head with group 1 only (then cache c reads KV head c); per KV head: any group.
    ASSERT_TRUE(!c.per_query_head || group == 1) << describe(c);
    cuda::ragged_append(k_new_gpu.data() + c.head_dim, v_new_gpu.data() + c.head_dim, rest,
                        keys.data() + cache_elements, values.data() + cache_elements,
                        lengths.data() + 1, nullptr);
  } else {
    cuda::ragged_append(k_new_gpu.data(), v_new_gpu.data(), shape, keys.data(), values.data(),
                        lengths.data(), nullptr);
  }
  host.append(k_new, v_new, group, c.per_query_head, c.empty_first_cache);
  const std::vector<float> expected = host.attend(q, shape);

  std::vector<int32_t> appended(host.caches);
  cuda::check(cudaDeviceSynchronize(), "ragged append");
  lengths.download(appended.data(), appended.size());
  for (int64_t i = 0; i < host.caches; ++i) {
    EXPECT_EQ(appended[i], host.lengths[i]) << describe(c) << ", cache " << i;
  }
  // The appended rows are exact copies.
  const auto keys_after = gpu_test::download_bf16(keys);
  const auto values_after = gpu_test::download_bf16(values);
  for (int64_t i = c.empty_first_cache ? 1 : 0; i < host.caches; ++i) {
    const int64_t row = host.lengths[i] - 1;
    for (int d = 0; d < c.head_dim; ++d) {
      const size_t at = (static_cast<size_t>(i) * host.stride + row) * c.head_dim + d;
      ASSERT_EQ(keys_after[at], host.keys[at]) << describe(c) << ", cache " << i;
      ASSERT_EQ(values_after[at], host.values[at]) << describe(c) << ", cache " << i;
    }
  }

  cuda::DeviceBuffer<cuda::bf16> out(static_cast<size_t>(c.q_heads) * c.head_dim);
  for (int requested : splits) {
    const int resolved = cuda::ragged_decode_splits(shape, requested);
    cuda::DeviceBuffer<float> workspace(
        std::max<size_t>(1, cuda::ragged_decode_workspace_floats(shape, resolved)));
    gpu_test::poison(out);
    cuda::ragged_decode(q_gpu.data(), keys.data(), values.data(), lengths.data(), shape, out.data(),
                        workspace.data(), workspace.size(), nullptr, resolved);
    cuda::check(cudaDeviceSynchronize(), "ragged decode");
    const std::string what = describe(c) + ", " + std::to_string(resolved) + " splits";
    expect_close(gpu_test::download_bf16(out), expected, what);
    if (print_speed) {
      cudaEvent_t start, stop;
      cuda::check(cudaEventCreate(&start), "cudaEventCreate");
      cuda::check(cudaEventCreate(&stop), "cudaEventCreate");
      const int repeats = 20;
      cuda::check(cudaEventRecord(start), "cudaEventRecord");
      for (int r = 0; r < repeats; ++r) {
        cuda::ragged_decode(q_gpu.data(), keys.data(), values.data(), lengths.data(), shape,
                            out.data(), workspace.data(), workspace.size(), nullptr, resolved);
      }
      cuda::check(cudaEventRecord(stop), "cudaEventRecord");
      cuda::check(cudaEventSynchronize(stop), "cudaEventSynchronize");
      float milliseconds = 0;
      cuda::check(cudaEventElapsedTime(&milliseconds, start, stop), "cudaEventElapsedTime");
      int64_t rows = 0;
      for (int64_t length : host.lengths) rows += length;
      const double seconds = milliseconds / repeats * 1e-3;
      const double bytes = static_cast<double>(rows) * c.head_dim * 2 * 2;  // K and V, bf16
      std::cout << "[ measure ] ragged decode speed, " << what << ": " << seconds * 1e6 << " us, "
                << bytes / seconds / 1e9 << " GB/s of K/V\n";
      cudaEventDestroy(start);
      cudaEventDestroy(stop);
    }
  }
}

TEST(CudaRaggedDecode, UnequalLengthsMatchCpuReference) {
  ENTROPYINFER_REQUIRE_GPU();
  const std::vector<RaggedCase> cases = {
      {8, 2, 128, false, 1, 3000}, {32, 8, 128, false, 100, 2500}, {14, 2, 64, false, 1, 700},
      {8, 2, 128, true, 1, 1500},  {8, 4, 64, true, 30, 2100},     {32, 1, 128, false, 1, 999},
      {4, 4, 64, false, 1, 40},    {6, 3, 128, false, 0, 5},
  };
  uint32_t seed = 100;
  for (const RaggedCase& c : cases) run_case(c, {1, 0, 7, 64}, seed += 11);
}

TEST(CudaRaggedDecode, EmptyCacheGivesZeros) {
  ENTROPYINFER_REQUIRE_GPU();
  run_case({4, 4, 128, false, 10, 300, /*empty_first_cache=*/true}, {1, 0, 5}, 700);
  run_case({8, 2, 64, false, 10, 300, true}, {1, 0, 5}, 710);
  run_case({4, 4, 64, true, 10, 300, true}, {1, 3}, 720);
}

TEST(CudaRaggedDecode, LongCacheMatchesCpuReference) {
  ENTROPYINFER_REQUIRE_GPU();
  run_case({32, 8, 128, false, 30000, 32760}, {0, 1}, 800, /*print_speed=*/true);
}

// One captured graph (append, then decode) replayed at three steps: the kernels must read the
// lengths when they run.
TEST(CudaRaggedDecode, CapturedGraphFollowsTheGrowingLengths) {
  ENTROPYINFER_REQUIRE_GPU();
  const int q_heads = 8, kv_heads = 2, head_dim = 128, group = q_heads / kv_heads;
  HostCaches host;
  host.caches = kv_heads;
  host.stride = 1200;
  host.head_dim = head_dim;
  host.keys =
      gpu_test::random_bf16_values(static_cast<size_t>(host.caches) * host.stride * head_dim, 900);
  host.values = gpu_test::random_bf16_values(host.keys.size(), 901, 1.0f, true);
  host.lengths = {700, 1100};
  auto keys = gpu_test::upload_bf16(host.keys);
  auto values = gpu_test::upload_bf16(host.values);
  std::vector<int32_t> lengths32(host.lengths.begin(), host.lengths.end());
  cuda::DeviceBuffer<int32_t> lengths(lengths32.size());
  lengths.upload(lengths32.data(), lengths32.size());
  cuda::RaggedShape shape;
  shape.q_heads = q_heads;
  shape.kv_heads = kv_heads;
  shape.head_dim = head_dim;
  shape.cache_stride = host.stride;
  shape.max_length = host.stride;
  const auto k_new = gpu_test::random_bf16_values(kv_heads * head_dim, 902);
  const auto v_new = gpu_test::random_bf16_values(k_new.size(), 903, 1.0f, true);
  const auto q = gpu_test::random_bf16_values(q_heads * head_dim, 904, 2.0f);
  auto k_gpu = gpu_test::upload_bf16(k_new), v_gpu = gpu_test::upload_bf16(v_new);
  auto q_gpu = gpu_test::upload_bf16(q);
  const int splits = cuda::ragged_decode_splits(shape, 0);
  cuda::DeviceBuffer<float> workspace(
      std::max<size_t>(1, cuda::ragged_decode_workspace_floats(shape, splits)));
  cuda::DeviceBuffer<cuda::bf16> out(static_cast<size_t>(q_heads) * head_dim);

  cudaStream_t stream;
  cuda::check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  cudaGraph_t graph;
  cudaGraphExec_t instance;
  cuda::check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin capture");
  cuda::ragged_append(k_gpu.data(), v_gpu.data(), shape, keys.data(), values.data(), lengths.data(),
                      stream);
  cuda::ragged_decode(q_gpu.data(), keys.data(), values.data(), lengths.data(), shape, out.data(),
                      workspace.data(), workspace.size(), stream, splits);
  cuda::check(cudaStreamEndCapture(stream, &graph), "end capture");
  cuda::check(cudaGraphInstantiate(&instance, graph, 0), "cudaGraphInstantiate");
  for (int step = 0; step < 3; ++step) {
    gpu_test::poison(out);
    cuda::check(cudaDeviceSynchronize(), "poison");  // the stream does not wait for the default one
    cuda::check(cudaGraphLaunch(instance, stream), "cudaGraphLaunch");
    cuda::check(cudaStreamSynchronize(stream), "graph step");
    host.append(k_new, v_new, group, false, false);
    expect_close(gpu_test::download_bf16(out), host.attend(q, shape),
                 "graph step " + std::to_string(step));
  }
  std::vector<int32_t> final_lengths(2);
  lengths.download(final_lengths.data(), 2);
  EXPECT_EQ(final_lengths[0], 703);
  EXPECT_EQ(final_lengths[1], 1103);
  cudaGraphExecDestroy(instance);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST(CudaRaggedDecode, RejectsBadShapesWithOneMessage) {
  ENTROPYINFER_REQUIRE_GPU();
  cuda::RaggedShape shape;
  shape.q_heads = 8;
  shape.kv_heads = 3;
  shape.head_dim = 128;
  shape.cache_stride = 100;
  shape.max_length = 100;
  EXPECT_THROW(cuda::ragged_decode_splits(shape), Error);
  shape.kv_heads = 2;
  shape.head_dim = 96;
  EXPECT_THROW(cuda::ragged_decode_splits(shape), Error);
  shape.head_dim = 128;
  shape.max_length = 101;
  EXPECT_THROW(cuda::ragged_decode_splits(shape), Error);
  shape.max_length = 100;
  cuda::DeviceBuffer<cuda::bf16> q(8 * 128), cache(2 * 100 * 128), out(8 * 128);
  cuda::DeviceBuffer<int32_t> lengths(2);
  const int splits = cuda::ragged_decode_splits(shape, 3);
  ASSERT_EQ(splits, 3);
  cuda::DeviceBuffer<float> small(cuda::ragged_decode_workspace_floats(shape, splits) - 1);
  EXPECT_THROW(cuda::ragged_decode(q.data(), cache.data(), cache.data(), lengths.data(), shape,
                                   out.data(), small.data(), small.size(), nullptr, splits),
               Error);
}

}  // namespace
}  // namespace entropyinfer

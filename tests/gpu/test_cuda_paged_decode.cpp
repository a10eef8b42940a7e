// Decode attention over many sequences' caches held in pages (cuda::paged_append and
// cuda::paged_decode), the layout a serving pool gives them, against the same rows in contiguous
// per-head caches decoded one sequence at a time by cuda::ragged_decode (itself checked against
// the CPU reference in test_cuda_ragged_decode.cpp), and against cpu::compressed_decode_attention.
//
// Each sequence's caches have their own, unequal lengths (AdaKV-like), one sequence is much longer
// than the rest, the pages of all of them are shuffled through one pool, and rows past a cache's
// length hold random values that must never be read. With the same split count the paged kernel
// runs the same tile loop over the same rows, so the outputs must be identical to ragged_decode's;
// against the fp32 CPU reference the tolerance is test_cuda_ragged_decode's (relative L2 and max
// |error| 1e-2). Outputs are poisoned with NaN first: every element must be written.
//
// FP8 pages (shape.fp8): contiguous FP8 caches (quantize_kv_rows) are copied into shuffled pages
// by the FP8 paged_store, each sequence's new row is appended by the FP8 paged_append, and
// paged_decode over the pages must equal ragged_decode over the contiguous caches bit for bit:
// codes and scales of every stored and appended row, lengths, and outputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/compressed_decode_attention.h"
#include "backends/cuda/kv_cache_fp8.h"
#include "backends/cuda/ragged_decode.h"
#include "gpu/gpu_test_support.h"

namespace entropyinfer {
namespace {

struct PagedCase {
  int q_heads = 32;
  int kv_heads = 8;
  int head_dim = 128;
  bool per_query_head = false;
  std::vector<int64_t> longest;  // per sequence: lengths drawn in [longest / 3, longest]
};

// A case's batch: each entry's length before the append, drawn in [longest / 3, longest] of its
// sequence, room for one more row in whole pages, and the decode shape over it.
struct PagedBatch {
  int caches = 0, batch = 0;
  int64_t head_dim = 0, longest = 0, max_pages = 0, stride = 0, entries = 0;
  std::vector<int32_t> lengths;
  cuda::RaggedShape shape;
};

PagedBatch paged_batch(const PagedCase& c, std::mt19937& generator) {
  PagedBatch p;
  p.caches = c.per_query_head ? c.q_heads : c.kv_heads;
  p.batch = static_cast<int>(c.longest.size());
  p.head_dim = c.head_dim;
  p.longest = *std::max_element(c.longest.begin(), c.longest.end());
  p.max_pages = (p.longest + 1 + cuda::kPagedRows - 1) / cuda::kPagedRows;
  p.stride = p.max_pages * cuda::kPagedRows;
  p.entries = static_cast<int64_t>(p.batch) * p.caches;
  p.lengths.resize(static_cast<size_t>(p.entries));
  for (int b = 0; b < p.batch; ++b) {
    std::uniform_int_distribution<int64_t> draw(c.longest[b] / 3, c.longest[b]);
    for (int cache = 0; cache < p.caches; ++cache)
      p.lengths[b * p.caches + cache] = draw(generator);
  }
  p.shape.q_heads = c.q_heads;
  p.shape.kv_heads = c.kv_heads;
  p.shape.head_dim = c.head_dim;
  p.shape.cache_stride = p.stride;
  p.shape.max_length = p.longest + 1;
  p.shape.per_query_head = c.per_query_head;
  return p;
}

// paged_decode of the whole batch with 1, 3 and the launch's own split count, against each
// sequence alone through decode_alone(b, out, workspace, workspace_floats, splits) with the split
// count ragged_decode resolves from the same: the same bits, else `differs`. check(b, mine) then
// sees each sequence's batched output.
template <typename DecodeAlone, typename Check>
void expect_batch_decodes_as_alone(const cuda::RaggedShape& shape, const cuda::PagedCaches& paged,
                                   const cuda::bf16* q, int batch, const char* differs,
                                   DecodeAlone decode_alone, Check check) {
  const int64_t q_width = static_cast<int64_t>(shape.q_heads) * shape.head_dim;
  cuda::DeviceBuffer<cuda::bf16> paged_out(static_cast<size_t>(batch) * q_width);
  cuda::DeviceBuffer<cuda::bf16> ragged_out(static_cast<size_t>(q_width));
  for (int splits : {1, 3, 0}) {
    // The split count the batch launch chooses, used for the per-sequence reference too.
    const int resolved = cuda::paged_decode_splits(shape, batch, splits);
    cuda::DeviceBuffer<float> workspace(
        std::max<size_t>(1, cuda::paged_decode_workspace_floats(shape, batch, resolved)));
    gpu_test::poison(paged_out);
    cuda::paged_decode(q, q_width, shape, paged, paged_out.data(), workspace.data(),
                       workspace.size(), nullptr, resolved);
    cuda::check(cudaDeviceSynchronize(), "paged decode");
    const std::vector<float> batched = gpu_test::download_bf16(paged_out);
    const int ragged_splits = cuda::ragged_decode_splits(shape, resolved);
    cuda::DeviceBuffer<float> ragged_workspace(
        std::max<size_t>(1, cuda::ragged_decode_workspace_floats(shape, ragged_splits)));
    for (int b = 0; b < batch; ++b) {
      SCOPED_TRACE("sequence " + std::to_string(b) + ", " + std::to_string(resolved) + " splits");
      gpu_test::poison(ragged_out);
      decode_alone(b, ragged_out.data(), ragged_workspace.data(), ragged_workspace.size(),
                   ragged_splits);
      cuda::check(cudaDeviceSynchronize(), "ragged decode");
      const std::vector<float> alone = gpu_test::download_bf16(ragged_out);
      const std::vector<float> mine(batched.begin() + b * q_width,
                                    batched.begin() + (b + 1) * q_width);
      EXPECT_EQ(mine, alone) << differs;
      check(b, mine);
    }
  }
}

void run_case(const PagedCase& c, uint32_t seed) {
  ENTROPYINFER_REQUIRE_GPU();
  const int group = c.q_heads / c.kv_heads;
  std::mt19937 generator(seed);
  // Lengths before the append, and every entry's pages shuffled through one pool.
  const PagedBatch p = paged_batch(c, generator);
  const int caches = p.caches, batch = p.batch;
  const int64_t head_dim = p.head_dim, max_pages = p.max_pages, stride = p.stride,
                entries = p.entries;
  const std::vector<int32_t>& lengths = p.lengths;
  const cuda::RaggedShape& shape = p.shape;
  std::vector<int32_t> page_tables(entries * max_pages);
  std::iota(page_tables.begin(), page_tables.end(), 0);
  std::shuffle(page_tables.begin(), page_tables.end(), generator);
  const int64_t pool_rows = entries * max_pages * cuda::kPagedRows;

  // Contiguous caches (entry-major, [entry][stride][head_dim]) and the same rows in the pool.
  const auto contiguous_keys =
      gpu_test::random_bf16_values(static_cast<size_t>(entries) * stride * head_dim, seed + 1);
  const auto contiguous_values =
      gpu_test::random_bf16_values(contiguous_keys.size(), seed + 2, 1.0f, /*uniform=*/true);
  std::vector<float> pool_keys =
      gpu_test::random_bf16_values(static_cast<size_t>(pool_rows) * head_dim, seed + 3);
  std::vector<float> pool_values = pool_keys;
  for (int64_t entry = 0; entry < entries; ++entry) {
    for (int64_t row = 0; row < stride; ++row) {
      const int64_t page = page_tables[entry * max_pages + row / cuda::kPagedRows];
      const size_t from = (static_cast<size_t>(entry) * stride + row) * head_dim;
      const size_t to =
          (static_cast<size_t>(page) * cuda::kPagedRows + row % cuda::kPagedRows) * head_dim;
      std::copy_n(contiguous_keys.begin() + from, head_dim, pool_keys.begin() + to);
      std::copy_n(contiguous_values.begin() + from, head_dim, pool_values.begin() + to);
    }
  }
  // Each sequence's new token: its K and V parts in a fused row of q + 2 * kv width.
  const int64_t q_width = static_cast<int64_t>(c.q_heads) * head_dim;
  const int64_t kv_width = static_cast<int64_t>(c.kv_heads) * head_dim;
  const int64_t row_stride = q_width + 2 * kv_width;
  const auto fused = gpu_test::random_bf16_values(static_cast<size_t>(batch) * row_stride, seed + 4,
                                                  1.0f, /*uniform=*/true);

  auto fused_gpu = gpu_test::upload_bf16(fused);
  auto pool_keys_gpu = gpu_test::upload_bf16(pool_keys);
  auto pool_values_gpu = gpu_test::upload_bf16(pool_values);
  cuda::DeviceBuffer<int32_t> tables_gpu(page_tables.size());
  tables_gpu.upload(page_tables.data(), page_tables.size());
  cuda::DeviceBuffer<int32_t> lengths_gpu(lengths.size());
  lengths_gpu.upload(lengths.data(), lengths.size());
  cuda::PagedCaches paged;
  paged.page_tables = tables_gpu.data();
  paged.max_pages = max_pages;
  paged.lengths = lengths_gpu.data();
  paged.keys = pool_keys_gpu.data();
  paged.values = pool_values_gpu.data();
  paged.batch = batch;
  cuda::paged_append(fused_gpu.data() + q_width, fused_gpu.data() + q_width + kv_width, row_stride,
                     shape, paged, nullptr);

  // The contiguous reference: ragged_append and ragged_decode per sequence.
  auto keys_gpu = gpu_test::upload_bf16(contiguous_keys);
  auto values_gpu = gpu_test::upload_bf16(contiguous_values);
  cuda::DeviceBuffer<int32_t> ragged_lengths(lengths.size());
  ragged_lengths.upload(lengths.data(), lengths.size());
  const size_t sequence_cache = static_cast<size_t>(caches) * stride * head_dim;
  for (int b = 0; b < batch; ++b) {
    cuda::ragged_append(fused_gpu.data() + b * row_stride + q_width,
                        fused_gpu.data() + b * row_stride + q_width + kv_width, shape,
                        keys_gpu.data() + b * sequence_cache,
                        values_gpu.data() + b * sequence_cache, ragged_lengths.data() + b * caches,
                        nullptr);
  }
  std::vector<int32_t> paged_after(lengths.size()), ragged_after(lengths.size());
  cuda::check(cudaDeviceSynchronize(), "appends");
  lengths_gpu.download(paged_after.data(), paged_after.size());
  ragged_lengths.download(ragged_after.data(), ragged_after.size());
  EXPECT_EQ(paged_after, ragged_after);
  for (size_t i = 0; i < lengths.size(); ++i) ASSERT_EQ(paged_after[i], lengths[i] + 1);

  const auto q = gpu_test::random_bf16_values(static_cast<size_t>(batch) * q_width, seed + 5, 2.0f);
  auto q_gpu = gpu_test::upload_bf16(q);
  const auto decode_alone = [&](int b, cuda::bf16* out, float* workspace, size_t workspace_floats,
                                int splits) {
    cuda::ragged_decode(q_gpu.data() + b * q_width, keys_gpu.data() + b * sequence_cache,
                        values_gpu.data() + b * sequence_cache, ragged_lengths.data() + b * caches,
                        shape, out, workspace, workspace_floats, nullptr, splits);
  };
  const auto matches_the_cpu = [&](int b, const std::vector<float>& mine) {
    // And the fp32 CPU reference over the host rows.
    std::vector<float> host_keys(contiguous_keys.begin() + b * sequence_cache,
                                 contiguous_keys.begin() + (b + 1) * sequence_cache);
    std::vector<float> host_values(contiguous_values.begin() + b * sequence_cache,
                                   contiguous_values.begin() + (b + 1) * sequence_cache);
    std::vector<const float*> key_heads(caches), value_heads(caches);
    std::vector<int64_t> host_lengths(caches);
    for (int cache = 0; cache < caches; ++cache) {
      const int64_t kv = c.per_query_head ? cache / group : cache;
      const int64_t row = lengths[b * caches + cache];
      const size_t at = (static_cast<size_t>(cache) * stride + row) * head_dim;
      std::copy_n(fused.begin() + b * row_stride + q_width + kv * head_dim, head_dim,
                  host_keys.begin() + at);
      std::copy_n(fused.begin() + b * row_stride + q_width + kv_width + kv * head_dim, head_dim,
                  host_values.begin() + at);
      key_heads[cache] = host_keys.data() + static_cast<size_t>(cache) * stride * head_dim;
      value_heads[cache] = host_values.data() + static_cast<size_t>(cache) * stride * head_dim;
      host_lengths[cache] = row + 1;
    }
    cpu::CompressedDecodeShape cpu_shape;
    cpu_shape.q_heads = c.q_heads;
    cpu_shape.kv_heads = c.kv_heads;
    cpu_shape.head_dim = head_dim;
    cpu_shape.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    cpu_shape.per_query_head = c.per_query_head;
    std::vector<float> expected(q_width);
    const std::vector<float> q_row(q.begin() + b * q_width, q.begin() + (b + 1) * q_width);
    cpu::compressed_decode_attention(q_row.data(), key_heads.data(), value_heads.data(),
                                     host_lengths.data(), cpu_shape, expected.data());
    const auto difference = gpu_test::compare(mine, expected);
    EXPECT_EQ(difference.non_finite, 0);
    EXPECT_LE(difference.relative_l2, 1e-2);
    EXPECT_LE(difference.max_abs_error, 1e-2);
  };
  expect_batch_decodes_as_alone(shape, paged, q_gpu.data(), batch,
                                "the paged batch differs from ragged_decode of the same rows",
                                decode_alone, matches_the_cpu);
}

// Device FP8 caches of `rows` rows: codes and one scale per row, for keys and for values.
struct DeviceFp8Rows {
  cuda::DeviceBuffer<uint8_t> key_codes, value_codes;
  cuda::DeviceBuffer<float> key_scales, value_scales;
  DeviceFp8Rows(int64_t rows, int64_t head_dim)
      : key_codes(static_cast<size_t>(rows * head_dim)),
        value_codes(static_cast<size_t>(rows * head_dim)),
        key_scales(static_cast<size_t>(rows)),
        value_scales(static_cast<size_t>(rows)) {}
  cuda::Fp8KvCache view() {
    return {key_codes.data(), value_codes.data(), key_scales.data(), value_scales.data()};
  }
};

// Rows [first, ...) of FP8 caches laid out as `rows`: codes of head_dim bytes, one scale each.
cuda::Fp8KvCache rows_from(const cuda::Fp8KvCache& rows, int64_t first, int64_t head_dim) {
  return {rows.key_codes + first * head_dim, rows.value_codes + first * head_dim,
          rows.key_scales + first, rows.value_scales + first};
}

void run_fp8_case(const PagedCase& c, uint32_t seed) {
  ENTROPYINFER_REQUIRE_GPU();
  std::mt19937 generator(seed);
  PagedBatch p = paged_batch(c, generator);
  const int caches = p.caches, batch = p.batch;
  const int64_t head_dim = p.head_dim, max_pages = p.max_pages, stride = p.stride,
                entries = p.entries;
  const std::vector<int32_t>& lengths = p.lengths;
  p.shape.fp8 = true;
  const cuda::RaggedShape& shape = p.shape;
  // More pages than the entries need, shuffled: stored rows land anywhere in the pool.
  const int64_t pool_pages = entries * max_pages + 7;
  std::vector<int32_t> all_pages(pool_pages);
  std::iota(all_pages.begin(), all_pages.end(), 0);
  std::shuffle(all_pages.begin(), all_pages.end(), generator);
  const std::vector<int32_t> page_tables(all_pages.begin(),
                                         all_pages.begin() + entries * max_pages);

  // Contiguous FP8 caches, entry-major, quantized on the GPU from bf16 rows.
  const auto keys = gpu_test::random_bf16_values(static_cast<size_t>(entries) * stride * head_dim,
                                                 seed + 1, 3.0f);
  const auto values = gpu_test::random_bf16_values(keys.size(), seed + 2, 1.0f, /*uniform=*/true);
  auto keys_gpu = gpu_test::upload_bf16(keys);
  auto values_gpu = gpu_test::upload_bf16(values);
  DeviceFp8Rows contiguous(entries * stride, head_dim);
  cuda::quantize_kv_rows(keys_gpu.data(), values_gpu.data(), entries, stride, head_dim, 0, stride,
                         contiguous.view(), nullptr, nullptr);

  // The same rows stored into the pool's pages, sequence by sequence as the server stores them.
  DeviceFp8Rows pool(pool_pages * cuda::kPagedRows, head_dim);
  cuda::DeviceBuffer<int32_t> tables_gpu(page_tables.size());
  tables_gpu.upload(page_tables.data(), page_tables.size());
  cuda::DeviceBuffer<int32_t> lengths_gpu(lengths.size());
  lengths_gpu.upload(lengths.data(), lengths.size());
  for (int b = 0; b < batch; ++b) {
    const int64_t first = static_cast<int64_t>(b) * caches;
    cuda::paged_store(rows_from(contiguous.view(), first * stride, head_dim), stride, caches,
                      head_dim, lengths_gpu.data() + first, tables_gpu.data() + first * max_pages,
                      max_pages, pool.view(), nullptr);
  }

  const int64_t q_width = static_cast<int64_t>(c.q_heads) * head_dim;
  const int64_t kv_width = static_cast<int64_t>(c.kv_heads) * head_dim;
  const int64_t row_stride = q_width + 2 * kv_width;
  auto fused_gpu = gpu_test::upload_bf16(gpu_test::random_bf16_values(
      static_cast<size_t>(batch) * row_stride, seed + 4, 2.0f, /*uniform=*/true));
  cuda::PagedCaches paged;
  paged.page_tables = tables_gpu.data();
  paged.max_pages = max_pages;
  paged.lengths = lengths_gpu.data();
  paged.fp8 = pool.view();
  paged.batch = batch;
  cuda::paged_append(fused_gpu.data() + q_width, fused_gpu.data() + q_width + kv_width, row_stride,
                     shape, paged, nullptr);
  cuda::DeviceBuffer<int32_t> ragged_lengths(lengths.size());
  ragged_lengths.upload(lengths.data(), lengths.size());
  for (int b = 0; b < batch; ++b) {
    cuda::ragged_append(fused_gpu.data() + b * row_stride + q_width,
                        fused_gpu.data() + b * row_stride + q_width + kv_width, shape,
                        rows_from(contiguous.view(), int64_t{b} * caches * stride, head_dim),
                        ragged_lengths.data() + b * caches, nullptr);
  }
  cuda::check(cudaDeviceSynchronize(), "store and append");
  const std::vector<int32_t> paged_after = gpu_test::download(lengths_gpu);
  EXPECT_EQ(paged_after, gpu_test::download(ragged_lengths));

  // Every row below its new length, stored or appended, is the contiguous row's codes and scale.
  const std::vector<uint8_t> pool_keys = gpu_test::download(pool.key_codes),
                             pool_values = gpu_test::download(pool.value_codes),
                             keys_contiguous = gpu_test::download(contiguous.key_codes),
                             values_contiguous = gpu_test::download(contiguous.value_codes);
  const std::vector<float> pool_key_scales = gpu_test::download(pool.key_scales),
                           pool_value_scales = gpu_test::download(pool.value_scales),
                           key_scales = gpu_test::download(contiguous.key_scales),
                           value_scales = gpu_test::download(contiguous.value_scales);
  int64_t mismatched_rows = 0;
  for (int64_t entry = 0; entry < entries; ++entry) {
    ASSERT_EQ(paged_after[entry], lengths[entry] + 1);
    for (int64_t row = 0; row < paged_after[entry]; ++row) {
      const int64_t at =
          page_tables[entry * max_pages + row / cuda::kPagedRows] * int64_t{cuda::kPagedRows} +
          row % cuda::kPagedRows;
      const int64_t from = entry * stride + row;
      const bool same =
          std::equal(pool_keys.begin() + at * head_dim, pool_keys.begin() + (at + 1) * head_dim,
                     keys_contiguous.begin() + from * head_dim) &&
          std::equal(pool_values.begin() + at * head_dim, pool_values.begin() + (at + 1) * head_dim,
                     values_contiguous.begin() + from * head_dim) &&
          pool_key_scales[at] == key_scales[from] && pool_value_scales[at] == value_scales[from];
      mismatched_rows += same ? 0 : 1;
    }
  }
  EXPECT_EQ(mismatched_rows, 0) << "pooled rows differ from the contiguous caches' codes";

  auto q_gpu = gpu_test::upload_bf16(
      gpu_test::random_bf16_values(static_cast<size_t>(batch) * q_width, seed + 5, 2.0f));
  expect_batch_decodes_as_alone(
      shape, paged, q_gpu.data(), batch, "FP8 pages differ from ragged_decode of the same codes",
      [&](int b, cuda::bf16* out, float* workspace, size_t workspace_floats, int splits) {
        cuda::ragged_decode(q_gpu.data() + b * q_width,
                            rows_from(contiguous.view(), int64_t{b} * caches * stride, head_dim),
                            ragged_lengths.data() + b * caches, shape, out, workspace,
                            workspace_floats, nullptr, splits);
      },
      [](int, const std::vector<float>& mine) {
        EXPECT_TRUE(
            std::all_of(mine.begin(), mine.end(), [](float x) { return std::isfinite(x); }));
      });
}

TEST(CudaPagedDecode, Fp8PagesMatchTheContiguousFp8Caches) {
  PagedCase c;
  c.longest = {700, 90, 3000, 33, 1200};
  run_fp8_case(c, 41);
}

TEST(CudaPagedDecode, Fp8PagesHeadDim64AndPerQueryHeadCaches) {
  PagedCase c;
  c.q_heads = 8;
  c.kv_heads = 8;
  c.head_dim = 64;
  c.per_query_head = true;
  c.longest = {64, 500, 31};
  run_fp8_case(c, 43);
}

TEST(CudaPagedDecode, ABatchOfUnequalSequencesMatchesEachDecodedAlone) {
  PagedCase c;
  c.longest = {700, 90, 3000, 33, 1200};
  run_case(c, 11);
}

TEST(CudaPagedDecode, HeadDim64AndPerQueryHeadCaches) {
  PagedCase c;
  c.q_heads = 8;
  c.kv_heads = 8;
  c.head_dim = 64;
  c.per_query_head = true;
  c.longest = {64, 500, 31};
  run_case(c, 23);
}

TEST(CudaPagedDecode, ThirtyTwoSequencesOfTheLlama8bShape) {
  PagedCase c;
  c.longest.assign(32, 600);
  run_case(c, 37);
}

TEST(CudaPagedDecode, RefusesInconsistentLayouts) {
  ENTROPYINFER_REQUIRE_GPU();
  cuda::RaggedShape shape;
  shape.q_heads = 8;
  shape.kv_heads = 2;
  shape.head_dim = 128;
  shape.cache_stride = 64;
  shape.max_length = 64;
  cuda::DeviceBuffer<int32_t> tables(4), lengths(2);
  cuda::DeviceBuffer<cuda::bf16> pool(static_cast<size_t>(4) * cuda::kPagedRows * 128);
  cuda::PagedCaches paged;
  paged.page_tables = tables.data();
  paged.max_pages = 3;  // 96 rows, not the shape's stride of 64
  paged.lengths = lengths.data();
  paged.keys = pool.data();
  paged.values = pool.data();
  paged.batch = 1;
  cuda::DeviceBuffer<cuda::bf16> q(8 * 128), out(8 * 128);
  EXPECT_THROW(
      cuda::paged_decode(q.data(), 8 * 128, shape, paged, out.data(), nullptr, 0, nullptr, 1),
      Error);
  paged.max_pages = 2;
  paged.batch = 0;
  EXPECT_THROW(
      cuda::paged_decode(q.data(), 8 * 128, shape, paged, out.data(), nullptr, 0, nullptr, 1),
      Error);
  paged.batch = 1;
  shape.fp8 = true;  // bf16 pools given for an FP8 shape
  EXPECT_THROW(
      cuda::paged_decode(q.data(), 8 * 128, shape, paged, out.data(), nullptr, 0, nullptr, 1),
      Error);
}

}  // namespace
}  // namespace entropyinfer

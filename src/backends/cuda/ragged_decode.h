// Decode attention over compressed KV caches whose heads hold different numbers of entries (AdaKV
// gives each head its own count; every method's appended tokens follow), the CUDA counterpart of
// cpu::compressed_decode_attention.
//
// Layout: `caches` per-head caches, caches = kv_heads, or q_heads when per_query_head (the released
// layout: each query head its own copy). Cache c is a [cache_stride][head_dim] bf16 slab of keys
// (and one of values) at c * cache_stride * head_dim, its first lengths[c] rows filled. lengths is
// a device array the kernels read when they run, so one captured CUDA graph serves every step.
//
// Decoding is split-KV like flash_decode: one warp per (cache, split, 16 query rows) streams 32-key
// tiles four stages deep with cp.async and mma.sync; each split covers an equal share of its own
// cache's length, writes fp32 partial outputs and their log-sum-exp, and a second kernel merges the
// splits. Softmax in fp32, P rounded to bf16 for P*V, output bf16. Over FP8 caches a split is a
// block of four warps, each taking a quarter of its tiles, combined in the block before the split
// is written. paged_decode runs the same kernels over many sequences' caches held in pages.
#pragma once

#include <cstdint>

#include "backends/cuda/cuda_common.h"
#include "backends/cuda/kv_cache_fp8.h"

namespace entropyinfer::cuda {

struct RaggedShape {
  int64_t q_heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;  // 64 or 128
  int64_t cache_stride = 0;
  // An upper bound of every lengths[c] while the launch (or the captured graph) is used: it sizes
  // the splits. At most cache_stride.
  int64_t max_length = 0;
  bool per_query_head = false;
  float scale = 0.0f;  // 0 means 1 / sqrt(head_dim)
  // The caches hold E4M3 codes with a scale per row (kv_cache_fp8.h): the Fp8KvCache overloads.
  bool fp8 = false;
};

// Number of per-head caches: q_heads when per_query_head, else kv_heads.
int64_t ragged_cache_count(const RaggedShape& shape);

// Appends one token's key and value (k, v: [kv_heads][head_dim] bf16 rows, e.g. the K and V parts
// of the fused qkv row) at row lengths[c] of every cache c and increments lengths[c]; with
// per_query_head the g caches of a KV head each get a copy. Reads lengths when it runs (CUDA-graph
// capturable). The caller guarantees lengths[c] < cache_stride: a full cache is left unchanged
// (its length too) rather than written past its end.
void ragged_append(const bf16* k, const bf16* v, const RaggedShape& shape, bf16* key_cache,
                   bf16* value_cache, int32_t* lengths, cudaStream_t stream);

// The same into FP8 caches (shape.fp8): the row is quantized as quantize_kv_rows quantizes it.
void ragged_append(const bf16* k, const bf16* v, const RaggedShape& shape, const Fp8KvCache& cache,
                   int32_t* lengths, cudaStream_t stream);

// Splits for ragged_decode: `requested` when positive (clamped to [1, key tiles of max_length]),
// else a count that fills the GPU once.
int ragged_decode_splits(const RaggedShape& shape, int requested = 0);

// Floats of workspace ragged_decode needs for `splits` (0 for one split).
size_t ragged_decode_workspace_floats(const RaggedShape& shape, int splits);

// One new token's queries (q: [q_heads][head_dim] bf16, 16-byte aligned) over the per-head caches:
// query head h attends to every row of cache h (per_query_head) or h / (q_heads / kv_heads). The
// new token's own key and value must already be appended. out: [q_heads][head_dim] bf16; a head
// whose cache is empty gets zeros. Lengths above cache_stride are read as cache_stride. Throws
// Error on unsupported shapes or a workspace smaller than ragged_decode_workspace_floats(shape,
// ragged_decode_splits(shape, splits)).
void ragged_decode(const bf16* q, const bf16* key_cache, const bf16* value_cache,
                   const int32_t* lengths, const RaggedShape& shape, bf16* out, float* workspace,
                   size_t workspace_floats, cudaStream_t stream, int splits = 0);

// ragged_decode over FP8 caches (shape.fp8). The tensor-core products take the codes exactly as
// fp16 and the queries rounded to fp16; each score is scaled by its key row's scale in fp32, and
// each probability by its value row's scale relative to the largest one seen so far before it is
// rounded to fp16 for P*V.
void ragged_decode(const bf16* q, const Fp8KvCache& cache, const int32_t* lengths,
                   const RaggedShape& shape, bf16* out, float* workspace, size_t workspace_floats,
                   cudaStream_t stream, int splits = 0);

// The caches of a batch of sequences in pages, as a serving pool holds them: `batch` sequences of
// ragged_cache_count(shape) caches each, entry b * caches + c for cache c of sequence b. An entry's
// rows [i * kPagedRows, (i + 1) * kPagedRows) live in page page_tables[entry * max_pages + i] of
// the pools ([pages][kPagedRows][head_dim] bf16 each); lengths[entry] rows are filled. The shape's
// cache_stride is max_pages * kPagedRows, its max_length bounds every length. With shape.fp8 the
// pools are `fp8` instead: E4M3 codes [pages][kPagedRows][head_dim] and one scale per row
// ([pages][kPagedRows] floats), each row quantized as quantize_kv_rows quantizes it.
constexpr int kPagedRows = 32;  // rows per page: one key tile of the decode kernel
struct PagedCaches {
  const int32_t* page_tables = nullptr;
  int64_t max_pages = 0;
  int32_t* lengths = nullptr;
  bf16* keys = nullptr;
  bf16* values = nullptr;
  Fp8KvCache fp8;
  int batch = 0;
};

// ragged_append for every sequence of the batch: sequence b's new key and value are the rows at
// k + b * row_stride and v + b * row_stride ([kv_heads][head_dim] each, e.g. the K and V parts of
// its fused qkv row). The caller guarantees each entry has a page for its new row.
void paged_append(const bf16* k, const bf16* v, int64_t row_stride, const RaggedShape& shape,
                  const PagedCaches& caches, cudaStream_t stream);

// Copies per-head caches into pages: the first lengths[c] rows (lengths a device array) of cache c
// (at c * cache_stride rows of keys and values, [rows][head_dim] each) go to the pages
// page_table[c * max_pages + i] (device) for rows [i * kPagedRows, (i + 1) * kPagedRows). The
// caller gives every cache enough pages for its length.
void paged_store(const bf16* keys, const bf16* values, int64_t cache_stride, int64_t caches,
                 int64_t head_dim, const int32_t* lengths, const int32_t* page_table,
                 int64_t max_pages, bf16* key_pool, bf16* value_pool, cudaStream_t stream);

// paged_store of FP8 caches (codes and row scales in `cache`, laid out as the bf16 ones) into FP8
// pools: the codes and scales are copied, not quantized again.
void paged_store(const Fp8KvCache& cache, int64_t cache_stride, int64_t caches, int64_t head_dim,
                 const int32_t* lengths, const int32_t* page_table, int64_t max_pages,
                 const Fp8KvCache& pool, cudaStream_t stream);

// ragged_decode_splits and ragged_decode_workspace_floats for paged_decode over `batch` sequences.
int paged_decode_splits(const RaggedShape& shape, int batch, int requested = 0);
size_t paged_decode_workspace_floats(const RaggedShape& shape, int batch, int splits);

// ragged_decode for every sequence of the batch in one launch: sequence b's queries at q + b *
// q_stride ([q_heads][head_dim]), its output at out + b * q_heads * head_dim. The same tile loop
// reads each key tile from its page, so a sequence's result is ragged_decode's over the same rows.
void paged_decode(const bf16* q, int64_t q_stride, const RaggedShape& shape,
                  const PagedCaches& caches, bf16* out, float* workspace, size_t workspace_floats,
                  cudaStream_t stream, int splits = 0);

}  // namespace entropyinfer::cuda

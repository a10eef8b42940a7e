// The FP8 KV cache on the GPU: E4M3 codes in the layout of the bf16 cache (per cache a [stride]
// [head_dim] slab of keys and one of values, a row being head_dim bytes) with one fp32 scale per
// row of keys and of values (at cache * stride + row). Rows are quantized by core/fp8.h's
// fp8_kv_round_trip_row rule, bit for bit from their bf16 values.
//
// Prompt attention, the estimate and the compression's scoring read a layer's rows widened to
// bf16 in a staging slab of the bf16 cache's layout; decode reads the codes
// (ragged_decode with RaggedShape::fp8).
#pragma once

#include <cstdint>

#include "backends/cuda/cuda_common.h"

namespace entropyinfer::cuda {

struct Fp8KvCache {
  uint8_t* key_codes = nullptr;
  uint8_t* value_codes = nullptr;
  float* key_scales = nullptr;
  float* value_scales = nullptr;
};

// Rows [first, first + count) of every one of `caches` caches in the bf16 staging slabs `keys`
// and `values` ([caches][stride][head_dim] each) into `cache` (the same strides); the staging rows
// are overwritten with their quantized values as bf16 (what the cache reads back as), and
// lengths[c], when lengths is not null, becomes first + count.
void quantize_kv_rows(bf16* keys, bf16* values, int64_t caches, int64_t stride, int64_t head_dim,
                      int64_t first, int64_t count, const Fp8KvCache& cache, int32_t* lengths,
                      cudaStream_t stream);

// Rows [first, first + count) of every cache widened into the staging slabs.
void dequantize_kv_rows(const Fp8KvCache& cache, int64_t caches, int64_t stride, int64_t head_dim,
                        int64_t first, int64_t count, bf16* keys, bf16* values,
                        cudaStream_t stream);

}  // namespace entropyinfer::cuda

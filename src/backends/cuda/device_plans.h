// The attention plans (attention/prefill_plan.h, attention/decode_plan.h) in GPU memory, in the
// same layouts, so that GPU policies can write them and GPU kernels can read them without a round
// trip to the host. The owning storage can also be filled from, and read back into, the host
// structs: that is how tests compare the GPU policies with the CPU ones, and how the GPU kernels
// are tested on plans made on the CPU.
#pragma once

#include <cstdint>
#include <vector>

#include "attention/decode_plan.h"
#include "attention/prefill_plan.h"
#include "backends/cuda/cuda_common.h"

namespace entropyinfer::cuda {

// A view of one layer's prefill plan. Rows r = kv_head * num_segments + segment; the blocks of row
// r are block_indices[row_offsets[r] .. row_offsets[r + 1]), ascending; rows of dense segments are
// empty. When `dense` is set (known on the host: the layer is below dense_layers or no segment is
// sparse) the pointers may be null and the layer runs full causal attention.
struct DevicePrefillPlan {
  bool dense = true;
  int64_t num_tokens = 0;
  int num_kv_heads = 0;
  int segment_size = 0;
  int block_size = 0;
  int num_segments = 0;
  const uint8_t* segment_sparse = nullptr;  // device, [num_segments]
  const int32_t* row_offsets = nullptr;     // device, [num_kv_heads * num_segments + 1]
  const int32_t* block_indices = nullptr;   // device, row_offsets[last] entries
};

// Owns the device arrays of a prefill plan.
struct DevicePrefillPlanStorage {
  DevicePrefillPlan view;
  DeviceBuffer<uint8_t> segment_sparse;
  DeviceBuffer<int32_t> row_offsets;
  DeviceBuffer<int32_t> block_indices;

  // Copies a host plan to the GPU (the estimate fields are not copied).
  static DevicePrefillPlanStorage upload(const LayerPrefillPlan& plan);
};

// Reads a device plan back into the host struct (segment_sparse, row_offsets, block_indices and
// the shape fields; the estimate fields stay empty). Synchronous.
LayerPrefillPlan download_prefill_plan(const DevicePrefillPlan& plan);

// A view of one layer's compressed cache selection: the entries kept by head c are
// kept_indices[kept_offsets[c] .. kept_offsets[c + 1]), ascending cache indices. heads = Hkv, or Hq
// when per_query_head.
struct DeviceDecodePlan {
  int heads = 0;
  bool per_query_head = false;
  const int32_t* kept_offsets = nullptr;  // device, [heads + 1]
  const int32_t* kept_indices = nullptr;  // device
};

struct DeviceDecodePlanStorage {
  DeviceDecodePlan view;
  DeviceBuffer<int32_t> kept_offsets;
  DeviceBuffer<int32_t> kept_indices;

  static DeviceDecodePlanStorage upload(const LayerDecodePlan& plan);
};

LayerDecodePlan download_decode_plan(const DeviceDecodePlan& plan);

}  // namespace entropyinfer::cuda

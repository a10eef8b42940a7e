#include <algorithm>

#include "backends/cuda/device_plans.h"

namespace entropyinfer::cuda {
namespace {

template <typename T>
std::vector<T> download_array(const T* device, size_t count) {
  std::vector<T> host(count);
  if (count != 0) {
    check(cudaMemcpy(host.data(), device, count * sizeof(T), cudaMemcpyDeviceToHost),
          "plan download");
  }
  return host;
}

template <typename T>
void upload_array(DeviceBuffer<T>& buffer, const std::vector<T>& host) {
  // One element at least, so that the view's pointer is never null for an empty list.
  buffer.allocate(std::max<size_t>(1, host.size()));
  if (!host.empty()) buffer.upload(host.data(), host.size());
}

}  // namespace

DevicePrefillPlanStorage DevicePrefillPlanStorage::upload(const LayerPrefillPlan& plan) {
  DevicePrefillPlanStorage storage;
  DevicePrefillPlan& view = storage.view;
  view.dense = plan.dense;
  view.num_tokens = plan.num_tokens;
  view.num_kv_heads = plan.num_kv_heads;
  view.segment_size = plan.segment_size;
  view.block_size = plan.block_size;
  view.num_segments = plan.num_segments;
  if (!plan.dense) {
    upload_array(storage.segment_sparse, plan.segment_sparse);
    upload_array(storage.row_offsets, plan.row_offsets);
    upload_array(storage.block_indices, plan.block_indices);
    view.segment_sparse = storage.segment_sparse.data();
    view.row_offsets = storage.row_offsets.data();
    view.block_indices = storage.block_indices.data();
  }
  return storage;
}

LayerPrefillPlan download_prefill_plan(const DevicePrefillPlan& view) {
  LayerPrefillPlan plan;
  plan.dense = view.dense;
  plan.num_tokens = view.num_tokens;
  plan.num_kv_heads = view.num_kv_heads;
  plan.segment_size = view.segment_size;
  plan.block_size = view.block_size;
  plan.num_segments = view.num_segments;
  if (view.dense) return plan;
  const size_t rows = static_cast<size_t>(view.num_kv_heads) * view.num_segments;
  plan.segment_sparse = download_array(view.segment_sparse, static_cast<size_t>(view.num_segments));
  plan.row_offsets = download_array(view.row_offsets, rows + 1);
  plan.block_indices =
      download_array(view.block_indices, static_cast<size_t>(plan.row_offsets.back()));
  return plan;
}

DeviceDecodePlanStorage DeviceDecodePlanStorage::upload(const LayerDecodePlan& plan) {
  DeviceDecodePlanStorage storage;
  std::vector<int32_t> offsets{0};
  std::vector<int32_t> indices;
  for (const auto& list : plan.kept) {
    indices.insert(indices.end(), list.begin(), list.end());
    offsets.push_back(static_cast<int32_t>(indices.size()));
  }
  upload_array(storage.kept_offsets, offsets);
  upload_array(storage.kept_indices, indices);
  storage.view.heads = static_cast<int>(plan.kept.size());
  storage.view.per_query_head = plan.per_query_head;
  storage.view.kept_offsets = storage.kept_offsets.data();
  storage.view.kept_indices = storage.kept_indices.data();
  return storage;
}

LayerDecodePlan download_decode_plan(const DeviceDecodePlan& view) {
  LayerDecodePlan plan;
  plan.per_query_head = view.per_query_head;
  const std::vector<int32_t> offsets =
      download_array(view.kept_offsets, static_cast<size_t>(view.heads) + 1);
  const std::vector<int32_t> indices =
      download_array(view.kept_indices, static_cast<size_t>(offsets.back()));
  plan.kept.resize(static_cast<size_t>(view.heads));
  for (int c = 0; c < view.heads; ++c) {
    plan.kept[c].assign(indices.begin() + offsets[c], indices.begin() + offsets[c + 1]);
  }
  return plan;
}

}  // namespace entropyinfer::cuda

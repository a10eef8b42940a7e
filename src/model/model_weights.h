// Weights of one model, row-major, each matrix [out_features, in_features] as in PyTorch's
// nn.Linear. Matrices keep the element type they are stored in (fp32, bf16, f16, or FP8 E4M3 with
// its scales) and are used in place from the memory map, so a 16 GB bf16 checkpoint costs no host
// memory beyond the page cache; the CPU computes with them as they are and the GPU upload streams
// them from the mapping. Vectors (norms, biases, FP8 scales) are always fp32, widened at load
// time: they are a few kilobytes per layer.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/fp8.h"
#include "core/half.h"
#include "core/mapped_file.h"
#include "model/model_config.h"

namespace entropyinfer {

struct WeightView {
  const void* data = nullptr;
  TensorDtype dtype = TensorDtype::kF32;
  std::vector<int64_t> shape;
  // FP8 matrices (dtype kF8E4M3): element (r, c) means code(r, c) * scales[r], or * scales[0]
  // when scale_count is 1. The product quantizes its input rows as `activations` says, with
  // input_scale as the static scale (0 unless activations are static per-tensor).
  const float* scales = nullptr;
  int64_t scale_count = 0;
  Fp8Activations activations;
  float input_scale = 0.0f;

  WeightView() = default;
  WeightView(const float* values, std::vector<int64_t> extents)
      : data(values), shape(std::move(extents)) {}
  WeightView(const void* values, TensorDtype type, std::vector<int64_t> extents)
      : data(values), dtype(type), shape(std::move(extents)) {}

  bool empty() const { return data == nullptr; }
  int64_t numel() const {
    int64_t count = 1;
    for (int64_t extent : shape) count *= extent;
    return shape.empty() ? 0 : count;
  }
  size_t byte_size() const {
    const size_t element = dtype == TensorDtype::kF32 ? 4 : dtype == TensorDtype::kF8E4M3 ? 1 : 2;
    return static_cast<size_t>(numel()) * element;
  }
  bool fp8() const { return dtype == TensorDtype::kF8E4M3; }
  float row_scale(int64_t row) const { return scales[scale_count == 1 ? 0 : row]; }
  // The values of an fp32 view (every vector is one); null when empty. Asking a 16-bit matrix
  // for floats is a programming error and throws.
  const float* floats() const;
  // Element `index` as fp32, whatever the stored type.
  float value(int64_t index) const;
  // Row `row` of a matrix widened to fp32 into `out` (shape[1] values).
  void widen_row(int64_t row, float* out) const;
};

struct LayerWeights {
  WeightView attn_norm;               // [hidden]
  WeightView q_proj, k_proj, v_proj;  // [heads*head_dim, hidden], [kv_heads*head_dim, hidden]
  WeightView q_bias, k_bias, v_bias;  // optional
  WeightView o_proj;                  // [hidden, heads*head_dim]
  WeightView o_bias;                  // optional
  WeightView q_norm, k_norm;          // optional, [head_dim]
  WeightView mlp_norm;                // [hidden]
  WeightView gate_proj, up_proj;      // [intermediate, hidden]
  WeightView down_proj;               // [hidden, intermediate]
};

struct ModelWeights {
  ModelConfig config;
  WeightView token_embedding;  // [vocab, hidden]
  WeightView final_norm;       // [hidden]
  WeightView lm_head;          // [vocab, hidden]; the embedding itself when tied
  std::vector<LayerWeights> layers;

  // Storage behind the views.
  std::vector<MappedFile> mapped_files;
  // Owned storage, in float units whatever it holds (a 16-bit copy takes half as many floats).
  std::vector<std::unique_ptr<float[]>> owned_buffers;

  // An FP8 model's format and activation scheme (a checkpoint's quantization_config, or
  // quantization at load); empty otherwise.
  std::string fp8_scheme;
  size_t owned_bytes = 0;   // copies: widened vectors, tensors stored where they cannot be read
  size_t mapped_bytes = 0;  // used in place
};

// Progress callback for long loads: (bytes done, bytes total).
using LoadProgress = void (*)(size_t done, size_t total, void* user);

// Loads a Hugging Face model folder (config.json plus model.safetensors or a sharded index).
ModelWeights load_hf_model(const std::string& folder, LoadProgress progress = nullptr,
                           void* progress_user = nullptr);

// Loads a llama2.c checkpoint (7-int header, fp32 weights).
ModelWeights load_llama2c_model(const std::string& path);
// The same over bytes the caller keeps alive (the views point into them); `path` names them in
// messages.
ModelWeights parse_llama2c_checkpoint(const uint8_t* bytes, size_t size, const std::string& path);

// Picks the loader from what the path is: a folder (Hugging Face) or a .bin file (llama2.c).
ModelWeights load_model(const std::string& path, LoadProgress progress = nullptr,
                        void* progress_user = nullptr);

}  // namespace entropyinfer

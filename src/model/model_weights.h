// Weights of one model in the layout the CPU backend computes with: fp32, row-major, each matrix
// [out_features, in_features] as in PyTorch's nn.Linear. fp32 checkpoints are used in place from
// the memory map; bf16 and f16 ones are widened once at load time into owned buffers.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/mapped_file.h"
#include "model/model_config.h"

namespace entropyinfer {

struct WeightView {
  const float* data = nullptr;
  std::vector<int64_t> shape;
  bool empty() const { return data == nullptr; }
  int64_t numel() const {
    int64_t count = 1;
    for (int64_t extent : shape) count *= extent;
    return shape.empty() ? 0 : count;
  }
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
  std::vector<std::unique_ptr<float[]>> owned_buffers;

  size_t owned_bytes = 0;   // widened copies
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

// What a decoder-only checkpoint is: sizes, and the few switches by which the supported families
// differ (attention bias, q/k norm, tied embeddings, RoPE variant). One generic decoder reads these
// flags.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

namespace entropyinfer {

enum class RopeScaling { kDefault, kLinear, kDynamic, kLlama3, kYarn };

struct RopeConfig {
  double theta = 10000.0;
  RopeScaling scaling = RopeScaling::kDefault;
  double factor = 1.0;
  // llama3
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  // llama3, yarn and dynamic: the context the model was trained with before scaling.
  int original_max_position_embeddings = 0;
  // yarn
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  std::optional<double> attention_factor;  // yarn's cos/sin temperature; default 0.1*ln(factor)+1
  // llama2.c checkpoints rotate adjacent pairs (x[2i], x[2i+1]); Hugging Face models rotate halves
  // (x[i], x[i + d/2]).
  bool rotate_adjacent_pairs = false;
  // How many leading dimensions of each head are rotated (all of them for every supported family).
  int rotary_dim = 0;
};

struct ModelConfig {
  std::string architecture;  // e.g. "LlamaForCausalLM", or "llama2.c"
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int vocab_size = 0;
  int max_position_embeddings = 0;
  float rms_norm_eps = 1e-6f;
  bool qkv_bias = false;  // Qwen2, openPangu
  bool o_bias = false;    // openPangu
  bool qk_norm = false;   // Qwen3
  bool tied_embeddings = false;
  std::optional<int> sliding_window;  // Mistral v0.1; recorded, full attention within it
  RopeConfig rope;
  std::optional<int> bos_token_id;
  std::vector<int> eos_token_ids;
  std::string torch_dtype;  // as config.json declares it, for reporting only

  int64_t parameter_count() const;
};

// Parses a Hugging Face config.json; throws Error naming the field on missing or contradictory
// values and on unsupported architectures.
ModelConfig parse_hf_config(const nlohmann::json& config_json);
ModelConfig load_hf_config(const std::string& config_path);

}  // namespace entropyinfer

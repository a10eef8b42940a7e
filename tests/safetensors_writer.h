// Test helpers that write safetensors files and whole tiny Hugging Face model folders on the fly:
// - encode_floats / write_safetensors: a file from (name, dtype, shape, values or raw bytes);
// - write_safetensors_raw: a file from a header text and data bytes, for crafting corrupt files;
// - write_tiny_model: config.json plus random weights for a given family, sharded or not, in F32,
//   BF16 or F16, returning the exact fp32 values a loader must produce.
// Header-only so that any test can include it.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/half.h"

namespace entropyinfer::testing {

// Round-to-nearest-even fp32 -> IEEE half, with subnormals and overflow to infinity.
inline uint16_t f32_to_f16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (magnitude >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520: inf
  if (magnitude < 0x38800000u) {  // below 2^-14: a half subnormal, in units of 2^-24
    float absolute;
    std::memcpy(&absolute, &magnitude, sizeof(absolute));
    const auto units = static_cast<uint32_t>(std::nearbyint(absolute * 16777216.0f));
    return static_cast<uint16_t>(sign | units);
  }
  const uint32_t exponent = (magnitude >> 23) - 127 + 15;
  const uint32_t mantissa = magnitude & 0x7fffffu;
  uint32_t half = (exponent << 10) | (mantissa >> 13);
  const uint32_t remainder = mantissa & 0x1fffu;
  if (remainder > 0x1000u || (remainder == 0x1000u && (half & 1u))) ++half;
  return static_cast<uint16_t>(sign | half);
}

// The bytes of `values` stored as `dtype` ("F32", "BF16" or "F16"); when `rounded` is given it
// receives what each value becomes after the round trip through that dtype.
inline std::string encode_floats(const std::vector<float>& values, const std::string& dtype,
                                 std::vector<float>* rounded = nullptr) {
  std::string bytes;
  if (rounded != nullptr) rounded->clear();
  for (float value : values) {
    if (dtype == "F32") {
      char raw[4];
      std::memcpy(raw, &value, 4);
      bytes.append(raw, 4);
      if (rounded != nullptr) rounded->push_back(value);
    } else if (dtype == "BF16" || dtype == "F16") {
      const uint16_t half = dtype == "BF16" ? f32_to_bf16(value) : f32_to_f16(value);
      bytes.push_back(static_cast<char>(half & 0xff));
      bytes.push_back(static_cast<char>(half >> 8));
      if (rounded != nullptr) {
        rounded->push_back(dtype == "BF16" ? bf16_to_f32(half) : f16_to_f32(half));
      }
    } else {
      throw std::invalid_argument("encode_floats: unsupported dtype " + dtype);
    }
  }
  return bytes;
}

struct TensorToWrite {
  std::string name;
  std::string dtype;  // any string: a writer of corrupt files may want an unsupported one
  std::vector<int64_t> shape;
  std::string bytes;
};

inline void write_file_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream stream(path, std::ios::binary | std::ios::trunc);
  if (!stream) throw std::runtime_error("cannot write " + path);
  stream.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline std::string little_endian_u64(uint64_t value) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((value >> (8 * i)) & 0xff);
  return bytes;
}

// A file holding exactly: 8-byte header length (the real one unless `header_length_override`), the
// header text, the data bytes.
inline void write_safetensors_raw(const std::string& path, const std::string& header_text,
                                  const std::string& data, int64_t header_length_override = -1) {
  const uint64_t length = header_length_override >= 0
                              ? static_cast<uint64_t>(header_length_override)
                              : static_cast<uint64_t>(header_text.size());
  write_file_bytes(path, little_endian_u64(length) + header_text + data);
}

// The header a well-formed file of these tensors has, laid out back to back in order, with the
// header padded with spaces to a multiple of 8 bytes as the reference writer does.
inline std::string safetensors_header(const std::vector<TensorToWrite>& tensors,
                                      const std::map<std::string, std::string>& metadata = {}) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const TensorToWrite& tensor : tensors) {
    header[tensor.name] = {{"dtype", tensor.dtype},
                           {"shape", tensor.shape},
                           {"data_offsets", {offset, offset + tensor.bytes.size()}}};
    offset += tensor.bytes.size();
  }
  std::string text = header.dump();
  while ((8 + text.size()) % 8 != 0) text.push_back(' ');
  return text;
}

inline void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata = {}) {
  std::string data;
  for (const TensorToWrite& tensor : tensors) data += tensor.bytes;
  write_safetensors_raw(path, safetensors_header(tensors, metadata), data);
}

// ---------------------------------------------------------------------------------------------------
// Tiny model folders.

struct TinyModelSpec {
  std::string architecture = "LlamaForCausalLM";
  int hidden_size = 16;
  int intermediate_size = 24;
  int num_layers = 2;
  int num_heads = 4;
  int num_kv_heads = 2;
  int head_dim = 0;  // 0: not written, implied as hidden/heads (Qwen3 always writes it)
  int vocab_size = 40;
  int max_position_embeddings = 128;
  bool tie_word_embeddings = false;
  // Llama/Mistral/Qwen3 `attention_bias`, openPangu `bias`: bias on q, k, v and o. (Qwen2 always
  // has q/k/v bias and never o bias, whatever this says.)
  bool attention_bias = false;
  std::string dtype = "F32";  // F32, BF16 or F16
  int num_shards = 1;         // more than 1: model-0000i-of-0000n.safetensors plus an index
  uint32_t seed = 1;
  // Weights are k/256 for integers |k| <= weight_steps: exact in every dtype when weight_steps <
  // 256.
  int weight_steps = 32;
  // Merged into config.json last (a null value is written as null)...
  nlohmann::json config_overrides = nlohmann::json::object();
  // ...and then these keys are removed.
  std::vector<std::string> remove_config_keys;
  // Called with the tensor list before it is written, to drop, add or corrupt tensors.
  std::function<void(std::vector<TensorToWrite>&)> edit_tensors;
};

struct TinyModel {
  nlohmann::json config;
  // Every tensor written, with the exact fp32 values a loader must produce and its shape.
  std::map<std::string, std::vector<float>> values;
  std::map<std::string, std::vector<int64_t>> shapes;
  std::vector<std::string> weight_files;  // as written, relative to the folder
};

inline nlohmann::json tiny_model_config(const TinyModelSpec& spec) {
  nlohmann::json config = {
      {"architectures", {spec.architecture}},
      {"hidden_size", spec.hidden_size},
      {"intermediate_size", spec.intermediate_size},
      {"num_hidden_layers", spec.num_layers},
      {"num_attention_heads", spec.num_heads},
      {"num_key_value_heads", spec.num_kv_heads},
      {"vocab_size", spec.vocab_size},
      {"max_position_embeddings", spec.max_position_embeddings},
      {"rms_norm_eps", 1e-5},
      {"rope_theta", 10000.0},
      {"hidden_act", "silu"},
      {"tie_word_embeddings", spec.tie_word_embeddings},
      {"bos_token_id", 1},
      {"eos_token_id", 2},
      {"torch_dtype", spec.dtype == "F32"    ? "float32"
                      : spec.dtype == "BF16" ? "bfloat16"
                                             : "float16"},
  };
  const bool qwen3 = spec.architecture == "Qwen3ForCausalLM";
  if (spec.head_dim > 0 || qwen3) {
    config["head_dim"] = spec.head_dim > 0 ? spec.head_dim : spec.hidden_size / spec.num_heads;
  }
  if (spec.architecture == "PanguEmbeddedForCausalLM") {
    config["bias"] = spec.attention_bias;
  } else if (spec.architecture != "Qwen2ForCausalLM") {
    config["attention_bias"] = spec.attention_bias;
  }
  if (spec.architecture == "MistralForCausalLM") config["sliding_window"] = nullptr;
  for (const auto& [key, value] : spec.config_overrides.items()) config[key] = value;
  for (const std::string& key : spec.remove_config_keys) config.erase(key);
  return config;
}

inline TinyModel write_tiny_model(const std::string& folder, const TinyModelSpec& spec) {
  namespace fs = std::filesystem;
  fs::create_directories(folder);
  TinyModel model;
  model.config = tiny_model_config(spec);
  {
    std::ofstream stream(folder + "/config.json", std::ios::trunc);
    stream << model.config.dump(2);
  }

  const std::string& arch = spec.architecture;
  const bool qwen2 = arch == "Qwen2ForCausalLM";
  const bool qwen3 = arch == "Qwen3ForCausalLM";
  const bool qkv_bias = qwen2 || spec.attention_bias;
  const bool o_bias = !qwen2 && spec.attention_bias;
  const int64_t hidden = spec.hidden_size;
  const int64_t head_dim = spec.head_dim > 0 ? spec.head_dim : spec.hidden_size / spec.num_heads;
  const int64_t q_width = spec.num_heads * head_dim;
  const int64_t kv_width = spec.num_kv_heads * head_dim;
  const int64_t inter = spec.intermediate_size;
  const int64_t vocab = spec.vocab_size;

  std::mt19937 generator(spec.seed);
  std::uniform_int_distribution<int> steps(-spec.weight_steps, spec.weight_steps);
  std::vector<TensorToWrite> tensors;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, float center) {
    int64_t count = 1;
    for (int64_t extent : shape) count *= extent;
    std::vector<float> values(static_cast<size_t>(count));
    for (float& value : values) value = center + static_cast<float>(steps(generator)) / 256.0f;
    std::vector<float> rounded;
    std::string bytes = encode_floats(values, spec.dtype, &rounded);
    model.values[name] = rounded;
    model.shapes[name] = shape;
    tensors.push_back({name, spec.dtype, std::move(shape), std::move(bytes)});
  };

  add("model.embed_tokens.weight", {vocab, hidden}, 0.0f);
  for (int i = 0; i < spec.num_layers; ++i) {
    const std::string prefix = "model.layers." + std::to_string(i) + ".";
    add(prefix + "input_layernorm.weight", {hidden}, 1.0f);
    add(prefix + "self_attn.q_proj.weight", {q_width, hidden}, 0.0f);
    add(prefix + "self_attn.k_proj.weight", {kv_width, hidden}, 0.0f);
    add(prefix + "self_attn.v_proj.weight", {kv_width, hidden}, 0.0f);
    add(prefix + "self_attn.o_proj.weight", {hidden, q_width}, 0.0f);
    if (qkv_bias) {
      add(prefix + "self_attn.q_proj.bias", {q_width}, 0.0f);
      add(prefix + "self_attn.k_proj.bias", {kv_width}, 0.0f);
      add(prefix + "self_attn.v_proj.bias", {kv_width}, 0.0f);
    }
    if (o_bias) add(prefix + "self_attn.o_proj.bias", {hidden}, 0.0f);
    if (qwen3) {
      add(prefix + "self_attn.q_norm.weight", {head_dim}, 1.0f);
      add(prefix + "self_attn.k_norm.weight", {head_dim}, 1.0f);
    }
    add(prefix + "post_attention_layernorm.weight", {hidden}, 1.0f);
    add(prefix + "mlp.gate_proj.weight", {inter, hidden}, 0.0f);
    add(prefix + "mlp.up_proj.weight", {inter, hidden}, 0.0f);
    add(prefix + "mlp.down_proj.weight", {hidden, inter}, 0.0f);
  }
  add("model.norm.weight", {hidden}, 1.0f);
  if (!spec.tie_word_embeddings) add("lm_head.weight", {vocab, hidden}, 0.0f);

  if (spec.edit_tensors) spec.edit_tensors(tensors);

  if (spec.num_shards <= 1) {
    write_safetensors(folder + "/model.safetensors", tensors);
    model.weight_files.push_back("model.safetensors");
    return model;
  }
  // Contiguous runs of tensors per shard, as transformers' save_pretrained splits them.
  const size_t shards = static_cast<size_t>(spec.num_shards);
  nlohmann::json weight_map = nlohmann::json::object();
  uint64_t total_size = 0;
  for (size_t shard = 0; shard < shards; ++shard) {
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", shard + 1, shards);
    const size_t begin = tensors.size() * shard / shards;
    const size_t end = tensors.size() * (shard + 1) / shards;
    std::vector<TensorToWrite> part(tensors.begin() + static_cast<std::ptrdiff_t>(begin),
                                    tensors.begin() + static_cast<std::ptrdiff_t>(end));
    for (const TensorToWrite& tensor : part) {
      weight_map[tensor.name] = name;
      total_size += tensor.bytes.size();
    }
    write_safetensors(folder + "/" + name, part);
    model.weight_files.push_back(name);
  }
  nlohmann::json index = {{"metadata", {{"total_size", total_size}}}, {"weight_map", weight_map}};
  std::ofstream stream(folder + "/model.safetensors.index.json", std::ios::trunc);
  stream << index.dump(2);
  return model;
}

// The message of the entropyinfer::Error that `action` throws; "" when it throws nothing, and a
// description when it throws something else (which tests treat as a failure too).
template <typename Action>
std::string error_message_of(Action&& action) {
  try {
    action();
  } catch (const std::exception& error) {
    if (dynamic_cast<const entropyinfer::Error*>(&error) != nullptr) return error.what();
    return std::string("<not an entropyinfer::Error: ") + error.what() + ">";
  }
  return "";
}

// Success when `message` is a non-empty error message containing every one of `parts`.
inline ::testing::AssertionResult mentions_all(const std::string& message,
                                               std::initializer_list<std::string> parts) {
  if (message.empty()) return ::testing::AssertionFailure() << "no entropyinfer::Error was thrown";
  for (const std::string& part : parts) {
    if (message.find(part) == std::string::npos) {
      return ::testing::AssertionFailure()
             << "message \"" << message << "\" does not mention \"" << part << "\"";
    }
  }
  return ::testing::AssertionSuccess();
}

// A fresh, empty folder under the system temp directory, removed when the object goes.
class TempFolder {
 public:
  explicit TempFolder(const std::string& tag) {
    namespace fs = std::filesystem;
    std::random_device entropy;
    path_ = (fs::temp_directory_path() /
             ("entropyinfer-" + tag + "-" + std::to_string(entropy()) + std::to_string(entropy())))
                .string();
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempFolder() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempFolder(const TempFolder&) = delete;
  TempFolder& operator=(const TempFolder&) = delete;

  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace entropyinfer::testing

// Loads a Hugging Face model folder: config.json, then the weights from model.safetensors or from
// the shards that model.safetensors.index.json names. Every tensor the configuration calls for is
// looked up by its Hugging Face name and its shape checked against config.json before any data is
// used, so a folder whose files disagree ends in one Error naming the tensor, not in a wrong answer
// later.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <new>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "core/json_reader.h"
#include "core/user_file.h"
#include "model/model_weights.h"
#include "model/safetensors.h"

namespace entropyinfer {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kSingleFileName = "model.safetensors";
constexpr const char* kIndexFileName = "model.safetensors.index.json";
// How many names an error message lists before it summarises the rest.
constexpr size_t kNamesListed = 8;

struct TensorSource {
  const SafetensorsTensor* tensor = nullptr;
  size_t file_index = 0;
};

// Every tensor of the checkpoint by name, with the files (one mapping per file) that hold them.
struct TensorCatalog {
  std::vector<SafetensorsFile> files;
  std::unordered_map<std::string, TensorSource> by_name;
  std::string description;  // what the weights were read from, for messages
};

std::string list_names(const std::vector<std::string>& names) {
  std::string text;
  for (size_t i = 0; i < names.size() && i < kNamesListed; ++i) {
    if (i > 0) text += ", ";
    text += "'" + names[i] + "'";
  }
  if (names.size() > kNamesListed) {
    text += " and " + std::to_string(names.size() - kNamesListed) + " more";
  }
  return text;
}

TensorCatalog open_single_file(const fs::path& path) {
  TensorCatalog catalog;
  catalog.description = "'" + path.string() + "'";
  catalog.files.emplace_back(path.string());
  for (const SafetensorsTensor& tensor : catalog.files.front().tensors()) {
    catalog.by_name.emplace(tensor.name, TensorSource{&tensor, 0});
  }
  return catalog;
}

TensorCatalog open_sharded(const fs::path& folder, const fs::path& index_path) {
  const std::string where = "safetensors index '" + index_path.string() + "'";
  const SafetensorsIndex index =
      parse_safetensors_index(read_user_file(index_path.string(), "safetensors index"), where);
  const std::vector<std::string>& shard_names = index.shard_names;
  for (const std::string& shard : shard_names) {
    const fs::path shard_path = folder / shard;
    std::error_code error;
    if (!fs::is_regular_file(shard_path, error)) {
      throw Error(where + " lists shard '" + shard + "', but '" + shard_path.string() +
                  "' does not exist");
    }
  }

  TensorCatalog catalog;
  catalog.description = "the " + std::to_string(shard_names.size()) + " shards listed in " + where;
  catalog.files.reserve(shard_names.size());
  for (const std::string& shard : shard_names)
    catalog.files.emplace_back((folder / shard).string());
  for (const auto& [tensor_name, file_index] : index.entries) {
    const SafetensorsTensor* tensor = catalog.files[file_index].find(tensor_name);
    if (tensor == nullptr) {
      throw Error(where + " maps tensor '" + tensor_name + "' to shard '" +
                  shard_names[file_index] + "', which has no tensor of that name");
    }
    catalog.by_name.emplace(tensor_name, TensorSource{tensor, file_index});
  }
  return catalog;
}

TensorCatalog open_weights(const fs::path& folder) {
  std::error_code error;
  const fs::path single = folder / kSingleFileName;
  if (fs::is_regular_file(single, error)) return open_single_file(single);
  const fs::path index = folder / kIndexFileName;
  if (fs::is_regular_file(index, error)) return open_sharded(folder, index);
  std::string hint;
  if (fs::exists(folder / "pytorch_model.bin", error) ||
      fs::exists(folder / "pytorch_model.bin.index.json", error)) {
    hint = " (it holds PyTorch .bin weights, which are not supported: convert them to safetensors)";
  }
  throw Error("model folder '" + folder.string() + "' has neither " + kSingleFileName + " nor " +
              kIndexFileName + hint);
}

// One tensor the configuration calls for: its name, the shape config.json implies (and why), and
// the view it fills.
struct ExpectedTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::string shape_reason;
  WeightView* target;
};

std::vector<ExpectedTensor> expected_tensors(ModelWeights& weights) {
  const ModelConfig& config = weights.config;
  const int64_t hidden = config.hidden_size;
  const int64_t vocab = config.vocab_size;
  const int64_t q_width = static_cast<int64_t>(config.num_heads) * config.head_dim;
  const int64_t kv_width = static_cast<int64_t>(config.num_kv_heads) * config.head_dim;
  const int64_t intermediate = config.intermediate_size;
  const int64_t head_dim = config.head_dim;
  const std::string hidden_reason = "hidden_size " + std::to_string(hidden);
  const std::string vocab_reason =
      "vocab_size " + std::to_string(vocab) + " x hidden_size " + std::to_string(hidden);
  const std::string q_reason = "num_attention_heads " + std::to_string(config.num_heads) +
                               " x head_dim " + std::to_string(head_dim);
  const std::string kv_reason = "num_key_value_heads " + std::to_string(config.num_kv_heads) +
                                " x head_dim " + std::to_string(head_dim);
  const std::string mlp_reason = "intermediate_size " + std::to_string(intermediate);

  std::vector<ExpectedTensor> expected;
  expected.push_back(
      {"model.embed_tokens.weight", {vocab, hidden}, vocab_reason, &weights.token_embedding});
  expected.push_back({"model.norm.weight", {hidden}, hidden_reason, &weights.final_norm});
  if (!config.tied_embeddings) {
    expected.push_back({"lm_head.weight", {vocab, hidden}, vocab_reason, &weights.lm_head});
  }
  weights.layers.assign(config.num_layers, LayerWeights{});
  for (int i = 0; i < config.num_layers; ++i) {
    LayerWeights& layer = weights.layers[i];
    const std::string prefix = "model.layers." + std::to_string(i) + ".";
    const std::string attn = prefix + "self_attn.";
    expected.push_back(
        {prefix + "input_layernorm.weight", {hidden}, hidden_reason, &layer.attn_norm});
    expected.push_back({attn + "q_proj.weight",
                        {q_width, hidden},
                        q_reason + ", " + hidden_reason,
                        &layer.q_proj});
    expected.push_back({attn + "k_proj.weight",
                        {kv_width, hidden},
                        kv_reason + ", " + hidden_reason,
                        &layer.k_proj});
    expected.push_back({attn + "v_proj.weight",
                        {kv_width, hidden},
                        kv_reason + ", " + hidden_reason,
                        &layer.v_proj});
    expected.push_back({attn + "o_proj.weight",
                        {hidden, q_width},
                        hidden_reason + ", " + q_reason,
                        &layer.o_proj});
    if (config.qkv_bias) {
      expected.push_back({attn + "q_proj.bias", {q_width}, q_reason, &layer.q_bias});
      expected.push_back({attn + "k_proj.bias", {kv_width}, kv_reason, &layer.k_bias});
      expected.push_back({attn + "v_proj.bias", {kv_width}, kv_reason, &layer.v_bias});
    }
    if (config.o_bias) {
      expected.push_back({attn + "o_proj.bias", {hidden}, hidden_reason, &layer.o_bias});
    }
    if (config.qk_norm) {
      const std::string reason = "head_dim " + std::to_string(head_dim);
      expected.push_back({attn + "q_norm.weight", {head_dim}, reason, &layer.q_norm});
      expected.push_back({attn + "k_norm.weight", {head_dim}, reason, &layer.k_norm});
    }
    expected.push_back(
        {prefix + "post_attention_layernorm.weight", {hidden}, hidden_reason, &layer.mlp_norm});
    const std::string mlp = prefix + "mlp.";
    expected.push_back({mlp + "gate_proj.weight",
                        {intermediate, hidden},
                        mlp_reason + ", " + hidden_reason,
                        &layer.gate_proj});
    expected.push_back({mlp + "up_proj.weight",
                        {intermediate, hidden},
                        mlp_reason + ", " + hidden_reason,
                        &layer.up_proj});
    expected.push_back({mlp + "down_proj.weight",
                        {hidden, intermediate},
                        hidden_reason + ", " + mlp_reason,
                        &layer.down_proj});
  }
  return expected;
}

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Tensors that a checkpoint may carry without meaning anything to inference.
bool is_ignorable(const std::string& name, const ModelConfig& config) {
  // Older transformers saved the RoPE frequency buffer; it is recomputed from the config.
  if (ends_with(name, "rotary_emb.inv_freq")) return true;
  // With tied embeddings transformers uses the embedding as the classifier and ignores any stored
  // copy.
  if (config.tied_embeddings && name == "lm_head.weight") return true;
  return false;
}

std::unique_ptr<float[]> allocate_floats(int64_t count, const std::string& name) {
  try {
    return std::make_unique_for_overwrite<float[]>(static_cast<size_t>(count));
  } catch (const std::bad_alloc&) {
    throw Error("out of memory copying tensor '" + name + "' (" +
                std::to_string(count * static_cast<int64_t>(sizeof(float))) + " bytes)");
  }
}

// What config.json's quantization_config says of FP8 weights. Matrices stored as F8_E4M3 stay as
// stored, with their scales (per output channel or per tensor, from the tensor's "<name>_scale"
// companion, e.g. q_proj.weight_scale); products quantize their inputs as `activations` says.
struct Fp8Scheme {
  bool on = false;
  std::string method;  // "compressed-tensors" or "fbgemm_fp8"
  Fp8Activations activations;
};

std::string config_field(const std::string& path) {
  return "config.json quantization_config." + path;
}

// The value at `object[key]`, or Error naming the field.
const json& require(const json& object, const std::string& key, const std::string& path) {
  if (!object.is_object() || !object.contains(key)) throw Error(config_field(path) + " is missing");
  return object.at(key);
}

Fp8Scheme read_fp8_scheme(const fs::path& config_path) {
  Fp8Scheme scheme;
  const json config = json::parse(read_user_file(config_path.string(), "model config"));
  if (!config.contains("quantization_config") || config.at("quantization_config").is_null())
    return scheme;
  const json& q = config.at("quantization_config");
  if (!q.is_object()) throw Error(config_field("") + " is not an object");
  const json& method = require(q, "quant_method", "quant_method");
  if (!method.is_string()) throw Error(config_field("quant_method") + " is not a string");
  scheme.method = method.get<std::string>();
  scheme.on = true;
  if (scheme.method == "fbgemm_fp8") {
    // Per-channel weight scales, activations quantized per token at run time, each row's largest
    // magnitude bounded by activation_scale_ub when it is given.
    scheme.activations.kind = Fp8Activations::Kind::kDynamicPerToken;
    if (q.contains("activation_scale_ub") && !q.at("activation_scale_ub").is_null()) {
      const json& bound = q.at("activation_scale_ub");
      if (!bound.is_number() || !(bound.get<double>() > 0) || !std::isfinite(bound.get<double>())) {
        throw Error(config_field("activation_scale_ub") + " " + bound.dump() +
                    " is not a positive number");
      }
      scheme.activations.upper_bound = bound.get<float>();
    }
    return scheme;
  }
  if (scheme.method == "fp8") {
    throw Error(config_field("quant_method") +
                " 'fp8' (block-wise scales, weight_block_size) is not supported: FP8 checkpoints "
                "of the compressed-tensors and fbgemm_fp8 formats are");
  }
  if (scheme.method != "compressed-tensors") {
    throw Error(config_field("quant_method") + " '" + scheme.method +
                "' is not supported (compressed-tensors and fbgemm_fp8 FP8 checkpoints are)");
  }
  if (q.contains("format")) {
    const json& format = q.at("format");
    if (!format.is_string() || (format != "float-quantized" && format != "naive-quantized")) {
      throw Error(config_field("format") + " " + format.dump() +
                  " is not supported (float-quantized or naive-quantized FP8 weights are)");
    }
  }
  const json& groups = require(q, "config_groups", "config_groups");
  if (!groups.is_object() || groups.empty())
    throw Error(config_field("config_groups") + " holds no quantization group");
  std::optional<Fp8Activations::Kind> activations;
  for (const auto& [name, group] : groups.items()) {
    const std::string where = "config_groups." + name;
    const json& weights = require(group, "weights", where + ".weights");
    const auto expect = [&](const json& object, const std::string& path, const char* key,
                            const json& wanted) {
      const json& value = require(object, key, path + "." + key);
      if (value != wanted) {
        throw Error(config_field(path + "." + key) + " is " + value.dump() + ": only " +
                    wanted.dump() + " is supported (8-bit float weights, symmetric scales)");
      }
    };
    expect(weights, where + ".weights", "num_bits", 8);
    expect(weights, where + ".weights", "type", "float");
    if (weights.contains("symmetric")) expect(weights, where + ".weights", "symmetric", true);
    if (weights.contains("dynamic")) expect(weights, where + ".weights", "dynamic", false);
    const json& strategy = require(weights, "strategy", where + ".weights.strategy");
    if (strategy != "channel" && strategy != "tensor") {
      throw Error(config_field(where + ".weights.strategy") + " " + strategy.dump() +
                  " is not supported (channel or tensor weight scales are)");
    }
    Fp8Activations::Kind group_activations = Fp8Activations::Kind::kNone;
    if (group.contains("input_activations") && !group.at("input_activations").is_null()) {
      const json& input = group.at("input_activations");
      const std::string path = where + ".input_activations";
      expect(input, path, "num_bits", 8);
      expect(input, path, "type", "float");
      const json& input_strategy = require(input, "strategy", path + ".strategy");
      const bool dynamic = input.contains("dynamic") && input.at("dynamic") == true;
      if (input_strategy == "token" && dynamic) {
        group_activations = Fp8Activations::Kind::kDynamicPerToken;
      } else if (input_strategy == "tensor" && !dynamic) {
        group_activations = Fp8Activations::Kind::kStaticPerTensor;
      } else {
        throw Error(config_field(path + ".strategy") + " " + input_strategy.dump() +
                    (dynamic ? " (dynamic)" : " (static)") +
                    " is not supported (dynamic per-token or static per-tensor activation "
                    "scales are)");
      }
    }
    if (activations && *activations != group_activations) {
      throw Error(config_field("config_groups") +
                  ": groups with different activation schemes are not supported");
    }
    activations = group_activations;
  }
  scheme.activations.kind = *activations;
  return scheme;
}

// "x.weight" -> "x.weight_scale": where both FP8 formats keep a weight's scales.
std::string scale_name_of(const std::string& weight_name) { return weight_name + "_scale"; }
std::string input_scale_name_of(const std::string& weight_name) {
  return weight_name.substr(0, weight_name.size() - std::string("weight").size()) + "input_scale";
}

template <float (*Convert)(uint16_t)>
void widen_16bit(const uint8_t* source, float* destination, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    uint16_t bits;
    std::memcpy(&bits, source + 2 * i, sizeof(bits));
    destination[i] = Convert(bits);
  }
}

// A tensor's values as fp32 into `out` (numel of them); false for an FP8 one, which needs its
// scales.
bool widen_to_f32(const SafetensorsTensor& tensor, float* out) {
  switch (tensor.dtype) {
    case TensorDtype::kF32:
      std::memcpy(out, tensor.data, tensor.byte_size);
      return true;
    case TensorDtype::kBF16:
      widen_16bit<bf16_to_f32>(tensor.data, out, tensor.numel());
      return true;
    case TensorDtype::kF16:
      widen_16bit<f16_to_f32>(tensor.data, out, tensor.numel());
      return true;
    case TensorDtype::kF8E4M3:
      return false;
  }
  return false;
}

// Scale values of an FP8 matrix of `rows` rows: one per row, or one for the whole tensor.
std::vector<float> fp8_scales(const SafetensorsTensor& scale, int64_t rows,
                              const std::string& weight_name, const std::string& where) {
  const int64_t count = scale.numel();
  const bool per_tensor = count == 1 && scale.shape.size() <= 2;
  const bool per_channel = count == rows && (scale.shape == std::vector<int64_t>{rows} ||
                                             scale.shape == std::vector<int64_t>{rows, 1});
  if (!per_tensor && !per_channel) {
    throw Error("tensor '" + scale.name + "' " + where + " has shape " + scale.shape_string() +
                ": the scales of '" + weight_name +
                "' must be one per tensor or one per each of its " + std::to_string(rows) +
                " rows (block-wise scales are not supported)");
  }
  std::vector<float> values(static_cast<size_t>(count));
  if (!widen_to_f32(scale, values.data())) {
    throw Error("tensor '" + scale.name + "' " + where +
                " is stored as F8_E4M3: scales must be F32, BF16 or F16");
  }
  // Zero is a row of zeros; a negative or non-finite scale is a broken file.
  for (size_t i = 0; i < values.size(); ++i) {
    if (!(values[i] >= 0.0f) || !std::isfinite(values[i])) {
      throw Error("tensor '" + scale.name + "' " + where + " holds " + std::to_string(values[i]) +
                  " at index " + std::to_string(i) +
                  ": a weight scale must be finite and not negative");
    }
  }
  return values;
}

// A static activation scale: the one value of `name`, positive and finite.
float static_input_scale(const TensorCatalog& catalog, const std::string& name,
                         const std::string& weight_name, const std::string& where) {
  const auto found = catalog.by_name.find(name);
  if (found == catalog.by_name.end()) {
    throw Error("tensor '" + weight_name + "' " + where +
                " has static per-tensor activation scales (quantization_config), but its "
                "activation scale '" +
                name + "' is missing");
  }
  const SafetensorsTensor& tensor = *found->second.tensor;
  float value = 0.0f;
  if (tensor.numel() != 1 || !widen_to_f32(tensor, &value)) {
    throw Error("tensor '" + name + "' " + where + " has shape " + tensor.shape_string() +
                " and type " + dtype_name(tensor.dtype) +
                ": an activation scale is one F32, BF16 or F16 value");
  }
  if (!(value > 0.0f) || !std::isfinite(value)) {
    throw Error("tensor '" + name + "' " + where + " holds " + std::to_string(value) +
                ": an activation scale must be positive and finite");
  }
  return value;
}

// Products the engine fuses (q/k/v, gate/up) read one quantized input, so with static activation
// scales each part uses the largest of the parts' scales, as vLLM does; the CPU reference applies
// the same rule, so both executors compute one thing.
void share_fused_input_scales(ModelWeights& weights) {
  for (LayerWeights& layer : weights.layers) {
    for (auto group : {std::vector<WeightView*>{&layer.q_proj, &layer.k_proj, &layer.v_proj},
                       std::vector<WeightView*>{&layer.gate_proj, &layer.up_proj}}) {
      float largest = 0.0f;
      for (const WeightView* part : group) largest = std::max(largest, part->input_scale);
      for (WeightView* part : group) {
        if (part->fp8()) part->input_scale = largest;
      }
    }
  }
}

}  // namespace

ModelWeights load_hf_model(const std::string& folder_text, LoadProgress progress,
                           void* progress_user) {
  const fs::path folder(folder_text);
  std::error_code error;
  if (!fs::exists(folder, error)) throw Error("model folder '" + folder_text + "' does not exist");
  if (!fs::is_directory(folder, error)) {
    throw Error("model path '" + folder_text + "' is not a folder (a Hugging Face model folder " +
                "holds config.json and model.safetensors)");
  }
  const fs::path config_path = folder / "config.json";
  if (!fs::is_regular_file(config_path, error)) {
    throw Error("model folder '" + folder_text + "' has no config.json");
  }

  ModelWeights weights;
  weights.config = load_hf_config(config_path.string());
  const ModelConfig& config = weights.config;
  TensorCatalog catalog = open_weights(folder);
  const std::string weights_where = "in " + catalog.description;

  const Fp8Scheme fp8 = read_fp8_scheme(config_path);
  std::vector<ExpectedTensor> expected = expected_tensors(weights);
  std::unordered_set<std::string> expected_names;
  std::vector<std::string> missing;
  for (const ExpectedTensor& tensor : expected) {
    expected_names.insert(tensor.name);
    if (!catalog.by_name.count(tensor.name)) missing.push_back(tensor.name);
  }
  if (!config.tied_embeddings && !catalog.by_name.count("lm_head.weight")) {
    throw Error("tensor 'lm_head.weight' is missing " + weights_where +
                ", and config.json has tie_word_embeddings false, so there is no classifier");
  }
  if (!missing.empty()) {
    throw Error(std::to_string(missing.size()) + " tensor(s) that config.json (" +
                config.architecture + ", " + std::to_string(config.num_layers) +
                " layers) calls for are missing " + weights_where + ": " + list_names(missing));
  }

  // An FP8 matrix brings its scales along; a checkpoint with static activation scales stores
  // an input_scale beside each (read by the formats' FP8 products, not by the widened model).
  for (const ExpectedTensor& tensor : expected) {
    const SafetensorsTensor& stored = *catalog.by_name.at(tensor.name).tensor;
    if (stored.dtype != TensorDtype::kF8E4M3) continue;
    if (!fp8.on) {
      throw Error("tensor '" + tensor.name + "' " + weights_where +
                  " is stored as F8_E4M3, but config.json has no quantization_config to say how "
                  "it is scaled");
    }
    if (stored.shape.size() != 2) {
      throw Error("tensor '" + tensor.name + "' " + weights_where +
                  " is stored as F8_E4M3: only matrices are quantized");
    }
    const std::string scale = scale_name_of(tensor.name);
    if (!catalog.by_name.count(scale)) {
      throw Error("tensor '" + tensor.name + "' " + weights_where + " is stored as F8_E4M3 (" +
                  fp8.method + "), but its scales '" + scale + "' are missing");
    }
    expected_names.insert(scale);
    expected_names.insert(input_scale_name_of(tensor.name));
  }

  std::vector<std::string> unexpected;
  for (const auto& [name, source] : catalog.by_name) {
    if (!expected_names.count(name) && !is_ignorable(name, config)) unexpected.push_back(name);
  }
  if (!unexpected.empty()) {
    std::sort(unexpected.begin(), unexpected.end());
    throw Error(std::to_string(unexpected.size()) + " tensor(s) " + weights_where +
                " have no place in the model config.json describes (" + config.architecture + ", " +
                std::to_string(config.num_layers) + " layers, q/k/v bias " +
                (config.qkv_bias ? "on" : "off") + ", o bias " + (config.o_bias ? "on" : "off") +
                "): " + list_names(unexpected));
  }

  size_t total_bytes = 0;
  for (const ExpectedTensor& tensor : expected) {
    const SafetensorsTensor& stored = *catalog.by_name.at(tensor.name).tensor;
    if (stored.shape != tensor.shape) {
      throw Error("tensor '" + tensor.name + "' " + weights_where + " has shape " +
                  stored.shape_string() + ", but config.json implies " +
                  shape_to_string(tensor.shape) + " (" + tensor.shape_reason + ")");
    }
    total_bytes += stored.byte_size;
  }
  weights.fp8_scheme =
      fp8.on ? fp8.method + " (activations: " + fp8.activations.describe() + ")" : "";

  std::vector<bool> file_used(catalog.files.size(), false);
  size_t done_bytes = 0;
  if (progress != nullptr) progress(0, total_bytes, progress_user);
  for (const ExpectedTensor& tensor : expected) {
    const TensorSource& source = catalog.by_name.at(tensor.name);
    const SafetensorsTensor& stored = *source.tensor;
    const int64_t count = stored.numel();
    WeightView& target = *tensor.target;
    target.shape = stored.shape;
    const size_t element_size = dtype_size(stored.dtype);
    const bool aligned = reinterpret_cast<uintptr_t>(stored.data) % element_size == 0;
    const bool layer_matrix = &target != &weights.token_embedding && &target != &weights.lm_head;
    if (stored.dtype == TensorDtype::kF8E4M3 && !layer_matrix) {
      // The embedding and the classifier run unquantized: widened with their scales.
      const int64_t rows = stored.shape[0], columns = stored.shape[1];
      const std::vector<float> scales = fp8_scales(
          *catalog.by_name.at(scale_name_of(tensor.name)).tensor, rows, tensor.name, weights_where);
      std::unique_ptr<float[]> buffer = allocate_floats(count, tensor.name);
      for (int64_t row = 0; row < rows; ++row) {
        const float scale = scales.size() == 1 ? scales[0] : scales[static_cast<size_t>(row)];
        for (int64_t column = 0; column < columns; ++column) {
          const int64_t i = row * columns + column;
          buffer[static_cast<size_t>(i)] = fp8_e4m3_to_f32(stored.data[i]) * scale;
        }
      }
      target.data = buffer.get();
      target.dtype = TensorDtype::kF32;
      weights.owned_bytes += static_cast<size_t>(count) * sizeof(float);
      weights.owned_buffers.push_back(std::move(buffer));
    } else if (stored.dtype == TensorDtype::kF8E4M3) {
      // Codes used as stored (checked above to be a matrix with scales); the scales, and a static
      // activation scale, widened beside them.
      const std::vector<float> scales =
          fp8_scales(*catalog.by_name.at(scale_name_of(tensor.name)).tensor, stored.shape[0],
                     tensor.name, weights_where);
      std::unique_ptr<float[]> scale_buffer =
          allocate_floats(static_cast<int64_t>(scales.size()), scale_name_of(tensor.name));
      std::copy(scales.begin(), scales.end(), scale_buffer.get());
      target.data = stored.data;
      target.dtype = TensorDtype::kF8E4M3;
      target.scales = scale_buffer.get();
      target.scale_count = static_cast<int64_t>(scales.size());
      target.activations = fp8.activations;
      weights.owned_bytes += scales.size() * sizeof(float);
      weights.owned_buffers.push_back(std::move(scale_buffer));
      if (fp8.activations.kind == Fp8Activations::Kind::kStaticPerTensor) {
        target.input_scale = static_input_scale(catalog, input_scale_name_of(tensor.name),
                                                tensor.name, weights_where);
      }
      file_used[source.file_index] = true;
      weights.mapped_bytes += stored.byte_size;
    } else if (aligned && (stored.shape.size() == 2 || stored.dtype == TensorDtype::kF32)) {
      // Matrices, and fp32 vectors, are used as stored, straight from the mapping.
      target.data = stored.data;
      target.dtype = stored.dtype;
      file_used[source.file_index] = true;
      weights.mapped_bytes += stored.byte_size;
    } else if (stored.shape.size() == 2) {
      // Stored at an offset its elements cannot be read from in place: copied, type kept.
      std::unique_ptr<float[]> buffer = allocate_floats((stored.byte_size + 3) / 4, tensor.name);
      std::memcpy(buffer.get(), stored.data, stored.byte_size);
      target.data = buffer.get();
      target.dtype = stored.dtype;
      weights.owned_bytes += stored.byte_size;
      weights.owned_buffers.push_back(std::move(buffer));
    } else {
      // 16-bit vectors (norms, biases) are widened to fp32, as are fp32 ones stored misaligned.
      std::unique_ptr<float[]> buffer = allocate_floats(count, tensor.name);
      if (!widen_to_f32(stored, buffer.get()))  // FP8 vectors are refused above
        throw Error("internal: an FP8 vector '" + tensor.name + "'");
      target.data = buffer.get();
      target.dtype = TensorDtype::kF32;
      weights.owned_bytes += static_cast<size_t>(count) * sizeof(float);
      weights.owned_buffers.push_back(std::move(buffer));
    }
    done_bytes += stored.byte_size;
    if (progress != nullptr) progress(done_bytes, total_bytes, progress_user);
  }
  if (config.tied_embeddings) weights.lm_head = weights.token_embedding;
  if (fp8.activations.kind == Fp8Activations::Kind::kStaticPerTensor)
    share_fused_input_scales(weights);

  // Only files that views point into stay mapped; the rest were fully copied into owned buffers.
  for (size_t i = 0; i < catalog.files.size(); ++i) {
    if (file_used[i]) weights.mapped_files.push_back(catalog.files[i].take_mapping());
  }
  return weights;
}

}  // namespace entropyinfer

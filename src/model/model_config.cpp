// Hugging Face config.json -> ModelConfig. The defaults and derivations follow what transformers 5
// computes for each family (checked against transformers 5.17), so that a config.json means the
// same function here as there; anything this engine cannot compute exactly is rejected by name
// rather than approximated.
#include "model/model_config.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/json_reader.h"
#include "core/user_file.h"

namespace entropyinfer {
namespace {

using nlohmann::json;

enum class Family { kLlama, kQwen2, kQwen3, kMistral, kPanguEmbedded };

struct FamilyTraits {
  const char* architecture;
  Family family;
  double default_rope_theta;
  double default_rms_norm_eps;
  int default_max_position_embeddings;
};

// Defaults are those of each family's transformers config class (openPangu's from its own
// configuration_openpangu_dense.py), used only when config.json leaves a field out.
constexpr FamilyTraits kFamilies[] = {
    {"LlamaForCausalLM", Family::kLlama, 10000.0, 1e-6, 2048},
    {"Qwen2ForCausalLM", Family::kQwen2, 10000.0, 1e-6, 32768},
    {"Qwen3ForCausalLM", Family::kQwen3, 10000.0, 1e-6, 32768},
    {"MistralForCausalLM", Family::kMistral, 10000.0, 1e-6, 131072},
    {"PanguEmbeddedForCausalLM", Family::kPanguEmbedded, 16000000.0, 1e-5, 32768},
};

// Qwen3's config class gives head_dim 128 when config.json omits it, whatever hidden/heads is.
constexpr int kQwen3DefaultHeadDim = 128;
// Mistral's config class enables a 4096-token window when config.json has no sliding_window key.
constexpr int kMistralDefaultSlidingWindow = 4096;
// Qwen2/3: layers from this index on use the sliding window when use_sliding_window is true.
constexpr int kQwenDefaultMaxWindowLayers = 28;

std::string supported_architectures() {
  std::string names;
  for (const FamilyTraits& traits : kFamilies) {
    if (!names.empty()) names += ", ";
    names += traits.architecture;
  }
  return names;
}

std::string describe(const json& value) { return value.dump(); }

bool present(const json& object, const char* field) {
  auto it = object.find(field);
  return it != object.end() && !it->is_null();
}

// An integer that fits in int; rejects floats, strings and booleans.
int as_int(const json& value, const std::string& field) {
  if (!value.is_number_integer()) {
    throw Error("config field '" + field + "' must be an integer, got " + describe(value));
  }
  if (value.is_number_unsigned()) {
    if (value.get<uint64_t>() > static_cast<uint64_t>(INT32_MAX)) {
      throw Error("config field '" + field + "' is too large: " + describe(value));
    }
    return static_cast<int>(value.get<uint64_t>());
  }
  const int64_t number = value.get<int64_t>();
  if (number > INT32_MAX || number < INT32_MIN) {
    throw Error("config field '" + field + "' is out of range: " + describe(value));
  }
  return static_cast<int>(number);
}

int required_positive_int(const json& object, const char* field) {
  if (!present(object, field)) throw Error("config field '" + std::string(field) + "' is missing");
  const int number = as_int(object.at(field), field);
  if (number <= 0) {
    throw Error("config field '" + std::string(field) + "' must be positive, got " +
                std::to_string(number));
  }
  return number;
}

int optional_positive_int(const json& object, const char* field, int fallback) {
  if (!present(object, field)) return fallback;
  const int number = as_int(object.at(field), field);
  if (number <= 0) {
    throw Error("config field '" + std::string(field) + "' must be positive, got " +
                std::to_string(number));
  }
  return number;
}

double as_number(const json& value, const std::string& field) {
  if (!value.is_number()) {
    throw Error("config field '" + field + "' must be a number, got " + describe(value));
  }
  const double number = value.get<double>();
  if (!std::isfinite(number)) throw Error("config field '" + field + "' must be finite");
  return number;
}

bool optional_bool(const json& object, const char* field, bool fallback) {
  if (!present(object, field)) return fallback;
  const json& value = object.at(field);
  if (!value.is_boolean()) {
    throw Error("config field '" + std::string(field) + "' must be true or false, got " +
                describe(value));
  }
  return value.get<bool>();
}

int token_id(const json& value, const std::string& field, int vocab_size) {
  const int id = as_int(value, field);
  if (id < 0 || id >= vocab_size) {
    throw Error("config field '" + field + "' is " + std::to_string(id) +
                ", outside the vocabulary of " + std::to_string(vocab_size) + " tokens");
  }
  return id;
}

// The merged RoPE parameters and the name config.json gives them, for messages.
struct RopeParameters {
  json values;
  std::string label;  // "rope_parameters" or "rope_scaling"

  std::string field(const char* name) const { return label + "." + name; }
  bool has(const char* name) const { return present(values, name); }
  const json& at(const char* name) const { return values.at(name); }
  double number(const char* name) const { return as_number(values.at(name), field(name)); }
  std::optional<double> optional_number(const char* name) const {
    if (!has(name)) return std::nullopt;
    return number(name);
  }
  double required_positive(const char* name, const std::string& type) const {
    if (!has(name)) {
      throw Error("RoPE type '" + type + "' needs '" + field(name) +
                  "', which config.json does not give");
    }
    const double value = number(name);
    if (value <= 0) {
      throw Error("config field '" + field(name) + "' must be positive, got " + describe(at(name)));
    }
    return value;
  }
  int original_context(int max_position_embeddings) const {
    if (!has("original_max_position_embeddings")) return max_position_embeddings;
    const int original =
        as_int(at("original_max_position_embeddings"), field("original_max_position_embeddings"));
    if (original <= 0) {
      throw Error("config field '" + field("original_max_position_embeddings") +
                  "' must be positive, got " + std::to_string(original));
    }
    return original;
  }
};

// The RoPE parameters, from `rope_parameters` (transformers 5) and/or `rope_scaling` (earlier
// versions). transformers 5 writes both in some configs; a key present in both must agree.
RopeParameters merged_rope_parameters(const json& config) {
  json merged = json::object();
  std::string label;
  for (const char* source : {"rope_parameters", "rope_scaling"}) {
    if (!present(config, source)) continue;
    json parameters = config.at(source);
    if (!parameters.is_object()) {
      throw Error("config field '" + std::string(source) + "' must be an object, got " +
                  describe(parameters));
    }
    // transformers 5 may key RoPE parameters by layer type; these families use one kind of layer.
    if (parameters.contains("full_attention") && parameters.at("full_attention").is_object()) {
      for (const auto& [key, value] : parameters.items()) {
        if (key != "full_attention" && !value.is_null()) {
          throw Error("config field '" + std::string(source) +
                      "' gives RoPE parameters for layer type '" + key +
                      "'; only 'full_attention' layers are supported");
        }
      }
      parameters = json(parameters.at("full_attention"));
    }
    for (const auto& [key, value] : parameters.items()) {
      auto existing = merged.find(key);
      if (existing != merged.end() && !existing->is_null() && !value.is_null() &&
          *existing != value) {
        throw Error("config fields 'rope_parameters." + key + "' (" + describe(*existing) +
                    ") and 'rope_scaling." + key + "' (" + describe(value) +
                    ") contradict each other");
      }
      if (existing == merged.end() || existing->is_null()) merged[key] = value;
    }
    if (label.empty()) label = source;
  }
  return RopeParameters{std::move(merged), label.empty() ? "rope_parameters" : label};
}

// YaRN's magnitude correction of cos/sin (the paper's 0.1 ln(s) + 1, scaled by mscale).
double yarn_mscale(double scale, double mscale) {
  return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

RopeConfig parse_rope(const json& config, const FamilyTraits& traits, int head_dim,
                      int max_position_embeddings) {
  const RopeParameters parameters = merged_rope_parameters(config);
  RopeConfig rope;

  // theta: rope_parameters.rope_theta (transformers 5), else the top-level rope_theta.
  std::optional<double> theta = parameters.optional_number("rope_theta");
  if (present(config, "rope_theta")) {
    const double top_level = as_number(config.at("rope_theta"), "rope_theta");
    if (theta && *theta != top_level) {
      throw Error("config fields 'rope_theta' (" + describe(config.at("rope_theta")) + ") and '" +
                  parameters.field("rope_theta") + "' (" + describe(parameters.at("rope_theta")) +
                  ") contradict each other");
    }
    theta = top_level;
  }
  rope.theta = theta.value_or(traits.default_rope_theta);
  if (rope.theta <= 1.0) {
    throw Error("config field 'rope_theta' must be greater than 1, got " +
                std::to_string(rope.theta));
  }

  std::string type = "default";
  const bool has_rope_type = parameters.has("rope_type");
  const bool has_type = parameters.has("type");
  for (const char* field : {"rope_type", "type"}) {
    if (parameters.has(field) && !parameters.at(field).is_string()) {
      throw Error("config field '" + parameters.field(field) + "' must be a string, got " +
                  describe(parameters.at(field)));
    }
  }
  if (has_rope_type && has_type &&
      parameters.at("rope_type").get<std::string>() != parameters.at("type").get<std::string>()) {
    throw Error("config fields '" + parameters.field("rope_type") + "' (" +
                describe(parameters.at("rope_type")) + ") and '" + parameters.field("type") +
                "' (" + describe(parameters.at("type")) + ") contradict each other");
  }
  if (has_rope_type) {
    type = parameters.at("rope_type").get<std::string>();
  } else if (has_type) {
    type = parameters.at("type").get<std::string>();
  }

  if (type == "default") {
    rope.scaling = RopeScaling::kDefault;
  } else if (type == "linear") {
    rope.scaling = RopeScaling::kLinear;
    rope.factor = parameters.required_positive("factor", type);
  } else if (type == "dynamic") {
    rope.scaling = RopeScaling::kDynamic;
    rope.factor = parameters.required_positive("factor", type);
    rope.original_max_position_embeddings = parameters.original_context(max_position_embeddings);
  } else if (type == "llama3") {
    rope.scaling = RopeScaling::kLlama3;
    rope.factor = parameters.required_positive("factor", type);
    rope.low_freq_factor = parameters.required_positive("low_freq_factor", type);
    rope.high_freq_factor = parameters.required_positive("high_freq_factor", type);
    if (rope.high_freq_factor <= rope.low_freq_factor) {
      throw Error("config field '" + parameters.field("high_freq_factor") + "' (" +
                  describe(parameters.at("high_freq_factor")) + ") must be greater than '" +
                  parameters.field("low_freq_factor") + "' (" +
                  describe(parameters.at("low_freq_factor")) + ")");
    }
    rope.original_max_position_embeddings = parameters.original_context(max_position_embeddings);
  } else if (type == "yarn") {
    rope.scaling = RopeScaling::kYarn;
    rope.original_max_position_embeddings = parameters.original_context(max_position_embeddings);
    // A null factor means the ratio of the two contexts (as transformers computes it).
    if (parameters.has("factor")) {
      rope.factor = parameters.required_positive("factor", type);
    } else {
      rope.factor =
          static_cast<double>(max_position_embeddings) / rope.original_max_position_embeddings;
    }
    // transformers reads these with `or`, so 0 and null both mean the paper's defaults.
    const double beta_fast = parameters.optional_number("beta_fast").value_or(0.0);
    const double beta_slow = parameters.optional_number("beta_slow").value_or(0.0);
    rope.beta_fast = beta_fast != 0.0 ? beta_fast : 32.0;
    rope.beta_slow = beta_slow != 0.0 ? beta_slow : 1.0;
    if (rope.beta_fast <= 0 || rope.beta_slow <= 0) {
      throw Error("config fields '" + parameters.field("beta_fast") + "' and '" +
                  parameters.field("beta_slow") + "' must be positive");
    }
    if (parameters.has("truncate") && parameters.at("truncate") != json(true)) {
      throw Error("config field '" + parameters.field("truncate") + "' is " +
                  describe(parameters.at("truncate")) +
                  "; only YaRN with a truncated correction range (true) is supported");
    }
    // The cos/sin temperature is resolved here, once, so the decoder reads a single number.
    if (std::optional<double> attention_factor = parameters.optional_number("attention_factor")) {
      if (*attention_factor <= 0) {
        throw Error("config field '" + parameters.field("attention_factor") +
                    "' must be positive, got " + describe(parameters.at("attention_factor")));
      }
      rope.attention_factor = *attention_factor;
    } else {
      const double mscale = parameters.optional_number("mscale").value_or(0.0);
      const double mscale_all_dim = parameters.optional_number("mscale_all_dim").value_or(0.0);
      if (mscale != 0.0 && mscale_all_dim != 0.0) {
        rope.attention_factor =
            yarn_mscale(rope.factor, mscale) / yarn_mscale(rope.factor, mscale_all_dim);
      } else {
        rope.attention_factor = yarn_mscale(rope.factor, 1.0);
      }
    }
  } else {
    throw Error("unsupported RoPE type '" + type +
                "' in config.json (supported: default, linear, dynamic, llama3, yarn)");
  }

  // Partial rotary embeddings: none of these families uses them, but a config that states a factor
  // gets exactly what it states.
  std::optional<double> partial = parameters.optional_number("partial_rotary_factor");
  if (!partial && present(config, "partial_rotary_factor")) {
    partial = as_number(config.at("partial_rotary_factor"), "partial_rotary_factor");
  }
  rope.rotary_dim = head_dim;
  if (partial) {
    if (*partial <= 0.0 || *partial > 1.0) {
      throw Error("config field 'partial_rotary_factor' must be in (0, 1], got " +
                  std::to_string(*partial));
    }
    rope.rotary_dim = static_cast<int>(head_dim * *partial);
  }
  if (rope.rotary_dim <= 0 || rope.rotary_dim % 2 != 0) {
    throw Error("the rotary dimension (" + std::to_string(rope.rotary_dim) + " of head_dim " +
                std::to_string(head_dim) + ") must be even and positive");
  }
  rope.rotate_adjacent_pairs = false;
  return rope;
}

// The window of Qwen2/Qwen3 models: per layer, sliding from max_window_layers on when
// use_sliding_window is set (or as an explicit layer_types list). One window for every layer, or
// none, is what this engine represents; a mix is rejected.
std::optional<int> qwen_sliding_window(const json& config, int num_layers) {
  // Counted, not listed per layer: num_hidden_layers is the file's word, up to INT32_MAX.
  int sliding_layers = 0;
  if (present(config, "layer_types")) {
    const json& types = config.at("layer_types");
    if (!types.is_array() || static_cast<int>(types.size()) != num_layers) {
      throw Error("config field 'layer_types' must list one type per layer (" +
                  std::to_string(num_layers) + "), got " + describe(types));
    }
    for (const json& type : types) {
      if (type == "sliding_attention") {
        ++sliding_layers;
      } else if (type != "full_attention") {
        throw Error("config field 'layer_types' has unsupported layer type " + describe(type));
      }
    }
  } else if (optional_bool(config, "use_sliding_window", false) &&
             !(config.contains("sliding_window") && config.at("sliding_window").is_null())) {
    // A null window turns the feature off even when use_sliding_window is set.
    const int first = present(config, "max_window_layers")
                          ? as_int(config.at("max_window_layers"), "max_window_layers")
                          : kQwenDefaultMaxWindowLayers;
    sliding_layers = num_layers - std::clamp(first, 0, num_layers);
  }
  if (sliding_layers == 0) return std::nullopt;
  if (sliding_layers != num_layers) {
    throw Error("config.json asks for sliding-window attention on " +
                std::to_string(sliding_layers) + " of " + std::to_string(num_layers) +
                " layers; only all or none is supported");
  }
  return optional_positive_int(config, "sliding_window", 4096);
}

}  // namespace

ModelConfig parse_hf_config(const json& config) {
  if (!config.is_object()) throw Error("config.json must hold a JSON object");
  if (!present(config, "architectures")) throw Error("config field 'architectures' is missing");
  const json& architectures = config.at("architectures");
  if (!architectures.is_array() || architectures.empty() || !architectures[0].is_string()) {
    throw Error("config field 'architectures' must be a non-empty list of names, got " +
                describe(architectures));
  }
  const std::string architecture = architectures[0].get<std::string>();
  const FamilyTraits* traits = nullptr;
  for (const FamilyTraits& candidate : kFamilies) {
    if (architecture == candidate.architecture) traits = &candidate;
  }
  if (traits == nullptr) {
    throw Error("unsupported architecture '" + architecture +
                "' (supported: " + supported_architectures() + ")");
  }
  const Family family = traits->family;

  ModelConfig model;
  model.architecture = architecture;
  model.hidden_size = required_positive_int(config, "hidden_size");
  model.intermediate_size = required_positive_int(config, "intermediate_size");
  model.num_layers = required_positive_int(config, "num_hidden_layers");
  model.num_heads = required_positive_int(config, "num_attention_heads");
  model.num_kv_heads = optional_positive_int(config, "num_key_value_heads", model.num_heads);
  model.vocab_size = required_positive_int(config, "vocab_size");
  model.max_position_embeddings = optional_positive_int(config, "max_position_embeddings",
                                                        traits->default_max_position_embeddings);

  if (model.num_heads % model.num_kv_heads != 0) {
    throw Error("config field 'num_attention_heads' (" + std::to_string(model.num_heads) +
                ") must be a multiple of 'num_key_value_heads' (" +
                std::to_string(model.num_kv_heads) + ")");
  }

  if (present(config, "head_dim")) {
    model.head_dim = optional_positive_int(config, "head_dim", 0);
  } else if (family == Family::kQwen3) {
    model.head_dim = kQwen3DefaultHeadDim;
  } else {
    if (model.hidden_size % model.num_heads != 0) {
      throw Error("config field 'hidden_size' (" + std::to_string(model.hidden_size) +
                  ") is not a multiple of 'num_attention_heads' (" +
                  std::to_string(model.num_heads) + ") and no 'head_dim' is given");
    }
    model.head_dim = model.hidden_size / model.num_heads;
  }

  const double eps = present(config, "rms_norm_eps")
                         ? as_number(config.at("rms_norm_eps"), "rms_norm_eps")
                         : traits->default_rms_norm_eps;
  if (eps <= 0.0 || eps >= 1.0) {
    throw Error("config field 'rms_norm_eps' must be in (0, 1), got " + std::to_string(eps));
  }
  model.rms_norm_eps = static_cast<float>(eps);

  if (present(config, "hidden_act")) {
    const json& activation = config.at("hidden_act");
    if (activation != "silu") {
      throw Error("config field 'hidden_act' is " + describe(activation) +
                  "; only 'silu' (SwiGLU) is supported");
    }
  }
  if (optional_bool(config, "mlp_bias", false)) {
    throw Error("config field 'mlp_bias' is true; MLP biases are not supported");
  }

  switch (family) {
    case Family::kLlama:
    case Family::kMistral:
      model.qkv_bias = model.o_bias = optional_bool(config, "attention_bias", false);
      break;
    case Family::kQwen2:  // Qwen2's attention always has q/k/v bias and never o bias.
      model.qkv_bias = true;
      model.o_bias = false;
      break;
    case Family::kQwen3:
      model.qk_norm = true;
      model.qkv_bias = model.o_bias = optional_bool(config, "attention_bias", false);
      break;
    case Family::kPanguEmbedded:
      model.qkv_bias = model.o_bias = optional_bool(config, "bias", true);
      break;
  }

  model.tied_embeddings = optional_bool(config, "tie_word_embeddings", false);

  switch (family) {
    case Family::kMistral:
      if (!config.contains("sliding_window")) {
        model.sliding_window = kMistralDefaultSlidingWindow;
      } else if (!config.at("sliding_window").is_null()) {
        model.sliding_window = optional_positive_int(config, "sliding_window", 0);
      }
      break;
    case Family::kQwen2:
    case Family::kQwen3:
      model.sliding_window = qwen_sliding_window(config, model.num_layers);
      break;
    default:
      break;
  }

  model.rope = parse_rope(config, *traits, model.head_dim, model.max_position_embeddings);

  if (present(config, "bos_token_id")) {
    model.bos_token_id = token_id(config.at("bos_token_id"), "bos_token_id", model.vocab_size);
  }
  if (present(config, "eos_token_id")) {
    const json& eos = config.at("eos_token_id");
    if (eos.is_array()) {
      for (size_t i = 0; i < eos.size(); ++i) {
        model.eos_token_ids.push_back(
            token_id(eos[i], "eos_token_id[" + std::to_string(i) + "]", model.vocab_size));
      }
    } else {
      model.eos_token_ids.push_back(token_id(eos, "eos_token_id", model.vocab_size));
    }
  }

  for (const char* field : {"torch_dtype", "dtype"}) {
    if (present(config, field) && config.at(field).is_string()) {
      model.torch_dtype = config.at(field).get<std::string>();
      break;
    }
  }
  return model;
}

ModelConfig load_hf_config(const std::string& config_path) {
  const json config = read_json_file(config_path, "model config");
  try {
    return parse_hf_config(config);
  } catch (const Error& error) {
    throw Error("model config '" + config_path + "': " + error.what());
  }
}

int64_t ModelConfig::parameter_count() const {
  const int64_t hidden = hidden_size;
  const int64_t q_width = static_cast<int64_t>(num_heads) * head_dim;
  const int64_t kv_width = static_cast<int64_t>(num_kv_heads) * head_dim;
  int64_t per_layer = 2 * hidden;                                            // two RMSNorm weights
  per_layer += hidden * q_width + 2 * hidden * kv_width + q_width * hidden;  // q, k, v, o
  per_layer += 3 * hidden * intermediate_size;                               // gate, up, down
  if (qkv_bias) per_layer += q_width + 2 * kv_width;
  if (o_bias) per_layer += hidden;
  if (qk_norm) per_layer += 2 * static_cast<int64_t>(head_dim);
  int64_t total = per_layer * num_layers;
  total += static_cast<int64_t>(vocab_size) * hidden;  // embedding
  if (!tied_embeddings) total += static_cast<int64_t>(vocab_size) * hidden;
  total += hidden;  // final norm
  return total;
}

}  // namespace entropyinfer

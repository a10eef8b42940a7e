#include "attention/attention_config.h"

#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <type_traits>

#include "core/error.h"
#include "core/json_reader.h"
#include "core/user_file.h"

namespace entropyinfer {
namespace {

[[noreturn]] void fail(const std::string& parameter, const std::string& problem) {
  throw Error("attention config: " + parameter + " " + problem);
}

void require_at_least(const std::string& parameter, int64_t value, int64_t minimum) {
  if (value < minimum) {
    fail(parameter,
         "must be at least " + std::to_string(minimum) + " (got " + std::to_string(value) + ")");
  }
}

void require_non_negative(const std::string& parameter, double value) {
  if (!std::isfinite(value) || value < 0.0) {
    std::ostringstream text;
    text << "must be a finite number >= 0 (got " << value << ")";
    fail(parameter, text.str());
  }
}

std::string pooling_name(Pooling pooling) {
  switch (pooling) {
    case Pooling::kAvg:
      return "avgpool";
    case Pooling::kMax:
      return "maxpool";
    case Pooling::kNone:
      return "none";
  }
  return "avgpool";
}

Pooling parse_pooling(const std::string& name) {
  if (name == "avgpool" || name == "avg") return Pooling::kAvg;
  if (name == "maxpool" || name == "max") return Pooling::kMax;
  if (name == "none") return Pooling::kNone;
  throw Error("attention config: pooling '" + name +
              "' is unknown (expected avgpool, maxpool or none)");
}

std::string aggregation_name(GroupAggregation aggregation) {
  return aggregation == GroupAggregation::kMax ? "max" : "mean";
}

GroupAggregation parse_aggregation(const std::string& name) {
  if (name == "mean") return GroupAggregation::kMean;
  if (name == "max") return GroupAggregation::kMax;
  throw Error("attention config: aggregation '" + name + "' is unknown (expected mean or max)");
}

// Reads a JSON value as a field of type T, naming the key when the type or range is wrong.
template <typename T>
T read_value(const std::string& key, const nlohmann::json& value) {
  bool ok = false;
  const char* expected = "a string";
  if constexpr (std::is_same_v<T, bool>) {
    expected = "true or false";
    ok = value.is_boolean();
  } else if constexpr (std::is_integral_v<T>) {
    expected = "an integer in the int range";
    if (value.is_number_unsigned()) {
      ok = value.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max());
    } else if (value.is_number_integer()) {
      const int64_t number = value.get<int64_t>();
      ok = number >= std::numeric_limits<T>::min() && number <= std::numeric_limits<T>::max();
    }
  } else if constexpr (std::is_floating_point_v<T>) {
    expected = "a number";
    ok = value.is_number();
  } else {
    ok = value.is_string();
  }
  if (!ok) {
    throw Error("attention config: '" + key + "' must be " + expected + " (got " + value.dump() +
                ")");
  }
  return value.get<T>();
}

using Setter = std::function<void(AttentionConfig&, const std::string&, const nlohmann::json&)>;

template <typename T, typename Params>
Setter field(Params AttentionConfig::*params, T Params::*member) {
  return [params, member](AttentionConfig& config, const std::string& key,
                          const nlohmann::json& value) {
    (config.*params).*member = read_value<T>(key, value);
  };
}

const std::map<std::string, Setter>& prefill_fields() {
  static const std::map<std::string, Setter> fields = {
      {"segment_size", field(&AttentionConfig::prefill_params, &PrefillParams::segment_size)},
      {"block_size", field(&AttentionConfig::prefill_params, &PrefillParams::block_size)},
      {"sparse_threshold",
       field(&AttentionConfig::prefill_params, &PrefillParams::sparse_threshold)},
      {"base_budget", field(&AttentionConfig::prefill_params, &PrefillParams::base_budget)},
      {"entropy_threshold",
       field(&AttentionConfig::prefill_params, &PrefillParams::entropy_threshold)},
      {"delta", field(&AttentionConfig::prefill_params, &PrefillParams::delta)},
      {"alpha", field(&AttentionConfig::prefill_params, &PrefillParams::alpha)},
      {"budget_cap_factor",
       field(&AttentionConfig::prefill_params, &PrefillParams::budget_cap_factor)},
      {"dense_layers", field(&AttentionConfig::prefill_params, &PrefillParams::dense_layers)},
      {"share_segment_budget",
       field(&AttentionConfig::prefill_params, &PrefillParams::share_segment_budget)},
      {"per_segment_rigid",
       field(&AttentionConfig::prefill_params, &PrefillParams::per_segment_rigid)},
      {"critiprefill_budget",
       field(&AttentionConfig::prefill_params, &PrefillParams::critiprefill_budget)},
  };
  return fields;
}

const std::map<std::string, Setter>& decode_fields() {
  static const std::map<std::string, Setter> fields = {
      {"budget", field(&AttentionConfig::decode_params, &DecodeParams::budget)},
      {"window", field(&AttentionConfig::decode_params, &DecodeParams::window)},
      {"gap", field(&AttentionConfig::decode_params, &DecodeParams::gap)},
      {"pooling",
       [](AttentionConfig& config, const std::string& key, const nlohmann::json& value) {
         config.decode_params.pooling = parse_pooling(read_value<std::string>(key, value));
       }},
      {"pool_kernel", field(&AttentionConfig::decode_params, &DecodeParams::pool_kernel)},
      {"aggregation",
       [](AttentionConfig& config, const std::string& key, const nlohmann::json& value) {
         config.decode_params.aggregation = parse_aggregation(read_value<std::string>(key, value));
       }},
      {"per_query_head", field(&AttentionConfig::decode_params, &DecodeParams::per_query_head)},
      {"sink_tokens", field(&AttentionConfig::decode_params, &DecodeParams::sink_tokens)},
      {"adakv_floor", field(&AttentionConfig::decode_params, &DecodeParams::adakv_floor)},
      {"pyramid_beta", field(&AttentionConfig::decode_params, &DecodeParams::pyramid_beta)},
  };
  return fields;
}

void read_section(AttentionConfig& config, const nlohmann::json& section,
                  const std::map<std::string, Setter>& fields, const std::string& section_name) {
  if (!section.is_object()) {
    throw Error("attention config: '" + section_name + "' must be an object");
  }
  for (const auto& [key, value] : section.items()) {
    const auto found = fields.find(key);
    if (found == fields.end()) {
      throw Error("attention config: unknown key '" + key + "' in '" + section_name + "'");
    }
    found->second(config, key, value);
  }
}

}  // namespace

void AttentionConfig::validate() const {
  const PrefillParams& p = prefill_params;
  require_at_least("segment_size", p.segment_size, 1);
  require_at_least("block_size", p.block_size, 1);
  if (p.segment_size % p.block_size != 0) {
    fail("segment_size", std::string("(") + std::to_string(p.segment_size) +
                             ") must be a multiple of block_size (" + std::to_string(p.block_size) +
                             ")");
  }
  // A threshold that is not a multiple of segment_size is accepted: the first sparse segment is the
  // first one that starts at or after it, which is well defined for any segment size.
  require_at_least("sparse_threshold", p.sparse_threshold, 0);
  require_at_least("base_budget", p.base_budget, p.block_size);
  require_non_negative("entropy_threshold", p.entropy_threshold);
  require_non_negative("delta", p.delta);
  require_non_negative("alpha", p.alpha);
  require_at_least("budget_cap_factor", p.budget_cap_factor, 1);
  if (static_cast<int64_t>(p.base_budget) * p.budget_cap_factor > (int64_t{1} << 30)) {
    fail("budget_cap_factor", "times base_budget exceeds 2^30 tokens");
  }
  require_at_least("dense_layers", p.dense_layers, 0);
  require_at_least("critiprefill_budget", p.critiprefill_budget, p.block_size);

  const DecodeParams& d = decode_params;
  require_at_least("budget", d.budget, 1);
  require_at_least("window", d.window, 1);
  if (d.window > d.budget) {
    fail("window", std::string("(") + std::to_string(d.window) +
                       ") must not exceed the decode budget (" + std::to_string(d.budget) +
                       "): the window is always kept");
  }
  require_at_least("gap", d.gap, 0);
  if (d.gap >= d.window) {
    fail("gap", std::string("(") + std::to_string(d.gap) + ") must be smaller than window (" +
                    std::to_string(d.window) + "): the window holds the gap's generated queries");
  }
  require_at_least("pool_kernel", d.pool_kernel, 1);
  if (d.pool_kernel % 2 == 0) {
    fail("pool_kernel", std::string("(") + std::to_string(d.pool_kernel) +
                            ") must be odd so that pooling keeps the length");
  }
  require_at_least("sink_tokens", d.sink_tokens, 0);
  if (d.sink_tokens > d.budget) {
    fail("sink_tokens", std::string("(") + std::to_string(d.sink_tokens) +
                            ") must not exceed the decode budget (" + std::to_string(d.budget) +
                            ")");
  }
  if (!std::isfinite(d.adakv_floor) || d.adakv_floor < 0.0 || d.adakv_floor > 1.0) {
    std::ostringstream text;
    text << "must lie in [0, 1] (got " << d.adakv_floor << ")";
    fail("adakv_floor", text.str());
  }
  if (!std::isfinite(d.pyramid_beta) || d.pyramid_beta < 1.0) {
    std::ostringstream text;
    text << "must be a finite number >= 1 (got " << d.pyramid_beta << ")";
    fail("pyramid_beta", text.str());
  }
}

AttentionConfig attention_config_from_json(const nlohmann::json& json) {
  if (!json.is_object()) throw Error("attention config: the top level must be a JSON object");
  AttentionConfig config;
  for (const auto& [key, value] : json.items()) {
    if (key == "prefill") {
      config.prefill = parse_prefill_method(read_value<std::string>(key, value));
    } else if (key == "decode") {
      config.decode = parse_decode_method(read_value<std::string>(key, value));
    } else if (key == "prefill_params") {
      read_section(config, value, prefill_fields(), key);
    } else if (key == "decode_params") {
      read_section(config, value, decode_fields(), key);
    } else if (const auto found = prefill_fields().find(key); found != prefill_fields().end()) {
      found->second(config, key, value);
    } else if (const auto found_decode = decode_fields().find(key);
               found_decode != decode_fields().end()) {
      found_decode->second(config, key, value);
    } else {
      throw Error("attention config: unknown key '" + key + "'");
    }
  }
  config.validate();
  return config;
}

AttentionConfig load_attention_config(const std::string& path) {
  const nlohmann::json json = read_json_file(path, "attention config");
  try {
    return attention_config_from_json(json);
  } catch (const Error& error) {
    throw Error(std::string(error.what()) + " (in '" + path + "')");
  }
}

nlohmann::json attention_config_to_json(const AttentionConfig& config) {
  const PrefillParams& p = config.prefill_params;
  const DecodeParams& d = config.decode_params;
  nlohmann::json json;
  json["prefill"] = prefill_method_name(config.prefill);
  json["decode"] = decode_method_name(config.decode);
  json["prefill_params"] = {
      {"segment_size", p.segment_size},
      {"block_size", p.block_size},
      {"sparse_threshold", p.sparse_threshold},
      {"base_budget", p.base_budget},
      {"entropy_threshold", p.entropy_threshold},
      {"delta", p.delta},
      {"alpha", p.alpha},
      {"budget_cap_factor", p.budget_cap_factor},
      {"dense_layers", p.dense_layers},
      {"share_segment_budget", p.share_segment_budget},
      {"per_segment_rigid", p.per_segment_rigid},
      {"critiprefill_budget", p.critiprefill_budget},
  };
  json["decode_params"] = {
      {"budget", d.budget},
      {"window", d.window},
      {"gap", d.gap},
      {"pooling", pooling_name(d.pooling)},
      {"pool_kernel", d.pool_kernel},
      {"aggregation", aggregation_name(d.aggregation)},
      {"per_query_head", d.per_query_head},
      {"sink_tokens", d.sink_tokens},
      {"adakv_floor", d.adakv_floor},
      {"pyramid_beta", d.pyramid_beta},
  };
  return json;
}

AttentionConfig with_methods(const std::string& text, const AttentionConfig& base) {
  AttentionConfig config = base;
  const size_t plus = text.find('+');
  const std::string prefill = text.substr(0, plus);
  if (prefill == kPerSegmentEntropyName) {
    config.prefill = PrefillMethod::kEntropy;
    config.prefill_params.per_segment_rigid = true;
  } else {
    config.prefill = parse_prefill_method(prefill);
  }
  config.decode =
      plus == std::string::npos ? DecodeMethod::kFull : parse_decode_method(text.substr(plus + 1));
  config.validate();
  return config;
}

PrefillMethod parse_prefill_method(const std::string& name) {
  if (name == "full") return PrefillMethod::kFull;
  if (name == "entropy") return PrefillMethod::kEntropy;
  if (name == "critiprefill") return PrefillMethod::kCritiPrefill;
  throw Error("unknown prefill method '" + name + "' (expected full, entropy or critiprefill)");
}

DecodeMethod parse_decode_method(const std::string& name) {
  if (name == "full") return DecodeMethod::kFull;
  if (name == "latent") return DecodeMethod::kLatent;
  if (name == "snapkv") return DecodeMethod::kSnapKV;
  if (name == "adakv") return DecodeMethod::kAdaKV;
  if (name == "streaming" || name == "streamingllm") return DecodeMethod::kStreamingLLM;
  if (name == "pyramidkv") return DecodeMethod::kPyramidKV;
  throw Error("unknown decode method '" + name +
              "' (expected full, latent, snapkv, adakv, streaming or pyramidkv)");
}

std::string prefill_method_name(PrefillMethod method) {
  switch (method) {
    case PrefillMethod::kFull:
      return "full";
    case PrefillMethod::kEntropy:
      return "entropy";
    case PrefillMethod::kCritiPrefill:
      return "critiprefill";
  }
  return "full";
}

std::string decode_method_name(DecodeMethod method) {
  switch (method) {
    case DecodeMethod::kFull:
      return "full";
    case DecodeMethod::kLatent:
      return "latent";
    case DecodeMethod::kSnapKV:
      return "snapkv";
    case DecodeMethod::kAdaKV:
      return "adakv";
    case DecodeMethod::kStreamingLLM:
      return "streaming";
    case DecodeMethod::kPyramidKV:
      return "pyramidkv";
  }
  return "full";
}

}  // namespace entropyinfer

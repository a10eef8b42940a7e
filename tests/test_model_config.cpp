// config.json parsing: every supported family, every RoPE variant, and one test per way a config
// can be wrong, each asserting that the message names the problem.
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "model/model_config.h"
#include "safetensors_writer.h"
#include "test_support.h"

namespace entropyinfer {
namespace {

using nlohmann::json;
using testing::error_message_of;
using testing::mentions_all;

// Real config.json files of released models, trimmed to the fields the loader reads.
json llama2_7b() {
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
    "hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 32, "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-05, "rope_scaling": null, "tie_word_embeddings": false,
    "torch_dtype": "float16", "vocab_size": 32000, "bos_token_id": 1, "eos_token_id": 2})");
}

json llama31_8b() {
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "attention_bias": false, "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu", "hidden_size": 4096,
    "intermediate_size": 14336, "max_position_embeddings": 131072, "mlp_bias": false,
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "vocab_size": 128256})");
}

json llama32_1b() {
  json config = llama31_8b();
  config["hidden_size"] = 2048;
  config["intermediate_size"] = 8192;
  config["num_hidden_layers"] = 16;
  config["head_dim"] = 64;
  config["tie_word_embeddings"] = true;
  config["rope_scaling"]["factor"] = 32.0;
  return config;
}

json qwen25_05b() {
  return json::parse(R"({
    "architectures": ["Qwen2ForCausalLM"], "bos_token_id": 151643, "eos_token_id": 151645,
    "hidden_act": "silu", "hidden_size": 896, "intermediate_size": 4864,
    "max_position_embeddings": 32768, "max_window_layers": 21, "model_type": "qwen2",
    "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768,
    "tie_word_embeddings": true, "torch_dtype": "bfloat16", "use_sliding_window": false,
    "vocab_size": 151936})");
}

json qwen3_06b() {
  return json::parse(R"({
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "bos_token_id": 151643,
    "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024,
    "intermediate_size": 3072, "max_position_embeddings": 40960, "max_window_layers": 28,
    "model_type": "qwen3", "num_attention_heads": 16, "num_hidden_layers": 28,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": null,
    "rope_theta": 1000000, "sliding_window": null, "tie_word_embeddings": true,
    "torch_dtype": "bfloat16", "use_sliding_window": false, "vocab_size": 151936})");
}

json mistral_7b_v01() {
  return json::parse(R"({
    "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336,
    "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": false,
    "torch_dtype": "bfloat16", "vocab_size": 32000})");
}

json pangu_7b() {
  return json::parse(R"({
    "architectures": ["PanguEmbeddedForCausalLM"], "model_type": "PanguEmbedded", "bias": true,
    "bos_token_id": 1, "eos_token_id": 45892, "hidden_act": "silu", "hidden_size": 4096,
    "intermediate_size": 12800, "max_position_embeddings": 32768, "num_attention_heads": 32,
    "num_hidden_layers": 34, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
    "rope_theta": 16000000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "vocab_size": 153376})");
}

// A small valid Llama config to break in one place per test.
json small_llama() {
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "vocab_size": 100, "max_position_embeddings": 256})");
}

std::string parse_error(const json& config) {
  return error_message_of([&] { parse_hf_config(config); });
}

double yarn_mscale(double factor) { return 0.1 * std::log(factor) + 1.0; }

// ------------------------------------------------------------------------------------------------
// Families

TEST(ModelConfig, Llama2ReadsSizesAndDefaults) {
  const ModelConfig config = parse_hf_config(llama2_7b());
  EXPECT_EQ(config.architecture, "LlamaForCausalLM");
  EXPECT_EQ(config.hidden_size, 4096);
  EXPECT_EQ(config.intermediate_size, 11008);
  EXPECT_EQ(config.num_layers, 32);
  EXPECT_EQ(config.num_heads, 32);
  EXPECT_EQ(config.num_kv_heads, 32);
  EXPECT_EQ(config.head_dim, 128);
  EXPECT_EQ(config.vocab_size, 32000);
  EXPECT_EQ(config.max_position_embeddings, 4096);
  EXPECT_FLOAT_EQ(config.rms_norm_eps, 1e-5f);
  EXPECT_FALSE(config.qkv_bias);
  EXPECT_FALSE(config.o_bias);
  EXPECT_FALSE(config.qk_norm);
  EXPECT_FALSE(config.tied_embeddings);
  EXPECT_FALSE(config.sliding_window.has_value());
  EXPECT_EQ(config.rope.scaling, RopeScaling::kDefault);
  EXPECT_DOUBLE_EQ(config.rope.theta, 10000.0);  // LlamaConfig's default when rope_theta is absent
  EXPECT_EQ(config.rope.rotary_dim, 128);
  EXPECT_FALSE(config.rope.rotate_adjacent_pairs);
  EXPECT_EQ(config.bos_token_id, 1);
  EXPECT_EQ(config.eos_token_ids, std::vector<int>{2});
  EXPECT_EQ(config.torch_dtype, "float16");
}

TEST(ModelConfig, Llama2ParameterCountMatchesThePublishedFigure) {
  EXPECT_EQ(parse_hf_config(llama2_7b()).parameter_count(), 6738415616);
}

TEST(ModelConfig, Llama31ReadsLlama3RopeScalingAndEosList) {
  const ModelConfig config = parse_hf_config(llama31_8b());
  EXPECT_EQ(config.num_kv_heads, 8);
  EXPECT_EQ(config.head_dim, 128);
  EXPECT_EQ(config.rope.scaling, RopeScaling::kLlama3);
  EXPECT_DOUBLE_EQ(config.rope.theta, 500000.0);
  EXPECT_DOUBLE_EQ(config.rope.factor, 8.0);
  EXPECT_DOUBLE_EQ(config.rope.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(config.rope.high_freq_factor, 4.0);
  EXPECT_EQ(config.rope.original_max_position_embeddings, 8192);
  EXPECT_EQ(config.eos_token_ids, (std::vector<int>{128001, 128008, 128009}));
  EXPECT_EQ(config.bos_token_id, 128000);
}

TEST(ModelConfig, Llama32TiesEmbeddingsAndTakesExplicitHeadDim) {
  const ModelConfig config = parse_hf_config(llama32_1b());
  EXPECT_TRUE(config.tied_embeddings);
  EXPECT_EQ(config.head_dim, 64);
  EXPECT_EQ(config.rope.rotary_dim, 64);
  EXPECT_DOUBLE_EQ(config.rope.factor, 32.0);
  // Llama 3.2 1B has 1.24B parameters with the embedding counted once.
  EXPECT_EQ(config.parameter_count(), 1235814400);
}

TEST(ModelConfig, UntiedCountsTheClassifierSeparately) {
  json config = llama32_1b();
  config["tie_word_embeddings"] = false;
  const ModelConfig untied = parse_hf_config(config);
  EXPECT_FALSE(untied.tied_embeddings);
  EXPECT_EQ(untied.parameter_count() - parse_hf_config(llama32_1b()).parameter_count(),
            int64_t{128256} * 2048);
}

TEST(ModelConfig, LlamaAttentionBiasMeansBiasOnQkvAndO) {
  json config = small_llama();
  config["attention_bias"] = true;
  const ModelConfig parsed = parse_hf_config(config);
  EXPECT_TRUE(parsed.qkv_bias);
  EXPECT_TRUE(parsed.o_bias);
  EXPECT_FALSE(parsed.qk_norm);
}

TEST(ModelConfig, Qwen2HasQkvBiasButNoOBias) {
  const ModelConfig config = parse_hf_config(qwen25_05b());
  EXPECT_TRUE(config.qkv_bias);
  EXPECT_FALSE(config.o_bias);
  EXPECT_FALSE(config.qk_norm);
  EXPECT_TRUE(config.tied_embeddings);
  EXPECT_EQ(config.head_dim, 64);
  EXPECT_DOUBLE_EQ(config.rope.theta, 1e6);
  EXPECT_FLOAT_EQ(config.rms_norm_eps, 1e-6f);
  // use_sliding_window false: the sliding_window value is not in effect.
  EXPECT_FALSE(config.sliding_window.has_value());
  EXPECT_EQ(config.parameter_count(), 494032768);
}

TEST(ModelConfig, Qwen25YarnRopeScaling) {
  json config = qwen25_05b();
  config["rope_scaling"] = {
      {"factor", 4.0}, {"original_max_position_embeddings", 32768}, {"type", "yarn"}};
  const ModelConfig parsed = parse_hf_config(config);
  EXPECT_EQ(parsed.rope.scaling, RopeScaling::kYarn);
  EXPECT_DOUBLE_EQ(parsed.rope.factor, 4.0);
  EXPECT_EQ(parsed.rope.original_max_position_embeddings, 32768);
  EXPECT_DOUBLE_EQ(parsed.rope.beta_fast, 32.0);
  EXPECT_DOUBLE_EQ(parsed.rope.beta_slow, 1.0);
  ASSERT_TRUE(parsed.rope.attention_factor.has_value());
  EXPECT_DOUBLE_EQ(*parsed.rope.attention_factor, yarn_mscale(4.0));
}

TEST(ModelConfig, Qwen3ExplicitHeadDimDiffersFromHiddenOverHeads) {
  const ModelConfig config = parse_hf_config(qwen3_06b());
  EXPECT_EQ(config.head_dim, 128);  // hidden/heads would be 64
  EXPECT_EQ(config.rope.rotary_dim, 128);
  EXPECT_TRUE(config.qk_norm);
  EXPECT_FALSE(config.qkv_bias);
  EXPECT_FALSE(config.o_bias);
  EXPECT_DOUBLE_EQ(config.rope.theta, 1e6);
  EXPECT_EQ(config.parameter_count(), 596049920);
}

TEST(ModelConfig, Qwen3WithoutHeadDimTakesTheFamilyDefault) {
  json config = qwen3_06b();
  config.erase("head_dim");
  EXPECT_EQ(parse_hf_config(config).head_dim, 128);  // Qwen3Config's default, not hidden/heads
}

TEST(ModelConfig, Qwen3HonoursAttentionBias) {
  json config = qwen3_06b();
  config["attention_bias"] = true;
  const ModelConfig parsed = parse_hf_config(config);
  EXPECT_TRUE(parsed.qkv_bias);
  EXPECT_TRUE(parsed.o_bias);
  EXPECT_TRUE(parsed.qk_norm);
}

TEST(ModelConfig, MistralSlidingWindow) {
  EXPECT_EQ(parse_hf_config(mistral_7b_v01()).sliding_window, 4096);
  json later = mistral_7b_v01();
  later["sliding_window"] = nullptr;  // v0.2 and later
  EXPECT_FALSE(parse_hf_config(later).sliding_window.has_value());
  json absent = mistral_7b_v01();
  absent.erase("sliding_window");  // MistralConfig's default applies
  EXPECT_EQ(parse_hf_config(absent).sliding_window, 4096);
  const ModelConfig parsed = parse_hf_config(mistral_7b_v01());
  EXPECT_FALSE(parsed.qkv_bias);
  EXPECT_EQ(parsed.num_kv_heads, 8);
}

TEST(ModelConfig, PanguBiasMeansBiasOnQkvAndO) {
  const ModelConfig config = parse_hf_config(pangu_7b());
  EXPECT_EQ(config.architecture, "PanguEmbeddedForCausalLM");
  EXPECT_TRUE(config.qkv_bias);
  EXPECT_TRUE(config.o_bias);
  EXPECT_FALSE(config.qk_norm);
  EXPECT_FALSE(config.tied_embeddings);
  EXPECT_EQ(config.num_layers, 34);
  EXPECT_EQ(config.vocab_size, 153376);
  EXPECT_DOUBLE_EQ(config.rope.theta, 1.6e7);
  EXPECT_EQ(config.eos_token_ids, std::vector<int>{45892});

  json no_bias = pangu_7b();
  no_bias["bias"] = false;
  EXPECT_FALSE(parse_hf_config(no_bias).qkv_bias);
  EXPECT_FALSE(parse_hf_config(no_bias).o_bias);
}

TEST(ModelConfig, PanguDefaultsFollowItsConfigClass) {
  json config = pangu_7b();
  config.erase("bias");
  config.erase("rope_theta");
  config.erase("rms_norm_eps");
  const ModelConfig parsed = parse_hf_config(config);
  EXPECT_TRUE(parsed.qkv_bias);
  EXPECT_TRUE(parsed.o_bias);
  EXPECT_DOUBLE_EQ(parsed.rope.theta, 1.6e7);
  EXPECT_FLOAT_EQ(parsed.rms_norm_eps, 1e-5f);
}

// ------------------------------------------------------------------------------------------------
// RoPE variants

TEST(ModelConfigRope, Linear) {
  json config = small_llama();
  config["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  const ModelConfig parsed = parse_hf_config(config);
  EXPECT_EQ(parsed.rope.scaling, RopeScaling::kLinear);
  EXPECT_DOUBLE_EQ(parsed.rope.factor, 2.0);
}

TEST(ModelConfigRope, DynamicDefaultsItsOriginalContextToMaxPositions) {
  json config = small_llama();
  config["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 3.0}};
  const ModelConfig parsed = parse_hf_config(config);
  EXPECT_EQ(parsed.rope.scaling, RopeScaling::kDynamic);
  EXPECT_DOUBLE_EQ(parsed.rope.factor, 3.0);
  EXPECT_EQ(parsed.rope.original_max_position_embeddings, 256);

  config["rope_scaling"]["original_max_position_embeddings"] = 128;
  EXPECT_EQ(parse_hf_config(config).rope.original_max_position_embeddings, 128);
}

TEST(ModelConfigRope, Llama3OriginalContextDefaultsToMaxPositions) {
  json config = small_llama();
  config["rope_scaling"] = {{"rope_type", "llama3"},
                            {"factor", 8.0},
                            {"low_freq_factor", 2.0},
                            {"high_freq_factor", 6.0}};
  const ModelConfig parsed = parse_hf_config(config);
  EXPECT_EQ(parsed.rope.scaling, RopeScaling::kLlama3);
  EXPECT_DOUBLE_EQ(parsed.rope.low_freq_factor, 2.0);
  EXPECT_DOUBLE_EQ(parsed.rope.high_freq_factor, 6.0);
  EXPECT_EQ(parsed.rope.original_max_position_embeddings, 256);
}

TEST(ModelConfigRope, YarnExplicitParameters) {
  json config = small_llama();
  config["rope_scaling"] = {
      {"rope_type", "yarn"}, {"factor", 4.0},  {"original_max_position_embeddings", 64},
      {"beta_fast", 16},     {"beta_slow", 2}, {"attention_factor", 1.25}};
  const ModelConfig parsed = parse_hf_config(config);
  EXPECT_EQ(parsed.rope.scaling, RopeScaling::kYarn);
  EXPECT_DOUBLE_EQ(parsed.rope.beta_fast, 16.0);
  EXPECT_DOUBLE_EQ(parsed.rope.beta_slow, 2.0);
  EXPECT_EQ(parsed.rope.original_max_position_embeddings, 64);
  EXPECT_DOUBLE_EQ(parsed.rope.attention_factor.value_or(-1.0), 1.25);
}

TEST(ModelConfigRope, YarnMscaleGivesTheRatioOfTwoCorrections) {
  json config = small_llama();
  config["rope_scaling"] = {{"rope_type", "yarn"},
                            {"factor", 40.0},
                            {"original_max_position_embeddings", 4096},
                            {"mscale", 1.0},
                            {"mscale_all_dim", 0.5}};
  const ModelConfig parsed = parse_hf_config(config);
  const double expected = (0.1 * 1.0 * std::log(40.0) + 1.0) / (0.1 * 0.5 * std::log(40.0) + 1.0);
  EXPECT_DOUBLE_EQ(parsed.rope.attention_factor.value_or(-1.0), expected);
}

TEST(ModelConfigRope, YarnWithoutFactorUsesTheContextRatio) {
  json config = small_llama();
  config["rope_scaling"] = {
      {"rope_type", "yarn"}, {"factor", nullptr}, {"original_max_position_embeddings", 64}};
  const ModelConfig parsed = parse_hf_config(config);
  EXPECT_DOUBLE_EQ(parsed.rope.factor, 4.0);  // 256 / 64
  EXPECT_DOUBLE_EQ(parsed.rope.attention_factor.value_or(-1.0), yarn_mscale(4.0));
}

TEST(ModelConfigRope, Transformers5RopeParametersCarryTheta) {
  json config = small_llama();
  config["rope_parameters"] = {{"rope_type", "linear"}, {"factor", 2.5}, {"rope_theta", 50000.0}};
  const ModelConfig parsed = parse_hf_config(config);
  EXPECT_EQ(parsed.rope.scaling, RopeScaling::kLinear);
  EXPECT_DOUBLE_EQ(parsed.rope.factor, 2.5);
  EXPECT_DOUBLE_EQ(parsed.rope.theta, 50000.0);
}

TEST(ModelConfigRope, RopeParametersAndRopeScalingThatAgreeAreAccepted) {
  json config = small_llama();
  config["rope_theta"] = 500000;
  config["rope_parameters"] = {{"rope_type", "yarn"},
                               {"type", "yarn"},
                               {"factor", 4.0},
                               {"rope_theta", 500000.0},
                               {"original_max_position_embeddings", 64}};
  config["rope_scaling"] = {
      {"type", "yarn"}, {"factor", 4}, {"original_max_position_embeddings", 64}};
  const ModelConfig parsed = parse_hf_config(config);
  EXPECT_EQ(parsed.rope.scaling, RopeScaling::kYarn);
  EXPECT_DOUBLE_EQ(parsed.rope.theta, 500000.0);
}

TEST(ModelConfigRope, DefaultTypeInRopeParameters) {
  json config = small_llama();
  config["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e6}};
  const ModelConfig parsed = parse_hf_config(config);
  EXPECT_EQ(parsed.rope.scaling, RopeScaling::kDefault);
  EXPECT_DOUBLE_EQ(parsed.rope.theta, 1e6);
}

TEST(ModelConfigRope, PartialRotaryFactor) {
  json config = small_llama();
  config["partial_rotary_factor"] = 0.5;
  EXPECT_EQ(parse_hf_config(config).rope.rotary_dim, 8);  // head_dim 16
}

TEST(ModelConfigRope, UnknownTypeIsNamed) {
  json config = small_llama();
  config["rope_scaling"] = {{"rope_type", "longrope"}, {"factor", 2.0}};
  EXPECT_TRUE(mentions_all(parse_error(config), {"unsupported RoPE type 'longrope'", "yarn"}));
}

TEST(ModelConfigRope, FactorMissingForLinearIsNamed) {
  json config = small_llama();
  config["rope_scaling"] = {{"type", "linear"}};
  EXPECT_TRUE(mentions_all(parse_error(config), {"'linear'", "rope_scaling.factor"}));
}

TEST(ModelConfigRope, NonPositiveFactorIsRejected) {
  json config = small_llama();
  config["rope_scaling"] = {{"type", "dynamic"}, {"factor", -2.0}};
  EXPECT_TRUE(mentions_all(parse_error(config), {"rope_scaling.factor", "positive"}));
}

TEST(ModelConfigRope, Llama3FrequencyFactorsOutOfOrderAreRejected) {
  json config = small_llama();
  config["rope_scaling"] = {{"rope_type", "llama3"},
                            {"factor", 8.0},
                            {"low_freq_factor", 4.0},
                            {"high_freq_factor", 1.0}};
  EXPECT_TRUE(mentions_all(parse_error(config), {"high_freq_factor", "low_freq_factor"}));
}

TEST(ModelConfigRope, YarnWithoutTruncationIsRejected) {
  json config = small_llama();
  config["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"truncate", false}};
  EXPECT_TRUE(mentions_all(parse_error(config), {"truncate"}));
}

TEST(ModelConfigRope, ContradictoryThetaIsRejected) {
  json config = small_llama();
  config["rope_theta"] = 10000.0;
  config["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 500000.0}};
  EXPECT_TRUE(mentions_all(parse_error(config), {"rope_theta", "500000", "contradict"}));
}

TEST(ModelConfigRope, ContradictoryScalingDictsAreRejected) {
  json config = small_llama();
  config["rope_parameters"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  config["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 4.0}};
  EXPECT_TRUE(mentions_all(parse_error(config),
                           {"rope_parameters.factor", "rope_scaling.factor", "contradict"}));
}

TEST(ModelConfigRope, ContradictoryTypeKeysAreRejected) {
  json config = small_llama();
  config["rope_scaling"] = {{"rope_type", "linear"}, {"type", "dynamic"}, {"factor", 2.0}};
  EXPECT_TRUE(mentions_all(parse_error(config), {"linear", "dynamic", "contradict"}));
}

TEST(ModelConfigRope, OddRotaryDimensionIsRejected) {
  json config = small_llama();
  config["head_dim"] = 15;
  EXPECT_TRUE(mentions_all(parse_error(config), {"rotary dimension", "15"}));
}

// ------------------------------------------------------------------------------------------------
// Bad configs

TEST(ModelConfigErrors, UnsupportedArchitectureIsNamedWithTheSupportedList) {
  json config = small_llama();
  config["architectures"] = {"GPT2LMHeadModel"};
  EXPECT_TRUE(mentions_all(parse_error(config),
                           {"unsupported architecture 'GPT2LMHeadModel'", "LlamaForCausalLM",
                            "Qwen3ForCausalLM", "PanguEmbeddedForCausalLM"}));
}

TEST(ModelConfigErrors, MissingArchitectures) {
  json config = small_llama();
  config.erase("architectures");
  EXPECT_TRUE(mentions_all(parse_error(config), {"architectures", "missing"}));
  config["architectures"] = json::array();
  EXPECT_TRUE(mentions_all(parse_error(config), {"architectures"}));
}

TEST(ModelConfigErrors, MissingSizeIsNamed) {
  json config = small_llama();
  config.erase("intermediate_size");
  EXPECT_TRUE(mentions_all(parse_error(config), {"intermediate_size", "missing"}));
}

TEST(ModelConfigErrors, NonPositiveSizeIsNamed) {
  json config = small_llama();
  config["num_hidden_layers"] = 0;
  EXPECT_TRUE(mentions_all(parse_error(config), {"num_hidden_layers", "positive"}));
  config = small_llama();
  config["vocab_size"] = -5;
  EXPECT_TRUE(mentions_all(parse_error(config), {"vocab_size", "-5"}));
}

TEST(ModelConfigErrors, NonIntegerSizeIsNamed) {
  json config = small_llama();
  config["hidden_size"] = "64";
  EXPECT_TRUE(mentions_all(parse_error(config), {"hidden_size", "integer"}));
  config["hidden_size"] = 64.5;
  EXPECT_TRUE(mentions_all(parse_error(config), {"hidden_size", "integer"}));
}

TEST(ModelConfigErrors, HeadsNotDivisibleByKvHeads) {
  json config = small_llama();
  config["num_key_value_heads"] = 3;
  EXPECT_TRUE(mentions_all(parse_error(config), {"num_attention_heads", "num_key_value_heads"}));
}

TEST(ModelConfigErrors, HiddenNotDivisibleByHeadsWithoutHeadDim) {
  json config = small_llama();
  config["hidden_size"] = 66;
  EXPECT_TRUE(mentions_all(parse_error(config), {"hidden_size", "66", "head_dim"}));
  config["head_dim"] = 16;  // stated explicitly, the ratio no longer matters
  EXPECT_EQ(parse_hf_config(config).head_dim, 16);
}

TEST(ModelConfigErrors, TokenIdOutsideTheVocabulary) {
  json config = small_llama();
  config["eos_token_id"] = {2, 100};
  EXPECT_TRUE(mentions_all(parse_error(config), {"eos_token_id[1]", "100", "vocabulary"}));
}

TEST(ModelConfigErrors, UnsupportedActivationAndMlpBias) {
  json config = small_llama();
  config["hidden_act"] = "gelu";
  EXPECT_TRUE(mentions_all(parse_error(config), {"hidden_act", "gelu"}));
  config = small_llama();
  config["mlp_bias"] = true;
  EXPECT_TRUE(mentions_all(parse_error(config), {"mlp_bias"}));
}

TEST(ModelConfigErrors, NonBooleanFlag) {
  json config = small_llama();
  config["tie_word_embeddings"] = "yes";
  EXPECT_TRUE(mentions_all(parse_error(config), {"tie_word_embeddings", "true or false"}));
}

TEST(ModelConfigErrors, QwenSlidingWindowOnSomeLayersIsRejected) {
  json config = qwen25_05b();
  config["use_sliding_window"] = true;  // layers 21..23 of 24 would slide
  EXPECT_TRUE(mentions_all(parse_error(config), {"sliding-window", "3 of 24"}));
  config["max_window_layers"] = 0;  // every layer slides: representable
  EXPECT_EQ(parse_hf_config(config).sliding_window, 32768);
}

TEST(ModelConfig, QwenNullWindowTurnsSlidingOff) {
  json config = qwen25_05b();
  config["use_sliding_window"] = true;
  config["sliding_window"] = nullptr;
  EXPECT_FALSE(parse_hf_config(config).sliding_window.has_value());
}

TEST(ModelConfigErrors, NotAnObject) {
  EXPECT_TRUE(mentions_all(parse_error(json::array()), {"object"}));
}

TEST(ModelConfigFile, MissingFileIsNamed) {
  EXPECT_TRUE(mentions_all(
      error_message_of([] { load_hf_config("/nonexistent/entropyinfer/config.json"); }),
      {"/nonexistent/entropyinfer/config.json"}));
}

TEST(ModelConfigFile, InvalidJsonIsNamed) {
  testing::TempFolder folder("config-json");
  testing::write_file_bytes(folder.file("config.json"), "{\"hidden_size\": 64,");
  EXPECT_TRUE(mentions_all(error_message_of([&] { load_hf_config(folder.file("config.json")); }),
                           {folder.file("config.json"), "not valid JSON"}));
}

TEST(ModelConfigFile, FieldErrorsNameTheFile) {
  testing::TempFolder folder("config-field");
  json config = small_llama();
  config["num_attention_heads"] = -4;
  testing::write_file_bytes(folder.file("config.json"), config.dump());
  EXPECT_TRUE(mentions_all(error_message_of([&] { load_hf_config(folder.file("config.json")); }),
                           {folder.file("config.json"), "num_attention_heads"}));
}

TEST(ModelConfigFile, ReadsAValidFile) {
  testing::TempFolder folder("config-ok");
  testing::write_file_bytes(folder.file("config.json"), qwen3_06b().dump());
  const ModelConfig config = load_hf_config(folder.file("config.json"));
  EXPECT_EQ(config.architecture, "Qwen3ForCausalLM");
  EXPECT_EQ(config.num_layers, 28);
}

}  // namespace
}  // namespace entropyinfer

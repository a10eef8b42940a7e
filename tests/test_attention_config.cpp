// Attention configuration: the released defaults, validation (one clear error naming the parameter
// for each impossible setting), JSON reading and writing, method names and the policy factories.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "attention/attention_config.h"
#include "attention/decode_policy.h"
#include "attention/prefill_policy.h"
#include "core/error.h"
#include "test_support.h"

namespace entropyinfer {
namespace {

// Runs `body`, expecting an Error whose message names `parameter`.
void expect_error_naming(const std::function<void()>& body, const std::string& parameter) {
  try {
    body();
    ADD_FAILURE() << "no error for " << parameter;
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find(parameter), std::string::npos)
        << "message '" << error.what() << "' does not name " << parameter;
  }
}

void expect_invalid(const std::function<void(AttentionConfig&)>& change,
                    const std::string& parameter) {
  AttentionConfig config;
  change(config);
  expect_error_naming([&] { config.validate(); }, parameter);
}

TEST(AttentionConfig, DefaultsAreTheReleasedOnesAndValid) {
  const AttentionConfig config;
  EXPECT_NO_THROW(config.validate());
  EXPECT_EQ(config.prefill_params.segment_size, 512);
  EXPECT_EQ(config.prefill_params.block_size, 8);
  EXPECT_EQ(config.prefill_params.sparse_threshold, 4096);
  EXPECT_EQ(config.prefill_params.base_budget, 2048);
  EXPECT_DOUBLE_EQ(config.prefill_params.entropy_threshold, 1e-5);
  EXPECT_DOUBLE_EQ(config.prefill_params.delta, 0.4);
  EXPECT_DOUBLE_EQ(config.prefill_params.alpha, 0.5);
  EXPECT_EQ(config.prefill_params.budget_cap_factor, 3);
  EXPECT_EQ(config.prefill_params.dense_layers, 1);
  EXPECT_FALSE(config.prefill_params.share_segment_budget);
  EXPECT_EQ(config.decode_params.budget, 1024);
  EXPECT_EQ(config.decode_params.window, 32);
  EXPECT_EQ(config.decode_params.gap, 16);
  EXPECT_EQ(config.decode_params.pooling, Pooling::kAvg);
  EXPECT_EQ(config.decode_params.pool_kernel, 5);
  EXPECT_EQ(config.decode_params.aggregation, GroupAggregation::kMean);
  EXPECT_FALSE(config.decode_params.per_query_head);
  EXPECT_EQ(config.decode_params.sink_tokens, 4);
}

TEST(AttentionConfig, EachImpossibleSettingIsRejectedNamingItsParameter) {
  expect_invalid([](auto& c) { c.prefill_params.segment_size = 0; }, "segment_size");
  expect_invalid([](auto& c) { c.prefill_params.segment_size = 500; }, "segment_size");
  expect_invalid([](auto& c) { c.prefill_params.block_size = 0; }, "block_size");
  expect_invalid([](auto& c) { c.prefill_params.sparse_threshold = -1; }, "sparse_threshold");
  expect_invalid([](auto& c) { c.prefill_params.base_budget = 0; }, "base_budget");
  expect_invalid([](auto& c) { c.prefill_params.base_budget = -64; }, "base_budget");
  expect_invalid([](auto& c) { c.prefill_params.base_budget = 4; }, "base_budget");  // < one block
  expect_invalid([](auto& c) { c.prefill_params.entropy_threshold = -1e-6; }, "entropy_threshold");
  expect_invalid([](auto& c) { c.prefill_params.delta = -0.1; }, "delta");
  expect_invalid([](auto& c) { c.prefill_params.alpha = -0.5; }, "alpha");
  expect_invalid([](auto& c) { c.prefill_params.alpha = std::nan(""); }, "alpha");
  expect_invalid([](auto& c) { c.prefill_params.budget_cap_factor = 0; }, "budget_cap_factor");
  expect_invalid([](auto& c) { c.prefill_params.dense_layers = -1; }, "dense_layers");
  expect_invalid([](auto& c) { c.prefill_params.critiprefill_budget = 0; }, "critiprefill_budget");
  expect_invalid([](auto& c) { c.decode_params.budget = 0; }, "budget");
  expect_invalid([](auto& c) { c.decode_params.budget = -5; }, "budget");
  expect_invalid([](auto& c) { c.decode_params.window = 0; }, "window");
  expect_invalid([](auto& c) { c.decode_params.window = 2048; }, "window");  // > budget 1024
  expect_invalid([](auto& c) { c.decode_params.gap = -1; }, "gap");
  expect_invalid([](auto& c) { c.decode_params.gap = 32; }, "gap");  // >= window
  expect_invalid([](auto& c) { c.decode_params.pool_kernel = 4; }, "pool_kernel");
  expect_invalid([](auto& c) { c.decode_params.pool_kernel = 0; }, "pool_kernel");
  expect_invalid([](auto& c) { c.decode_params.sink_tokens = -1; }, "sink_tokens");
  expect_invalid([](auto& c) { c.decode_params.sink_tokens = 2000; }, "sink_tokens");
  expect_invalid([](auto& c) { c.decode_params.adakv_floor = -0.1; }, "adakv_floor");
  expect_invalid([](auto& c) { c.decode_params.adakv_floor = 1.5; }, "adakv_floor");
  expect_invalid([](auto& c) { c.decode_params.pyramid_beta = 0.5; }, "pyramid_beta");
}

TEST(AttentionConfig, BoundaryValuesAreAccepted) {
  AttentionConfig config;
  config.prefill_params.entropy_threshold = 0.0;
  config.prefill_params.delta = 0.0;
  config.prefill_params.alpha = 0.0;
  config.prefill_params.budget_cap_factor = 1;
  config.prefill_params.dense_layers = 0;
  config.prefill_params.sparse_threshold = 4000;  // not a multiple of 512: first segment at >= 4000
  config.decode_params.window = config.decode_params.budget;
  config.decode_params.gap = 0;
  config.decode_params.pool_kernel = 1;
  config.decode_params.adakv_floor = 1.0;
  config.decode_params.sink_tokens = 0;
  EXPECT_NO_THROW(config.validate());
}

TEST(AttentionConfig, JsonRoundTripsEveryField) {
  AttentionConfig config;
  config.prefill = PrefillMethod::kEntropy;
  config.decode = DecodeMethod::kAdaKV;
  config.prefill_params.segment_size = 256;
  config.prefill_params.block_size = 16;
  config.prefill_params.sparse_threshold = 1024;
  config.prefill_params.base_budget = 512;
  config.prefill_params.entropy_threshold = 2e-5;
  config.prefill_params.delta = 0.3;
  config.prefill_params.alpha = 0.7;
  config.prefill_params.budget_cap_factor = 4;
  config.prefill_params.dense_layers = 2;
  config.prefill_params.share_segment_budget = true;
  config.prefill_params.critiprefill_budget = 1024;
  config.decode_params.budget = 512;
  config.decode_params.window = 64;
  config.decode_params.gap = 8;
  config.decode_params.pooling = Pooling::kMax;
  config.decode_params.pool_kernel = 7;
  config.decode_params.aggregation = GroupAggregation::kMax;
  config.decode_params.per_query_head = true;
  config.decode_params.sink_tokens = 8;
  config.decode_params.adakv_floor = 0.1;
  config.decode_params.pyramid_beta = 10.0;
  const nlohmann::json json = attention_config_to_json(config);
  const AttentionConfig back = attention_config_from_json(json);
  EXPECT_EQ(attention_config_to_json(back), json);
  EXPECT_EQ(back.prefill, PrefillMethod::kEntropy);
  EXPECT_EQ(back.decode, DecodeMethod::kAdaKV);
  EXPECT_EQ(back.decode_params.pooling, Pooling::kMax);
  EXPECT_TRUE(back.prefill_params.share_segment_budget);
  EXPECT_EQ(json["decode_params"]["pooling"], "maxpool");
}

TEST(AttentionConfig, JsonAcceptsFlatAndNestedKeys) {
  const auto config = attention_config_from_json(nlohmann::json::parse(
      R"({"prefill": "critiprefill", "decode": "latent", "segment_size": 1024, "budget": 2048,
          "decode_params": {"pooling": "none", "aggregation": "max"},
          "prefill_params": {"delta": 0.25}})"));
  EXPECT_EQ(config.prefill, PrefillMethod::kCritiPrefill);
  EXPECT_EQ(config.decode, DecodeMethod::kLatent);
  EXPECT_EQ(config.prefill_params.segment_size, 1024);
  EXPECT_EQ(config.decode_params.budget, 2048);
  EXPECT_EQ(config.decode_params.pooling, Pooling::kNone);
  EXPECT_EQ(config.decode_params.aggregation, GroupAggregation::kMax);
  EXPECT_DOUBLE_EQ(config.prefill_params.delta, 0.25);
  EXPECT_EQ(config.prefill_params.block_size, 8);  // untouched fields keep their defaults
}

TEST(AttentionConfig, JsonErrorsNameTheKey) {
  using nlohmann::json;
  expect_error_naming([] { attention_config_from_json(json::parse(R"({"segmnet_size": 4})")); },
                      "segmnet_size");
  expect_error_naming(
      [] { attention_config_from_json(json::parse(R"({"decode_params": {"segment_size": 4}})")); },
      "segment_size");
  expect_error_naming([] { attention_config_from_json(json::parse(R"({"budget": "many"})")); },
                      "budget");
  expect_error_naming([] { attention_config_from_json(json::parse(R"({"budget": 10.5})")); },
                      "budget");
  expect_error_naming([] { attention_config_from_json(json::parse(R"({"window": 1e12})")); },
                      "window");
  expect_error_naming(
      [] { attention_config_from_json(json::parse(R"({"block_size": 4294967304})")); },
      "block_size");
  expect_error_naming(
      [] { attention_config_from_json(json::parse(R"({"share_segment_budget": 1})")); },
      "share_segment_budget");
  expect_error_naming([] { attention_config_from_json(json::parse(R"({"pooling": "median"})")); },
                      "median");
  expect_error_naming([] { attention_config_from_json(json::parse(R"({"prefill": "fast"})")); },
                      "fast");
  expect_error_naming([] { attention_config_from_json(json::parse(R"({"gap": 40})")); }, "gap");
  expect_error_naming([] { attention_config_from_json(json::parse("[1, 2]")); }, "object");
}

TEST(AttentionConfig, LoadsFromFileAndReportsThePath) {
  const auto dir = std::filesystem::temp_directory_path() / "entropyinfer_attention_config_test";
  std::filesystem::create_directories(dir);
  const auto good = dir / "good.json";
  std::ofstream(good) << R"({"prefill": "entropy", "decode": "snapkv", "window": 24})";
  const AttentionConfig config = load_attention_config(good.string());
  EXPECT_EQ(config.prefill, PrefillMethod::kEntropy);
  EXPECT_EQ(config.decode_params.window, 24);
  const auto bad = dir / "bad.json";
  std::ofstream(bad) << R"({"prefill": "entropy", "delta": -1})";
  expect_error_naming([&] { load_attention_config(bad.string()); }, "bad.json");
  const auto broken = dir / "broken.json";
  std::ofstream(broken) << "{\"prefill\": ";
  expect_error_naming([&] { load_attention_config(broken.string()); }, "broken.json");
  expect_error_naming([&] { load_attention_config((dir / "missing.json").string()); },
                      "missing.json");
  std::filesystem::remove_all(dir);
}

TEST(AttentionConfig, MethodNamesParseAndPrint) {
  for (PrefillMethod method :
       {PrefillMethod::kFull, PrefillMethod::kEntropy, PrefillMethod::kCritiPrefill}) {
    EXPECT_EQ(parse_prefill_method(prefill_method_name(method)), method);
  }
  for (DecodeMethod method :
       {DecodeMethod::kFull, DecodeMethod::kLatent, DecodeMethod::kSnapKV, DecodeMethod::kAdaKV,
        DecodeMethod::kStreamingLLM, DecodeMethod::kPyramidKV}) {
    EXPECT_EQ(parse_decode_method(decode_method_name(method)), method);
  }
  EXPECT_EQ(parse_decode_method("streamingllm"), DecodeMethod::kStreamingLLM);
  expect_error_naming([] { parse_prefill_method("Entropy"); }, "Entropy");
  expect_error_naming([] { parse_decode_method("h2o"); }, "h2o");
}

TEST(AttentionConfig, MethodPairsNameThePerSegmentVariant) {
  const AttentionConfig released = with_methods("entropy+latent", AttentionConfig{});
  EXPECT_EQ(released.prefill, PrefillMethod::kEntropy);
  EXPECT_FALSE(released.prefill_params.per_segment_rigid);
  const AttentionConfig variant = with_methods("entropy-segment+latent", AttentionConfig{});
  EXPECT_EQ(variant.prefill, PrefillMethod::kEntropy);
  EXPECT_EQ(variant.decode, DecodeMethod::kLatent);
  EXPECT_TRUE(variant.prefill_params.per_segment_rigid);
  EXPECT_EQ(with_methods("critiprefill", AttentionConfig{}).decode, DecodeMethod::kFull);
  expect_error_naming([] { with_methods("entropy-segments+latent", AttentionConfig{}); },
                      "entropy-segments");
}

TEST(AttentionConfig, FactoriesBuildTheNamedPolicies) {
  AttentionConfig config;
  EXPECT_EQ(make_prefill_policy(config)->name(), "full");
  EXPECT_EQ(make_decode_policy(config), nullptr);
  const std::pair<PrefillMethod, std::string> prefill[] = {
      {PrefillMethod::kEntropy, "entropy"}, {PrefillMethod::kCritiPrefill, "critiprefill"}};
  for (const auto& [method, name] : prefill) {
    config.prefill = method;
    EXPECT_EQ(make_prefill_policy(config)->name(), name);
  }
  const std::pair<DecodeMethod, std::string> decode[] = {{DecodeMethod::kLatent, "latent"},
                                                         {DecodeMethod::kSnapKV, "snapkv"},
                                                         {DecodeMethod::kAdaKV, "adakv"},
                                                         {DecodeMethod::kStreamingLLM, "streaming"},
                                                         {DecodeMethod::kPyramidKV, "pyramidkv"}};
  for (const auto& [method, name] : decode) {
    config.decode = method;
    EXPECT_EQ(make_decode_policy(config)->name(), name);
  }
  config.decode = DecodeMethod::kLatent;
  EXPECT_EQ(make_decode_policy(config)->compress_after_generated(), 16);
  config.decode_params.window = 0;
  expect_error_naming([&] { make_decode_policy(config); }, "window");
}

}  // namespace
}  // namespace entropyinfer

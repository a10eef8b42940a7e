// Which attention policies run and with what parameters. Defaults are the released ones
// (docs/method.md section 5). Every field can be set from a JSON config file and from command-line
// flags; validate() rejects contradictory or impossible settings with one clear Error.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>

namespace entropyinfer {

enum class PrefillMethod { kFull, kEntropy, kCritiPrefill };
enum class DecodeMethod { kFull, kLatent, kSnapKV, kAdaKV, kStreamingLLM, kPyramidKV };
enum class Pooling { kAvg, kMax, kNone };
enum class GroupAggregation { kMean, kMax };

struct PrefillParams {
  int segment_size = 512;           // S: query segment length
  int block_size = 8;               // b: key block length
  int sparse_threshold = 4096;      // segments starting before this are dense
  int base_budget = 2048;           // tokens
  double entropy_threshold = 1e-5;  // e_t: below it in every segment, a head is rigid
  double delta = 0.4;               // delta_t
  double alpha = 0.5;
  int budget_cap_factor = 3;  // budgets are clamped to [base, factor * base]
  int dense_layers = 1;       // the first layers run dense
  // The released code gives every head of a segment the largest budget among them; the project
  // honours each (KV head, segment) budget. true reproduces the released behaviour.
  bool share_segment_budget = false;
  // The paper's rule makes a head rigid (every segment at the base budget) only when every one of
  // its segments is below e_t. With per_segment_rigid, each segment below e_t takes the base budget
  // on its own and the others follow the entropy recursion: a variant to measure, not the default.
  bool per_segment_rigid = false;
  int critiprefill_budget = 2048;  // CritiPrefill's one fixed budget, tokens
};

struct DecodeParams {
  int budget = 1024;  // K: cache entries kept per head
  int window = 32;    // W: observation window, always kept
  int gap = 16;       // G: generated tokens before the latent compression
  Pooling pooling = Pooling::kAvg;
  int pool_kernel = 5;
  GroupAggregation aggregation = GroupAggregation::kMean;  // scores of a GQA group -> one KV head
  // The released code selects per query head (copying each KV head g times); kept as an option.
  bool per_query_head = false;
  int sink_tokens = 4;         // StreamingLLM
  double adakv_floor = 0.2;    // AdaKV: each head keeps at least this fraction of (K - W)
  double pyramid_beta = 20.0;  // PyramidKV: top-layer budget is K / beta ... see policy file
};

struct AttentionConfig {
  PrefillMethod prefill = PrefillMethod::kFull;
  DecodeMethod decode = DecodeMethod::kFull;
  PrefillParams prefill_params;
  DecodeParams decode_params;

  void validate() const;  // throws Error naming the parameter and the problem
};

// JSON keys are the field names above ("prefill": "entropy", "decode": "latent", "segment_size":
// 512,
// ... flat or nested under "prefill_params"/"decode_params"). Unknown keys are an error.
AttentionConfig attention_config_from_json(const nlohmann::json& json);
AttentionConfig load_attention_config(const std::string& path);
nlohmann::json attention_config_to_json(const AttentionConfig& config);

PrefillMethod parse_prefill_method(const std::string& name);  // full, entropy, critiprefill
DecodeMethod parse_decode_method(
    const std::string& name);  // full, latent, snapkv, adakv, streaming, pyramidkv
std::string prefill_method_name(PrefillMethod method);
std::string decode_method_name(DecodeMethod method);

// "prefill[+decode]" (e.g. "entropy+latent"; the decode method is full when left out) applied to
// `base`, validated; Error naming the bad part. The prefill may also be kPerSegmentEntropyName:
// EntropyInfer's prefill with per_segment_rigid on, so that an evaluation ranks the variant
// beside the released rule in one run.
constexpr const char* kPerSegmentEntropyName = "entropy-segment";
AttentionConfig with_methods(const std::string& text, const AttentionConfig& base);

}  // namespace entropyinfer

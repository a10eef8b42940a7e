// The concrete attention policies. make_prefill_policy / make_decode_policy build them from an
// AttentionConfig; tests and tools may also build one directly from its parameters.
#pragma once

#include <string>

#include "attention/attention_config.h"
#include "attention/decode_policy.h"
#include "attention/prefill_policy.h"

namespace entropyinfer {

// --- Prefill (full_prefill.cpp, entropy_prefill.cpp, critiprefill.cpp)
// -----------------------------

// Dense attention for every layer and segment.
class FullPrefillPolicy final : public PrefillPolicy {
 public:
  explicit FullPrefillPolicy(const PrefillParams& params) : params_(params) {}
  std::string name() const override { return "full"; }
  LayerPrefillPlan plan(const PrefillInputs& inputs) const override;

 private:
  PrefillParams params_;
};

// Entropy-guided, per-(KV head, segment) budgets (docs/method.md section 2).
class EntropyPrefillPolicy final : public PrefillPolicy {
 public:
  explicit EntropyPrefillPolicy(const PrefillParams& params);
  std::string name() const override { return "entropy"; }
  LayerPrefillPlan plan(const PrefillInputs& inputs) const override;

 private:
  PrefillParams params_;
};

// The same estimate with one fixed budget (critiprefill_budget) for every head and segment.
class CritiPrefillPolicy final : public PrefillPolicy {
 public:
  explicit CritiPrefillPolicy(const PrefillParams& params) : params_(params) {}
  std::string name() const override { return "critiprefill"; }
  LayerPrefillPlan plan(const PrefillInputs& inputs) const override;

 private:
  PrefillParams params_;
};

// --- Decode (latent_decode.cpp, snapkv.cpp, adakv.cpp, streaming_llm.cpp, pyramidkv.cpp)
// ----------

// EntropyInfer's latent compression: SnapKV's selection, run once G generated tokens have been
// seen, the window then ending in their queries (docs/method.md section 3).
class LatentDecodePolicy final : public DecodePolicy {
 public:
  explicit LatentDecodePolicy(const DecodeParams& params) : params_(params) {}
  std::string name() const override { return "latent"; }
  int compress_after_generated() const override { return params_.gap; }
  LayerDecodePlan plan(const DecodeInputs& inputs) const override;

 private:
  DecodeParams params_;
};

// SnapKV: compress right after prefill with the last W prompt queries as the window.
class SnapKVPolicy final : public DecodePolicy {
 public:
  explicit SnapKVPolicy(const DecodeParams& params) : params_(params) {}
  std::string name() const override { return "snapkv"; }
  int compress_after_generated() const override { return 0; }
  LayerDecodePlan plan(const DecodeInputs& inputs) const override;

 private:
  DecodeParams params_;
};

// AdaKV: SnapKV's scores, the layer's candidate budget shared across heads (see adakv.cpp).
class AdaKVPolicy final : public DecodePolicy {
 public:
  explicit AdaKVPolicy(const DecodeParams& params) : params_(params) {}
  std::string name() const override { return "adakv"; }
  int compress_after_generated() const override { return 0; }
  LayerDecodePlan plan(const DecodeInputs& inputs) const override;

 private:
  DecodeParams params_;
};

// StreamingLLM: the first sink_tokens entries and the most recent K - sink_tokens.
class StreamingLLMPolicy final : public DecodePolicy {
 public:
  explicit StreamingLLMPolicy(const DecodeParams& params) : params_(params) {}
  std::string name() const override { return "streaming"; }
  int compress_after_generated() const override { return 0; }
  bool needs_window_queries() const override { return false; }
  LayerDecodePlan plan(const DecodeInputs& inputs) const override;

 private:
  DecodeParams params_;
};

// PyramidKV: SnapKV's selection with budgets shrinking linearly from the bottom layer to the top
// one (see pyramidkv.cpp for the formula).
class PyramidKVPolicy final : public DecodePolicy {
 public:
  explicit PyramidKVPolicy(const DecodeParams& params) : params_(params) {}
  std::string name() const override { return "pyramidkv"; }
  int compress_after_generated() const override { return 0; }
  LayerDecodePlan plan(const DecodeInputs& inputs) const override;

 private:
  DecodeParams params_;
};

}  // namespace entropyinfer

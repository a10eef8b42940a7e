// The one interface every command runs a model through, whatever the device: a CPU executor
// (engine/transformer.h) and a CUDA executor (engine/cuda/cuda_transformer.h) implement it, and
// make_language_model picks one from EngineOptions::device. Generation, evaluation and inspection
// are written once against this class.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "attention/attention_config.h"
#include "attention/decode_plan.h"
#include "attention/prefill_plan.h"
#include "model/model_config.h"
#include "model/model_weights.h"

namespace entropyinfer {

// What the attention policies did, so that every time can be read next to the work behind it.
struct AttentionWork {
  // Prefill: keys read summed over layers, KV heads and queries, and what full causal attention
  // would have read over the same spans.
  int64_t prefill_keys_read = 0;
  int64_t prefill_keys_dense = 0;
  // Decode-cache compression (once per generation).
  bool compressed = false;
  int64_t cache_entries_before = 0;  // summed over layers and cache heads
  int64_t cache_entries_after = 0;
  size_t cache_bytes_before = 0;  // allocated cache memory just before / after compressing
  size_t cache_bytes_after = 0;
};

// One layer's queries and keys after RoPE, as set_capture_attention_inputs collects them.
struct CapturedAttentionInputs {
  int64_t tokens = 0;
  std::vector<float> queries;  // [tokens][num_heads][head_dim]
  std::vector<float> keys;     // [tokens][num_kv_heads][head_dim]
};

// What an executor keeps for inspection and tests while asked to (LanguageModel's
// set_record_plans and set_capture_attention_inputs); both executors fill it alike.
struct AttentionRecording {
  bool record_plans = false;
  std::vector<LayerPrefillPlan> prefill_plans;
  std::vector<LayerDecodePlan> decode_plans;
  bool capture_inputs = false;
  std::vector<CapturedAttentionInputs> captured;  // one per layer while capturing

  // Appends m tokens' rotated queries ([m][q_width]) and keys ([m][kv_width]) to `layer`.
  void capture(int layer, const float* queries, int64_t q_width, const float* keys,
               int64_t kv_width, int64_t m);
};

class LanguageModel {
 public:
  virtual ~LanguageModel() = default;

  // Runs `tokens` at positions [position(), position() + n), appends their keys and values to the
  // cache and returns fp32 logits: [n, vocab] row-major when all_logits, else [vocab] for the last
  // token. The first call after reset() is the prefill, where the prefill policy applies; the
  // decode policy compresses the cache once, after the prefill or after its number of generated
  // tokens. Throws Error when the tokens do not fit in the context or an id is outside the
  // vocabulary.
  virtual std::vector<float> forward(std::span<const int32_t> tokens, bool all_logits = false) = 0;
  // forward(), returning only the id of the largest last-token logit; Error, naming the id, for a
  // NaN or +inf logit or when every logit is -inf.
  virtual int32_t forward_greedy(std::span<const int32_t> tokens);

  virtual void reset() = 0;  // forgets the sequence (and any compression)
  // Pays once, before any request, what a first request would pay for (an executor's kernel and
  // algorithm choices, decode graphs): runs a prompt of up to one prompt chunk and a few decode
  // steps under the current attention policies, then forgets them. Timings after it are steady.
  // Executors with nothing to warm do nothing.
  virtual void warm_up() {}
  // Switches the attention policies and forgets the sequence: the same weights measured under
  // several methods. Throws Error naming the problem for an invalid configuration.
  virtual void set_attention(const AttentionConfig& attention) = 0;

  virtual int position() const = 0;
  virtual int context_length() const = 0;
  virtual const ModelConfig& config() const = 0;
  virtual const AttentionConfig& attention_config() const = 0;
  virtual size_t kv_cache_bytes() const = 0;  // allocated now
  virtual const AttentionWork& attention_work() const = 0;

  // Keep every layer's prefill plan of the next prefill, and its decode plan of the compression,
  // for inspection (the CUDA executor reads each back as it is made, a synchronisation each).
  void set_record_plans(bool record) { recording_.record_plans = record; }
  const std::vector<LayerPrefillPlan>& recorded_plans() const { return recording_.prefill_plans; }
  // One per layer once the cache is compressed while plans are recorded: the cache indices each
  // head kept (an empty plan for a layer its policy left whole).
  const std::vector<LayerDecodePlan>& recorded_decode_plans() const {
    return recording_.decode_plans;
  }

  // While on, every forward pass appends each layer's queries and keys after RoPE, so that a
  // policy's decisions can be rebuilt outside the model from what the model computed. Costly (the
  // CUDA executor copies them back and decodes without its graph): for tests and inspection.
  // Turning it on forgets what an earlier capture held.
  void set_capture_attention_inputs(bool capture);
  const std::vector<CapturedAttentionInputs>& captured_attention_inputs() const {
    return recording_.captured;
  }

  // Called during long forward passes with (tokens done, tokens total), for progress display.
  using ProgressCallback = std::function<void(int64_t done, int64_t total)>;
  virtual void set_progress_callback(ProgressCallback callback) = 0;

  // What reports call the device, e.g. "cpu (8 threads)" or "cuda (NVIDIA H200)".
  virtual std::string device_name() const = 0;
  // The executor's memory plan in one line, where it plans memory up front (empty otherwise).
  virtual std::string memory_description() const { return {}; }

 protected:
  AttentionRecording recording_;
};

enum class Device { kCpu, kCuda };

// The precision of the CUDA executor's prompt attention (cuda::CudaModelOptions::prompt_attention
// says where each runs). kAuto: FP8 for dense attention with the FP8 KV cache.
enum class PromptAttention { kAuto, kBf16, kFp8 };
// "auto", "bf16" or "fp8"; Error otherwise.
PromptAttention parse_prompt_attention(const std::string& name);

// "cpu" or "cuda"; Error otherwise.
Device parse_device(const std::string& name);
const char* device_label(Device device);
// Whether this build has an executor for `device` and the machine has the device.
bool device_available(Device device);
// Error saying which of the two is missing, when one is.
void check_device(Device device);

// cuda: prompt tokens per pass through the layers, unless a command is told otherwise. Whole
// 16k-token chunks keep each product's weights reused across many rows (bench's measured setting).
constexpr int kDefaultChunkTokens = 16384;

struct EngineOptions {
  Device device = Device::kCpu;
  int context_length = 0;  // 0 means the model's max_position_embeddings
  AttentionConfig attention;
  // cuda: prompt tokens per pass through the layers (bounds activation memory).
  int chunk_tokens = kDefaultChunkTokens;
  // cuda: after compression the cache keeps room for this many more tokens (at most the rest of
  // the context); decoding past it is an error.
  int decode_room = 4096;
  // cuda: called as the weights go up, with (bytes read, bytes in all).
  std::function<void(int64_t done, int64_t total)> upload_progress;
  // The KV cache in FP8 (core/fp8.h, fp8_kv_round_trip_row): every cached row of keys and of values
  // of each head is held as E4M3 codes with one fp32 scale of its own. The CUDA executor stores the
  // codes; the CPU executor, the reference, stores each row as it reads back after quantization.
  bool fp8_kv_cache = false;
  PromptAttention prompt_attention = PromptAttention::kAuto;  // cuda only
};

// The model on `options.device`. The CPU executor reads `weights` in place, which must then
// outlive the model; the CUDA executor copies them to the GPU, so `weights` may be released once
// this returns. Error for a device this build or machine does not have.
std::unique_ptr<LanguageModel> make_language_model(const ModelWeights& weights,
                                                   const EngineOptions& options);

}  // namespace entropyinfer

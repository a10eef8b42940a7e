// The dense decoder on the GPU, mirroring engine/transformer.cpp for full attention at batch 1:
// bf16 weights (q/k/v and gate/up fused into one product each), bf16 head-major KV cache, fp32
// residual stream. Prompts run in chunks of chunk_tokens through all layers, so activation memory
// stays bounded at any prompt length; single tokens decode with split-KV attention. All GPU memory
// (weights, the cache for the whole context, activations) is planned up front and allocated up
// front, except under compress_during_prefill (one layer's full cache at a time).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "attention/attention_config.h"
#include "attention/prefill_plan.h"
#include "engine/language_model.h"
#include "model/model_config.h"
#include "model/model_weights.h"

namespace entropyinfer::cuda {

struct CudaModelOptions {
  int context_length = 0;                  // 0 means the model's max_position_embeddings
  int chunk_tokens = kDefaultChunkTokens;  // prompt tokens per pass through the layers
  // Called as the weights go up, with (bytes read, bytes in all); may be empty.
  std::function<void(int64_t done, int64_t total)> upload_progress;
  AttentionConfig attention;  // prefill and decode methods with their parameters
  // Full-attention prompts (from position 0) also run layer by layer, one attention launch per
  // layer over the whole prompt. Sparse prefill methods always do. Either costs context * (4 *
  // hidden + 4 * query width) bytes of activations more than the chunked path.
  bool layer_major_prefill = false;
  // After compression the cache keeps room for this many more tokens (at most the rest of the
  // context); decoding past it is an error.
  int decode_room = 4096;
  // Decode methods that compress right after the prompt (SnapKV, AdaKV, PyramidKV, StreamingLLM)
  // compress each layer as soon as its prefill is done, from the same window queries, so only one
  // layer's full cache ever exists: the prompt runs layer by layer, no full cache is allocated up
  // front, and the longest prompt is bounded by the prompt's activations instead of the whole
  // model's full cache. The selections are those of compressing after the prefill. Needs such a
  // decode method (not latent, which waits for generated tokens) and the prompt in one call.
  bool compress_during_prefill = false;
  // How the products over a whole prompt chunk pick their cuBLASLt algorithm on first use
  // (Blas::set_autotune): the heuristic's first choice; the fastest of eight in a short burst; or
  // the fastest of eight under sustained load, where the GPU's power cap sets the clock as it does
  // through a long prefill (about a second per product shape, once).
  enum class GemmTuning { kHeuristic, kBurst, kSustained };
  GemmTuning gemm_tuning = GemmTuning::kBurst;
  // FP8 products (core/fp8.h): every layer's projections held as E4M3 codes with one scale per
  // output row, their inputs quantized per token. A model built from weights decides this from
  // them (on when every projection is FP8 with quantized inputs, as a checkpoint or
  // quantize_weights_fp8 makes them); with random weights, on draws them in bf16 and quantizes
  // each row.
  bool fp8_weights = false;
  // FP8 products of 9-64 rows (decode batches) run unscaled with the scales applied by a kernel of
  // their own (Blas::set_fp8_separate_scaling).
  bool fp8_separate_scaling = true;
  // An FP8 KV cache (EngineOptions::fp8_kv_cache): E4M3 codes with one fp32 scale per cached row
  // of each head. Prompt attention and the estimate read one layer's rows widened to bf16 in a
  // staging slab (FP8 prompt attention, see prompt_attention, quantizes them again with a scale
  // per KV head); decode reads the codes (ragged_decode_fp8).
  bool fp8_kv_cache = false;
  // Prompt attention in FP8 (flash_prefill_fp8 and, for the sparse prefill methods,
  // flash_prefill_block_sparse_fp8: Q, K, V and the softmax weights in E4M3 on the FP8 tensor
  // cores) where it can run: a Hopper build and device, head_dim 64 or 128, and for a sparse plan
  // blocks and segments of multiples of 8 keys. Elsewhere prompt attention stays bf16. The prefill
  // estimate reads bf16 keys either way. kAuto: FP8 with the FP8 cache, as vLLM's FP8 cache runs
  // FlashAttention-3 in FP8, for dense plans only. The sparse FP8 kernel runs the method's plans
  // 1.15x faster than bf16 at 128k (a whole 128k entropy prefill 3.5% shorter:
  // bench/results/gpu-2026-12-07-fp8-sparse-attention.md), but the shipped model's eval has not
  // been run with it, so sparse plans run in FP8 with kFp8 alone.
  using PromptAttention = entropyinfer::PromptAttention;
  PromptAttention prompt_attention = PromptAttention::kAuto;
};

// What the attention policies did in the last prefill and compression (AttentionWork), with the
// GPU's own timings, for reading each time next to the work behind it.
struct CudaAttentionWork : AttentionWork {
  // GPU time (CUDA events) of the estimate (block extrema, scores, entropy, budgets, selection) and
  // of the prefill attention launches, summed over layers; layer-major prefills only.
  double estimate_ms = 0;
  double prefill_attention_ms = 0;
  double compression_ms = 0;  // wall time of the one-time compression
  // Of it: allocating the compressed caches and freeing the full ones (host wall time).
  double compression_memory_ms = 0;
  // With set_stage_timing: the last prefill's GPU time per part (embedding, norms, each product,
  // pointwise kernels, cache writes, estimate, attention, logits, compression), in milliseconds.
  std::vector<std::pair<std::string, double>> prefill_stage_ms;
};

// Bytes a model needs on the GPU.
struct GpuMemoryPlan {
  size_t weights = 0;
  size_t kv_cache = 0;
  size_t activations = 0;
  bool fp8_weights = false;           // the projections are FP8 codes
  bool fp8_kv_cache = false;          // the cache is FP8 codes with row scales
  bool fp8_prompt_attention = false;  // full-attention prompts attend in FP8
  size_t total() const { return weights + kv_cache + activations; }
  std::string describe() const;
};

// The CUDA executor of LanguageModel.
class CudaTransformer : public LanguageModel {
 public:
  // Uploads `weights` (fp32 on the host) as bf16; norms and biases stay fp32.
  CudaTransformer(const ModelWeights& weights, const CudaModelOptions& options = {});
  // A model of `config`'s shape with random weights drawn on the GPU (uniform in +-1/sqrt(fan_in),
  // embeddings in +-1, norms 1): for speed measurements of shapes with no checkpoint at hand.
  CudaTransformer(const ModelConfig& config, uint64_t seed, const CudaModelOptions& options = {});
  ~CudaTransformer() override;
  CudaTransformer(const CudaTransformer&) = delete;
  CudaTransformer& operator=(const CudaTransformer&) = delete;

  // Runs `tokens` at positions [position(), position() + n) and appends their keys and values to
  // the cache; returns fp32 logits, [n, vocab] when all_logits, else [vocab] for the last token.
  // Throws Error when the tokens do not fit in the context or an id is outside the vocabulary.
  std::vector<float> forward(std::span<const int32_t> tokens, bool all_logits = false) override;
  // The same, returning only the id of the largest last-token logit (chosen on the GPU).
  int32_t forward_greedy(std::span<const int32_t> tokens) override;

  void reset() override;  // forgets the sequence; a compressed cache is re-allocated at full size
  // A prompt of chunk_tokens + 1 tokens (so whole-chunk products tune their algorithms) and 24
  // decode steps (past the latent gap), each within the context.
  void warm_up() override;

  // Switches the attention policies (and forgets the sequence): the same model measured under
  // several methods. Throws Error naming the problem for an invalid configuration, or when the
  // policies' buffers do not fit.
  void set_attention(const AttentionConfig& attention, bool layer_major_prefill);
  void set_attention(const AttentionConfig& attention) override;
  int position() const override;
  int context_length() const override;
  const ModelConfig& config() const override;
  const AttentionConfig& attention_config() const override;
  const GpuMemoryPlan& memory_plan() const;
  const CudaAttentionWork& attention_work() const override;

  // Reports after each chunk or layer of a prompt longer than chunk_tokens; it waits for the GPU
  // to get there, which costs a synchronisation per layer.
  void set_progress_callback(ProgressCallback callback) override;
  std::string device_name() const override;
  std::string memory_description() const override;  // memory_plan().describe()
  // Time every part of the next prefills with CUDA events (attention_work().prefill_stage_ms).
  // The events add a few microseconds per part, so timings meant as headline numbers leave it off.
  void set_stage_timing(bool timing);
  size_t kv_cache_bytes() const override;  // allocated now (it shrinks when compressed)

  // What a model of `config` needs with `options`; construction throws Error (naming the bytes
  // needed and free) when it is more than the GPU has free.
  static GpuMemoryPlan plan(const ModelConfig& config, const CudaModelOptions& options);

  // --- Serving (engine/cuda/cuda_batch_model.cu): the model's own cache holds one resident
  // sequence while it prefills (and, for latent compression, until it compresses); its cache is
  // then stored into pages of a pool, and many stored sequences decode together.

  // A prompt from position 0, layer-major, in slices (a chunk of a layer's products, a range of
  // its attention's queries) so that other sequences' decode steps run between them.
  // run_prompt_work() enqueues slices while `budget` token-layers last (engine/prefill_work.h; at
  // least one) and returns the work it enqueued. The slices are the same whatever the budget, so
  // the prompt's results do not depend on it. finish_prompt() returns the last token's logits
  // after compressing when the decode method compresses right after the prompt.
  // With every_row, every prompt row runs through the last layer, and finish_prompt() also hands
  // each row's logits to `each_rows` (required then), in order, kScoredPromptRows rows at a time:
  // the output head runs on those rows on the GPU and they come down into host memory, so no
  // [n, vocab] array exists anywhere.
  using LogitRowsCallback = std::function<void(int64_t first_row, std::span<const float> rows)>;
  static constexpr int64_t kScoredPromptRows = 64;
  void begin_prompt(std::span<const int32_t> tokens, bool every_row = false);
  bool prompt_layers_done() const;
  double run_prompt_work(double budget);
  std::vector<float> finish_prompt(const LogitRowsCallback& each_rows = {});

  // The resident cache of one layer: `caches` per-head caches and their lengths.
  struct ResidentLayer {
    int caches = 0;
    bool per_query_head = false;
    std::vector<int32_t> lengths;
  };
  ResidentLayer resident_layer(int layer) const;
  // A serving pool's pages: bf16 keys and values ([pages][kPagedRows][head_dim] each), or, for a
  // model with an FP8 cache (CudaModelOptions::fp8_kv_cache), E4M3 codes in that layout with one
  // float scale per row ([pages][kPagedRows]) in the scales.
  struct PagedPool {
    void* keys = nullptr;
    void* values = nullptr;
    float* key_scales = nullptr;
    float* value_scales = nullptr;
  };
  // Copies that layer's cache into pool pages: cache c's rows go to the pages
  // page_table[c * max_pages ..] (a device array) of the pool. Ordered on stream().
  void store_resident_layer(int layer, const int32_t* page_table, int64_t max_pages,
                            const PagedPool& pool);

  // One layer's paged caches of a batch: entry b * kv_heads + h is KV head h of row b.
  struct PagedLayer {
    const int32_t* page_tables = nullptr;  // device, [rows * kv_heads][max_pages]
    int64_t max_pages = 0;
    int32_t* lengths = nullptr;  // device, [rows * kv_heads]; each step appends one row
  };
  struct PagedBatch {
    std::span<const int32_t> tokens;     // one per row
    std::span<const int32_t> positions;  // each row's position
    std::vector<PagedLayer> layers;
    PagedPool pool;
  };
  // Runs every row's token through the model over its paged caches, appending its key and value
  // there, and writes [rows][vocab] logits to host memory at `logits` (pinned memory downloads
  // fastest). Independent of the resident sequence.
  void decode_paged(const PagedBatch& batch, float* logits);
  void* stream() const;  // the cudaStream_t all of the model's work runs on

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace entropyinfer::cuda

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <tuple>

#include "attention/decode_policy.h"
#include "attention/decode_selection.h"
#include "attention/entropy_prefill.h"
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/decode_compression.h"
#include "backends/cuda/device_plans.h"
#include "backends/cuda/flash_attention.h"
#include "backends/cuda/kv_cache_fp8.h"
#include "backends/cuda/prefill_estimate.h"
#include "backends/cuda/prefill_qkv_epilogue.h"
#include "backends/cuda/ragged_decode.h"
#include "core/error.h"
#include "core/stopwatch.h"
#include "engine/cuda/cuda_transformer.h"
#include "engine/cuda/weight_upload.h"
#include "engine/prefill_work.h"
#include "engine/rope.h"
#include "engine/sampler.h"
#include "engine/sequence_schedule.h"
#include "model/random_model.h"

namespace entropyinfer::cuda {
namespace {

// Room left for the CUDA context's own allocations and cuBLASLt's workspace.
constexpr size_t kReserveBytes = size_t{768} << 20;

std::string gib(size_t bytes) {
  std::ostringstream text;
  text.precision(2);
  text << std::fixed << static_cast<double>(bytes) / (1 << 30) << " GiB";
  return text.str();
}

struct Widths {
  int64_t hidden, q, kv, qkv, intermediate, vocab, head_dim, half_rotary;
};

Widths widths_of(const ModelConfig& c) {
  Widths w;
  w.hidden = c.hidden_size;
  w.head_dim = c.head_dim;
  w.q = static_cast<int64_t>(c.num_heads) * c.head_dim;
  w.kv = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
  w.qkv = w.q + 2 * w.kv;
  w.intermediate = c.intermediate_size;
  w.vocab = c.vocab_size;
  w.half_rotary = (c.rope.rotary_dim > 0 ? c.rope.rotary_dim : c.head_dim) / 2;
  return w;
}

void validate(const ModelConfig& c, int context) {
  if (c.head_dim != 64 && c.head_dim != 128) {
    throw Error("the CUDA backend supports head_dim 64 and 128, the model has " +
                std::to_string(c.head_dim));
  }
  if (c.num_kv_heads <= 0 || c.num_heads % c.num_kv_heads != 0) {
    throw Error("the model's " + std::to_string(c.num_heads) + " query heads do not share " +
                std::to_string(c.num_kv_heads) + " KV heads evenly");
  }
  if (c.sliding_window.has_value() && *c.sliding_window > 0 && *c.sliding_window < context) {
    throw Error("sliding-window attention (window " + std::to_string(*c.sliding_window) +
                ") is not supported by the CUDA backend; use a context of at most the window");
  }
  if ((c.rope.rotary_dim > 0 ? c.rope.rotary_dim : c.head_dim) % 2 != 0) {
    throw Error("rotary_dim must be even");
  }
}

bool sparse_prefill(const AttentionConfig& attention) {
  return attention.prefill != PrefillMethod::kFull;
}

BudgetRule budget_rule(PrefillMethod method) {
  return method == PrefillMethod::kEntropy ? BudgetRule::kEntropy : BudgetRule::kFixed;
}

// Prompt rows per pass in the layer-major path of a sparse prefill, at most `chunk` (the
// activation buffers hold that many rows): a multiple of the query segment when a chunk holds one,
// so that every pass but the last covers whole segments and blocks and the fused q/k/v epilogue
// takes their statistics; otherwise a multiple of the key block, and the estimator's own kernels
// take them. A chunk shorter than a key block must hold the whole context (configure_attention
// refuses it otherwise), so the prompt is one pass.
// A served prompt's product slices: at most about a millisecond of an 8B model's products on an
// H200, so that a step's prefill budget can be met closely; larger slices gain little (the
// products are compute-bound from a few hundred rows on).
constexpr int64_t kServedProductRows = 2048;

int64_t layer_major_chunk(int64_t chunk, int segment_size, int block_size) {
  if (chunk >= segment_size) return chunk / segment_size * segment_size;
  if (chunk >= block_size) return chunk / block_size * block_size;
  return chunk;
}

// Whether prompt attention runs in FP8 (CudaModelOptions::prompt_attention).
bool fp8_attention_runs(const ModelConfig& config, const CudaModelOptions& options) {
  using PromptAttention = CudaModelOptions::PromptAttention;
  const bool asked = options.prompt_attention == PromptAttention::kFp8 ||
                     (options.prompt_attention == PromptAttention::kAuto && options.fp8_kv_cache);
  return asked && fp8_attention_supports_head_dim(config.head_dim) && fp8_attention_available();
}

// An upper bound on one layer's compressed cache rows (all cache heads, decode room included), for
// the memory plan: every head is allocated at the longest head's length.
int64_t compressed_rows_bound(const ModelConfig& config, DecodeMethod method,
                              const DecodeParams& params, int context, int decode_room) {
  const int64_t heads = params.per_query_head ? config.num_heads : config.num_kv_heads;
  const int64_t longest = decode_selection_bounds(method, params, config.num_heads,
                                                  config.num_kv_heads, config.num_layers, context)
                              .longest_list;
  const int64_t room = std::max(1, std::min(decode_room, context));
  return heads * (longest + room);
}

// Sums the GPU time between pairs of events recorded on a stream, read once the work is done.
class EventTimer {
 public:
  ~EventTimer() { clear(); }
  void start(cudaStream_t stream) {
    cudaEvent_t begin = nullptr, end = nullptr;
    check(cudaEventCreate(&begin), "cudaEventCreate");
    check(cudaEventCreate(&end), "cudaEventCreate");
    check(cudaEventRecord(begin, stream), "cudaEventRecord");
    pairs_.push_back({begin, end});
  }
  void stop(cudaStream_t stream) {
    check(cudaEventRecord(pairs_.back().second, stream), "cudaEventRecord");
  }
  double total_ms() {
    double total = 0;
    for (auto [begin, end] : pairs_) {
      float ms = 0;
      check(cudaEventSynchronize(end), "cudaEventSynchronize");
      check(cudaEventElapsedTime(&ms, begin, end), "cudaEventElapsedTime");
      total += ms;
    }
    return total;
  }
  void clear() {
    for (auto [begin, end] : pairs_) {
      cudaEventDestroy(begin);
      cudaEventDestroy(end);
    }
    pairs_.clear();
  }

 private:
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> pairs_;
};

// The parts of a prefill, for the opt-in breakdown (CudaTransformer::set_stage_timing).
enum class Stage {
  kEmbedding,
  kNorms,
  kQkvProduct,
  kQkvPointwise,  // bias, q/k norms, RoPE
  kCacheWrites,   // cache append, the observation window
  kEstimate,
  kAttention,
  kOProduct,
  kGateUpProduct,
  kSwiglu,
  kDownProduct,
  kLogits,
  kCompression,
  kCount
};
constexpr const char* kStageNames[] = {
    "embedding",    "norms",     "qkv product", "qkv pointwise",   "cache writes",
    "estimate",     "attention", "o product",   "gate/up product", "swiglu",
    "down product", "logits",    "compression"};
static_assert(sizeof(kStageNames) / sizeof(kStageNames[0]) == static_cast<size_t>(Stage::kCount));

// GPU time per Stage over one prefill, from events recorded around each part; off, it records
// nothing. Events between kernels add a few microseconds each, so headline timings leave it off.
class StageTimes {
 public:
  class Scope {
   public:
    Scope(EventTimer* timer, cudaStream_t stream) : timer_(timer), stream_(stream) {
      if (timer_ != nullptr) timer_->start(stream_);
    }
    ~Scope() {
      // A destructor must not throw; a failed record shows when the times are read (total_ms).
      try {
        if (timer_ != nullptr) timer_->stop(stream_);
      } catch (const Error&) {
      }
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    EventTimer* timer_;
    cudaStream_t stream_;
  };

  bool active = false;
  Scope scope(Stage stage, cudaStream_t stream) {
    return Scope(active ? &timers_[static_cast<size_t>(stage)] : nullptr, stream);
  }
  void add(Stage stage, double ms) { extra_ms_[static_cast<size_t>(stage)] += ms; }
  std::vector<std::pair<std::string, double>> totals_ms() {
    std::vector<std::pair<std::string, double>> totals;
    for (size_t i = 0; i < timers_.size(); ++i) {
      const double ms = timers_[i].total_ms() + extra_ms_[i];
      if (ms > 0) totals.emplace_back(kStageNames[i], ms);
    }
    return totals;
  }
  void clear() {
    for (EventTimer& timer : timers_) timer.clear();
    extra_ms_.fill(0);
  }

 private:
  std::array<EventTimer, static_cast<size_t>(Stage::kCount)> timers_;
  std::array<double, static_cast<size_t>(Stage::kCount)> extra_ms_{};
};

}  // namespace

std::string GpuMemoryPlan::describe() const {
  return gib(total()) + " (weights " + gib(weights) + (fp8_weights ? " with FP8 projections" : "") +
         ", KV cache " + gib(kv_cache) + (fp8_kv_cache ? " in FP8" : "") + ", activations " +
         gib(activations) + ")" + (fp8_prompt_attention ? ", prompt attention in FP8" : "");
}

// The widest input an FP8 product quantizes.
int64_t fp8_input_width(const Widths& w) { return std::max({w.hidden, w.q, w.intermediate}); }

// Whether a model of these weights runs FP8 products: every layer's projections are FP8 with
// inputs the format quantizes, and every product's width suits the FP8 kernels (a multiple of 16).
// Anything else (weights-only FP8 among them) runs bf16 products over widened weights.
bool runs_fp8_products(const ModelWeights& weights, const Widths& w) {
  if (weights.layers.empty()) return false;
  if (w.hidden % 16 != 0 || w.q % 16 != 0 || w.intermediate % 16 != 0) return false;
  for (const LayerWeights& layer : weights.layers) {
    for (const WeightView* matrix : {&layer.q_proj, &layer.k_proj, &layer.v_proj, &layer.o_proj,
                                     &layer.gate_proj, &layer.up_proj, &layer.down_proj}) {
      if (!matrix->fp8() || matrix->activations.kind == Fp8Activations::Kind::kNone) return false;
    }
  }
  return true;
}

GpuMemoryPlan CudaTransformer::plan(const ModelConfig& config, const CudaModelOptions& options) {
  const int context = resolve_context_length(config, options.context_length);
  const Widths w = widths_of(config);
  const int64_t chunk = std::max(1, std::min(options.chunk_tokens, context));
  GpuMemoryPlan plan;
  const int64_t per_layer = w.qkv * w.hidden + w.hidden * w.q + 3 * w.intermediate * w.hidden;
  plan.fp8_weights = options.fp8_weights;
  const size_t projection_bytes = options.fp8_weights ? 1 : sizeof(bf16);
  plan.weights = projection_bytes * per_layer * config.num_layers +
                 sizeof(bf16) * w.vocab * w.hidden * (config.tied_embeddings ? 1 : 2);
  if (options.fp8_weights) {
    // One scale per projection row, and the products' quantized inputs.
    plan.weights += sizeof(float) * config.num_layers * (w.qkv + 2 * w.hidden + 2 * w.intermediate);
    plan.activations += static_cast<size_t>(chunk) * (fp8_input_width(w) + sizeof(float));
  }
  plan.weights +=
      sizeof(float) * (config.num_layers * (2 * w.hidden + w.qkv + w.hidden + 2 * w.head_dim) +
                       w.hidden);  // norms and biases, whether present or not
  const AttentionConfig& attention = options.attention;
  if (options.compress_during_prefill) {
    // One layer's full cache while that layer is prefilled, then every layer's compressed cache.
    plan.kv_cache = sizeof(bf16) * 2 * static_cast<size_t>(w.kv) * context +
                    sizeof(bf16) * 2 * static_cast<size_t>(config.num_layers) * config.head_dim *
                        compressed_rows_bound(config, attention.decode, attention.decode_params,
                                              context, options.decode_room);
  } else if (options.fp8_kv_cache) {
    // Codes and a scale per row for every layer, and one layer's rows widened to bf16 (staging).
    plan.kv_cache = 2 * static_cast<size_t>(config.num_layers) *
                        (static_cast<size_t>(w.kv) + sizeof(float) * config.num_kv_heads) *
                        context +
                    sizeof(bf16) * 2 * static_cast<size_t>(w.kv) * context;
    plan.fp8_kv_cache = true;
  } else {
    plan.kv_cache = sizeof(bf16) * 2 * static_cast<size_t>(config.num_layers) * w.kv * context;
  }
  if (fp8_attention_runs(config, options)) {
    plan.fp8_prompt_attention = true;
    // One layer's keys and values staged as codes, and their scales.
    plan.activations += fp8_staged_code_bytes(config.num_kv_heads, config.head_dim, context) +
                        sizeof(float) * 2 * config.num_kv_heads;
  }
  const int64_t bf16_row =
      2 * w.hidden + w.qkv + w.q + 3 * w.intermediate;  // normed, qkv, attn, gate|up, act
  plan.activations +=
      static_cast<size_t>(chunk) * (sizeof(float) * w.hidden + sizeof(bf16) * bf16_row);
  plan.activations += sizeof(float) * w.vocab;  // last-token logits
  plan.activations +=
      sizeof(float) * 2 * static_cast<size_t>(context) * w.half_rotary;  // RoPE tables
  plan.activations += sizeof(int32_t) * static_cast<size_t>(context);    // token ids
  FlashShape decode;
  decode.tokens = 1;
  decode.q_heads = config.num_heads;
  decode.kv_heads = config.num_kv_heads;
  decode.head_dim = config.head_dim;
  decode.first_position = context - 1;
  decode.cache_stride = context;
  plan.activations +=
      sizeof(float) * flash_decode_workspace_floats(decode, flash_decode_splits(decode));
  if (sparse_prefill(attention) || options.layer_major_prefill || options.compress_during_prefill) {
    // The whole prompt's residual stream, queries and attention output.
    plan.activations +=
        static_cast<size_t>(context) * (sizeof(float) * w.hidden + 2 * sizeof(bf16) * w.q);
  }
  if (sparse_prefill(attention)) {
    plan.activations += PrefillEstimator::device_bytes(
        config.num_heads, config.num_kv_heads, config.head_dim, context, attention.prefill_params);
  }
  if (attention.decode != DecodeMethod::kFull) {
    const int window = attention.decode_params.window;
    plan.activations +=
        sizeof(bf16) * static_cast<size_t>(config.num_layers + 1) * window * w.q;  // window rings
    plan.activations += DecodeCompressor::device_bytes(attention.decode, attention.decode_params,
                                                       config.num_heads, config.num_kv_heads,
                                                       config.head_dim, config.num_layers, context);
  }
  return plan;
}

// A stream of our own: CUDA graphs cannot capture the legacy default stream. It is a blocking
// stream, so plain cudaMemcpy calls (weight and id uploads) stay ordered with its work.
struct OwnedStream {
  cudaStream_t handle = nullptr;
  OwnedStream() { check(cudaStreamCreate(&handle), "cudaStreamCreate"); }
  ~OwnedStream() { cudaStreamDestroy(handle); }
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;
};

struct CudaTransformer::State {
  OwnedStream owned_stream;
  cudaStream_t stream = owned_stream.handle;
  ModelConfig config;
  PrefillWork prefill_work{ModelConfig{}};  // what a served prompt's slices cost
  Widths w{};
  int context = 0;
  int chunk = 0;
  SequenceSchedule schedule;  // position, prefill, when to compress, the window's extent
  GpuMemoryPlan plan;
  Blas blas{stream};
  // Decoding replays one captured graph per token: the kernels read the position from
  // device_position, so the same graph serves every position.
  DeviceBuffer<int32_t> device_position;
  int decode_splits = 1;
  int eager_decode_steps = 0;
  cudaGraphExec_t decode_graph = nullptr;

  ~State() {
    if (decode_graph != nullptr) cudaGraphExecDestroy(decode_graph);
  }

  // A layer's projection (fused ones hold their matrices' rows one after the other): bf16 rows,
  // or FP8 codes with one scale per row when the checkpoint's products quantize their inputs
  // (core/fp8.h). Weights-only FP8 matrices are widened to bf16, as their products are.
  struct Projection {
    DeviceBuffer<bf16> values;
    DeviceBuffer<uint8_t> codes;
    DeviceBuffer<float> scales;
    int64_t in = 0;
    Fp8Activations activations;
    float input_scale = 0.0f;

    bool fp8() const { return codes.size() > 0; }
    void allocate(int64_t rows, int64_t width, bool as_fp8) {
      in = width;
      values.release();
      codes.release();
      scales.release();
      if (as_fp8) {
        codes.allocate(static_cast<size_t>(rows * width));
        scales.allocate(static_cast<size_t>(rows));
      } else {
        values.allocate(static_cast<size_t>(rows * width));
      }
    }
    DeviceMatrix matrix(int64_t first_row = 0) const {
      DeviceMatrix m;
      m.values = values.data();
      m.codes = fp8() ? codes.data() : nullptr;
      m.scales = fp8() ? scales.data() : nullptr;
      m.in = in;
      m.activations = activations;
      m.input_scale = input_scale;
      return m.rows_from(first_row);
    }
  };

  struct Layer {
    Projection qkv, o, gate_up, down;
    DeviceBuffer<float> attn_norm, mlp_norm, qkv_bias, o_bias, q_norm, k_norm;
    DeviceBuffer<bf16> keys, values;  // [cache heads][cache_stride][head_dim]
    // An FP8 cache (fp8_cache) in their place: codes of the same layout, one scale per row.
    DeviceBuffer<uint8_t> key_codes, value_codes;
    DeviceBuffer<float> key_scales, value_scales;
    Fp8KvCache fp8_rows() {
      return {key_codes.data(), value_codes.data(), key_scales.data(), value_scales.data()};
    }
    // After compression, and always with an FP8 cache: per-head caches of lengths[head] rows (read
    // and advanced on the GPU).
    bool compressed = false;
    bool per_query_head = false;  // cache heads are query heads (the released layout)
    int cache_heads = 0;
    int64_t cache_stride = 0;
    int decode_splits = 1;
    DeviceBuffer<int32_t> lengths;
  };

  // Attention policies.
  AttentionConfig attention;
  bool layer_major = false;
  // compress_during_prefill: no full cache per layer; each layer's prompt keys and values go into
  // this one full-size cache, which that layer's compression reads, and which is freed after the
  // prompt.
  bool compress_in_prefill = false;
  DeviceBuffer<bf16> scratch_keys, scratch_values;
  std::unique_ptr<PrefillEstimator> estimator;    // sparse prefill methods
  std::unique_ptr<DecodeCompressor> compressor;   // compressing decode methods
  bool keeps_window = false;                      // the compressor reads the observation window
  int window = 0;                                 // ring slots per layer (0 without rings)
  bool compressed = false;                        // the caches are the compressed ones
  DeviceBuffer<float> prompt_hidden;              // layer-major: [context][hidden]
  DeviceBuffer<bf16> prompt_q, prompt_attention;  // layer-major: [context][q width]
  DeviceBuffer<bf16> window_rings;                // [layers][window][q width], slot p % window
  DeviceBuffer<bf16> window_oldest_first;         // [window][q width]
  DeviceBuffer<unsigned long long> key_counters;  // keys the sparse kernel read (device)
  DeviceBuffer<float> ragged_workspace;
  CudaAttentionWork work;
  AttentionRecording* recording = nullptr;  // the model's
  LanguageModel::ProgressCallback progress;

  // set_capture_attention_inputs: m rows of layer `index`'s rotated queries (q_stride apart) and
  // keys, read from the rows at k (k_stride apart) or, with k null, from the full cache at
  // positions first..first + m - 1.
  void capture(int index, const bf16* q, int64_t q_stride, const bf16* k, int64_t k_stride,
               const bf16* cache_keys, int64_t first, int64_t m) {
    std::vector<bf16> queries(static_cast<size_t>(m * w.q)), keys(static_cast<size_t>(m * w.kv));
    check(cudaMemcpy2DAsync(queries.data(), sizeof(bf16) * w.q, q, sizeof(bf16) * q_stride,
                            sizeof(bf16) * w.q, m, cudaMemcpyDeviceToHost, stream),
          "captured queries");
    if (k != nullptr) {
      check(cudaMemcpy2DAsync(keys.data(), sizeof(bf16) * w.kv, k, sizeof(bf16) * k_stride,
                              sizeof(bf16) * w.kv, m, cudaMemcpyDeviceToHost, stream),
            "captured keys");
    } else {
      // Head h's rows are contiguous in the cache; the capture interleaves heads per token.
      for (int head = 0; head < config.num_kv_heads; ++head) {
        check(cudaMemcpy2DAsync(keys.data() + head * w.head_dim, sizeof(bf16) * w.kv,
                                cache_keys + (head * context + first) * w.head_dim,
                                sizeof(bf16) * w.head_dim, sizeof(bf16) * w.head_dim, m,
                                cudaMemcpyDeviceToHost, stream),
              "captured keys");
      }
    }
    check(cudaStreamSynchronize(stream), "captured attention inputs");
    std::vector<float> query_rows(queries.size()), key_rows(keys.size());
    const auto widen = [](bf16 value) { return __bfloat162float(value); };
    std::transform(queries.begin(), queries.end(), query_rows.begin(), widen);
    std::transform(keys.begin(), keys.end(), key_rows.begin(), widen);
    recording->capture(index, query_rows.data(), w.q, key_rows.data(), w.kv, m);
  }

  // Tells the progress callback that `done` of `total` prompt tokens have passed (through every
  // layer, or through `layers` of them), once the GPU has got there. Short spans are not reported.
  void report_progress(int64_t done, int64_t total) {
    if (!progress || total <= chunk) return;
    check(cudaStreamSynchronize(stream), "forward");
    progress(done, total);
  }
  bool stage_timing = false;  // break the next prefills' GPU time down by Stage
  StageTimes stages;
  std::vector<Layer> layers;
  DeviceBuffer<bf16> embedding, lm_head;  // lm_head empty when tied
  DeviceBuffer<float> final_norm;

  DeviceBuffer<float> rope_cos, rope_sin;  // [context][half_rotary], unless dynamic
  DeviceBuffer<float> hidden, logits, decode_workspace;
  DeviceBuffer<bf16> normed, qkv, attn_out, gate_up, activation;
  DeviceBuffer<int32_t> ids, best;
  ArgmaxWorkspace argmax_workspace;  // the greedy token's argmax over many blocks

  bool fp8_weights = false;  // the projections hold FP8 codes (CudaModelOptions::fp8_weights)
  // CudaModelOptions::fp8_kv_cache: the layers' caches are FP8 and scratch_keys / scratch_values
  // are the staging slabs that prompt attention and the estimate read.
  bool fp8_cache = false;
  // CudaModelOptions::prompt_attention in FP8, where it runs: a layer's keys and values are staged
  // as codes before its prompt attention (fp8_staged_layer: the layer of the layer-major pass
  // whose whole prompt is staged, or -1). The estimate keeps reading the bf16 slabs. Sparse plans
  // run in FP8 only when asked for (fp8_sparse_attention: PromptAttention::kFp8) and where the
  // kernel can run them (fp8_block_sparse_fits); otherwise their layer stays bf16.
  bool fp8_attention = false;
  bool fp8_sparse_attention = false;
  Fp8StagingBuffers fp8_staging;
  int fp8_staged_layer = -1;
  const bf16* head() const { return config.tied_embeddings ? embedding.data() : lm_head.data(); }

  void allocate(const ModelConfig& c, const CudaModelOptions& options) {
    config = c;
    prefill_work = PrefillWork(c);
    context = resolve_context_length(c, options.context_length);
    validate(c, context);
    options.attention.validate();
    w = widths_of(c);
    chunk = std::max(1, std::min(options.chunk_tokens, context));
    fp8_weights = options.fp8_weights;
    blas.set_fp8_separate_scaling(options.fp8_separate_scaling);
    fp8_cache = options.fp8_kv_cache;
    if (fp8_cache && options.compress_during_prefill) {
      throw Error("an FP8 KV cache and compress_during_prefill cannot be combined");
    }
    if (fp8_cache && config.head_dim % 16 != 0) {
      throw Error("an FP8 KV cache needs head_dim to be a multiple of 16, not " +
                  std::to_string(config.head_dim));
    }
    if (fp8_weights && (w.hidden % 16 != 0 || w.q % 16 != 0 || w.intermediate % 16 != 0)) {
      throw Error(
          "FP8 products need the hidden, query and intermediate widths to be multiples "
          "of 16");
    }
    plan = CudaTransformer::plan(c, options);
    const auto [free_bytes, total_bytes] = device_memory();
    if (plan.total() + kReserveBytes > free_bytes) {
      throw Error("the model needs " + plan.describe() + " of GPU memory for a context of " +
                  std::to_string(context) + " tokens, but only " + gib(free_bytes) + " of " +
                  gib(total_bytes) + " are free");
    }
    layers.resize(c.num_layers);
    for (Layer& layer : layers) {
      layer.qkv.allocate(w.qkv, w.hidden, fp8_weights);
      layer.o.allocate(w.hidden, w.q, fp8_weights);
      layer.gate_up.allocate(2 * w.intermediate, w.hidden, fp8_weights);
      layer.down.allocate(w.hidden, w.intermediate, fp8_weights);
      layer.attn_norm.allocate(w.hidden);
      layer.mlp_norm.allocate(w.hidden);
      if (c.qkv_bias) layer.qkv_bias.allocate(w.qkv);
      if (c.o_bias) layer.o_bias.allocate(w.hidden);
      if (c.qk_norm) {
        layer.q_norm.allocate(w.head_dim);
        layer.k_norm.allocate(w.head_dim);
      }
      if (!options.compress_during_prefill) allocate_full_cache(layer);
    }
    if (fp8_cache) {
      scratch_keys.allocate(static_cast<size_t>(w.kv) * context);
      scratch_values.allocate(static_cast<size_t>(w.kv) * context);
    }
    fp8_attention = fp8_attention_runs(c, options);
    fp8_sparse_attention =
        fp8_attention && options.prompt_attention == CudaModelOptions::PromptAttention::kFp8;
    if (fp8_attention) {
      fp8_staging.allocate(c.num_kv_heads, c.head_dim, context);
    }
    embedding.allocate(static_cast<size_t>(w.vocab * w.hidden));
    if (!c.tied_embeddings) lm_head.allocate(static_cast<size_t>(w.vocab * w.hidden));
    final_norm.allocate(w.hidden);

    if (c.rope.scaling != RopeScaling::kDynamic) {
      // Angles do not depend on the sequence length: one table for the whole context.
      const RopeTables tables = rope_tables(c, 0, context);
      rope_cos.allocate(tables.cos.size());
      rope_sin.allocate(tables.sin.size());
      rope_cos.upload(tables.cos.data(), tables.cos.size());
      rope_sin.upload(tables.sin.data(), tables.sin.size());
    }
    hidden.allocate(static_cast<size_t>(chunk * w.hidden));
    normed.allocate(static_cast<size_t>(chunk * w.hidden));
    qkv.allocate(static_cast<size_t>(chunk * w.qkv));
    attn_out.allocate(static_cast<size_t>(chunk * w.q));
    gate_up.allocate(static_cast<size_t>(chunk * 2 * w.intermediate));
    activation.allocate(static_cast<size_t>(chunk * w.intermediate));
    logits.allocate(static_cast<size_t>(w.vocab));
    ids.allocate(static_cast<size_t>(context));
    best.allocate(1);
    FlashShape decode = decode_shape(context - 1);
    decode_splits = flash_decode_splits(decode);
    decode_workspace.allocate(
        std::max<size_t>(1, flash_decode_workspace_floats(decode, decode_splits)));
    device_position.allocate(1);
    key_counters.allocate(1);
    for (Layer& layer : layers) full_cache_shape(layer);
    configure_attention(options);
    this->options = options;
  }

  void allocate_full_cache(Layer& layer) {
    const size_t elements = static_cast<size_t>(w.kv) * context;
    if (fp8_cache) {
      layer.key_codes.allocate(elements);
      layer.value_codes.allocate(elements);
      layer.key_scales.allocate(static_cast<size_t>(config.num_kv_heads) * context);
      layer.value_scales.allocate(static_cast<size_t>(config.num_kv_heads) * context);
    } else {
      layer.keys.allocate(elements);
      layer.values.allocate(elements);
    }
  }

  void release_cache(Layer& layer) {
    layer.keys.release();
    layer.values.release();
    layer.key_codes.release();
    layer.value_codes.release();
    layer.key_scales.release();
    layer.value_scales.release();
  }

  // An FP8 full cache decodes as per-head caches of equal lengths (ragged_decode), which its span
  // writes set and its decode steps advance.
  void full_cache_shape(Layer& layer) {
    layer.compressed = false;
    layer.per_query_head = false;
    layer.cache_heads = config.num_kv_heads;
    layer.cache_stride = context;
    layer.lengths.release();
    if (fp8_cache) {
      layer.lengths.allocate(static_cast<size_t>(config.num_kv_heads));
      check(cudaMemsetAsync(layer.lengths.data(), 0, layer.lengths.bytes(), stream), "lengths");
      const RaggedShape shape = ragged_shape(layer);
      layer.decode_splits = ragged_decode_splits(shape);
      const size_t floats = ragged_decode_workspace_floats(shape, layer.decode_splits);
      if (ragged_workspace.size() < std::max<size_t>(1, floats))
        ragged_workspace.allocate(std::max<size_t>(1, floats));
    }
  }

  // Builds the GPU policies of options.attention and their buffers.
  void configure_attention(const CudaModelOptions& options) {
    reset();
    attention = options.attention;
    attention.validate();
    compress_in_prefill = options.compress_during_prefill;
    layer_major = sparse_prefill(attention) || options.layer_major_prefill || compress_in_prefill;
    decode_room = options.decode_room;
    if (decode_room < 1) throw Error("decode_room must be at least 1 token");
    if (sparse_prefill(attention) && chunk < attention.prefill_params.block_size &&
        chunk < context) {
      throw Error("chunk_tokens (" + std::to_string(chunk) +
                  ") must be at least the sparse prefill's block_size (" +
                  std::to_string(attention.prefill_params.block_size) +
                  "): each pass records whole key blocks");
    }
    // Products over a whole chunk take the fastest of cuBLASLt's first eight algorithms, timed on
    // their first run (bench_gemm at 16k tokens: 2-11% faster than the heuristic's choice on three
    // of the four products). A prompt's shorter last chunk keeps the heuristic's choice, so a new
    // prompt length never stops to tune. Single-token products take the GEMV configuration
    // measured fastest for the shape.
    const int64_t whole_chunk =
        sparse_prefill(attention) ? layer_major_chunk(chunk, attention.prefill_params.segment_size,
                                                      attention.prefill_params.block_size)
                                  : chunk;
    using GemmTuning = CudaModelOptions::GemmTuning;
    blas.set_autotune(options.gemm_tuning == GemmTuning::kHeuristic ? 0 : 8,
                      std::max<int64_t>(2, whole_chunk),
                      options.gemm_tuning == GemmTuning::kSustained ? Blas::TuneLoad::kSustained
                                                                    : Blas::TuneLoad::kBurst);
    blas.set_gemv_tuning(true);
    if (fp8_weights) blas.reserve_fp8_inputs(chunk, fp8_input_width(w));
    estimator.reset();
    compressor.reset();
    prompt_hidden.release();
    prompt_q.release();
    prompt_attention.release();
    window_rings.release();
    window_oldest_first.release();
    if (layer_major) {
      prompt_hidden.allocate(static_cast<size_t>(context) * w.hidden);
      prompt_q.allocate(static_cast<size_t>(context) * w.q);
      prompt_attention.allocate(static_cast<size_t>(context) * w.q);
    }
    if (sparse_prefill(attention)) {
      estimator = std::make_unique<PrefillEstimator>(
          config.num_heads, config.num_kv_heads, config.head_dim, context, attention.prefill_params,
          budget_rule(attention.prefill));
    }
    window = 0;
    keeps_window = false;
    int compress_after = -1;
    if (attention.decode != DecodeMethod::kFull) {
      const std::unique_ptr<DecodePolicy> policy = make_decode_policy(attention);
      compress_after = policy->compress_after_generated();
      keeps_window = policy->needs_window_queries();
      if (keeps_window) window = attention.decode_params.window;
      compressor = std::make_unique<DecodeCompressor>(attention.decode, attention.decode_params,
                                                      config.num_heads, config.num_kv_heads,
                                                      config.head_dim, config.num_layers, context);
      if (keeps_window) {
        window_rings.allocate(static_cast<size_t>(config.num_layers) * window * w.q);
        window_oldest_first.allocate(static_cast<size_t>(window) * w.q);
      }
    }
    schedule.configure(context, compress_after, window);
    if (compress_in_prefill && (!compressor || compress_after != 0)) {
      throw Error(
          "compress_during_prefill needs a decode method that compresses right after the "
          "prompt (snapkv, adakv, pyramidkv, streaming), not " +
          decode_method_name(attention.decode));
    }
  }
  int decode_room = 4096;
  CudaModelOptions options;

  FlashShape decode_shape(int first_position) const {
    FlashShape shape;
    shape.tokens = 1;
    shape.q_heads = config.num_heads;
    shape.kv_heads = config.num_kv_heads;
    shape.head_dim = config.head_dim;
    shape.first_position = first_position;
    shape.cache_stride = context;
    shape.q_token_stride = w.qkv;  // queries stay inside the fused q/k/v rows
    return shape;
  }

  void upload_floats(DeviceBuffer<float>& target, size_t offset, const WeightView& view) {
    if (view.empty()) return;
    target.upload(view.floats(), static_cast<size_t>(view.numel()), offset);
  }

  // The matrices' rows, one after another, as the projection holds them: FP8 codes as stored with
  // each row's scale (a per-tensor scale repeated), or bf16. The loader gave fused matrices one
  // input scheme and one static input scale.
  void upload_projection(WeightUploader& uploader, Projection& projection,
                         std::initializer_list<const WeightView*> parts) {
    int64_t row = 0;
    std::vector<float> scales;
    for (const WeightView* part : parts) {
      const int64_t rows = part->shape.at(0);
      if (projection.fp8()) {
        uploader.upload_codes(*part, projection.codes.data() + row * projection.in);
        for (int64_t r = 0; r < rows; ++r) scales.push_back(part->row_scale(r));
      } else {
        uploader.upload(*part, projection.values.data() + row * projection.in);
      }
      row += rows;
    }
    if (projection.fp8()) {
      projection.scales.upload(scales.data(), scales.size());
      projection.activations = (*parts.begin())->activations;
      projection.input_scale = (*parts.begin())->input_scale;
    }
  }

  void load(const ModelWeights& weights) {
    WeightUploader uploader(stream);
    int64_t total_bytes =
        static_cast<int64_t>(weights.token_embedding.byte_size() +
                             (config.tied_embeddings ? 0 : weights.lm_head.byte_size()));
    for (const LayerWeights& layer : weights.layers) {
      for (const WeightView* matrix : {&layer.q_proj, &layer.k_proj, &layer.v_proj, &layer.o_proj,
                                       &layer.gate_proj, &layer.up_proj, &layer.down_proj}) {
        total_bytes += static_cast<int64_t>(matrix->byte_size());
      }
    }
    const auto report = [&] {
      if (options.upload_progress) {
        options.upload_progress(static_cast<int64_t>(uploader.bytes_read()), total_bytes);
      }
    };
    auto expect = [](const WeightView& view, int64_t count, const char* name) {
      if (view.empty() || view.numel() != count) {
        throw Error(std::string("weights: ") + name + " has " + std::to_string(view.numel()) +
                    " values, expected " + std::to_string(count));
      }
    };
    for (int index = 0; index < config.num_layers; ++index) {
      const LayerWeights& source = weights.layers[index];
      Layer& layer = layers[index];
      expect(source.q_proj, w.q * w.hidden, "q_proj");
      expect(source.k_proj, w.kv * w.hidden, "k_proj");
      expect(source.v_proj, w.kv * w.hidden, "v_proj");
      expect(source.o_proj, w.hidden * w.q, "o_proj");
      expect(source.gate_proj, w.intermediate * w.hidden, "gate_proj");
      expect(source.up_proj, w.intermediate * w.hidden, "up_proj");
      expect(source.down_proj, w.hidden * w.intermediate, "down_proj");
      // Fused products: rows of q, then k, then v; rows of gate, then up.
      upload_projection(uploader, layer.qkv, {&source.q_proj, &source.k_proj, &source.v_proj});
      upload_projection(uploader, layer.o, {&source.o_proj});
      upload_projection(uploader, layer.gate_up, {&source.gate_proj, &source.up_proj});
      upload_projection(uploader, layer.down, {&source.down_proj});
      upload_floats(layer.attn_norm, 0, source.attn_norm);
      upload_floats(layer.mlp_norm, 0, source.mlp_norm);
      if (config.qkv_bias) {
        upload_floats(layer.qkv_bias, 0, source.q_bias);
        upload_floats(layer.qkv_bias, w.q, source.k_bias);
        upload_floats(layer.qkv_bias, w.q + w.kv, source.v_bias);
      }
      if (config.o_bias) upload_floats(layer.o_bias, 0, source.o_bias);
      if (config.qk_norm) {
        upload_floats(layer.q_norm, 0, source.q_norm);
        upload_floats(layer.k_norm, 0, source.k_norm);
      }
      report();
    }
    expect(weights.token_embedding, w.vocab * w.hidden, "token_embedding");
    uploader.upload(weights.token_embedding, embedding.data());
    if (!config.tied_embeddings) {
      expect(weights.lm_head, w.vocab * w.hidden, "lm_head");
      uploader.upload(weights.lm_head, lm_head.data());
    }
    upload_floats(final_norm, 0, weights.final_norm);
    uploader.finish();
    report();
  }

  void randomize(uint64_t seed) {
    auto fill = [&](DeviceBuffer<bf16>& buffer, int64_t fan_in) {
      fill_uniform(buffer.data(), static_cast<int64_t>(buffer.size()), seed++,
                   1.0f / std::sqrt(static_cast<float>(fan_in)), stream);
    };
    auto ones = [&](DeviceBuffer<float>& buffer) {
      const std::vector<float> values(buffer.size(), 1.0f);
      buffer.upload(values.data(), values.size());
    };
    auto small = [&](DeviceBuffer<float>& buffer) {
      fill_uniform(buffer.data(), static_cast<int64_t>(buffer.size()), seed++, 0.02f, stream);
    };
    // FP8 projections: drawn in bf16, then each row quantized (dynamic per-token inputs).
    DeviceBuffer<bf16> drawn;
    auto fill_projection = [&](Projection& projection, int64_t fan_in) {
      if (!projection.fp8()) return fill(projection.values, fan_in);
      const int64_t rows = static_cast<int64_t>(projection.scales.size());
      if (drawn.size() < projection.codes.size()) drawn.allocate(projection.codes.size());
      fill_uniform(drawn.data(), static_cast<int64_t>(projection.codes.size()), seed++,
                   1.0f / std::sqrt(static_cast<float>(fan_in)), stream);
      quantize_weight_rows_fp8(drawn.data(), rows, projection.in, projection.codes.data(),
                               projection.scales.data(), stream);
      projection.activations.kind = Fp8Activations::Kind::kDynamicPerToken;
    };
    for (Layer& layer : layers) {
      fill_projection(layer.qkv, w.hidden);
      fill_projection(layer.o, w.q);
      fill_projection(layer.gate_up, w.hidden);
      fill_projection(layer.down, w.intermediate);
      ones(layer.attn_norm);
      ones(layer.mlp_norm);
      if (config.qkv_bias) small(layer.qkv_bias);
      if (config.o_bias) small(layer.o_bias);
      if (config.qk_norm) {
        ones(layer.q_norm);
        ones(layer.k_norm);
      }
    }
    fill_uniform(embedding.data(), static_cast<int64_t>(embedding.size()), seed++, 1.0f, stream);
    if (!config.tied_embeddings) fill(lm_head, w.hidden);
    ones(final_norm);
    check(cudaStreamSynchronize(stream), "random weights");
  }

  // The first half of a layer over the m tokens whose residual rows are at `rows`: RMSNorm, the
  // fused q/k/v product (into `qkv`), bias, q/k norm and RoPE. Positions first.. (or, with
  // device_position, one token at the position stored there; cos/sin are then the whole tables).
  void enqueue_qkv(Layer& layer, const float* rows, int64_t m, const float* cos, const float* sin,
                   const int* device_position_pointer, bf16* q_out = nullptr) {
    enqueue_qkv_product(layer, rows, m);
    const ModelConfig& c = config;
    const auto timed = stages.scope(Stage::kQkvPointwise, stream);
    bf16* q = qkv.data();
    // The key heads follow the query heads in each fused row: one launch rotates both (and with
    // q_out writes the rotated queries there, rows w.q apart).
    if (q_out != nullptr) {
      apply_rope_queries_out(q, m, c.num_heads + c.num_kv_heads, w.head_dim, w.qkv, cos, sin,
                             2 * w.half_rotary, c.rope.rotate_adjacent_pairs, c.num_heads, q_out,
                             w.q, stream);
    } else {
      apply_rope(q, m, c.num_heads + c.num_kv_heads, w.head_dim, w.qkv, cos, sin, 2 * w.half_rotary,
                 c.rope.rotate_adjacent_pairs, stream, device_position_pointer);
    }
  }

  // enqueue_qkv up to the rotation: RMSNorm, the product, bias and q/k norm, into `qkv`.
  // With first_q_row > 0 the queries of rows before it are not computed (their columns of `qkv`
  // hold whatever they held): the last layer of a prompt reads only its last rows' queries.
  void enqueue_qkv_product(Layer& layer, const float* rows, int64_t m, int64_t first_q_row = 0) {
    const ModelConfig& c = config;
    if (first_q_row == 0 && !stages.active) {
      // One launch for the norm and an FP8 GEMV's input where a decode step allows it (the
      // opt-in breakdown times the norm on its own).
      const auto timed = stages.scope(Stage::kQkvProduct, stream);
      blas.normed_linear(rows, layer.attn_norm.data(), c.rms_norm_eps, normed.data(), m, w.hidden,
                         layer.qkv.matrix(), w.qkv, qkv.data());
    } else {
      {
        const auto timed = stages.scope(Stage::kNorms, stream);
        rms_norm(rows, layer.attn_norm.data(), m, w.hidden, c.rms_norm_eps, normed.data(), stream);
      }
      const auto timed = stages.scope(Stage::kQkvProduct, stream);
      if (first_q_row == 0) {
        blas.linear(normed.data(), m, w.hidden, layer.qkv.matrix(), w.qkv, qkv.data());
      } else {
        // Keys and values of every row (their weight rows follow the queries' in the fused
        // matrix), queries of the rows from first_q_row on.
        blas.linear(normed.data(), m, w.hidden, layer.qkv.matrix(w.q), 2 * w.kv, qkv.data() + w.q,
                    w.qkv);
        if (first_q_row < m) {
          blas.linear(normed.data() + first_q_row * w.hidden, m - first_q_row, w.hidden,
                      layer.qkv.matrix(), w.q, qkv.data() + first_q_row * w.qkv, w.qkv);
        }
      }
    }
    const auto timed = stages.scope(Stage::kQkvPointwise, stream);
    if (c.qkv_bias) add_bias(qkv.data(), layer.qkv_bias.data(), m, w.qkv, w.qkv, stream);
    bf16* q = qkv.data();
    bf16* k = qkv.data() + w.q;
    if (c.qk_norm) {
      head_rms_norm(q, m, c.num_heads, w.head_dim, w.qkv, layer.q_norm.data(), c.rms_norm_eps,
                    stream);
      head_rms_norm(k, m, c.num_kv_heads, w.head_dim, w.qkv, layer.k_norm.data(), c.rms_norm_eps,
                    stream);
    }
  }

  // The second half over m rows: output projection added to the residual rows, then the MLP.
  void enqueue_mlp(Layer& layer, float* rows, const bf16* attention_rows, int64_t m) {
    const ModelConfig& c = config;
    {
      const auto timed = stages.scope(Stage::kOProduct, stream);
      blas.linear(attention_rows, m, w.q, layer.o.matrix(), w.hidden, rows, /*accumulate=*/true);
      if (c.o_bias) add_bias(rows, layer.o_bias.data(), m, w.hidden, w.hidden, stream);
    }
    if (!stages.active) {
      // The norm and SwiGLU each in one launch with the FP8 GEMV's input where a decode step
      // allows it (the opt-in breakdown times them on their own).
      blas.normed_linear(rows, layer.mlp_norm.data(), c.rms_norm_eps, normed.data(), m, w.hidden,
                         layer.gate_up.matrix(), 2 * w.intermediate, gate_up.data());
      blas.swiglu_linear(gate_up.data(), gate_up.data() + w.intermediate, m, w.intermediate,
                         2 * w.intermediate, activation.data(), layer.down.matrix(), w.hidden, rows,
                         /*accumulate=*/true);
      return;
    }
    {
      const auto timed = stages.scope(Stage::kNorms, stream);
      rms_norm(rows, layer.mlp_norm.data(), m, w.hidden, c.rms_norm_eps, normed.data(), stream);
    }
    {
      const auto timed = stages.scope(Stage::kGateUpProduct, stream);
      blas.linear(normed.data(), m, w.hidden, layer.gate_up.matrix(), 2 * w.intermediate,
                  gate_up.data());
    }
    {
      const auto timed = stages.scope(Stage::kSwiglu, stream);
      swiglu(gate_up.data(), gate_up.data() + w.intermediate, m, w.intermediate, 2 * w.intermediate,
             activation.data(), stream);
    }
    const auto timed = stages.scope(Stage::kDownProduct, stream);
    blas.linear(activation.data(), m, w.intermediate, layer.down.matrix(), w.hidden, rows, true);
  }

  RaggedShape ragged_shape(const Layer& layer) const {
    RaggedShape shape;
    shape.q_heads = config.num_heads;
    shape.kv_heads = config.num_kv_heads;
    shape.head_dim = config.head_dim;
    shape.cache_stride = layer.cache_stride;
    shape.max_length = layer.cache_stride;
    shape.per_query_head = layer.per_query_head;
    shape.fp8 = fp8_cache;
    return shape;
  }

  // The observation window: queries of positions first .. first + m - 1 (rows q_stride apart) go
  // to ring slots position % window; only the newest `window` of them can survive, so only those
  // are copied.
  void record_window(int layer_index, const bf16* q, int64_t q_stride, int64_t first, int64_t m) {
    if (!keeps_window || compressed) return;
    const int64_t skip = std::max<int64_t>(0, m - window);
    bf16* ring = window_rings.data() + static_cast<size_t>(layer_index) * window * w.q;
    for (int64_t row = skip; row < m;) {
      const int64_t slot = (first + row) % window;
      const int64_t run = std::min<int64_t>(m - row, window - slot);
      check(cudaMemcpy2DAsync(ring + slot * w.q, sizeof(bf16) * w.q, q + row * q_stride,
                              sizeof(bf16) * q_stride, sizeof(bf16) * w.q, run,
                              cudaMemcpyDeviceToDevice, stream),
            "window queries");
      row += run;
    }
  }

  // One layer over the m tokens whose residual rows are in `hidden`, chunk by chunk through the
  // layers (or one decode step). Positions first.. or *device_position_pointer. Only the last
  // `output_rows` rows (0 or 1 when fewer than m) get their attention and MLP: every row's keys and
  // values enter the cache, but the last layer's other outputs are never read (see
  // output_rows_of_layer).
  void enqueue_layer(int layer_index, int64_t m, int64_t first, const float* cos, const float* sin,
                     const int* device_position_pointer, int64_t output_rows) {
    Layer& layer = layers[layer_index];
    const ModelConfig& c = config;
    enqueue_qkv(layer, hidden.data(), m, cos, sin, device_position_pointer);
    bf16* q = qkv.data();
    bf16* k = qkv.data() + w.q;
    bf16* v = qkv.data() + w.q + w.kv;
    if (device_position_pointer == nullptr) {
      const auto timed = stages.scope(Stage::kCacheWrites, stream);
      record_window(layer_index, q, w.qkv, first, m);
    }
    if (recording->capture_inputs) capture(layer_index, q, w.qkv, k, w.qkv, nullptr, 0, m);
    if (layer.compressed || (fp8_cache && m == 1)) {
      // Single tokens only (run() feeds a compressed cache one token at a time).
      const RaggedShape shape = ragged_shape(layer);
      if (fp8_cache) {
        ragged_append(k, v, shape, layer.fp8_rows(), layer.lengths.data(), stream);
        ragged_decode(q, layer.fp8_rows(), layer.lengths.data(), shape, attn_out.data(),
                      ragged_workspace.data(), ragged_workspace.size(), stream,
                      layer.decode_splits);
      } else {
        ragged_append(k, v, shape, layer.keys.data(), layer.values.data(), layer.lengths.data(),
                      stream);
        ragged_decode(q, layer.keys.data(), layer.values.data(), layer.lengths.data(), shape,
                      attn_out.data(), ragged_workspace.data(), ragged_workspace.size(), stream,
                      layer.decode_splits);
      }
    } else {
      bf16* cache_keys = fp8_cache ? scratch_keys.data() : layer.keys.data();
      bf16* cache_values = fp8_cache ? scratch_values.data() : layer.values.data();
      {
        const auto timed = stages.scope(Stage::kCacheWrites, stream);
        append_kv(k, v, m, w.qkv, c.num_kv_heads, w.head_dim, cache_keys, cache_values, context,
                  first, stream, device_position_pointer);
        if (fp8_cache) {
          // The span's rows into the cache, and the earlier ones back into the staging slabs
          // that the attention below reads.
          quantize_kv_rows(cache_keys, cache_values, c.num_kv_heads, context, w.head_dim, first, m,
                           layer.fp8_rows(), layer.lengths.data(), stream);
          if (output_rows > 0) {
            dequantize_kv_rows(layer.fp8_rows(), c.num_kv_heads, context, w.head_dim, 0, first,
                               cache_keys, cache_values, stream);
          }
        }
      }
      const auto timed = stages.scope(Stage::kAttention, stream);
      if (device_position_pointer != nullptr) {
        FlashShape shape = decode_shape(context - 1);  // the largest position sizes the splits
        shape.device_position = device_position_pointer;
        flash_decode(q, cache_keys, cache_values, shape, attn_out.data(), decode_workspace.data(),
                     decode_workspace.size(), stream, decode_splits);
      } else if (output_rows == 0) {
        return;  // nothing of this layer's span is read beyond its keys and values
      } else if (output_rows < m) {
        // The span's last row alone, as a decode step over the cache it has just filled.
        const FlashShape shape = decode_shape(static_cast<int>(first + m - 1));
        flash_decode(q + (m - 1) * w.qkv, cache_keys, cache_values, shape,
                     attn_out.data() + (m - 1) * w.q, decode_workspace.data(),
                     decode_workspace.size(), stream);
      } else {
        FlashShape shape = decode_shape(static_cast<int>(first));
        shape.tokens = m;
        if (m == 1) {
          flash_decode(q, cache_keys, cache_values, shape, attn_out.data(), decode_workspace.data(),
                       decode_workspace.size(), stream);
        } else if (fp8_attention) {
          stage_fp8_keys(cache_keys, cache_values, context, w.head_dim, first + m, fp8_staging.view,
                         stream);
          fp8_staged_layer = -1;
          flash_prefill_fp8(q, fp8_staging.view, shape, attn_out.data(), stream);
        } else {
          flash_prefill(q, cache_keys, cache_values, shape, attn_out.data(), stream);
        }
      }
    }
    const int64_t skipped = m - output_rows;
    enqueue_mlp(layer, hidden.data() + skipped * w.hidden, attn_out.data() + skipped * w.q,
                output_rows);
  }

  // How many of the last rows of a span [t0, t0 + m) of an n-token pass need layer `index`'s
  // attention and MLP. Every row, except in the last layer without all_logits: there only the
  // pass's last row feeds anything (the logits), so other spans need none and the last span one.
  // Its keys and values, and its queries for an observation window, are still made for every row.
  // The last row is computed as in any other layer: llama.cpp prunes the same way.
  int64_t output_rows_of_layer(int index, int64_t t0, int64_t m, int64_t n, bool all_logits) const {
    if (all_logits || index + 1 < config.num_layers) return m;
    return t0 + m == n ? 1 : 0;
  }

  // Whether run_layer_major estimates a plan for layer `index` of an n-token prompt: not for the
  // dense first layers, nor for a last layer that reads only its last row, unless plans are
  // recorded (they describe every layer).
  bool layer_is_estimated(int index, int64_t n, bool all_logits) const {
    if (index < attention.prefill_params.dense_layers) return false;
    return recording->record_plans || output_rows_of_layer(index, 0, n, n, all_logits) == n;
  }

  // The first row of the span [t0, t0 + m) of an n-token prompt whose query run_layer_major reads
  // in layer `index`: 0 but in a last layer that is not estimated, which reads the last row's
  // query and the observation window's (m when the span has none of them).
  int64_t first_query_row(int index, int64_t t0, int64_t m, int64_t n, bool all_logits) const {
    if (recording->capture_inputs || output_rows_of_layer(index, 0, n, n, all_logits) == n ||
        layer_is_estimated(index, n, all_logits)) {
      return 0;
    }
    const int64_t first_read = n - std::max<int64_t>(keeps_window ? window : 0, 1);
    return std::clamp<int64_t>(first_read - t0, 0, m);
  }

  // The whole decode step of the token in ids[0] at *device_position: embedding, layers, logits and
  // their argmax (into `best`). Position-independent launches only, so it can be captured once.
  void enqueue_decode_step() {
    cuda::embedding(embedding.data(), ids.data(), 1, w.hidden, hidden.data(), stream);
    for (int index = 0; index < config.num_layers; ++index)
      enqueue_layer(index, 1, 0, rope_cos.data(), rope_sin.data(), device_position.data(), 1);
    rms_norm(hidden.data(), final_norm.data(), 1, w.hidden, config.rms_norm_eps, normed.data(),
             stream);
    blas.linear(normed.data(), 1, w.hidden, head(), w.vocab, logits.data());
    argmax_rows(logits.data(), 1, w.vocab, best.data(), stream, &argmax_workspace);
  }

  // Decodes one token: eagerly the first time (which also settles every lazily initialised kernel
  // attribute), then through the graph captured on the second step.
  void decode(int32_t token) {
    check(cudaMemcpyAsync(ids.data(), &token, sizeof(token), cudaMemcpyHostToDevice, stream),
          "token upload");
    const int position = schedule.position();
    check(cudaMemcpyAsync(device_position.data(), &position, sizeof(position),
                          cudaMemcpyHostToDevice, stream),
          "position upload");
    if (decode_graph == nullptr && eager_decode_steps >= 1) {
      cudaGraph_t graph = nullptr;
      check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
            "cudaStreamBeginCapture");
      try {
        enqueue_decode_step();
      } catch (...) {
        cudaStreamEndCapture(stream, &graph);
        if (graph != nullptr) cudaGraphDestroy(graph);
        throw;
      }
      check(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
      const cudaError_t status = cudaGraphInstantiate(&decode_graph, graph, 0);
      cudaGraphDestroy(graph);
      check(status, "cudaGraphInstantiate");
    }
    if (decode_graph != nullptr) {
      check(cudaGraphLaunch(decode_graph, stream), "cudaGraphLaunch");
    } else {
      enqueue_decode_step();
      ++eager_decode_steps;
    }
  }

  bool graph_decodes(std::span<const int32_t> tokens, bool all_logits) const {
    // While the observation window is being filled, steps run eagerly: they copy their queries
    // into the rings at positions only the host knows.
    const bool filling_window = keeps_window && !compressed;
    return tokens.size() == 1 && !all_logits && config.rope.scaling != RopeScaling::kDynamic &&
           !filling_window && !recording->capture_inputs;
  }

  // RoPE tables for positions position .. position + n - 1; dynamic scaling builds them into the
  // given buffers (which must outlive the kernels that read them).
  std::pair<const float*, const float*> rope_span(int64_t n, DeviceBuffer<float>& dynamic_cos,
                                                  DeviceBuffer<float>& dynamic_sin) {
    if (config.rope.scaling == RopeScaling::kDynamic) {
      // The angles depend on the sequence length: tables for exactly this span.
      const RopeTables tables = rope_tables(config, schedule.position(), n);
      dynamic_cos.allocate(tables.cos.size());
      dynamic_sin.allocate(tables.sin.size());
      dynamic_cos.upload(tables.cos.data(), tables.cos.size());
      dynamic_sin.upload(tables.sin.data(), tables.sin.size());
      return {dynamic_cos.data(), dynamic_sin.data()};
    }
    const int64_t position = schedule.position();
    return {rope_cos.data() + position * w.half_rotary, rope_sin.data() + position * w.half_rotary};
  }

  // Final norm and logits of rows [t0, t0 + m) of `rows` (the residual stream): all of them into
  // `all` when all_logits, else only the span's last row when it ends the forward pass.
  void enqueue_logits(const float* rows, int64_t t0, int64_t m, int64_t n, bool all_logits,
                      std::vector<float>* all) {
    if (all_logits) {
      // Row by row through the one-row logits buffer keeps memory bounded for long spans.
      rms_norm(rows, final_norm.data(), m, w.hidden, config.rms_norm_eps, normed.data(), stream);
      for (int64_t r = 0; r < m; ++r) {
        blas.linear(normed.data() + r * w.hidden, 1, w.hidden, head(), w.vocab, logits.data());
        check(cudaMemcpyAsync(all->data() + (t0 + r) * w.vocab, logits.data(),
                              sizeof(float) * w.vocab, cudaMemcpyDeviceToHost, stream),
              "logits download");
      }
      check(cudaStreamSynchronize(stream), "logits download");
    } else if (t0 + m == n) {
      rms_norm(rows + (m - 1) * w.hidden, final_norm.data(), 1, w.hidden, config.rms_norm_eps,
               normed.data(), stream);
      blas.linear(normed.data(), 1, w.hidden, head(), w.vocab, logits.data());
    }
  }

  // Chunk by chunk through all layers (prompts on the plain path, and single tokens outside the
  // captured graph).
  void run_chunked(int64_t n, bool all_logits, std::vector<float>* all) {
    DeviceBuffer<float> dynamic_cos, dynamic_sin;
    const auto [cos_table, sin_table] = rope_span(n, dynamic_cos, dynamic_sin);
    for (int64_t t0 = 0; t0 < n; t0 += chunk) {
      const int64_t m = std::min<int64_t>(chunk, n - t0);
      {
        const auto timed = stages.scope(Stage::kEmbedding, stream);
        cuda::embedding(embedding.data(), ids.data() + t0, m, w.hidden, hidden.data(), stream);
      }
      for (int index = 0; index < config.num_layers; ++index) {
        enqueue_layer(index, m, schedule.position() + t0, cos_table + t0 * w.half_rotary,
                      sin_table + t0 * w.half_rotary, nullptr,
                      output_rows_of_layer(index, t0, m, n, all_logits));
      }
      {
        const auto timed = stages.scope(Stage::kLogits, stream);
        enqueue_logits(hidden.data(), t0, m, n, all_logits, all);
      }
      report_progress(t0 + m, n);
    }
    // The dynamic tables must outlive the kernels that read them.
    if (dynamic_cos.size() != 0) check(cudaStreamSynchronize(stream), "forward");
  }

  // A prompt from position 0, layer by layer over the whole prompt: each layer's queries and keys
  // of every token exist before its attention runs, so a sparse method can estimate the layer's
  // plan from all of them (the rigid/dynamic test looks at every segment) and the attention is
  // one launch per layer (unless served in slices). Matrix products still go chunk by chunk.
  // A layer-major prompt in progress, as a sequence of slices: per layer, its products chunk by
  // chunk (the queries, keys and values of every token), then its attention by query ranges, then
  // its output projection and MLP chunk by chunk. run_layer_major runs it whole; serving runs a
  // budget of slices per step between the decode steps of other sequences (begin_prompt).
  enum class PassPhase { kProducts, kAttention, kMlp };
  struct LayerMajorPass {
    int64_t n = 0;
    bool all_logits = false;
    std::vector<float>* all = nullptr;
    DeviceBuffer<float> dynamic_cos, dynamic_sin;
    const float* cos_table = nullptr;
    const float* sin_table = nullptr;
    int64_t step = 0;        // prompt rows per product slice
    int64_t query_step = 0;  // the granule of attention slices' query ranges
    EventTimer estimate_timer, attention_timer;
    int64_t host_keys = 0;                 // dense layers' keys, counted on the host
    int64_t sparse_layers_dense_keys = 0;  // what full attention would read in sparse layers
    int next_layer = 0;
    PassPhase phase = PassPhase::kProducts;
    int64_t next_row = 0;                 // the phase's next prompt row
    DevicePrefillPlan plan;               // the layer's attention plan, once its products have run
    bool sliced = false;                  // served in budgeted slices (begin_prompt)
    std::vector<uint8_t> segment_sparse;  // a sliced pass's sparse plan, on the host
    std::vector<int32_t> row_offsets;
  };

  void run_layer_major(int64_t n, bool all_logits, std::vector<float>* all) {
    LayerMajorPass pass;
    begin_layer_major(pass, n, all_logits, all, chunk);
    while (pass.next_layer < config.num_layers)
      run_layer_major_work(pass, std::numeric_limits<double>::infinity());
    finish_layer_major(pass);
  }

  // Product slices of at most max_step rows (whole segments when a sparse method estimates).
  void begin_layer_major(LayerMajorPass& pass, int64_t n, bool all_logits, std::vector<float>* all,
                         int64_t max_step) {
    pass.n = n;
    pass.all_logits = all_logits;
    pass.all = all;
    std::tie(pass.cos_table, pass.sin_table) = rope_span(n, pass.dynamic_cos, pass.dynamic_sin);
    const int64_t rows = std::min<int64_t>(chunk, max_step);
    pass.step = estimator ? layer_major_chunk(rows, attention.prefill_params.segment_size,
                                              attention.prefill_params.block_size)
                          : rows;
    // A query range starts on a segment (a sparse tile reads one segment's plan row) and on a tile
    // of packed rows (128 tokens hold a whole number of tiles for any group size).
    pass.query_step = estimator ? attention.prefill_params.segment_size : 128;
    recording->prefill_plans.clear();
    if (estimator)
      check(cudaMemsetAsync(key_counters.data(), 0, sizeof(unsigned long long), stream),
            "counters");
    if (compress_in_prefill) {
      scratch_keys.allocate(static_cast<size_t>(w.kv) * context);
      scratch_values.allocate(static_cast<size_t>(w.kv) * context);
      begin_compression(static_cast<int>(n));
    }
    for (int64_t t0 = 0; t0 < n; t0 += pass.step) {
      const int64_t m = std::min<int64_t>(pass.step, n - t0);
      const auto timed = stages.scope(Stage::kEmbedding, stream);
      cuda::embedding(embedding.data(), ids.data() + t0, m, w.hidden,
                      prompt_hidden.data() + t0 * w.hidden, stream);
    }
  }

  // Enqueues slices while `budget` token-layers last (at least one); returns their work.
  double run_layer_major_work(LayerMajorPass& pass, double budget) {
    double spent = 0;
    do {
      spent += run_layer_major_slice(pass, budget - spent);
    } while (spent < budget && pass.next_layer < config.num_layers);
    return spent;
  }

  double run_layer_major_slice(LayerMajorPass& pass, double budget) {
    const int index = pass.next_layer;
    const int64_t n = pass.n;
    if (pass.phase == PassPhase::kProducts) {
      const int64_t t0 = pass.next_row, m = std::min<int64_t>(pass.step, n - t0);
      run_product_slice(pass, index, t0, m);
      pass.next_row += m;
      if (pass.next_row == n) {
        pass.phase = PassPhase::kAttention;
        pass.next_row = 0;
      }
      return static_cast<double>(m) * prefill_work.qkv_per_token();
    }
    if (pass.phase == PassPhase::kAttention) {
      double spent = 0;
      if (pass.next_row == 0 && plan_layer_attention(pass, index)) {
        spent = prefill_work.attention(n - 1, n);  // the last row alone ran
        pass.next_row = n;
      } else {
        const int64_t first = pass.next_row;
        int64_t end = std::min(n, first + pass.query_step);
        spent = attention_cost(pass, first, end);
        while (end < n) {
          const int64_t next = std::min(n, end + pass.query_step);
          const double more = attention_cost(pass, end, next);
          if (spent + more > budget) break;
          spent += more;
          end = next;
        }
        run_attention_slice(pass, first, end);
        pass.next_row = end;
      }
      if (pass.next_row == n) {
        if (compress_in_prefill) {
          // The layer's attention has read its full cache (stream order); the compaction ends
          // with a synchronisation, after which the next layer may overwrite the full-size cache.
          const auto timed = stages.scope(Stage::kCompression, stream);
          compress_layer(index, scratch_keys.data(), scratch_values.data(), static_cast<int>(n),
                         keeps_window ? static_cast<int>(std::min<int64_t>(window, n)) : 0);
        }
        pass.phase = PassPhase::kMlp;
        pass.next_row = 0;
      }
      return spent;
    }
    const int64_t t0 = pass.next_row, m = std::min<int64_t>(pass.step, n - t0);
    const int64_t rows = output_rows_of_layer(index, t0, m, n, pass.all_logits);
    if (rows > 0) {
      const int64_t skipped = m - rows;
      enqueue_mlp(layers[index], prompt_hidden.data() + (t0 + skipped) * w.hidden,
                  prompt_attention.data() + (t0 + skipped) * w.q, rows);
    }
    pass.next_row += m;
    if (pass.next_row == n) {
      report_progress((index + 1) * n / config.num_layers, n);
      ++pass.next_layer;
      pass.phase = PassPhase::kProducts;
      pass.next_row = 0;
    }
    return static_cast<double>(rows) * prefill_work.mlp_per_token();
  }

  bf16* pass_keys(int index) {
    return compress_in_prefill || fp8_cache ? scratch_keys.data() : layers[index].keys.data();
  }
  bf16* pass_values(int index) {
    return compress_in_prefill || fp8_cache ? scratch_values.data() : layers[index].values.data();
  }

  // Rows t0 .. t0+m-1 through the layer's q/k/v product, their rotated queries into the prompt's
  // query rows and their keys and values into the cache.
  void run_product_slice(LayerMajorPass& pass, int index, int64_t t0, int64_t m) {
    const int64_t n = pass.n;
    Layer& layer = layers[index];
    bf16* cache_keys = pass_keys(index);
    bf16* cache_values = pass_values(index);
    bf16* q = prompt_q.data() + t0 * w.q;
    const float* cos_rows = pass.cos_table + t0 * w.half_rotary;
    const float* sin_rows = pass.sin_table + t0 * w.half_rotary;
    // One pass rotates the queries and keys, fills the caches and, for a layer that is estimated,
    // takes the estimate's statistics (prefill_qkv_epilogue.h).
    PrefillQkvShape epilogue_shape;
    epilogue_shape.tokens = m;
    epilogue_shape.token_stride = w.qkv;
    epilogue_shape.q_heads = config.num_heads;
    epilogue_shape.kv_heads = config.num_kv_heads;
    epilogue_shape.head_dim = w.head_dim;
    epilogue_shape.adjacent_pairs = config.rope.rotate_adjacent_pairs;
    epilogue_shape.q_out_stride = w.q;
    epilogue_shape.cache_stride = context;
    epilogue_shape.first_position = t0;
    // The statistics only for passes of whole segments (every pass but the last when the chunk
    // holds a segment); otherwise the estimator reads the keys back itself.
    const int S = attention.prefill_params.segment_size;
    const bool estimated = estimator && layer_is_estimated(index, n, pass.all_logits);
    const bool with_stats = estimated && t0 % S == 0 && (m % S == 0 || t0 + m == n);
    PrefillQkvStats stats;
    if (with_stats) stats = estimator->fused_stats();
    const bool fused =
        prefill_qkv_epilogue_fits(qkv.data(), epilogue_shape, 2 * w.half_rotary, cos_rows, sin_rows,
                                  q, with_stats ? &stats : nullptr);
    if (fused) {
      enqueue_qkv_product(layer, prompt_hidden.data() + t0 * w.hidden, m,
                          first_query_row(index, t0, m, n, pass.all_logits));
      const auto timed = stages.scope(Stage::kQkvPointwise, stream);
      prefill_qkv_epilogue(qkv.data(), epilogue_shape, cos_rows, sin_rows, q, cache_keys,
                           cache_values, with_stats ? &stats : nullptr, stream);
    } else {  // partial rotation or unaligned rows: the separate kernels
      enqueue_qkv(layer, prompt_hidden.data() + t0 * w.hidden, m, cos_rows, sin_rows, nullptr, q);
      const auto timed = stages.scope(Stage::kCacheWrites, stream);
      append_kv(qkv.data() + w.q, qkv.data() + w.q + w.kv, m, w.qkv, config.num_kv_heads,
                w.head_dim, cache_keys, cache_values, context, t0, stream);
    }
    if (fused && with_stats) {
      estimator->record_fused(t0, m);
    } else if (estimated) {
      pass.estimate_timer.start(stream);
      estimator->record_key_blocks(cache_keys, context, t0, m, stream);
      pass.estimate_timer.stop(stream);
    }
    const auto timed = stages.scope(Stage::kCacheWrites, stream);
    record_window(index, q, w.q, t0, m);
    if (recording->capture_inputs) capture(index, q, w.q, nullptr, 0, cache_keys, t0, m);
  }

  // Once every row's queries and keys of the layer exist: its plan (pass.plan). For the last layer
  // without all_logits, runs its attention at once instead and returns true: the prompt's last row
  // alone (the last segment is dense under every method), as a decode step over the filled cache.
  // The estimate then runs only when plans are recorded (they describe every layer).
  bool plan_layer_attention(LayerMajorPass& pass, int index) {
    const int64_t n = pass.n;
    pass.plan = DevicePrefillPlan{};
    if (output_rows_of_layer(index, 0, n, n, pass.all_logits) < n) {
      if (estimator && recording->record_plans) {
        estimator->estimate(prompt_q.data(), w.q, n, index, stream);
        recording->prefill_plans.push_back(estimator->download_last(stream));
      }
      store_fp8_rows(index, n);
      pass.host_keys += static_cast<int64_t>(config.num_kv_heads) * n;
      pass.attention_timer.start(stream);
      flash_decode(prompt_q.data() + (n - 1) * w.q, pass_keys(index), pass_values(index),
                   decode_shape(static_cast<int>(n - 1)), prompt_attention.data() + (n - 1) * w.q,
                   decode_workspace.data(), decode_workspace.size(), stream);
      pass.attention_timer.stop(stream);
      return true;
    }
    if (estimator) {
      pass.estimate_timer.start(stream);
      pass.plan = estimator->estimate(prompt_q.data(), w.q, n, index, stream);
      pass.estimate_timer.stop(stream);
      if (recording->record_plans)
        recording->prefill_plans.push_back(estimator->download_last(stream));
      if (!pass.plan.dense && pass.sliced) {
        // What the slices will cost: the plan's row lengths (a few KiB, one wait per layer).
        pass.segment_sparse.resize(static_cast<size_t>(pass.plan.num_segments));
        pass.row_offsets.resize(
            static_cast<size_t>(pass.plan.num_kv_heads) * pass.plan.num_segments + 1);
        check(cudaMemcpyAsync(pass.segment_sparse.data(), pass.plan.segment_sparse,
                              pass.segment_sparse.size(), cudaMemcpyDeviceToHost, stream),
              "plan download");
        check(cudaMemcpyAsync(pass.row_offsets.data(), pass.plan.row_offsets,
                              sizeof(int32_t) * pass.row_offsets.size(), cudaMemcpyDeviceToHost,
                              stream),
              "plan download");
        check(cudaStreamSynchronize(stream), "plan download");
      }
    }
    store_fp8_rows(index, n);
    fp8_staged_layer = -1;
    const bool fp8_plan = pass.plan.dense ||
                          (fp8_sparse_attention &&
                           fp8_block_sparse_fits(pass.plan, config.num_heads, config.num_kv_heads));
    if (fp8_attention && fp8_plan) {
      const auto timed = stages.scope(Stage::kCacheWrites, stream);
      stage_fp8_keys(pass_keys(index), pass_values(index), context, w.head_dim, n, fp8_staging.view,
                     stream);
      fp8_staged_layer = index;
    }
    return false;
  }

  // With an FP8 cache: the prompt's n rows of layer `index`, estimated from at full precision, go
  // into its cache; its attention then reads the staging slabs as the cache reads back.
  void store_fp8_rows(int index, int64_t n) {
    if (!fp8_cache) return;
    const auto timed = stages.scope(Stage::kCacheWrites, stream);
    quantize_kv_rows(scratch_keys.data(), scratch_values.data(), config.num_kv_heads, context,
                     w.head_dim, 0, n, layers[index].fp8_rows(), layers[index].lengths.data(),
                     stream);
  }

  // Queries first .. end-1 of the layer under pass.plan, in token-layers. A pass run whole needs
  // no costs (it is one slice): a sparse plan then counts as dense.
  double attention_cost(const LayerMajorPass& pass, int64_t first, int64_t end) const {
    if (pass.plan.dense || !pass.sliced) return prefill_work.attention(first, end);
    return prefill_work.sparse_attention(pass.segment_sparse, pass.row_offsets,
                                         pass.plan.num_kv_heads, pass.plan.segment_size,
                                         pass.plan.block_size, first, end);
  }

  // The layer's attention for the queries at positions first .. end-1 under pass.plan.
  void run_attention_slice(LayerMajorPass& pass, int64_t first, int64_t end) {
    const int index = pass.next_layer;
    FlashShape shape = decode_shape(0);
    shape.tokens = end - first;
    shape.first_position = first;
    shape.q_token_stride = w.q;
    shape.out_token_stride = w.q;
    const int64_t keys =
        static_cast<int64_t>(config.num_kv_heads) * (end * (end + 1) / 2 - first * (first + 1) / 2);
    const bf16* q = prompt_q.data() + first * w.q;
    bf16* out = prompt_attention.data() + first * w.q;
    pass.attention_timer.start(stream);
    if (pass.plan.dense) {
      pass.host_keys += keys;
    } else {  // the kernel counts the keys it reads under a sparse plan
      pass.sparse_layers_dense_keys += keys;
    }
    if (fp8_staged_layer == index) {
      flash_prefill_block_sparse_fp8(q, fp8_staging.view, shape, pass.plan, out, stream,
                                     key_counters.data());
    } else if (estimator) {
      flash_prefill_block_sparse(q, pass_keys(index), pass_values(index), shape, pass.plan, out,
                                 stream, FlashKernel::kAuto, key_counters.data());
    } else {
      flash_prefill(q, pass_keys(index), pass_values(index), shape, out, stream);
    }
    pass.attention_timer.stop(stream);
  }

  void finish_layer_major(LayerMajorPass& pass) {
    const int64_t n = pass.n;
    for (int64_t t0 = 0; t0 < n; t0 += pass.step) {
      const int64_t m = std::min<int64_t>(pass.step, n - t0);
      const auto timed = stages.scope(Stage::kLogits, stream);
      // A served prompt scored row by row has no `all`: its rows come down in finish_prompt.
      enqueue_logits(prompt_hidden.data() + t0 * w.hidden, t0, m, n,
                     pass.all_logits && pass.all != nullptr, pass.all);
    }
    unsigned long long counters[1] = {0};
    if (estimator) {
      check(cudaMemcpyAsync(counters, key_counters.data(), sizeof(counters), cudaMemcpyDeviceToHost,
                            stream),
            "work counters");
    }
    check(cudaStreamSynchronize(stream), "prefill");
    if (compress_in_prefill) {
      finish_compression();
      scratch_keys.release();
      scratch_values.release();
    }
    // The kernel counts (query head, key) pairs; the work is per KV head.
    const int64_t group = config.num_heads / config.num_kv_heads;
    work.prefill_keys_read = pass.host_keys + static_cast<int64_t>(counters[0]) / group;
    work.prefill_keys_dense = pass.host_keys + pass.sparse_layers_dense_keys;
    work.estimate_ms = pass.estimate_timer.total_ms();
    work.prefill_attention_ms = pass.attention_timer.total_ms();
    if (stages.active) {  // these two are always timed here
      stages.add(Stage::kEstimate, work.estimate_ms);
      stages.add(Stage::kAttention, work.prefill_attention_ms);
    }
  }

  size_t cache_bytes() const {
    size_t total = 0;
    for (const Layer& layer : layers) {
      total += layer.keys.bytes() + layer.values.bytes() + layer.key_codes.bytes() +
               layer.value_codes.bytes() + layer.key_scales.bytes() + layer.value_scales.bytes();
    }
    return total;
  }

  // The one-time compression of every layer's cache (docs/method.md section 3), mirroring the CPU
  // engine: each layer's plan is made on the GPU from its observation window, the kept rows are
  // gathered into per-head caches sized to the longest head plus decode_room, and the full cache is
  // freed.
  void compress() {
    const int position = schedule.position();
    begin_compression(position);
    for (int index = 0; index < config.num_layers; ++index) {
      Layer& layer = layers[index];
      if (fp8_cache) {
        // The scores read the rows as the cache holds them, widened; the codes move as they are.
        dequantize_kv_rows(layer.fp8_rows(), config.num_kv_heads, context, w.head_dim, 0, position,
                           scratch_keys.data(), scratch_values.data(), stream);
        compress_layer(index, scratch_keys.data(), scratch_values.data(), position,
                       schedule.window_tokens());
      } else {
        compress_layer(index, layer.keys.data(), layer.values.data(), position,
                       schedule.window_tokens());
      }
    }
    finish_compression();
  }

  size_t compression_workspace_floats = 1;
  double compression_seconds = 0;
  double compression_memory_seconds = 0;

  void begin_compression(int tokens) {
    // Under compress_during_prefill no full cache is ever whole: "before" is what it would take.
    work.cache_bytes_before = compress_in_prefill
                                  ? sizeof(bf16) * 2 * static_cast<size_t>(config.num_layers) *
                                        static_cast<size_t>(w.kv) * context
                                  : cache_bytes();
    work.cache_entries_before =
        static_cast<int64_t>(config.num_layers) * config.num_kv_heads * tokens;
    work.cache_entries_after = 0;
    compression_workspace_floats = 1;
    recording->decode_plans.assign(recording->record_plans ? config.num_layers : 0,
                                   LayerDecodePlan{});
    compression_seconds = 0;
    compression_memory_seconds = 0;
  }

  // Compresses layer `index`, whose full cache (per KV head a [context][head_dim] slab) holds
  // `tokens` rows, with the last `window_tokens` queries of its ring as the observation window.
  void compress_layer(int index, const bf16* full_keys, const bf16* full_values, int tokens,
                      int window_tokens) {
    const auto start = std::chrono::steady_clock::now();
    Layer& layer = layers[index];
    const int group = config.num_heads / config.num_kv_heads;
    const int room = std::max(1, std::min(decode_room, context - tokens));
    if (keeps_window) {
      // Oldest first: the ring slots of positions tokens - window_tokens .. tokens - 1.
      const bf16* ring = window_rings.data() + static_cast<size_t>(index) * window * w.q;
      for (int row = 0; row < window_tokens;) {
        const int slot = (tokens - window_tokens + row) % window;
        const int run = std::min(window_tokens - row, window - slot);
        check(cudaMemcpyAsync(window_oldest_first.data() + static_cast<size_t>(row) * w.q,
                              ring + static_cast<size_t>(slot) * w.q, sizeof(bf16) * run * w.q,
                              cudaMemcpyDeviceToDevice, stream),
              "window queries");
        row += run;
      }
    }
    const DeviceDecodePlan plan =
        compressor->plan(keeps_window ? window_oldest_first.data() : nullptr, window_tokens,
                         full_keys, context, tokens, index, stream);
    if (recording->record_plans) {
      recording->decode_plans[index] =
          plan.heads == 0 ? LayerDecodePlan{} : compressor->download_last(stream);
    }
    if (plan.heads == 0) {  // the cache is within this layer's budget: nothing to drop
      work.cache_entries_after += static_cast<int64_t>(config.num_kv_heads) * tokens;
      if (compress_in_prefill) keep_whole_layer(layer, full_keys, full_values, tokens, room);
      compression_seconds += seconds_since(start);
      return;
    }
    std::vector<int32_t> offsets(static_cast<size_t>(plan.heads) + 1);
    check(cudaMemcpyAsync(offsets.data(), plan.kept_offsets, sizeof(int32_t) * offsets.size(),
                          cudaMemcpyDeviceToHost, stream),
          "compression plan");
    check(cudaStreamSynchronize(stream), "compression plan");
    int longest = 0;
    for (int c = 0; c < plan.heads; ++c) longest = std::max(longest, offsets[c + 1] - offsets[c]);
    work.cache_entries_after += offsets.back();
    const int64_t stride = longest + room;
    const auto allocation_start = std::chrono::steady_clock::now();
    Layer compact;
    const size_t elements = static_cast<size_t>(plan.heads) * stride * w.head_dim;
    if (fp8_cache) {
      compact.key_codes.allocate(elements);
      compact.value_codes.allocate(elements);
      compact.key_scales.allocate(static_cast<size_t>(plan.heads) * stride);
      compact.value_scales.allocate(static_cast<size_t>(plan.heads) * stride);
    } else {
      compact.keys.allocate(elements);
      compact.values.allocate(elements);
    }
    compact.lengths.allocate(static_cast<size_t>(plan.heads));
    compression_memory_seconds += seconds_since(allocation_start);
    if (fp8_cache) {
      compact_cache(layer.fp8_rows(), context, config.num_kv_heads, config.head_dim, plan,
                    plan.per_query_head ? group : 1, compact.fp8_rows(), stride,
                    compact.lengths.data(), stream);
    } else {
      compact_cache(full_keys, full_values, context, config.num_kv_heads, config.head_dim, plan,
                    plan.per_query_head ? group : 1, compact.keys.data(), compact.values.data(),
                    stride, compact.lengths.data(), stream);
    }
    check(cudaStreamSynchronize(stream), "cache compaction");  // before the old cache is freed
    const auto install_start = std::chrono::steady_clock::now();
    install_ragged(layer, std::move(compact), plan.heads, plan.per_query_head, stride);
    compression_memory_seconds += seconds_since(install_start);
    compression_seconds += seconds_since(start);
  }

  // compress_during_prefill, a layer within its budget: all its rows move out of the full-size
  // cache (which the next layer reuses) into a cache of their own, with room to decode.
  void keep_whole_layer(Layer& layer, const bf16* full_keys, const bf16* full_values, int tokens,
                        int room) {
    const int heads = config.num_kv_heads;
    const int64_t stride = static_cast<int64_t>(tokens) + room;
    DeviceBuffer<bf16> keys(static_cast<size_t>(heads) * stride * w.head_dim);
    DeviceBuffer<bf16> values(static_cast<size_t>(heads) * stride * w.head_dim);
    const size_t row_bytes = sizeof(bf16) * static_cast<size_t>(w.head_dim);
    const std::pair<bf16*, const bf16*> copies[] = {{keys.data(), full_keys},
                                                    {values.data(), full_values}};
    for (const auto& [target, source] : copies) {
      check(cudaMemcpy2DAsync(target, row_bytes * stride, source, row_bytes * context,
                              row_bytes * tokens, heads, cudaMemcpyDeviceToDevice, stream),
            "cache copy");
    }
    const std::vector<int32_t> host_lengths(static_cast<size_t>(heads), tokens);
    DeviceBuffer<int32_t> lengths(static_cast<size_t>(heads));
    lengths.upload(host_lengths.data(), host_lengths.size());
    check(cudaStreamSynchronize(stream), "cache copy");  // before the full-size cache is reused
    Layer whole;
    whole.keys = std::move(keys);
    whole.values = std::move(values);
    whole.lengths = std::move(lengths);
    install_ragged(layer, std::move(whole), heads, false, stride);
  }

  // The caches and lengths of `compact` (bf16 or FP8) become the layer's, the old ones are freed.
  void install_ragged(Layer& layer, Layer compact, int heads, bool per_query_head, int64_t stride) {
    layer.keys = std::move(compact.keys);
    layer.values = std::move(compact.values);
    layer.key_codes = std::move(compact.key_codes);
    layer.value_codes = std::move(compact.value_codes);
    layer.key_scales = std::move(compact.key_scales);
    layer.value_scales = std::move(compact.value_scales);
    layer.lengths = std::move(compact.lengths);
    layer.compressed = true;
    layer.per_query_head = per_query_head;
    layer.cache_heads = heads;
    layer.cache_stride = stride;
    const RaggedShape shape = ragged_shape(layer);
    layer.decode_splits = ragged_decode_splits(shape);
    compression_workspace_floats = std::max(
        compression_workspace_floats, ragged_decode_workspace_floats(shape, layer.decode_splits));
  }

  void finish_compression() {
    // An FP8 cache's uncompressed layers decode through the same workspace.
    if (ragged_workspace.size() < compression_workspace_floats)
      ragged_workspace.allocate(compression_workspace_floats);
    work.cache_bytes_after = cache_bytes();
    work.compressed = true;
    compressed = true;
    schedule.mark_compressed();
    drop_graph();  // the captured steps read the old caches
    work.compression_ms = 1e3 * compression_seconds;
    work.compression_memory_ms = 1e3 * compression_memory_seconds;
  }

  void drop_graph() {
    if (decode_graph != nullptr) cudaGraphExecDestroy(decode_graph);
    decode_graph = nullptr;
    eager_decode_steps = 0;
  }

  // Forgets the sequence; a compressed cache goes back to full size.
  void reset() {
    schedule.reset();
    work = CudaAttentionWork{};
    if (compressed) {
      drop_graph();
      for (Layer& layer : layers) {
        if (!layer.compressed) continue;
        release_cache(layer);
        if (!compress_in_prefill) allocate_full_cache(layer);  // that mode has none per layer
        full_cache_shape(layer);
      }
      if (!fp8_cache) ragged_workspace.release();
      compressed = false;
    }
    if (fp8_cache) {  // the next span starts at row 0 of every head
      for (Layer& layer : layers) {
        check(cudaMemsetAsync(layer.lengths.data(), 0, layer.lengths.bytes(), stream), "lengths");
      }
    }
  }

  // Runs the tokens through the model; leaves the logits of the last token (or, with all_logits, of
  // every token, copied into `all`) and returns the device pointer of the last token's logits.
  const float* run(std::span<const int32_t> tokens, bool all_logits, std::vector<float>* all) {
    schedule.check_span(tokens, config.vocab_size);
    const int64_t n = static_cast<int64_t>(tokens.size());
    const int position = schedule.position();
    if (compress_in_prefill && !compressed && (position != 0 || n < 2)) {
      throw Error(
          "compress_during_prefill: the prompt must come whole, in one call of at least 2 "
          "tokens from position 0");
    }
    if (compressed && n > 1) {
      // A compressed cache has heads of different lengths; new tokens go through one at a time.
      if (all_logits) all->assign(static_cast<size_t>(n * w.vocab), 0.0f);
      for (int64_t t = 0; t < n; ++t) {
        std::vector<float> row;
        run(tokens.subspan(static_cast<size_t>(t), 1), all_logits, &row);
        if (all_logits) std::copy(row.begin(), row.end(), all->begin() + t * w.vocab);
      }
      return logits.data();
    }
    const bool is_prefill = schedule.is_prefill();
    if (graph_decodes(tokens, all_logits)) {
      decode(tokens[0]);
    } else {
      check(cudaMemcpyAsync(ids.data(), tokens.data(), sizeof(int32_t) * n, cudaMemcpyHostToDevice,
                            stream),
            "token upload");
      if (is_prefill) work = CudaAttentionWork{};
      if (all_logits) all->assign(static_cast<size_t>(n * w.vocab), 0.0f);
      stages.clear();
      stages.active = stage_timing && is_prefill;
      if (is_prefill && position == 0 && n > 1 && layer_major) {
        run_layer_major(n, all_logits, all);
      } else {
        run_chunked(n, all_logits, all);
        if (is_prefill) {
          // Full causal attention over the span, per KV head; the last layer's last row alone
          // unless every row's logits were asked for.
          const double first = position, last = position + n;
          const int whole_layers = all_logits ? config.num_layers : config.num_layers - 1;
          const double keys = config.num_kv_heads *
                              (whole_layers * ((last * (last + 1) - first * (first + 1)) / 2) +
                               (config.num_layers - whole_layers) * last);
          work.prefill_keys_read = work.prefill_keys_dense = static_cast<int64_t>(keys);
        }
      }
      if (stages.active) {
        work.prefill_stage_ms = stages.totals_ms();  // waits for the prefill's last event
        stages.active = false;
      }
    }
    if (schedule.advance(n)) compress();
    return logits.data();
  }

  // --- Serving (engine/cuda/cuda_batch_model.cu)
  // --------------------------------------------------

  std::unique_ptr<LayerMajorPass> prompt_pass;      // the resident prompt while its layers run
  std::vector<float> host_rope_cos, host_rope_sin;  // the RoPE tables, for batch rows' positions
  DeviceBuffer<float> batch_rope_cos, batch_rope_sin, batch_logits, paged_workspace;
  DeviceBuffer<int32_t> batch_ids;
  DeviceBuffer<float> scored_rows_logits;  // [kScoredPromptRows][vocab], once a prompt is scored
  bool prompt_every_row = false;           // the resident prompt was begun with every_row

  void begin_prompt(std::span<const int32_t> tokens, bool every_row) {
    if (compress_in_prefill) throw Error("begin_prompt: compress_during_prefill is not served");
    if (schedule.position() != 0) throw Error("begin_prompt: the model holds a sequence");
    schedule.check_span(tokens, config.vocab_size);
    prompt_pass.reset();
    work = CudaAttentionWork{};
    stages.clear();
    stages.active = false;
    prompt_every_row = every_row;
    if (tokens.size() < 2) {  // one token has no layers to interleave
      run(tokens, false, nullptr);
      return;
    }
    check(cudaMemcpyAsync(ids.data(), tokens.data(), sizeof(int32_t) * tokens.size(),
                          cudaMemcpyHostToDevice, stream),
          "token upload");
    prompt_pass = std::make_unique<LayerMajorPass>();
    prompt_pass->sliced = true;
    begin_layer_major(*prompt_pass, static_cast<int64_t>(tokens.size()), every_row, nullptr,
                      kServedProductRows);
  }

  bool prompt_layers_done() const {
    return !prompt_pass || prompt_pass->next_layer >= config.num_layers;
  }

  double run_prompt_work(double budget) {
    if (prompt_layers_done()) throw Error("run_prompt_work: no prompt work is left");
    return run_layer_major_work(*prompt_pass, budget);
  }

  std::vector<float> finish_prompt(const CudaTransformer::LogitRowsCallback& each_rows) {
    if (prompt_every_row != static_cast<bool>(each_rows)) {
      throw Error(prompt_every_row ? "finish_prompt: the prompt's rows need a callback"
                                   : "finish_prompt: the prompt was begun without every_row");
    }
    const bool one_token = !prompt_pass;
    if (prompt_pass) {
      if (!prompt_layers_done()) throw Error("finish_prompt: layers are left");
      finish_layer_major(*prompt_pass);
      const int64_t n = prompt_pass->n;
      prompt_pass.reset();
      // Before a compression, which may reuse the prompt's buffers.
      if (each_rows) download_prompt_rows(n, each_rows);
      if (schedule.advance(n)) compress();
    }
    std::vector<float> host(static_cast<size_t>(w.vocab));
    check(cudaMemcpyAsync(host.data(), logits.data(), sizeof(float) * host.size(),
                          cudaMemcpyDeviceToHost, stream),
          "logits download");
    check(cudaStreamSynchronize(stream), "prefill");
    if (each_rows && one_token) each_rows(0, host);
    prompt_every_row = false;
    return host;
  }

  // The output head over a finished layer-major prompt's n rows (prompt_hidden), a slice of rows
  // per product; each slice comes down and goes to each_rows before the next is computed.
  void download_prompt_rows(int64_t n, const CudaTransformer::LogitRowsCallback& each_rows) {
    const int64_t slice = std::min<int64_t>(CudaTransformer::kScoredPromptRows, chunk);
    const size_t slice_floats = static_cast<size_t>(slice * w.vocab);
    if (scored_rows_logits.size() < slice_floats) scored_rows_logits.allocate(slice_floats);
    std::vector<float> host(slice_floats);
    for (int64_t t0 = 0; t0 < n; t0 += slice) {
      const int64_t m = std::min(slice, n - t0);
      rms_norm(prompt_hidden.data() + t0 * w.hidden, final_norm.data(), m, w.hidden,
               config.rms_norm_eps, normed.data(), stream);
      blas.linear(normed.data(), m, w.hidden, head(), w.vocab, scored_rows_logits.data());
      check(cudaMemcpyAsync(host.data(), scored_rows_logits.data(), sizeof(float) * m * w.vocab,
                            cudaMemcpyDeviceToHost, stream),
            "prompt logits download");
      check(cudaStreamSynchronize(stream), "prompt logits download");
      each_rows(t0, std::span<const float>(host.data(), static_cast<size_t>(m * w.vocab)));
    }
  }

  CudaTransformer::ResidentLayer resident_layer(int index) const {
    const Layer& layer = layers.at(static_cast<size_t>(index));
    CudaTransformer::ResidentLayer resident;
    resident.caches = layer.cache_heads;
    resident.per_query_head = layer.per_query_head;
    resident.lengths.assign(static_cast<size_t>(layer.cache_heads), schedule.position());
    if (layer.compressed) {
      check(cudaMemcpyAsync(resident.lengths.data(), layer.lengths.data(),
                            sizeof(int32_t) * resident.lengths.size(), cudaMemcpyDeviceToHost,
                            stream),
            "cache lengths");
      check(cudaStreamSynchronize(stream), "cache lengths");
    }
    return resident;
  }

  static Fp8KvCache fp8_pages(const CudaTransformer::PagedPool& pool) {
    return {static_cast<uint8_t*>(pool.keys), static_cast<uint8_t*>(pool.values), pool.key_scales,
            pool.value_scales};
  }

  void store_resident_layer(int index, const int32_t* page_table, int64_t max_pages,
                            const CudaTransformer::PagedPool& pool) {
    Layer& layer = layers.at(static_cast<size_t>(index));
    const int32_t* lengths = layer.lengths.data();
    DeviceBuffer<int32_t> full_lengths;
    if (!layer.compressed) {
      const std::vector<int32_t> host(static_cast<size_t>(layer.cache_heads), schedule.position());
      full_lengths.allocate(host.size());
      full_lengths.upload(host.data(), host.size());
      lengths = full_lengths.data();
    }
    if (fp8_cache) {
      paged_store(layer.fp8_rows(), layer.cache_stride, layer.cache_heads, w.head_dim, lengths,
                  page_table, max_pages, fp8_pages(pool), stream);
    } else {
      paged_store(layer.keys.data(), layer.values.data(), layer.cache_stride, layer.cache_heads,
                  w.head_dim, lengths, page_table, max_pages, static_cast<bf16*>(pool.keys),
                  static_cast<bf16*>(pool.values), stream);
    }
    if (!layer.compressed) check(cudaStreamSynchronize(stream), "cache store");
  }

  // One decode step of every row of `batch` over its paged caches: the layers' products run over
  // all rows at once (one pass over each weight matrix), attention per row over its own pages.
  void decode_paged(const CudaTransformer::PagedBatch& batch, float* host_logits) {
    const int64_t rows = static_cast<int64_t>(batch.tokens.size());
    if (rows == 0) return;
    if (rows > chunk) throw Error("decode_paged: more rows than chunk_tokens");
    if (config.rope.scaling == RopeScaling::kDynamic)
      throw Error("batched decode does not support dynamic RoPE scaling");
    if (batch.positions.size() != batch.tokens.size() ||
        batch.layers.size() != static_cast<size_t>(config.num_layers)) {
      throw Error("decode_paged: one position per token and one page table per layer");
    }
    if (host_rope_cos.empty()) {
      const RopeTables tables = rope_tables(config, 0, context);
      host_rope_cos = tables.cos;
      host_rope_sin = tables.sin;
    }
    const auto grow = [](auto& buffer, size_t count) {
      if (buffer.size() < count) buffer.allocate(std::max(count, 2 * buffer.size()));
    };
    const size_t half = static_cast<size_t>(w.half_rotary);
    std::vector<float> cos_rows(static_cast<size_t>(rows) * half),
        sin_rows(static_cast<size_t>(rows) * half);
    for (int64_t r = 0; r < rows; ++r) {
      const int position = batch.positions[static_cast<size_t>(r)];
      if (position < 0 || position >= context) throw Error("decode_paged: position out of range");
      std::copy_n(host_rope_cos.begin() + static_cast<int64_t>(position) * w.half_rotary, half,
                  cos_rows.begin() + r * w.half_rotary);
      std::copy_n(host_rope_sin.begin() + static_cast<int64_t>(position) * w.half_rotary, half,
                  sin_rows.begin() + r * w.half_rotary);
    }
    grow(batch_rope_cos, cos_rows.size());
    grow(batch_rope_sin, sin_rows.size());
    grow(batch_ids, static_cast<size_t>(rows));
    grow(batch_logits, static_cast<size_t>(rows * w.vocab));
    batch_rope_cos.upload(cos_rows.data(), cos_rows.size());
    batch_rope_sin.upload(sin_rows.data(), sin_rows.size());
    batch_ids.upload(batch.tokens.data(), batch.tokens.size());
    RaggedShape shape;
    shape.q_heads = config.num_heads;
    shape.kv_heads = config.num_kv_heads;
    shape.head_dim = config.head_dim;
    shape.fp8 = fp8_cache;
    size_t workspace = 1;
    for (const CudaTransformer::PagedLayer& layer : batch.layers) {
      shape.cache_stride = shape.max_length = layer.max_pages * kPagedRows;
      const int splits = paged_decode_splits(shape, static_cast<int>(rows));
      workspace = std::max(workspace, paged_decode_workspace_floats(shape, rows, splits));
    }
    grow(paged_workspace, workspace);

    cuda::embedding(embedding.data(), batch_ids.data(), rows, w.hidden, hidden.data(), stream);
    for (int index = 0; index < config.num_layers; ++index) {
      Layer& layer = layers[index];
      const CudaTransformer::PagedLayer& pages = batch.layers[static_cast<size_t>(index)];
      enqueue_qkv(layer, hidden.data(), rows, batch_rope_cos.data(), batch_rope_sin.data(),
                  nullptr);
      PagedCaches caches;
      caches.page_tables = pages.page_tables;
      caches.max_pages = pages.max_pages;
      caches.lengths = pages.lengths;
      if (fp8_cache) {
        caches.fp8 = fp8_pages(batch.pool);
      } else {
        caches.keys = static_cast<bf16*>(batch.pool.keys);
        caches.values = static_cast<bf16*>(batch.pool.values);
      }
      caches.batch = static_cast<int>(rows);
      shape.cache_stride = shape.max_length = pages.max_pages * kPagedRows;
      paged_append(qkv.data() + w.q, qkv.data() + w.q + w.kv, w.qkv, shape, caches, stream);
      paged_decode(qkv.data(), w.qkv, shape, caches, attn_out.data(), paged_workspace.data(),
                   paged_workspace.size(), stream);
      enqueue_mlp(layer, hidden.data(), attn_out.data(), rows);
    }
    rms_norm(hidden.data(), final_norm.data(), rows, w.hidden, config.rms_norm_eps, normed.data(),
             stream);
    blas.linear(normed.data(), rows, w.hidden, head(), w.vocab, batch_logits.data());
    check(cudaMemcpyAsync(host_logits, batch_logits.data(), sizeof(float) * rows * w.vocab,
                          cudaMemcpyDeviceToHost, stream),
          "logits download");
    check(cudaStreamSynchronize(stream), "batched decode");
  }
};

CudaTransformer::CudaTransformer(const ModelWeights& weights, const CudaModelOptions& options)
    : state_(std::make_unique<State>()) {
  state_->recording = &recording_;
  CudaModelOptions resolved = options;
  resolved.fp8_weights = runs_fp8_products(weights, widths_of(weights.config));
  state_->allocate(weights.config, resolved);
  state_->load(weights);
}

CudaTransformer::CudaTransformer(const ModelConfig& config, uint64_t seed,
                                 const CudaModelOptions& options)
    : state_(std::make_unique<State>()) {
  state_->recording = &recording_;
  state_->allocate(config, options);
  state_->randomize(seed);
}

CudaTransformer::~CudaTransformer() = default;

std::vector<float> CudaTransformer::forward(std::span<const int32_t> tokens, bool all_logits) {
  std::vector<float> all;
  const float* last = state_->run(tokens, all_logits, &all);
  if (all_logits) return all;
  std::vector<float> logits(static_cast<size_t>(state_->w.vocab));
  check(cudaMemcpyAsync(logits.data(), last, logits.size() * sizeof(float), cudaMemcpyDeviceToHost,
                        state_->stream),
        "logits download");
  check(cudaStreamSynchronize(state_->stream), "forward");
  return logits;
}

int32_t CudaTransformer::forward_greedy(std::span<const int32_t> tokens) {
  const bool graph = state_->graph_decodes(tokens, false);
  const float* last = state_->run(tokens, false, nullptr);
  if (!graph)
    argmax_rows(last, 1, state_->w.vocab, state_->best.data(), state_->stream,
                &state_->argmax_workspace);  // the graph did it
  int32_t token = 0;
  check(cudaMemcpyAsync(&token, state_->best.data(), sizeof(token), cudaMemcpyDeviceToHost,
                        state_->stream),
        "token download");
  check(cudaStreamSynchronize(state_->stream), "forward");
  if (token < 0) {
    // Rare: fetch the row so that the error names the token, as the CPU sampler's does.
    std::vector<float> row(static_cast<size_t>(state_->w.vocab));
    check(cudaMemcpy(row.data(), last, row.size() * sizeof(float), cudaMemcpyDeviceToHost),
          "logits download");
    check_logits_usable(row);
    throw Error("the model produced logits no token can be chosen from");
  }
  return token;
}

void CudaTransformer::reset() { state_->reset(); }

void CudaTransformer::warm_up() {
  constexpr int kDecodeSteps = 24;
  const int context = context_length();
  const int steps = std::min(kDecodeSteps, context / 2);
  const int prompt_tokens =
      std::max(1, std::min(state_->options.chunk_tokens + 1, context - steps));
  reset();
  int32_t token = forward_greedy(random_prompt(prompt_tokens, state_->config.vocab_size, 1));
  for (int step = 0; step < steps && position() < context; ++step) {
    token = forward_greedy(std::span<const int32_t>(&token, 1));
  }
  reset();
}

void CudaTransformer::set_attention(const AttentionConfig& attention) {
  set_attention(attention, state_->options.layer_major_prefill);
}

void CudaTransformer::set_attention(const AttentionConfig& attention, bool layer_major_prefill) {
  CudaModelOptions options = state_->options;
  options.attention = attention;
  options.layer_major_prefill = layer_major_prefill;
  state_->configure_attention(options);
  state_->options = options;
}
int CudaTransformer::position() const { return state_->schedule.position(); }
int CudaTransformer::context_length() const { return state_->context; }
const ModelConfig& CudaTransformer::config() const { return state_->config; }
const AttentionConfig& CudaTransformer::attention_config() const {
  return state_->options.attention;
}
const GpuMemoryPlan& CudaTransformer::memory_plan() const { return state_->plan; }
const CudaAttentionWork& CudaTransformer::attention_work() const { return state_->work; }
size_t CudaTransformer::kv_cache_bytes() const { return state_->cache_bytes(); }
void CudaTransformer::set_stage_timing(bool timing) { state_->stage_timing = timing; }
void CudaTransformer::set_progress_callback(ProgressCallback callback) {
  state_->progress = std::move(callback);
}

std::string CudaTransformer::memory_description() const { return state_->plan.describe(); }

void CudaTransformer::begin_prompt(std::span<const int32_t> tokens, bool every_row) {
  state_->begin_prompt(tokens, every_row);
}
bool CudaTransformer::prompt_layers_done() const { return state_->prompt_layers_done(); }
double CudaTransformer::run_prompt_work(double budget) { return state_->run_prompt_work(budget); }
std::vector<float> CudaTransformer::finish_prompt(const LogitRowsCallback& each_rows) {
  return state_->finish_prompt(each_rows);
}
CudaTransformer::ResidentLayer CudaTransformer::resident_layer(int layer) const {
  return state_->resident_layer(layer);
}
void CudaTransformer::store_resident_layer(int layer, const int32_t* page_table, int64_t max_pages,
                                           const PagedPool& pool) {
  state_->store_resident_layer(layer, page_table, max_pages, pool);
}
void CudaTransformer::decode_paged(const PagedBatch& batch, float* logits) {
  state_->decode_paged(batch, logits);
}
void* CudaTransformer::stream() const { return state_->stream; }

std::string CudaTransformer::device_name() const {
  int index = 0;
  cudaDeviceProp properties{};
  check(cudaGetDevice(&index), "cudaGetDevice");
  check(cudaGetDeviceProperties(&properties, index), "cudaGetDeviceProperties");
  return std::string("cuda (") + properties.name + ")";
}

}  // namespace entropyinfer::cuda

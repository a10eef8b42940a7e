#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/cuda_transformer.h"
#include "backends/cuda/flash_attention.h"
#include "core/error.h"
#include "engine/rope.h"

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

int resolve_context(const ModelConfig& config, int requested) {
  const int limit = config.max_position_embeddings;
  const int context = requested > 0 ? requested : limit;
  if (context <= 0) throw Error("context length must be positive");
  if (limit > 0 && context > limit && config.rope.scaling != RopeScaling::kDynamic) {
    throw Error("context length " + std::to_string(context) + " exceeds the model's maximum of " +
                std::to_string(limit) + " positions");
  }
  return context;
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

}  // namespace

std::string GpuMemoryPlan::describe() const {
  return gib(total()) + " (weights " + gib(weights) + ", KV cache " + gib(kv_cache) +
         ", activations " + gib(activations) + ")";
}

GpuMemoryPlan CudaTransformer::plan(const ModelConfig& config, const CudaModelOptions& options) {
  const int context = resolve_context(config, options.context_length);
  const Widths w = widths_of(config);
  const int64_t chunk = std::max(1, std::min(options.chunk_tokens, context));
  GpuMemoryPlan plan;
  const int64_t per_layer = w.qkv * w.hidden + w.hidden * w.q + 3 * w.intermediate * w.hidden;
  plan.weights = sizeof(bf16) * (per_layer * config.num_layers +
                                 w.vocab * w.hidden * (config.tied_embeddings ? 1 : 2));
  plan.weights +=
      sizeof(float) * (config.num_layers * (2 * w.hidden + w.qkv + w.hidden + 2 * w.head_dim) +
                       w.hidden);  // norms and biases, whether present or not
  plan.kv_cache = sizeof(bf16) * 2 * static_cast<size_t>(config.num_layers) * w.kv * context;
  const int64_t bf16_row =
      2 * w.hidden + w.qkv + w.q + 3 * w.intermediate;  // normed, qkv, attn, gate|up, act
  plan.activations =
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
  Widths w{};
  int context = 0;
  int chunk = 0;
  int position = 0;
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

  struct Layer {
    DeviceBuffer<bf16> qkv, o, gate_up, down;
    DeviceBuffer<float> attn_norm, mlp_norm, qkv_bias, o_bias, q_norm, k_norm;
    DeviceBuffer<bf16> keys, values;  // [kv_heads][context][head_dim]
  };
  std::vector<Layer> layers;
  DeviceBuffer<bf16> embedding, lm_head;  // lm_head empty when tied
  DeviceBuffer<float> final_norm;

  DeviceBuffer<float> rope_cos, rope_sin;  // [context][half_rotary], unless dynamic
  DeviceBuffer<float> hidden, logits, decode_workspace;
  DeviceBuffer<bf16> normed, qkv, attention, gate_up, activation;
  DeviceBuffer<int32_t> ids, best;

  const bf16* head() const { return config.tied_embeddings ? embedding.data() : lm_head.data(); }

  void allocate(const ModelConfig& c, const CudaModelOptions& options) {
    config = c;
    context = resolve_context(c, options.context_length);
    validate(c, context);
    w = widths_of(c);
    chunk = std::max(1, std::min(options.chunk_tokens, context));
    plan = CudaTransformer::plan(c, options);
    const auto [free_bytes, total_bytes] = device_memory();
    if (plan.total() + kReserveBytes > free_bytes) {
      throw Error("the model needs " + plan.describe() + " of GPU memory for a context of " +
                  std::to_string(context) + " tokens, but only " + gib(free_bytes) + " of " +
                  gib(total_bytes) + " are free");
    }
    layers.resize(c.num_layers);
    for (Layer& layer : layers) {
      layer.qkv.allocate(static_cast<size_t>(w.qkv * w.hidden));
      layer.o.allocate(static_cast<size_t>(w.hidden * w.q));
      layer.gate_up.allocate(static_cast<size_t>(2 * w.intermediate * w.hidden));
      layer.down.allocate(static_cast<size_t>(w.hidden * w.intermediate));
      layer.attn_norm.allocate(w.hidden);
      layer.mlp_norm.allocate(w.hidden);
      if (c.qkv_bias) layer.qkv_bias.allocate(w.qkv);
      if (c.o_bias) layer.o_bias.allocate(w.hidden);
      if (c.qk_norm) {
        layer.q_norm.allocate(w.head_dim);
        layer.k_norm.allocate(w.head_dim);
      }
      layer.keys.allocate(static_cast<size_t>(w.kv) * context);
      layer.values.allocate(static_cast<size_t>(w.kv) * context);
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
    attention.allocate(static_cast<size_t>(chunk * w.q));
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
  }

  FlashShape decode_shape(int first_position) const {
    FlashShape shape;
    shape.tokens = 1;
    shape.q_heads = config.num_heads;
    shape.kv_heads = config.num_kv_heads;
    shape.head_dim = config.head_dim;
    shape.first_position = first_position;
    shape.cache_stride = context;
    shape.q_token_stride = w.qkv;
    return shape;
  }

  // Host fp32 -> device bf16 through a device staging buffer (the conversion runs on the GPU).
  void upload_bf16(DeviceBuffer<bf16>& target, size_t offset, const float* source, size_t count,
                   DeviceBuffer<float>& staging) {
    for (size_t done = 0; done < count;) {
      const size_t piece = std::min(staging.size(), count - done);
      staging.upload(source + done, piece);
      to_bf16(staging.data(), static_cast<int64_t>(piece), target.data() + offset + done, stream);
      check(cudaStreamSynchronize(stream), "weight upload");
      done += piece;
    }
  }
  void upload_floats(DeviceBuffer<float>& target, size_t offset, const WeightView& view) {
    if (view.empty()) return;
    target.upload(view.data, static_cast<size_t>(view.numel()), offset);
  }

  void load(const ModelWeights& weights) {
    DeviceBuffer<float> staging(size_t{16} << 20);
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
      upload_bf16(layer.qkv, 0, source.q_proj.data, w.q * w.hidden, staging);
      upload_bf16(layer.qkv, w.q * w.hidden, source.k_proj.data, w.kv * w.hidden, staging);
      upload_bf16(layer.qkv, (w.q + w.kv) * w.hidden, source.v_proj.data, w.kv * w.hidden, staging);
      upload_bf16(layer.o, 0, source.o_proj.data, w.hidden * w.q, staging);
      upload_bf16(layer.gate_up, 0, source.gate_proj.data, w.intermediate * w.hidden, staging);
      upload_bf16(layer.gate_up, w.intermediate * w.hidden, source.up_proj.data,
                  w.intermediate * w.hidden, staging);
      upload_bf16(layer.down, 0, source.down_proj.data, w.hidden * w.intermediate, staging);
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
    }
    expect(weights.token_embedding, w.vocab * w.hidden, "token_embedding");
    upload_bf16(embedding, 0, weights.token_embedding.data, w.vocab * w.hidden, staging);
    if (!config.tied_embeddings) {
      expect(weights.lm_head, w.vocab * w.hidden, "lm_head");
      upload_bf16(lm_head, 0, weights.lm_head.data, w.vocab * w.hidden, staging);
    }
    upload_floats(final_norm, 0, weights.final_norm);
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
    for (Layer& layer : layers) {
      fill(layer.qkv, w.hidden);
      fill(layer.o, w.q);
      fill(layer.gate_up, w.hidden);
      fill(layer.down, w.intermediate);
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

  void check_tokens(std::span<const int32_t> tokens) const {
    const int64_t n = static_cast<int64_t>(tokens.size());
    if (n == 0) throw Error("forward() needs at least one token");
    if (position + n > context) {
      throw Error("the sequence needs " + std::to_string(position + n) +
                  " positions but the context holds " + std::to_string(context));
    }
    for (int32_t token : tokens) {
      if (token < 0 || token >= config.vocab_size) {
        throw Error("token id " + std::to_string(token) + " is outside the vocabulary of " +
                    std::to_string(config.vocab_size));
      }
    }
  }

  // One layer over the m tokens whose residual rows are in `hidden`, at positions first.. (or, with
  // device_position, one token at the position stored there; cos/sin are then the whole tables).
  void enqueue_layer(Layer& layer, int64_t m, int64_t first, const float* cos, const float* sin,
                     const int* device_position_pointer) {
    const ModelConfig& c = config;
    rms_norm(hidden.data(), layer.attn_norm.data(), m, w.hidden, c.rms_norm_eps, normed.data(),
             stream);
    blas.linear(normed.data(), m, w.hidden, layer.qkv.data(), w.qkv, qkv.data());
    if (c.qkv_bias) add_bias(qkv.data(), layer.qkv_bias.data(), m, w.qkv, w.qkv, stream);
    bf16* q = qkv.data();
    bf16* k = qkv.data() + w.q;
    bf16* v = qkv.data() + w.q + w.kv;
    if (c.qk_norm) {
      head_rms_norm(q, m, c.num_heads, w.head_dim, w.qkv, layer.q_norm.data(), c.rms_norm_eps,
                    stream);
      head_rms_norm(k, m, c.num_kv_heads, w.head_dim, w.qkv, layer.k_norm.data(), c.rms_norm_eps,
                    stream);
    }
    const int64_t rotary_dim = 2 * w.half_rotary;
    apply_rope(q, m, c.num_heads, w.head_dim, w.qkv, cos, sin, rotary_dim,
               c.rope.rotate_adjacent_pairs, stream, device_position_pointer);
    apply_rope(k, m, c.num_kv_heads, w.head_dim, w.qkv, cos, sin, rotary_dim,
               c.rope.rotate_adjacent_pairs, stream, device_position_pointer);
    append_kv(k, v, m, w.qkv, c.num_kv_heads, w.head_dim, layer.keys.data(), layer.values.data(),
              context, first, stream, device_position_pointer);
    if (device_position_pointer != nullptr) {
      FlashShape shape = decode_shape(context - 1);  // the largest position sizes the splits
      shape.device_position = device_position_pointer;
      flash_decode(q, layer.keys.data(), layer.values.data(), shape, attention.data(),
                   decode_workspace.data(), decode_workspace.size(), stream, decode_splits);
    } else {
      FlashShape shape = decode_shape(static_cast<int>(first));
      shape.tokens = m;
      if (m == 1) {
        flash_decode(q, layer.keys.data(), layer.values.data(), shape, attention.data(),
                     decode_workspace.data(), decode_workspace.size(), stream);
      } else {
        flash_prefill(q, layer.keys.data(), layer.values.data(), shape, attention.data(), stream);
      }
    }
    blas.linear(attention.data(), m, w.q, layer.o.data(), w.hidden, hidden.data(),
                /*accumulate=*/true);
    if (c.o_bias) add_bias(hidden.data(), layer.o_bias.data(), m, w.hidden, w.hidden, stream);
    rms_norm(hidden.data(), layer.mlp_norm.data(), m, w.hidden, c.rms_norm_eps, normed.data(),
             stream);
    blas.linear(normed.data(), m, w.hidden, layer.gate_up.data(), 2 * w.intermediate,
                gate_up.data());
    swiglu(gate_up.data(), gate_up.data() + w.intermediate, m, w.intermediate, 2 * w.intermediate,
           activation.data(), stream);
    blas.linear(activation.data(), m, w.intermediate, layer.down.data(), w.hidden, hidden.data(),
                true);
  }

  // The whole decode step of the token in ids[0] at *device_position: embedding, layers, logits and
  // their argmax (into `best`). Position-independent launches only, so it can be captured once.
  void enqueue_decode_step() {
    cuda::embedding(embedding.data(), ids.data(), 1, w.hidden, hidden.data(), stream);
    for (Layer& layer : layers)
      enqueue_layer(layer, 1, 0, rope_cos.data(), rope_sin.data(), device_position.data());
    rms_norm(hidden.data(), final_norm.data(), 1, w.hidden, config.rms_norm_eps, normed.data(),
             stream);
    blas.linear(normed.data(), 1, w.hidden, head(), w.vocab, logits.data());
    argmax_rows(logits.data(), 1, w.vocab, best.data(), stream);
  }

  // Decodes one token: eagerly the first time (which also settles every lazily initialised kernel
  // attribute), then through the graph captured on the second step.
  void decode(int32_t token) {
    check(cudaMemcpyAsync(ids.data(), &token, sizeof(token), cudaMemcpyHostToDevice, stream),
          "token upload");
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
    position += 1;
  }

  bool graph_decodes(std::span<const int32_t> tokens, bool all_logits) const {
    return tokens.size() == 1 && !all_logits && config.rope.scaling != RopeScaling::kDynamic;
  }

  // Runs the tokens through the model; leaves the logits of the last token (or, with all_logits, of
  // every token, copied into `all`) and returns the device pointer of the last token's logits.
  const float* run(std::span<const int32_t> tokens, bool all_logits, std::vector<float>* all) {
    check_tokens(tokens);
    if (graph_decodes(tokens, all_logits)) {
      decode(tokens[0]);
      return logits.data();
    }
    const int64_t n = static_cast<int64_t>(tokens.size());
    check(cudaMemcpyAsync(ids.data(), tokens.data(), sizeof(int32_t) * n, cudaMemcpyHostToDevice,
                          stream),
          "token upload");
    DeviceBuffer<float> dynamic_cos, dynamic_sin;
    const float* cos_table = nullptr;
    const float* sin_table = nullptr;
    if (config.rope.scaling == RopeScaling::kDynamic) {
      // The angles depend on the sequence length: tables for exactly this span.
      const RopeTables tables = rope_tables(config, position, n);
      dynamic_cos.allocate(tables.cos.size());
      dynamic_sin.allocate(tables.sin.size());
      dynamic_cos.upload(tables.cos.data(), tables.cos.size());
      dynamic_sin.upload(tables.sin.data(), tables.sin.size());
      cos_table = dynamic_cos.data();
      sin_table = dynamic_sin.data();
    } else {
      cos_table = rope_cos.data() + static_cast<int64_t>(position) * w.half_rotary;
      sin_table = rope_sin.data() + static_cast<int64_t>(position) * w.half_rotary;
    }
    if (all_logits) all->assign(static_cast<size_t>(n * w.vocab), 0.0f);
    for (int64_t t0 = 0; t0 < n; t0 += chunk) {
      const int64_t m = std::min<int64_t>(chunk, n - t0);
      cuda::embedding(embedding.data(), ids.data() + t0, m, w.hidden, hidden.data(), stream);
      for (Layer& layer : layers) {
        enqueue_layer(layer, m, position + t0, cos_table + t0 * w.half_rotary,
                      sin_table + t0 * w.half_rotary, nullptr);
      }
      if (all_logits) {
        // Row by row through the one-row logits buffer keeps memory bounded for long spans.
        rms_norm(hidden.data(), final_norm.data(), m, w.hidden, config.rms_norm_eps, normed.data(),
                 stream);
        for (int64_t r = 0; r < m; ++r) {
          blas.linear(normed.data() + r * w.hidden, 1, w.hidden, head(), w.vocab, logits.data());
          check(cudaMemcpyAsync(all->data() + (t0 + r) * w.vocab, logits.data(),
                                sizeof(float) * w.vocab, cudaMemcpyDeviceToHost, stream),
                "logits download");
        }
        check(cudaStreamSynchronize(stream), "logits download");
      } else if (t0 + m == n) {
        rms_norm(hidden.data() + (m - 1) * w.hidden, final_norm.data(), 1, w.hidden,
                 config.rms_norm_eps, normed.data(), stream);
        blas.linear(normed.data(), 1, w.hidden, head(), w.vocab, logits.data());
      }
    }
    // The dynamic tables must outlive the kernels that read them.
    if (dynamic_cos.size() != 0) check(cudaStreamSynchronize(stream), "forward");
    position += static_cast<int>(n);
    return logits.data();
  }
};

CudaTransformer::CudaTransformer(const ModelWeights& weights, const CudaModelOptions& options)
    : state_(std::make_unique<State>()) {
  state_->allocate(weights.config, options);
  state_->load(weights);
}

CudaTransformer::CudaTransformer(const ModelConfig& config, uint64_t seed,
                                 const CudaModelOptions& options)
    : state_(std::make_unique<State>()) {
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
    argmax_rows(last, 1, state_->w.vocab, state_->best.data(), state_->stream);  // the graph did it
  int32_t token = 0;
  check(cudaMemcpyAsync(&token, state_->best.data(), sizeof(token), cudaMemcpyDeviceToHost,
                        state_->stream),
        "token download");
  check(cudaStreamSynchronize(state_->stream), "forward");
  return token;
}

void CudaTransformer::reset() { state_->position = 0; }
int CudaTransformer::position() const { return state_->position; }
int CudaTransformer::context_length() const { return state_->context; }
const ModelConfig& CudaTransformer::config() const { return state_->config; }
const GpuMemoryPlan& CudaTransformer::memory_plan() const { return state_->plan; }

}  // namespace entropyinfer::cuda

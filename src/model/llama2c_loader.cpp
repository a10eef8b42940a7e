// llama2.c checkpoints: a header of seven int32 (dim, hidden_dim, layers, heads, kv_heads,
// vocab_size, seq_len; a negative vocab size means an untied classifier follows) and then fp32
// weights, each layer's matrices stacked per kind. The weights are used in place from the memory
// map.
#include <cstdint>
#include <cstring>
#include <string>

#include "core/error.h"
#include "model/model_weights.h"

namespace entropyinfer {
namespace {

struct Llama2cHeader {
  int32_t dim, hidden_dim, layers, heads, kv_heads, vocab_size, seq_len;
};

class WeightCursor {
 public:
  WeightCursor(const uint8_t* bytes, size_t size, const std::string& path, size_t offset)
      : bytes_(bytes), size_(size), path_(path), offset_(offset) {}

  WeightView take(std::vector<int64_t> shape, const char* what) {
    int64_t count = 1;
    for (int64_t extent : shape) count *= extent;
    const size_t bytes = static_cast<size_t>(count) * sizeof(float);
    if (offset_ + bytes > size_) {
      throw Error("llama2.c checkpoint '" + path_ + "' is truncated: " + what + " needs " +
                  std::to_string(offset_ + bytes) + " bytes, the file has " +
                  std::to_string(size_));
    }
    WeightView view{reinterpret_cast<const float*>(bytes_ + offset_), std::move(shape)};
    offset_ += bytes;
    return view;
  }
  void skip(int64_t floats, const char* what) { take({floats}, what); }

 private:
  const uint8_t* bytes_;
  size_t size_;
  const std::string& path_;
  size_t offset_;
};

// A view of layer `index` inside a tensor that stacks all layers.
WeightView layer_slice(const WeightView& stacked, int index) {
  std::vector<int64_t> shape(stacked.shape.begin() + 1, stacked.shape.end());
  int64_t per_layer = 1;
  for (int64_t extent : shape) per_layer *= extent;
  return WeightView{stacked.floats() + index * per_layer, std::move(shape)};
}

}  // namespace

ModelWeights load_llama2c_model(const std::string& path) {
  MappedFile file(path);
  ModelWeights weights = parse_llama2c_checkpoint(file.data(), file.size(), path);
  weights.mapped_bytes = file.size();
  weights.mapped_files.push_back(std::move(file));
  return weights;
}

ModelWeights parse_llama2c_checkpoint(const uint8_t* bytes, size_t size, const std::string& path) {
  if (size < sizeof(Llama2cHeader)) {
    throw Error("'" + path + "' is too small to be a llama2.c checkpoint (" + std::to_string(size) +
                " bytes)");
  }
  Llama2cHeader header;
  std::memcpy(&header, bytes, sizeof(header));
  const bool tied = header.vocab_size > 0;
  // In 64 bits: negating INT32_MIN would overflow.
  const int64_t vocab = tied ? int64_t{header.vocab_size} : -int64_t{header.vocab_size};
  if (header.dim <= 0 || header.hidden_dim <= 0 || header.layers <= 0 || header.heads <= 0 ||
      header.kv_heads <= 0 || vocab <= 0 || vocab > INT32_MAX || header.seq_len <= 0 ||
      header.dim % header.heads != 0 || header.heads % header.kv_heads != 0 ||
      header.dim > (1 << 16) || header.layers > 1024) {
    throw Error("'" + path + "' does not hold a valid llama2.c header (dim " +
                std::to_string(header.dim) + ", hidden " + std::to_string(header.hidden_dim) +
                ", layers " + std::to_string(header.layers) + ", heads " +
                std::to_string(header.heads) + "/" + std::to_string(header.kv_heads) + ", vocab " +
                std::to_string(header.vocab_size) + ", seq_len " + std::to_string(header.seq_len) +
                ")");
  }

  ModelWeights weights;
  ModelConfig& config = weights.config;
  config.architecture = "llama2.c";
  config.hidden_size = header.dim;
  config.intermediate_size = header.hidden_dim;
  config.num_layers = header.layers;
  config.num_heads = header.heads;
  config.num_kv_heads = header.kv_heads;
  config.head_dim = header.dim / header.heads;
  config.vocab_size = static_cast<int32_t>(vocab);
  config.max_position_embeddings = header.seq_len;
  config.rms_norm_eps = 1e-5f;
  config.tied_embeddings = tied;
  config.rope.theta = 10000.0;
  config.rope.rotate_adjacent_pairs = true;
  config.rope.rotary_dim = config.head_dim;
  config.bos_token_id = 1;
  // llama2.c's run.c ends a sample when the model emits BOS, which separates stories in its data.
  config.eos_token_ids = {1};
  config.torch_dtype = "float32";

  const int64_t dim = header.dim;
  const int64_t hidden = header.hidden_dim;
  const int64_t layers = header.layers;
  const int64_t head_dim = config.head_dim;
  const int64_t kv_dim = head_dim * header.kv_heads;
  WeightCursor cursor(bytes, size, path, sizeof(Llama2cHeader));
  weights.token_embedding = cursor.take({vocab, dim}, "token_embedding_table");
  const WeightView attn_norm = cursor.take({layers, dim}, "rms_att_weight");
  const WeightView wq = cursor.take({layers, dim, dim}, "wq");
  const WeightView wk = cursor.take({layers, kv_dim, dim}, "wk");
  const WeightView wv = cursor.take({layers, kv_dim, dim}, "wv");
  const WeightView wo = cursor.take({layers, dim, dim}, "wo");
  const WeightView mlp_norm = cursor.take({layers, dim}, "rms_ffn_weight");
  const WeightView w1 = cursor.take({layers, hidden, dim}, "w1");
  const WeightView w2 = cursor.take({layers, dim, hidden}, "w2");
  const WeightView w3 = cursor.take({layers, hidden, dim}, "w3");
  weights.final_norm = cursor.take({dim}, "rms_final_weight");
  // Precomputed RoPE tables of older exports; unused, the engine computes its own.
  cursor.skip(header.seq_len * head_dim / 2, "freq_cis_real");
  cursor.skip(header.seq_len * head_dim / 2, "freq_cis_imag");
  weights.lm_head = tied ? weights.token_embedding : cursor.take({vocab, dim}, "wcls");

  weights.layers.resize(layers);
  for (int i = 0; i < header.layers; ++i) {
    LayerWeights& layer = weights.layers[i];
    layer.attn_norm = layer_slice(attn_norm, i);
    layer.q_proj = layer_slice(wq, i);
    layer.k_proj = layer_slice(wk, i);
    layer.v_proj = layer_slice(wv, i);
    layer.o_proj = layer_slice(wo, i);
    layer.mlp_norm = layer_slice(mlp_norm, i);
    layer.gate_proj = layer_slice(w1, i);
    layer.down_proj = layer_slice(w2, i);
    layer.up_proj = layer_slice(w3, i);
  }
  return weights;
}

}  // namespace entropyinfer

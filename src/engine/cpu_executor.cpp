#include "engine/cpu_executor.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "attention/decode_policy.h"
#include "attention/decode_selection.h"
#include "attention/prefill_policy.h"
#include "backends/cpu/block_sparse_attention.h"
#include "backends/cpu/compressed_decode_attention.h"
#include "backends/cpu/cpu_ops.h"
#include "core/error.h"
#include "core/fp8.h"
#include "engine/rope.h"

namespace entropyinfer {
namespace {

// Tokens per matrix-product chunk: bounds scratch memory on long prompts while keeping products
// large enough to reuse each weight tile across many tokens.
constexpr int64_t kChunkTokens = 256;

// Without a pool: rows added beyond what is needed when a cache grows or is compacted, so that
// decoding does not reallocate at every token.
constexpr int kCacheHeadroom = 256;

cpu::WeightMatrix matrix(const WeightView& view) {
  cpu::WeightMatrix matrix(view.data, view.dtype);
  matrix.scales = view.scales;
  matrix.scale_count = view.scale_count;
  matrix.activations = view.activations;
  matrix.input_scale = view.input_scale;
  return matrix;
}

int64_t round_up(int64_t rows, int64_t multiple) {
  return (rows + multiple - 1) / multiple * multiple;
}

// The products of a span and of a decode batch, written once: m consecutive rows either way.

// Queries, keys and values of m residual rows (q/k RMSNorm where the family has it), before RoPE.
void project_qkv(const ModelConfig& c, const LayerWeights& layer, const float* rows, int64_t m,
                 float* normed, float* q, float* k, float* v) {
  const int64_t hidden = c.hidden_size;
  const int64_t q_width = static_cast<int64_t>(c.num_heads) * c.head_dim;
  const int64_t kv_width = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
  cpu::rms_norm(rows, layer.attn_norm.floats(), m, hidden, c.rms_norm_eps, normed);
  cpu::linear(normed, m, hidden, matrix(layer.q_proj), layer.q_bias.floats(), q_width, q);
  cpu::linear(normed, m, hidden, matrix(layer.k_proj), layer.k_bias.floats(), kv_width, k);
  cpu::linear(normed, m, hidden, matrix(layer.v_proj), layer.v_bias.floats(), kv_width, v);
  if (c.qk_norm) {
    cpu::rms_norm(q, layer.q_norm.floats(), m * c.num_heads, c.head_dim, c.rms_norm_eps, q);
    cpu::rms_norm(k, layer.k_norm.floats(), m * c.num_kv_heads, c.head_dim, c.rms_norm_eps, k);
  }
}

// The output projection of m attention rows added to their residual rows, then the MLP block.
// normed and projected hold m * hidden floats, gate and up m * intermediate_size.
void output_and_mlp(const ModelConfig& c, const LayerWeights& layer, const float* attention,
                    float* residual, int64_t m, float* normed, float* projected, float* gate,
                    float* up) {
  const int64_t hidden = c.hidden_size;
  const int64_t q_width = static_cast<int64_t>(c.num_heads) * c.head_dim;
  cpu::linear(attention, m, q_width, matrix(layer.o_proj), layer.o_bias.floats(), hidden,
              projected);
  cpu::add_inplace(residual, projected, m * hidden);
  cpu::rms_norm(residual, layer.mlp_norm.floats(), m, hidden, c.rms_norm_eps, normed);
  cpu::linear(normed, m, hidden, matrix(layer.gate_proj), nullptr, c.intermediate_size, gate);
  cpu::linear(normed, m, hidden, matrix(layer.up_proj), nullptr, c.intermediate_size, up);
  cpu::swiglu_inplace(gate, up, m * c.intermediate_size);
  cpu::linear(gate, m, c.intermediate_size, matrix(layer.down_proj), nullptr, hidden, projected);
  cpu::add_inplace(residual, projected, m * hidden);
}

// Final norm and fp32 logits of m residual rows.
void project_logits(const ModelWeights& w, const float* rows, int64_t m, float* normed,
                    float* logits) {
  const ModelConfig& c = w.config;
  cpu::rms_norm(rows, w.final_norm.floats(), m, c.hidden_size, c.rms_norm_eps, normed);
  cpu::linear(normed, m, c.hidden_size, matrix(w.lm_head), nullptr, c.vocab_size, logits);
}

}  // namespace

void KvPagePool::acquire(int64_t pages) {
  if (pages > pages_total_ - pages_used_) {
    throw Error("the KV pool has " + std::to_string(pages_total_ - pages_used_) + " of " +
                std::to_string(pages_total_) + " pages free, " + std::to_string(pages) + " needed");
  }
  pages_used_ += pages;
}

void KvPagePool::release(int64_t pages) { pages_used_ -= pages; }

int64_t compression_length(const AttentionConfig& attention, int prompt_tokens, int row_limit) {
  const std::unique_ptr<DecodePolicy> policy = make_decode_policy(attention);
  if (!policy) return -1;
  const int64_t at = static_cast<int64_t>(prompt_tokens) + policy->compress_after_generated();
  return at <= row_limit ? at : -1;
}

int kv_rows_before_compression(const ModelConfig& config, const AttentionConfig& attention,
                               int layer, int prompt_tokens, int row_limit) {
  const int64_t at = compression_length(attention, prompt_tokens, row_limit);
  if (at < 0) return row_limit;
  const DecodeSelection selection =
      decode_selection(attention.decode, attention.decode_params, config.num_heads,
                       config.num_kv_heads, layer, config.num_layers, at);
  return selection.compresses ? static_cast<int>(at) : row_limit;
}

KvPageNeed kv_pages_needed(const ModelConfig& config, const AttentionConfig& attention,
                           int page_rows, int prompt_tokens, int row_limit) {
  const auto pages = [&](int64_t lists, int64_t rows) {
    return lists * ((rows + page_rows - 1) / page_rows);
  };
  const int64_t at = compression_length(attention, prompt_tokens, row_limit);
  KvPageNeed need;
  int64_t largest_new_layer = 0;
  for (int layer = 0; layer < config.num_layers; ++layer) {
    const int64_t before =
        pages(config.num_kv_heads,
              kv_rows_before_compression(config, attention, layer, prompt_tokens, row_limit));
    need.peak += before;
    if (at < 0) {
      need.steady += before;
      continue;
    }
    const DecodeSelection selection =
        decode_selection(attention.decode, attention.decode_params, config.num_heads,
                         config.num_kv_heads, layer, config.num_layers, at);
    if (!selection.compresses) {
      need.steady += before;
      continue;
    }
    // A compressed layer keeps at most its longest list per head, plus every row of the answer
    // still to come.
    const int64_t after = pages(selection.lists, selection.longest_list() + (row_limit - at));
    need.steady += after;
    largest_new_layer = std::max(largest_new_layer, after);
  }
  // Compression moves one layer at a time: the new slab exists beside the old one for a moment.
  need.peak += largest_new_layer;
  return need;
}

namespace {

// One layer's KV cache: `heads` slabs of [capacity, head_dim] for keys and for values, so that each
// head's history is contiguous and heads can hold different numbers of entries once compressed.
// With a pool, capacity is whole pages and every slab is charged to it while it lives.
struct LayerCache {
  int heads = 0;
  int capacity = 0;
  std::vector<int> lengths;
  std::vector<float> keys;
  std::vector<float> values;
  KvPagePool* pool = nullptr;
  int64_t pages = 0;

  LayerCache() = default;
  LayerCache(const LayerCache&) = delete;
  LayerCache& operator=(const LayerCache&) = delete;
  ~LayerCache() {
    if (pool != nullptr) pool->release(pages);
  }

  int max_length() const {
    return lengths.empty() ? 0 : *std::max_element(lengths.begin(), lengths.end());
  }
  size_t bytes() const { return (keys.capacity() + values.capacity()) * sizeof(float); }

  // Moves every head into slabs of `new_capacity` rows, copying the rows `kept` lists (or the
  // first lengths[head] rows when null). Replacing the vectors returns the old memory (and its
  // pages) once the new slab holds the rows.
  void reshape(int new_heads, int new_capacity, int64_t head_dim,
               const std::vector<std::vector<int32_t>>* kept, int source_group) {
    int64_t new_pages = 0;
    if (pool != nullptr) {
      new_capacity = static_cast<int>(round_up(new_capacity, pool->page_rows()));
      new_pages = static_cast<int64_t>(new_heads) * new_capacity / pool->page_rows();
      pool->acquire(new_pages);
    }
    std::vector<float> new_keys(static_cast<size_t>(new_heads) * new_capacity * head_dim);
    std::vector<float> new_values(new_keys.size());
    std::vector<int> new_lengths(new_heads, 0);
    for (int head = 0; head < new_heads; ++head) {
      const int source = head / source_group;
      const float* source_keys = keys.data() + static_cast<int64_t>(source) * capacity * head_dim;
      const float* source_values =
          values.data() + static_cast<int64_t>(source) * capacity * head_dim;
      float* target_keys = new_keys.data() + static_cast<int64_t>(head) * new_capacity * head_dim;
      float* target_values =
          new_values.data() + static_cast<int64_t>(head) * new_capacity * head_dim;
      if (kept == nullptr) {
        new_lengths[head] = lengths[source];
        if (lengths[source] == 0) continue;  // nothing to move (and no source buffer yet)
        std::memcpy(target_keys, source_keys, sizeof(float) * lengths[source] * head_dim);
        std::memcpy(target_values, source_values, sizeof(float) * lengths[source] * head_dim);
        continue;
      }
      const std::vector<int32_t>& rows = (*kept)[head];
      new_lengths[head] = static_cast<int>(rows.size());
      for (size_t i = 0; i < rows.size(); ++i) {
        std::memcpy(target_keys + i * head_dim, source_keys + rows[i] * head_dim,
                    sizeof(float) * head_dim);
        std::memcpy(target_values + i * head_dim, source_values + rows[i] * head_dim,
                    sizeof(float) * head_dim);
      }
    }
    heads = new_heads;
    capacity = new_capacity;
    lengths = std::move(new_lengths);
    keys = std::move(new_keys);
    values = std::move(new_values);
    if (pool != nullptr) pool->release(pages);
    pages = new_pages;
  }
};

}  // namespace

struct CpuExecutor::Sequence {
  SequenceSchedule schedule;
  AttentionConfig attention;
  std::unique_ptr<PrefillPolicy> prefill_policy;
  std::unique_ptr<DecodePolicy> decode_policy;
  KvPagePool* pool = nullptr;
  int row_limit = 0;  // rows per head this sequence may ever need (prompt + answer)

  std::vector<LayerCache> cache;
  // The last `window` queries of every layer (after RoPE), oldest first: the decode policy's
  // observation window.
  int window = 0;
  std::vector<std::vector<float>> recent_queries;

  AttentionWork work;
  AttentionRecording& recording;

  explicit Sequence(AttentionRecording& recording_of_owner) : recording(recording_of_owner) {}
};

struct CpuExecutor::SpanJob {
  Sequence& sequence;
  std::vector<int32_t> tokens;
  bool all_logits = false;
  int64_t first_position = 0;
  bool is_prefill = false;
  bool plan_this_span = false;
  int next_layer = 0;
  RopeTables rope;
  std::vector<float> hidden, q, attention_out;  // [n, hidden], [n, q_width], [n, q_width]

  explicit SpanJob(Sequence& s) : sequence(s) {}
};

struct CpuExecutor::Scratch {
  std::vector<float> normed, k, v, projected, gate, up;
  // decode
  std::vector<float> hidden, q, attention_out;
};

namespace {

void remember_queries(CpuExecutor::Sequence& s, const ModelConfig& c, int layer,
                      const float* queries, int64_t count);

}  // namespace

CpuExecutor::CpuExecutor(const ModelWeights& weights, int context_length, bool fp8_kv_cache)
    : weights_(weights),
      context_length_(context_length),
      fp8_kv_cache_(fp8_kv_cache),
      scratch_(std::make_unique<Scratch>()) {}

CpuExecutor::~CpuExecutor() = default;

const ModelConfig& CpuExecutor::config() const { return weights_.config; }

void CpuExecutor::set_progress_callback(LanguageModel::ProgressCallback callback) {
  progress_ = std::move(callback);
}

const SequenceSchedule& CpuExecutor::schedule(const Sequence& sequence) {
  return sequence.schedule;
}
const AttentionConfig& CpuExecutor::attention(const Sequence& sequence) {
  return sequence.attention;
}
const AttentionWork& CpuExecutor::work(const Sequence& sequence) { return sequence.work; }
size_t CpuExecutor::cache_bytes(const Sequence& sequence) {
  size_t total = 0;
  for (const LayerCache& layer : sequence.cache) total += layer.bytes();
  return total;
}
int64_t CpuExecutor::cache_pages(const Sequence& sequence) {
  int64_t total = 0;
  for (const LayerCache& layer : sequence.cache) total += layer.pages;
  return total;
}

void CpuExecutor::StateDeleter::operator()(Sequence* sequence) const { delete sequence; }
void CpuExecutor::StateDeleter::operator()(SpanJob* job) const { delete job; }

CpuExecutor::SequencePtr CpuExecutor::new_sequence(const AttentionConfig& attention,
                                                   AttentionRecording& recording, KvPagePool* pool,
                                                   int row_limit) {
  SequencePtr s(new Sequence(recording));
  s->attention = attention;
  s->attention.validate();
  s->prefill_policy = make_prefill_policy(s->attention);
  s->decode_policy = make_decode_policy(s->attention);
  if (s->decode_policy && s->decode_policy->needs_window_queries())
    s->window = s->attention.decode_params.window;
  s->pool = pool;
  s->row_limit = row_limit > 0 ? std::min(row_limit, context_length_) : context_length_;
  s->schedule.configure(context_length_,
                        s->decode_policy ? s->decode_policy->compress_after_generated() : -1,
                        s->window);
  reset(*s);
  return s;
}

void CpuExecutor::reset(Sequence& s) {
  const ModelConfig& c = config();
  s.schedule.reset();
  s.work = AttentionWork{};
  s.cache.clear();
  s.cache = std::vector<LayerCache>(c.num_layers);
  for (LayerCache& layer : s.cache) {
    layer.heads = c.num_kv_heads;
    layer.lengths.assign(c.num_kv_heads, 0);
    layer.pool = s.pool;
  }
  s.recent_queries.assign(
      c.num_layers, std::vector<float>(static_cast<size_t>(s.window) * c.num_heads * c.head_dim));
}

namespace {

// Room for `needed` more rows in every head. Without a pool a cache doubles (up to the context),
// so that decoding rarely reallocates; with one, the prefill takes at once what the layer holds
// until its compression (kv_rows_before_compression), and a later growth the whole row limit, so
// that a sequence holds exactly what kv_pages_needed reserved for it.
void ensure_capacity(CpuExecutor::Sequence& s, const ModelConfig& c, int needed) {
  for (int layer_index = 0; layer_index < c.num_layers; ++layer_index) {
    LayerCache& layer = s.cache[layer_index];
    const int rows = layer.max_length() + needed;
    if (rows <= layer.capacity) continue;
    int grown = 0;
    if (s.pool != nullptr) {
      grown = s.schedule.is_prefill()
                  ? kv_rows_before_compression(c, s.attention, layer_index,
                                               s.schedule.position() + needed, s.row_limit)
                  : s.row_limit;
    } else {
      grown = std::min(s.schedule.context_length(),
                       std::max({rows, layer.capacity * 2, kCacheHeadroom}));
    }
    layer.reshape(layer.heads, std::max(grown, rows), c.head_dim, nullptr, 1);
  }
}

void remember_queries(CpuExecutor::Sequence& s, const ModelConfig& c, int layer,
                      const float* queries, int64_t count) {
  if (s.window == 0) return;
  const int64_t width = static_cast<int64_t>(c.num_heads) * c.head_dim;
  std::vector<float>& ring = s.recent_queries[layer];
  const int64_t incoming = std::min<int64_t>(count, s.window);
  const int64_t held = s.schedule.window_tokens();  // before this span's tokens are counted
  const int64_t kept_old = std::min<int64_t>(held, s.window - incoming);
  // Slide the newest kept_old rows to the front, then append the incoming rows.
  std::memmove(ring.data(), ring.data() + (held - kept_old) * width,
               sizeof(float) * kept_old * width);
  std::memcpy(ring.data() + kept_old * width, queries + (count - incoming) * width,
              sizeof(float) * incoming * width);
}

// The FP8 cache: the last `rows` rows of keys and of values of every cache head replaced by what
// FP8 reads back from them, once they are appended and before any attention reads them.
void round_trip_latest_rows(LayerCache& cache, int64_t rows, int64_t head_dim) {
  for (int head = 0; head < cache.heads; ++head) {
    const int64_t first = static_cast<int64_t>(head) * cache.capacity + cache.lengths[head] - rows;
    for (int64_t row = first; row < first + rows; ++row) {
      fp8_kv_round_trip_row(cache.keys.data() + row * head_dim, static_cast<int>(head_dim));
      fp8_kv_round_trip_row(cache.values.data() + row * head_dim, static_cast<int>(head_dim));
    }
  }
}

void compress(CpuExecutor::Sequence& s, const ModelConfig& c) {
  const int group = c.num_heads / c.num_kv_heads;
  s.work.cache_bytes_before = CpuExecutor::cache_bytes(s);
  for (const LayerCache& layer : s.cache) {
    for (int length : layer.lengths) s.work.cache_entries_before += length;
  }
  s.recording.decode_plans.clear();
  for (int layer_index = 0; layer_index < c.num_layers; ++layer_index) {
    LayerCache& layer = s.cache[layer_index];
    DecodeInputs inputs;
    inputs.window_queries = s.recent_queries[layer_index].data();
    inputs.window_tokens = s.schedule.window_tokens();
    inputs.keys = layer.keys.data();
    inputs.key_stride = layer.capacity;
    inputs.cache_length = s.schedule.position();
    inputs.num_q_heads = c.num_heads;
    inputs.num_kv_heads = c.num_kv_heads;
    inputs.head_dim = c.head_dim;
    inputs.layer = layer_index;
    inputs.num_layers = c.num_layers;
    LayerDecodePlan plan = s.decode_policy->plan(inputs);
    if (s.recording.record_plans) s.recording.decode_plans.push_back(plan);
    if (plan.kept.empty()) continue;  // the cache is within the budget: nothing to drop
    int longest = 0;
    for (const auto& rows : plan.kept)
      longest = std::max<int>(longest, static_cast<int>(rows.size()));
    // With a pool the rest of the answer is reserved now; without, some headroom.
    const int rest = s.row_limit - s.schedule.position();
    const int room = s.pool != nullptr ? rest : std::min(kCacheHeadroom, rest);
    layer.reshape(static_cast<int>(plan.kept.size()), longest + std::max(room, 1), c.head_dim,
                  &plan.kept, plan.per_query_head ? group : 1);
  }
  for (const LayerCache& layer : s.cache) {
    for (int length : layer.lengths) s.work.cache_entries_after += length;
  }
  s.work.cache_bytes_after = CpuExecutor::cache_bytes(s);
  s.work.compressed = true;
  s.schedule.mark_compressed();
}

// Decode attention of one new token (its key and value already appended) over the sequence's
// cache of this layer: per-head lengths once compressed, else causal (and windowed).
void decode_attention(const CpuExecutor::Sequence& s, const ModelConfig& c, int layer_index,
                      const float* q, float* out) {
  const LayerCache& cache = s.cache[layer_index];
  const int64_t head_dim = c.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  if (s.schedule.compressed()) {
    std::vector<const float*> key_heads(cache.heads), value_heads(cache.heads);
    std::vector<int64_t> lengths(cache.heads);
    for (int head = 0; head < cache.heads; ++head) {
      key_heads[head] = cache.keys.data() + static_cast<int64_t>(head) * cache.capacity * head_dim;
      value_heads[head] =
          cache.values.data() + static_cast<int64_t>(head) * cache.capacity * head_dim;
      lengths[head] = cache.lengths[head];
    }
    cpu::CompressedDecodeShape shape;
    shape.q_heads = c.num_heads;
    shape.kv_heads = c.num_kv_heads;
    shape.head_dim = head_dim;
    shape.scale = scale;
    shape.per_query_head = cache.heads != c.num_kv_heads;
    cpu::compressed_decode_attention(q, key_heads.data(), value_heads.data(), lengths.data(), shape,
                                     out);
    return;
  }
  cpu::AttentionShape shape;
  shape.tokens = 1;
  shape.q_heads = c.num_heads;
  shape.kv_heads = c.num_kv_heads;
  shape.head_dim = head_dim;
  shape.first_position = s.schedule.position();
  shape.cache_stride = cache.capacity;
  shape.window = c.sliding_window.value_or(0);
  shape.scale = scale;
  cpu::causal_attention(q, cache.keys.data(), cache.values.data(), shape, out);
}

}  // namespace

CpuExecutor::SpanJobPtr CpuExecutor::begin_span(Sequence& s, std::span<const int32_t> tokens,
                                                bool all_logits) {
  const ModelConfig& c = config();
  s.schedule.check_span(tokens, c.vocab_size);
  if (s.schedule.compressed() && tokens.size() > 1) {
    throw Error("a compressed cache takes new tokens one at a time");
  }
  SpanJobPtr job(new SpanJob(s));
  job->tokens.assign(tokens.begin(), tokens.end());
  job->all_logits = all_logits;
  const int64_t n = static_cast<int64_t>(tokens.size());
  job->is_prefill = s.schedule.is_prefill();
  job->first_position = s.schedule.position();
  // A sliding window shorter than the span is its own sparsity; the block plans assume full causal
  // reach, so such spans stay dense.
  const int sliding_window = c.sliding_window.value_or(0);
  job->plan_this_span = job->is_prefill && job->first_position == 0 &&
                        !(sliding_window > 0 && sliding_window < job->first_position + n);
  if (job->is_prefill && s.recording.record_plans) s.recording.prefill_plans.clear();
  ensure_capacity(s, c, static_cast<int>(n));
  const int64_t q_width = static_cast<int64_t>(c.num_heads) * c.head_dim;
  job->hidden.resize(n * c.hidden_size);
  job->q.resize(n * q_width);
  job->attention_out.resize(n * q_width);
  for (int64_t t = 0; t < n; ++t) {
    weights_.token_embedding.widen_row(job->tokens[t], job->hidden.data() + t * c.hidden_size);
  }
  job->rope = rope_tables(c, job->first_position, n);
  return job;
}

bool CpuExecutor::span_layers_done(const SpanJob& job) const {
  return job.next_layer >= config().num_layers;
}

void CpuExecutor::run_span_layer(SpanJob& job) {
  Sequence& s = job.sequence;
  Scratch& scratch = *scratch_;
  const ModelConfig& c = config();
  const int layer_index = job.next_layer++;
  const LayerWeights& layer = weights_.layers[layer_index];
  LayerCache& cache = s.cache[layer_index];
  const int64_t n = static_cast<int64_t>(job.tokens.size());
  const int64_t hidden = c.hidden_size;
  const int64_t head_dim = c.head_dim;
  const int64_t q_width = static_cast<int64_t>(c.num_heads) * head_dim;
  const int64_t kv_width = static_cast<int64_t>(c.num_kv_heads) * head_dim;
  const int64_t rotary_dim = c.rope.rotary_dim > 0 ? c.rope.rotary_dim : head_dim;
  const int64_t half_rotary = rotary_dim / 2;
  const int64_t chunk = std::min(kChunkTokens, n);
  const int group = c.num_heads / c.num_kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const int sliding_window = c.sliding_window.value_or(0);
  scratch.normed.resize(chunk * hidden);
  scratch.k.resize(chunk * kv_width);
  scratch.v.resize(chunk * kv_width);
  scratch.projected.resize(chunk * hidden);
  scratch.gate.resize(chunk * c.intermediate_size);
  scratch.up.resize(chunk * c.intermediate_size);

  // What a prefill policy plans from: the span's queries and the layer's cache.
  const auto prefill_inputs = [&] {
    PrefillInputs inputs;
    inputs.queries = job.q.data();
    inputs.keys = cache.keys.data();
    inputs.key_stride = cache.capacity;
    inputs.num_tokens = n;
    inputs.num_q_heads = c.num_heads;
    inputs.num_kv_heads = c.num_kv_heads;
    inputs.head_dim = static_cast<int>(head_dim);
    inputs.layer = layer_index;
    return inputs;
  };
  // Without all_logits only the span's last row reads anything from the last layer (through the
  // logits): the other rows get its keys, values and window queries but no attention or MLP.
  const bool last_row_only = !job.all_logits && n > 1 && layer_index == c.num_layers - 1;
  for (int64_t t0 = 0; t0 < n; t0 += chunk) {
    const int64_t m = std::min(chunk, n - t0);
    float* q = job.q.data() + t0 * q_width;
    project_qkv(c, layer, job.hidden.data() + t0 * hidden, m, scratch.normed.data(), q,
                scratch.k.data(), scratch.v.data());
    const float* cos = job.rope.cos.data() + t0 * half_rotary;
    const float* sin = job.rope.sin.data() + t0 * half_rotary;
    cpu::apply_rope(q, m, c.num_heads, head_dim, cos, sin, rotary_dim,
                    c.rope.rotate_adjacent_pairs);
    cpu::apply_rope(scratch.k.data(), m, c.num_kv_heads, head_dim, cos, sin, rotary_dim,
                    c.rope.rotate_adjacent_pairs);
    if (s.recording.capture_inputs)
      s.recording.capture(layer_index, q, q_width, scratch.k.data(), kv_width, m);
    // Append to every cache head; after a per-query-head compression a KV head feeds g caches.
    const int source_group = cache.heads == c.num_kv_heads ? 1 : group;
    for (int64_t t = 0; t < m; ++t) {
      for (int head = 0; head < cache.heads; ++head) {
        const int64_t source = (t * c.num_kv_heads + head / source_group) * head_dim;
        const int64_t slot =
            (static_cast<int64_t>(head) * cache.capacity + cache.lengths[head] + t0 + t) * head_dim;
        std::memcpy(cache.keys.data() + slot, scratch.k.data() + source, sizeof(float) * head_dim);
        std::memcpy(cache.values.data() + slot, scratch.v.data() + source,
                    sizeof(float) * head_dim);
      }
    }
  }
  for (int& length : cache.lengths) length += static_cast<int>(n);
  remember_queries(s, c, layer_index, job.q.data(), n);

  // The span's rows, or in the last layer without all_logits its last row alone, which every
  // method reads densely (the last segment is never sparse).
  const int64_t first_row = last_row_only ? n - 1 : 0;
  cpu::AttentionShape shape;
  shape.tokens = n - first_row;
  shape.q_heads = c.num_heads;
  shape.kv_heads = c.num_kv_heads;
  shape.head_dim = head_dim;
  shape.first_position = job.first_position + first_row;
  shape.cache_stride = cache.capacity;
  shape.window = sliding_window;
  shape.scale = scale;
  // With last_row_only a policy still plans the layer when plans are recorded, so that they
  // describe every layer.
  const bool plans_layer = job.plan_this_span && (!last_row_only || s.recording.record_plans);
  LayerPrefillPlan plan;
  if (plans_layer) plan = s.prefill_policy->plan(prefill_inputs());
  // The estimate's statistics keep their precision: the policy has planned from the rows as
  // computed, and only then do they become what the FP8 cache holds, for every read after it.
  if (fp8_kv_cache_) round_trip_latest_rows(cache, n, head_dim);
  bool done = false;
  if (job.plan_this_span && last_row_only) {
    // The keys read are the last row's.
    if (s.recording.record_plans) s.recording.prefill_plans.push_back(std::move(plan));
    const int64_t row_keys = static_cast<int64_t>(c.num_kv_heads) * n;
    s.work.prefill_keys_read += row_keys;
    s.work.prefill_keys_dense += row_keys;
  } else if (job.plan_this_span) {
    s.work.prefill_keys_dense += plan.keys_read_dense();
    if (!plan.dense) {
      shape.window = 0;
      s.work.prefill_keys_read +=
          cpu::block_sparse_attention(job.q.data(), cache.keys.data(), cache.values.data(), shape,
                                      plan, job.attention_out.data());
      done = true;
    } else {
      s.work.prefill_keys_read += plan.keys_read_dense();
    }
    if (s.recording.record_plans) s.recording.prefill_plans.push_back(std::move(plan));
  }
  if (!done) {
    cpu::causal_attention(job.q.data() + first_row * q_width, cache.keys.data(),
                          cache.values.data(), shape,
                          job.attention_out.data() + first_row * q_width);
  }

  for (int64_t t0 = first_row; t0 < n; t0 += chunk) {
    const int64_t m = std::min(chunk, n - t0);
    output_and_mlp(c, layer, job.attention_out.data() + t0 * q_width,
                   job.hidden.data() + t0 * hidden, m, scratch.normed.data(),
                   scratch.projected.data(), scratch.gate.data(), scratch.up.data());
  }
  if (progress_ && n > chunk)
    progress_(static_cast<int64_t>(layer_index + 1) * n / c.num_layers, n);
}

std::vector<float> CpuExecutor::finish_span(SpanJob& job) {
  if (!job.all_logits) return finish_span_rows(job, nullptr);
  const int64_t vocab = config().vocab_size;
  std::vector<float> logits(job.tokens.size() * static_cast<size_t>(vocab));
  finish_span_rows(job, [&](int64_t first_row, std::span<const float> rows) {
    std::copy(rows.begin(), rows.end(), logits.begin() + first_row * vocab);
  });
  return logits;
}

std::vector<float> CpuExecutor::finish_span(SpanJob& job, const LogitRowsCallback& each_chunk) {
  if (!job.all_logits) throw Error("finish_span: the span was begun without all_logits");
  if (!each_chunk) throw Error("finish_span: no callback for the rows");
  return finish_span_rows(job, each_chunk);
}

std::vector<float> CpuExecutor::finish_span_rows(SpanJob& job,
                                                 const LogitRowsCallback& each_chunk) {
  Sequence& s = job.sequence;
  Scratch& scratch = *scratch_;
  const ModelConfig& c = config();
  if (!span_layers_done(job)) throw Error("finish_span before the span's last layer");
  const int64_t n = static_cast<int64_t>(job.tokens.size());
  const int64_t hidden = c.hidden_size;
  const int64_t vocab = c.vocab_size;
  const int64_t chunk = std::min(kChunkTokens, n);
  if (s.schedule.advance(n)) compress(s, c);
  // Without a callback only the last row is projected.
  const int64_t first_row = each_chunk ? 0 : n - 1;
  std::vector<float> chunk_logits(static_cast<size_t>(std::min(chunk, n - first_row) * vocab));
  std::vector<float> last(static_cast<size_t>(vocab));
  scratch.normed.resize(chunk * hidden);
  for (int64_t t0 = first_row; t0 < n; t0 += chunk) {
    const int64_t m = std::min(chunk, n - t0);
    project_logits(weights_, job.hidden.data() + t0 * hidden, m, scratch.normed.data(),
                   chunk_logits.data());
    if (each_chunk) each_chunk(t0, std::span<const float>(chunk_logits.data(), m * vocab));
    if (t0 + m == n) std::copy_n(chunk_logits.begin() + (m - 1) * vocab, vocab, last.begin());
  }
  return last;
}

std::vector<float> CpuExecutor::decode(std::span<Sequence* const> sequences,
                                       std::span<const int32_t> tokens) {
  const ModelConfig& c = config();
  Scratch& scratch = *scratch_;
  const int64_t b = static_cast<int64_t>(sequences.size());
  if (static_cast<int64_t>(tokens.size()) != b) throw Error("decode needs one token per sequence");
  if (b == 0) return {};
  for (int64_t i = 0; i < b; ++i) {
    Sequence& s = *sequences[i];
    if (s.schedule.is_prefill()) throw Error("a sequence decodes only after its prefill");
    for (int64_t j = 0; j < i; ++j) {
      if (sequences[j] == sequences[i]) throw Error("a sequence decodes once per step");
    }
    s.schedule.check_span(tokens.subspan(i, 1), c.vocab_size);
  }
  for (Sequence* s : sequences) ensure_capacity(*s, c, 1);

  const int64_t hidden = c.hidden_size;
  const int64_t head_dim = c.head_dim;
  const int64_t q_width = static_cast<int64_t>(c.num_heads) * head_dim;
  const int64_t kv_width = static_cast<int64_t>(c.num_kv_heads) * head_dim;
  const int64_t vocab = c.vocab_size;
  const int64_t rotary_dim = c.rope.rotary_dim > 0 ? c.rope.rotary_dim : head_dim;
  const int group = c.num_heads / c.num_kv_heads;
  scratch.hidden.resize(b * hidden);
  scratch.q.resize(b * q_width);
  scratch.attention_out.resize(b * q_width);
  scratch.normed.resize(b * hidden);
  scratch.k.resize(b * kv_width);
  scratch.v.resize(b * kv_width);
  scratch.projected.resize(b * hidden);
  scratch.gate.resize(b * c.intermediate_size);
  scratch.up.resize(b * c.intermediate_size);
  std::vector<RopeTables> rope(b);
  for (int64_t i = 0; i < b; ++i) {
    weights_.token_embedding.widen_row(tokens[i], scratch.hidden.data() + i * hidden);
    rope[i] = rope_tables(c, sequences[i]->schedule.position(), 1);
  }
  for (int layer_index = 0; layer_index < c.num_layers; ++layer_index) {
    const LayerWeights& layer = weights_.layers[layer_index];
    // The products run over all rows at once: one pass over each weight matrix per step.
    project_qkv(c, layer, scratch.hidden.data(), b, scratch.normed.data(), scratch.q.data(),
                scratch.k.data(), scratch.v.data());
    for (int64_t i = 0; i < b; ++i) {
      Sequence& s = *sequences[i];
      LayerCache& cache = s.cache[layer_index];
      float* q = scratch.q.data() + i * q_width;
      float* k = scratch.k.data() + i * kv_width;
      const float* v = scratch.v.data() + i * kv_width;
      cpu::apply_rope(q, 1, c.num_heads, head_dim, rope[i].cos.data(), rope[i].sin.data(),
                      rotary_dim, c.rope.rotate_adjacent_pairs);
      cpu::apply_rope(k, 1, c.num_kv_heads, head_dim, rope[i].cos.data(), rope[i].sin.data(),
                      rotary_dim, c.rope.rotate_adjacent_pairs);
      if (s.recording.capture_inputs) s.recording.capture(layer_index, q, q_width, k, kv_width, 1);
      const int source_group = cache.heads == c.num_kv_heads ? 1 : group;
      for (int head = 0; head < cache.heads; ++head) {
        const int64_t source = static_cast<int64_t>(head / source_group) * head_dim;
        const int64_t slot =
            (static_cast<int64_t>(head) * cache.capacity + cache.lengths[head]) * head_dim;
        std::memcpy(cache.keys.data() + slot, k + source, sizeof(float) * head_dim);
        std::memcpy(cache.values.data() + slot, v + source, sizeof(float) * head_dim);
      }
      for (int& length : cache.lengths) ++length;
      if (fp8_kv_cache_) round_trip_latest_rows(cache, 1, head_dim);
      remember_queries(s, c, layer_index, q, 1);
      decode_attention(s, c, layer_index, q, scratch.attention_out.data() + i * q_width);
    }
    output_and_mlp(c, layer, scratch.attention_out.data(), scratch.hidden.data(), b,
                   scratch.normed.data(), scratch.projected.data(), scratch.gate.data(),
                   scratch.up.data());
  }
  for (Sequence* s : sequences) {
    if (s->schedule.advance(1)) compress(*s, c);
  }
  std::vector<float> logits(static_cast<size_t>(b * vocab));
  project_logits(weights_, scratch.hidden.data(), b, scratch.normed.data(), logits.data());
  return logits;
}

}  // namespace entropyinfer

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "backends/cuda/cuda_common.h"
#include "backends/cuda/ragged_decode.h"
#include "core/error.h"
#include "engine/cpu_executor.h"
#include "engine/cuda/cuda_batch_model.h"
#include "engine/cuda/cuda_transformer.h"

namespace entropyinfer::cuda {
namespace {

// Beside the pool: the CUDA context, cuBLASLt's workspace, the batched step's buffers.
constexpr size_t kHeadroomBytes = size_t{2} << 30;

// Keys and values of kPagedRows rows of one head: bf16, or E4M3 codes with a float scale per row.
int64_t page_bytes_of(const ModelConfig& c, bool fp8) {
  const int64_t row_bytes = fp8 ? c.head_dim + static_cast<int64_t>(sizeof(float))
                                : c.head_dim * static_cast<int64_t>(sizeof(bf16));
  return 2 * static_cast<int64_t>(kPagedRows) * row_bytes;
}

// The model's buffers for the heaviest policies a request may pick (sparse prefill estimator,
// compressor, observation windows), so that switching to them later still fits beside the pool.
size_t largest_policy_activations(const ModelConfig& config, const CudaModelOptions& base) {
  size_t largest = 0;
  for (PrefillMethod prefill : {PrefillMethod::kFull, PrefillMethod::kEntropy}) {
    for (DecodeMethod decode :
         {DecodeMethod::kFull, DecodeMethod::kLatent, DecodeMethod::kSnapKV, DecodeMethod::kAdaKV,
          DecodeMethod::kPyramidKV, DecodeMethod::kStreamingLLM}) {
      CudaModelOptions options = base;
      options.attention.prefill = prefill;
      options.attention.decode = decode;
      largest = std::max(largest, CudaTransformer::plan(config, options).activations);
    }
  }
  return largest;
}

// Page-locked host floats, so that each step's logits download at the link's full rate.
class PinnedFloats {
 public:
  PinnedFloats() = default;
  ~PinnedFloats() { release(); }
  PinnedFloats(const PinnedFloats&) = delete;
  PinnedFloats& operator=(const PinnedFloats&) = delete;
  void reserve(size_t count) {
    if (count <= capacity_) return;
    release();
    const size_t grown = std::max(count, 2 * capacity_);
    check(cudaHostAlloc(reinterpret_cast<void**>(&data_), grown * sizeof(float),
                        cudaHostAllocDefault),
          "cudaHostAlloc (logits)");
    capacity_ = grown;
  }
  float* data() { return data_; }

 private:
  void release() {
    if (data_ != nullptr) cudaFreeHost(data_);
    data_ = nullptr;
    capacity_ = 0;
  }
  float* data_ = nullptr;
  size_t capacity_ = 0;
};

class CudaBatchModel : public BatchModel {
 public:
  // `model` was built with model_options(options).
  CudaBatchModel(std::unique_ptr<CudaTransformer> model, const BatchModelOptions& options)
      : config_(model->config()),
        fp8_pages_(options.fp8_kv_cache),
        owned_model_(std::move(model)),
        model_(*owned_model_) {
    const CudaModelOptions base = model_options(config_, options);
    const size_t current = model_.memory_plan().activations;
    const size_t largest = largest_policy_activations(config_, base);
    const size_t headroom = kHeadroomBytes + (largest > current ? largest - current : 0);
    const auto [free_bytes, total_bytes] = device_memory();
    const int64_t page_bytes = page_bytes_of(config_, fp8_pages_);
    int64_t pool_bytes = options.pool_bytes;
    if (pool_bytes <= 0) {
      pool_bytes = free_bytes > headroom ? static_cast<int64_t>(free_bytes - headroom) : 0;
    } else if (static_cast<size_t>(pool_bytes) + headroom > free_bytes) {
      throw Error("the KV pool of " + std::to_string(pool_bytes >> 20) +
                  " MiB does not fit: " + std::to_string(free_bytes >> 20) + " MiB of the GPU's " +
                  std::to_string(total_bytes >> 20) + " MiB are free after the model, and " +
                  std::to_string(headroom >> 20) + " MiB stay for its buffers");
    }
    pages_total_ = pool_bytes / page_bytes;
    if (pages_total_ < 1) {
      throw Error("the GPU has no memory left for a KV pool after the model (" +
                  std::to_string(free_bytes >> 20) + " MiB free)");
    }
    const size_t rows = static_cast<size_t>(pages_total_) * kPagedRows;
    const size_t element_bytes = fp8_pages_ ? 1 : sizeof(bf16);
    pool_keys_.allocate(rows * config_.head_dim * element_bytes);
    pool_values_.allocate(rows * config_.head_dim * element_bytes);
    if (fp8_pages_) {
      pool_key_scales_.allocate(rows);
      pool_value_scales_.allocate(rows);
    }
    free_pages_.resize(static_cast<size_t>(pages_total_));
    // Popped from the back: low page numbers first.
    std::iota(free_pages_.rbegin(), free_pages_.rend(), 0);
  }

  SequenceId open(const AttentionConfig& attention, std::vector<int32_t> prompt,
                  int max_new_tokens) override {
    attention.validate();
    if (attention.decode_params.per_query_head) {
      throw Error(
          "per_query_head caches are not served on cuda: the batched step reads one cache per "
          "KV head");
    }
    const int rows = check_batch_request(config_, model_.context_length(), prompt, max_new_tokens);
    Entry entry;
    entry.attention = attention;
    entry.prompt = std::move(prompt);
    entry.row_limit = rows;
    const SequenceId id = next_id_++;
    sequences_.emplace(id, std::move(entry));
    return id;
  }

  void close(SequenceId sequence) override {
    auto it = sequences_.find(sequence);
    if (it == sequences_.end()) return;
    if (resident_ == sequence) release_resident();
    release_pages(it->second);
    sequences_.erase(it);
    batch_ids_.clear();  // the batch's tables name this sequence's pages
  }

  void ask_prompt_logprobs(SequenceId sequence, int top, int scored_ids) override {
    check_prompt_logprobs_request(config_, top, scored_ids);
    Entry& entry = find(sequence);
    if (entry.prefilled || resident_ == sequence)
      throw Error("sequence " + std::to_string(sequence) + " has begun its prefill");
    entry.prompt_logprobs_top = top;
    entry.scored_ids = scored_ids;
  }

  bool prefill_slot_free() const override { return resident_ < 0; }

  StepOutput step(const StepInput& input) override {
    StepOutput output;
    if (input.decode.size() != input.decode_tokens.size())
      throw Error("step: one decode token per decoding sequence");
    std::vector<SequenceId> stored;
    std::vector<int32_t> stored_tokens;
    int resident_row = -1;
    for (size_t i = 0; i < input.decode.size(); ++i) {
      const SequenceId id = input.decode[i];
      Entry& entry = find(id);
      if (!entry.prefilled) throw Error("sequence " + std::to_string(id) + " is prefilling");
      if (entry.position + 1 > entry.row_limit) {
        throw Error("sequence " + std::to_string(id) + " decodes past the " +
                    std::to_string(entry.row_limit) + " rows it was opened for");
      }
      if (std::count(input.decode.begin(), input.decode.end(), id) != 1)
        throw Error("sequence " + std::to_string(id) + " appears more than once per step");
      if (id == resident_) {
        resident_row = static_cast<int>(i);
      } else {
        stored.push_back(id);
        stored_tokens.push_back(input.decode_tokens[i]);
      }
    }
    const size_t vocab = static_cast<size_t>(config_.vocab_size);
    step_logits_.reserve(input.decode.size() * vocab);
    float* logits = step_logits_.data();
    if (!stored.empty()) {
      // The stored rows are the step's rows in order, but for the resident one's (last, moved).
      decode_stored(stored, stored_tokens, logits);
      if (resident_row >= 0) {
        for (size_t r = stored.size(); r-- > static_cast<size_t>(resident_row);)
          std::copy_n(logits + r * vocab, vocab, logits + (r + 1) * vocab);
      }
    }
    if (resident_row >= 0) {
      // The resident sequence decodes alone until it compresses (the latent gap).
      Entry& entry = find(resident_);
      const int32_t token = input.decode_tokens[static_cast<size_t>(resident_row)];
      const std::vector<float> row = model_.forward(std::span<const int32_t>(&token, 1));
      std::copy(row.begin(), row.end(), logits + static_cast<size_t>(resident_row) * vocab);
      entry.position = model_.position();
      if (model_.attention_work().compressed) store_resident();
    }
    output.decode_logits = std::span<float>(logits, input.decode.size() * vocab);
    if (input.prefill >= 0) {
      Entry& entry = find(input.prefill);
      if (entry.prefilled)
        throw Error("sequence " + std::to_string(input.prefill) + " has finished its prefill");
      if (resident_ >= 0 && resident_ != input.prefill) {
        throw Error("sequence " + std::to_string(resident_) +
                    " still holds the prefill cache (prefill_slot_free is false)");
      }
      if (resident_ < 0) {
        if (!same_attention(model_.attention_config(), entry.attention))
          model_.set_attention(entry.attention, true);
        model_.reset();
        model_.begin_prompt(entry.prompt, entry.prompt_logprobs_top >= 0);
        resident_ = input.prefill;
      }
      if (!model_.prompt_layers_done()) model_.run_prompt_work(input.prefill_budget);
      if (model_.prompt_layers_done()) {
        if (entry.prompt_logprobs_top >= 0) {
          // Reduced on the host as each slice of rows comes down.
          const int64_t vocab = config_.vocab_size;
          output.prompt_logprobs.reserve(entry.prompt.size() - 1);
          output.prefill_logits = model_.finish_prompt([&](int64_t first_row,
                                                           std::span<const float> rows) {
            append_prompt_logprobs(entry.prompt, first_row, rows, vocab, entry.prompt_logprobs_top,
                                   entry.scored_ids, output.prompt_logprobs);
          });
        } else {
          output.prefill_logits = model_.finish_prompt();
        }
        output.prefill_done = true;
        entry.prefilled = true;
        entry.position = model_.position();
        entry.work = model_.attention_work();
        // Stored now unless its compression is still to come (latent, after G tokens).
        const int64_t at = compression_length(
            entry.attention, static_cast<int>(entry.prompt.size()), entry.row_limit);
        if (entry.work.compressed || at < 0) store_resident();
      }
    }
    return output;
  }

  PageNeed pages_needed(const AttentionConfig& attention, int prompt_tokens,
                        int max_new_tokens) const override {
    const int rows = std::min(prompt_tokens + max_new_tokens, model_.context_length());
    // The pool receives the cache after any compression (the resident cache takes the peak).
    const KvPageNeed need = kv_pages_needed(config_, attention, kPagedRows, prompt_tokens, rows);
    return {need.steady, need.steady};
  }

  KvPoolUsage pool_usage() const override {
    KvPoolUsage usage;
    usage.pages_total = pages_total_;
    usage.pages_used = pages_total_ - static_cast<int64_t>(free_pages_.size());
    usage.page_bytes = page_bytes_of(config_, fp8_pages_);
    return usage;
  }
  int pages_held(SequenceId sequence) const override {
    const Entry& entry = find(sequence);
    int64_t pages = 0;
    for (const StoredLayer& layer : entry.layers) {
      for (const std::vector<int32_t>& cache : layer.pages)
        pages += static_cast<int64_t>(cache.size());
    }
    return static_cast<int>(pages);
  }
  int position(SequenceId sequence) const override { return find(sequence).position; }
  bool prefilled(SequenceId sequence) const override { return find(sequence).prefilled; }
  bool compressed(SequenceId sequence) const override {
    const Entry& entry = find(sequence);
    return sequence == resident_ ? model_.attention_work().compressed : entry.work.compressed;
  }
  const AttentionWork& attention_work(SequenceId sequence) const override {
    const Entry& entry = find(sequence);
    return sequence == resident_ ? model_.attention_work() : entry.work;
  }
  int context_length() const override { return model_.context_length(); }
  int num_layers() const override { return config_.num_layers; }
  const ModelConfig& config() const override { return config_; }
  std::string device_name() const override { return model_.device_name(); }

 private:
  struct StoredLayer {
    std::vector<std::vector<int32_t>> pages;  // per KV head, its pages in row order
    std::vector<int32_t> lengths;             // per KV head, rows when stored
  };
  struct Entry {
    AttentionConfig attention;
    std::vector<int32_t> prompt;
    int row_limit = 0;
    int position = 0;
    bool prefilled = false;
    AttentionWork work;
    std::vector<StoredLayer> layers;  // empty until stored
    int stored_position = 0;          // position when stored: rows appended since are theirs
    int prompt_logprobs_top = -1;     // -1: the prompt is not scored
    int scored_ids = 0;
  };

 public:
  static CudaModelOptions model_options(const ModelConfig& config,
                                        const BatchModelOptions& options) {
    CudaModelOptions cuda_options;
    // The resident cache and the pool's pages alike: stored pages are its codes and scales.
    cuda_options.fp8_kv_cache = options.fp8_kv_cache;
    cuda_options.prompt_attention = options.prompt_attention;
    cuda_options.fp8_separate_scaling = options.fp8_separate_scaling;
    cuda_options.context_length = resolve_context_length(config, options.context_length);
    cuda_options.layer_major_prefill = true;
    // The resident cache is stored into the pool right after it compresses, with room for the
    // answer there; the compressed resident cache needs no room of its own.
    cuda_options.decode_room = 1;
    return cuda_options;
  }

 private:
  static bool same_attention(const AttentionConfig& a, const AttentionConfig& b) {
    return attention_config_to_json(a) == attention_config_to_json(b);
  }

  Entry& find(SequenceId id) {
    auto it = sequences_.find(id);
    if (it == sequences_.end()) throw Error("no sequence " + std::to_string(id));
    return it->second;
  }
  const Entry& find(SequenceId id) const {
    auto it = sequences_.find(id);
    if (it == sequences_.end()) throw Error("no sequence " + std::to_string(id));
    return it->second;
  }

  CudaTransformer::PagedPool pool() {
    return {pool_keys_.data(), pool_values_.data(), pool_key_scales_.data(),
            pool_value_scales_.data()};
  }

  void release_resident() {
    model_.reset();
    resident_ = -1;
  }

  void release_pages(Entry& entry) {
    for (StoredLayer& layer : entry.layers) {
      for (std::vector<int32_t>& cache : layer.pages) {
        free_pages_.insert(free_pages_.end(), cache.begin(), cache.end());
      }
    }
    entry.layers.clear();
  }

  // Moves the resident cache into pool pages, each head with room for the rest of the answer.
  void store_resident() {
    Entry& entry = find(resident_);
    entry.work = model_.attention_work();
    const int remaining = entry.row_limit - entry.position;
    std::vector<StoredLayer> layers(static_cast<size_t>(config_.num_layers));
    std::vector<DeviceBuffer<int32_t>> tables;
    const auto give_back = [&] {
      for (StoredLayer& layer : layers) {
        for (std::vector<int32_t>& cache : layer.pages)
          free_pages_.insert(free_pages_.end(), cache.begin(), cache.end());
      }
    };
    try {
      for (int index = 0; index < config_.num_layers; ++index) {
        const CudaTransformer::ResidentLayer resident = model_.resident_layer(index);
        if (resident.per_query_head || resident.caches != config_.num_kv_heads)
          throw Error("the resident cache is not one cache per KV head");
        StoredLayer& layer = layers[static_cast<size_t>(index)];
        layer.lengths = resident.lengths;
        layer.pages.resize(static_cast<size_t>(resident.caches));
        int64_t max_pages = 1;
        for (int c = 0; c < resident.caches; ++c) {
          const int64_t rows = resident.lengths[static_cast<size_t>(c)] + remaining;
          const int64_t count = std::max<int64_t>(1, (rows + kPagedRows - 1) / kPagedRows);
          if (count > static_cast<int64_t>(free_pages_.size())) {
            throw Error("the KV pool has no room for the sequence's cache (" +
                        std::to_string(free_pages_.size()) + " pages free)");
          }
          std::vector<int32_t>& pages = layer.pages[static_cast<size_t>(c)];
          pages.assign(free_pages_.end() - count, free_pages_.end());
          free_pages_.resize(free_pages_.size() - static_cast<size_t>(count));
          max_pages = std::max(max_pages, count);
        }
        std::vector<int32_t> table(static_cast<size_t>(resident.caches * max_pages), 0);
        for (int c = 0; c < resident.caches; ++c) {
          const std::vector<int32_t>& pages = layer.pages[static_cast<size_t>(c)];
          std::copy(pages.begin(), pages.end(), table.begin() + c * max_pages);
        }
        tables.emplace_back(table.size());
        tables.back().upload(table.data(), table.size());
        model_.store_resident_layer(index, tables.back().data(), max_pages, pool());
      }
      check(cudaStreamSynchronize(static_cast<cudaStream_t>(model_.stream())), "cache store");
    } catch (...) {
      give_back();
      throw;
    }
    entry.layers = std::move(layers);
    entry.stored_position = entry.position;
    release_resident();
  }

  // The batched step over stored sequences; page tables and lengths go up only when the batch
  // differs from the last step's.
  void decode_stored(const std::vector<SequenceId>& ids, const std::vector<int32_t>& tokens,
                     float* logits) {
    const int kv = config_.num_kv_heads;
    if (ids != batch_ids_) {
      batch_layers_.resize(static_cast<size_t>(config_.num_layers));
      for (int index = 0; index < config_.num_layers; ++index) {
        int64_t max_pages = 1;
        for (SequenceId id : ids) {
          for (const std::vector<int32_t>& pages : find(id).layers[index].pages)
            max_pages = std::max<int64_t>(max_pages, static_cast<int64_t>(pages.size()));
        }
        std::vector<int32_t> table(ids.size() * kv * static_cast<size_t>(max_pages), 0);
        std::vector<int32_t> lengths(ids.size() * kv);
        for (size_t b = 0; b < ids.size(); ++b) {
          const Entry& entry = find(ids[b]);
          const StoredLayer& layer = entry.layers[static_cast<size_t>(index)];
          for (int c = 0; c < kv; ++c) {
            const size_t slot = b * kv + static_cast<size_t>(c);
            const std::vector<int32_t>& pages = layer.pages[static_cast<size_t>(c)];
            std::copy(pages.begin(), pages.end(),
                      table.begin() + static_cast<int64_t>(slot) * max_pages);
            lengths[slot] =
                layer.lengths[static_cast<size_t>(c)] + entry.position - entry.stored_position;
          }
        }
        BatchLayer& batch = batch_layers_[static_cast<size_t>(index)];
        batch.tables.allocate(table.size());
        batch.tables.upload(table.data(), table.size());
        batch.lengths.allocate(lengths.size());
        batch.lengths.upload(lengths.data(), lengths.size());
        batch.max_pages = max_pages;
      }
      batch_ids_ = ids;
    }
    std::vector<int32_t> positions(ids.size());
    for (size_t b = 0; b < ids.size(); ++b) positions[b] = find(ids[b]).position;
    CudaTransformer::PagedBatch batch;
    batch.tokens = tokens;
    batch.positions = positions;
    batch.pool = pool();
    for (BatchLayer& layer : batch_layers_)
      batch.layers.push_back({layer.tables.data(), layer.max_pages, layer.lengths.data()});
    model_.decode_paged(batch, logits);
    for (SequenceId id : ids) ++find(id).position;
  }

  struct BatchLayer {
    DeviceBuffer<int32_t> tables, lengths;
    int64_t max_pages = 1;
  };

  ModelConfig config_;
  bool fp8_pages_ = false;  // the pool holds FP8 pages (BatchModelOptions::fp8_kv_cache)
  std::unique_ptr<CudaTransformer> owned_model_;
  CudaTransformer& model_;
  // Pages of bf16 rows, or of E4M3 codes with a float scale per row (fp8_pages_).
  DeviceBuffer<uint8_t> pool_keys_, pool_values_;
  DeviceBuffer<float> pool_key_scales_, pool_value_scales_;  // FP8 pages only
  int64_t pages_total_ = 0;
  std::vector<int32_t> free_pages_;
  std::map<SequenceId, Entry> sequences_;
  SequenceId next_id_ = 0;
  SequenceId resident_ = -1;
  std::vector<SequenceId> batch_ids_;  // the sequences batch_layers_ describe, in row order
  std::vector<BatchLayer> batch_layers_;
  PinnedFloats step_logits_;  // the last step's logits
};

}  // namespace

std::unique_ptr<BatchModel> make_cuda_batch_model(const ModelWeights& weights,
                                                  const BatchModelOptions& options) {
  return std::make_unique<CudaBatchModel>(
      std::make_unique<CudaTransformer>(weights,
                                        CudaBatchModel::model_options(weights.config, options)),
      options);
}

std::unique_ptr<BatchModel> make_cuda_batch_model(const ModelConfig& config, uint64_t seed,
                                                  const BatchModelOptions& options,
                                                  bool fp8_weights) {
  CudaModelOptions model_options = CudaBatchModel::model_options(config, options);
  model_options.fp8_weights = fp8_weights;
  return std::make_unique<CudaBatchModel>(
      std::make_unique<CudaTransformer>(config, seed, model_options), options);
}

}  // namespace entropyinfer::cuda

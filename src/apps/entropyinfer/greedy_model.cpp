#include "apps/entropyinfer/greedy_model.h"

#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>

#include "core/error.h"
#include "core/json_reader.h"
#include "core/user_file.h"

#ifdef ENTROPYINFER_WITH_CUDA
#include "backends/cuda/cuda_common.h"
#include "backends/cuda/cuda_transformer.h"
#endif

namespace entropyinfer::cli {
namespace {

namespace fs = std::filesystem;

template <typename Work>
WorkFractions fractions_of(const Work& work) {
  WorkFractions fractions;
  if (work.prefill_keys_dense > 0) {
    fractions.prefill_keys =
        static_cast<double>(work.prefill_keys_read) / static_cast<double>(work.prefill_keys_dense);
  }
  if (work.compressed && work.cache_entries_before > 0) {
    fractions.cache_kept = static_cast<double>(work.cache_entries_after) /
                           static_cast<double>(work.cache_entries_before);
  }
  fractions.compressed = work.compressed;
  return fractions;
}

int32_t argmax(const std::vector<float>& logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

#ifdef ENTROPYINFER_WITH_CUDA
class CudaGreedyModel : public GreedyModel {
 public:
  CudaGreedyModel(const ModelWeights& weights, const cuda::CudaModelOptions& options)
      : model_(weights, options) {}
  void set_attention(const AttentionConfig& config) override { model_.set_attention(config); }
  int32_t prefill(std::span<const int32_t> prompt) override {
    model_.reset();
    return model_.forward_greedy(prompt);
  }
  int32_t step(int32_t token) override {
    return model_.forward_greedy(std::span<const int32_t>(&token, 1));
  }
  WorkFractions work() const override { return fractions_of(model_.attention_work()); }
  const cuda::CudaTransformer& model() const { return model_; }

 private:
  cuda::CudaTransformer model_;
};
#endif

}  // namespace

CpuGreedyModel::CpuGreedyModel(const ModelWeights& weights, int context)
    : weights_(weights), context_(context) {}

void CpuGreedyModel::set_attention(const AttentionConfig& config) {
  model_ = std::make_unique<Transformer>(weights_, context_, config);
  if (progress_) model_->set_progress_callback(progress_);
}

int32_t CpuGreedyModel::prefill(std::span<const int32_t> prompt) {
  model_->reset();
  return argmax(model_->forward(prompt));
}

int32_t CpuGreedyModel::step(int32_t token) {
  return argmax(model_->forward(std::span<const int32_t>(&token, 1)));
}

WorkFractions CpuGreedyModel::work() const { return fractions_of(model_->attention_work()); }

void CpuGreedyModel::set_progress(Transformer::ProgressCallback callback) {
  progress_ = std::move(callback);
  if (model_) model_->set_progress_callback(progress_);
}

void DeviceFlags::add_to(CLI::App* command) {
  command->add_option("--device", device, "cpu or cuda (CUDA builds)")->capture_default_str();
  command->add_option("--threads", threads, "CPU threads (default: OpenMP's)")
      ->check(integer_in(1, kMaxThreads));
  command->add_option("--chunk", chunk_tokens, "cuda: prompt tokens per matrix-product pass")
      ->check(integer_in(1, kMaxTokenCount))
      ->capture_default_str();
}

void DeviceFlags::check() const {
  if (device != "cpu" && device != "cuda") {
    throw Error("--device must be cpu or cuda, not '" + device + "'");
  }
#ifndef ENTROPYINFER_WITH_CUDA
  if (device == "cuda") {
    throw Error(
        "--device cuda: this build has no CUDA backend (configure with -DENTROPYINFER_CUDA=ON)");
  }
#endif
}

void DeviceFlags::apply_threads() const {
  if (threads > 0) omp_set_num_threads(threads);
}

std::unique_ptr<GreedyModel> make_greedy_model(const DeviceFlags& flags, ModelWeights& weights,
                                               int context, const AttentionConfig& first,
                                               std::string& device_name) {
  flags.check();
  device_name = "cpu (" + std::to_string(omp_get_max_threads()) + " threads)";
  if (flags.device == "cuda") {
#ifdef ENTROPYINFER_WITH_CUDA
    if (cuda::device_count() == 0) throw Error("--device cuda: no CUDA device is present");
    cuda::CudaModelOptions options;
    options.context_length = context;
    options.chunk_tokens = flags.chunk_tokens;
    options.decode_room = 64;  // answers are at most a few dozen tokens
    options.attention = first;
    std::fprintf(stderr, "uploading to the GPU...\n");
    auto cuda_model = std::make_unique<CudaGreedyModel>(weights, options);
    std::fprintf(stderr, "%s\n", cuda_model->model().memory_plan().describe().c_str());
    weights = ModelWeights{};  // the GPU holds its own copy
    int index = 0;
    cudaDeviceProp properties{};
    cuda::check(cudaGetDevice(&index), "cudaGetDevice");
    cuda::check(cudaGetDeviceProperties(&properties, index), "cudaGetDeviceProperties");
    device_name = std::string("cuda (") + properties.name + ")";
    return cuda_model;
#endif
  }
  (void)first;
  return std::make_unique<CpuGreedyModel>(weights, context);
}

std::vector<int32_t> stop_token_ids(const ModelConfig& config, const Tokenizer& tokenizer) {
  std::vector<int32_t> ids(config.eos_token_ids.begin(), config.eos_token_ids.end());
  for (int32_t id : tokenizer.eos_ids()) ids.push_back(id);
  return ids;
}

std::vector<AttentionConfig> parse_methods_flag(const std::vector<std::string>& methods,
                                                const AttentionConfig& base) {
  if (methods.empty()) throw Error("--methods: give at least one method");
  std::vector<AttentionConfig> configs;
  std::set<std::string> seen;
  for (const std::string& method : methods) {
    if (!seen.insert(method).second) throw Error("--methods: '" + method + "' is given twice");
    try {
      configs.push_back(with_methods(method, base));
    } catch (const Error& error) {
      throw Error("--methods: '" + method + "': " + error.what());
    }
  }
  return configs;
}

bool has_budget(const AttentionConfig& config) {
  return config.prefill != PrefillMethod::kFull || config.decode != DecodeMethod::kFull;
}

AttentionConfig at_budget_level(AttentionConfig config, int budget, bool scale_threshold) {
  config.prefill_params.base_budget = budget;
  config.prefill_params.critiprefill_budget = budget;
  config.decode_params.budget = budget;
  if (scale_threshold) config.prefill_params.sparse_threshold = budget;
  return config;
}

AttentionConfig checked_budget_level(const AttentionConfig& config, int budget,
                                     bool scale_threshold, const std::string& flag,
                                     const std::string& method) {
  const AttentionConfig level = at_budget_level(config, budget, scale_threshold);
  try {
    level.validate();
  } catch (const Error& error) {
    throw Error(flag + " " + std::to_string(budget) + " with '" + method + "': " + error.what());
  }
  return level;
}

void reject_flags(CLI::App* command, std::initializer_list<const char*> flags,
                  const std::string& why) {
  for (const char* flag : flags) {
    if (command->get_option(flag)->count() > 0) throw Error(std::string(flag) + ": " + why);
  }
}

std::vector<int32_t> prompt_token_ids(const Tokenizer& tokenizer, const std::string& prompt) {
  std::vector<int32_t> ids;
  if (const std::optional<int32_t> bos = tokenizer.bos_id()) ids.push_back(*bos);
  EncodeOptions encode;
  encode.add_bos = false;
  encode.parse_special = false;
  for (int32_t id : tokenizer.encode(prompt, encode)) ids.push_back(id);
  return ids;
}

bool sparse_threshold_given(CLI::App* command) {
  bool given = command->get_option("--sparse-threshold")->count() > 0;
  if (const CLI::Option* file = command->get_option("--attention-config"); file->count() > 0) {
    // The file is read again, and its errors reported, by load_attention_config.
    const nlohmann::json json = read_json_file(file->as<std::string>(), "attention config");
    given = given || (json.is_object() &&
                      (json.contains("sparse_threshold") ||
                       (json.contains("prefill_params") && json["prefill_params"].is_object() &&
                        json["prefill_params"].contains("sparse_threshold"))));
  }
  return given;
}

std::optional<fs::path> find_above_cwd_or_executable(const fs::path& relative) {
  std::vector<fs::path> starts = {fs::current_path()};
  std::error_code error;
  const fs::path executable = fs::read_symlink("/proc/self/exe", error);
  if (!error) starts.push_back(executable.parent_path());
  for (fs::path folder : starts) {
    while (true) {
      const fs::path candidate = folder / relative;
      if (fs::is_directory(candidate)) return candidate;
      if (folder == folder.parent_path() || folder.empty()) break;
      folder = folder.parent_path();
    }
  }
  return std::nullopt;
}

std::string find_text_dir(const std::string& given) {
  if (!given.empty()) return given;
  if (const auto found = find_above_cwd_or_executable(fs::path("shared") / "assets" / "text")) {
    return found->string();
  }
  throw Error(
      "no shared/assets/text folder found above the current directory or the executable: pass "
      "--text-dir (the folder holding janeausten/persuasion.txt)");
}

}  // namespace entropyinfer::cli

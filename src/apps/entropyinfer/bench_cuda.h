// `entropyinfer bench --device cuda`: llama-bench-style measurements of the CUDA backend, one row
// per prompt length and attention method.
#pragma once

#include <algorithm>
#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "attention/attention_config.h"
#include "engine/language_model.h"

namespace entropyinfer::cli {

// --gemm-tuning's modes, in the order of cuda::CudaModelOptions::GemmTuning.
inline constexpr std::array<std::string_view, 3> kGemmTuningModes = {"heuristic", "burst",
                                                                     "sustained"};

// The mode's index in kGemmTuningModes, or -1 for an unknown one.
inline int gemm_tuning_index(std::string_view mode) {
  const auto found = std::find(kGemmTuningModes.begin(), kGemmTuningModes.end(), mode);
  return found == kGemmTuningModes.end() ? -1 : static_cast<int>(found - kGemmTuningModes.begin());
}

struct CudaBenchArgs {
  std::string model;         // a model folder, or empty with random_model set
  std::string random_model;  // a named shape (model/random_model.h), weights drawn on the GPU
  std::vector<int> prompt_tokens;
  int decode_tokens = 256;
  int repetitions = 1;
  int chunk_tokens = kDefaultChunkTokens;
  bool stage_times = false;               // one more prefill per row, timed part by part
  std::string gemm_tuning = "burst";      // one of kGemmTuningModes
  std::string weights = "as-stored";      // or fp8 (quantize_weights_fp8; random weights drawn so)
  std::string kv_cache = "auto";          // bf16, or fp8 (CudaModelOptions::fp8_kv_cache)
  std::string prompt_attention = "auto";  // bf16, fp8 or auto (CudaModelOptions::prompt_attention)
  // >= 0: decode step k of each row's first repetition runs between cudaProfilerStart and
  // cudaProfilerStop, for a profiler started with --profile-from-start off.
  int profile_decode_step = -1;
  bool profile_prefill = false;  // the same around each row's first timed prefill
  // "prefill[+decode]" each, e.g. full, entropy+latent, critiprefill+snapkv.
  std::vector<std::string> methods;
  AttentionConfig base;  // the parameters every method shares
  std::string json_path;
  std::string markdown_path;
  std::string command_line;  // recorded in the results
};

// Throws Error when this build has no CUDA backend or no GPU is present. The flags it shares with
// the CPU bench are checked by the caller (bench_command.cpp) before this runs.
void run_cuda_bench(const CudaBenchArgs& args);

}  // namespace entropyinfer::cli

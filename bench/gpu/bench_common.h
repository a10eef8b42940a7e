// What the GPU benchmarks share: CUDA events around each run after warm-up and medians, the
// "--flag value" command lines, and the random attention inputs of the attention benchmarks. The
// device name and its copy bandwidth come from backends/cuda/device_info.h.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "backends/cuda/cuda_common.h"
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/device_info.h"
#include "backends/cuda/flash_attention.h"
#include "core/stopwatch.h"

namespace entropyinfer::bench {

struct Timing {
  double median_ms = 0;
  double min_ms = 0;
  int runs = 0;
};

// Runs `work` (which enqueues on `stream`) `warmup` times, then at least min_runs and until
// min_total_ms of measured time or max_runs; each run timed alone with events.
inline Timing time_runs(const std::function<void()>& work, cudaStream_t stream, int warmup = 2,
                        int min_runs = 5, int max_runs = 50, double min_total_ms = 1500) {
  for (int i = 0; i < warmup; ++i) work();
  cuda::check(cudaStreamSynchronize(stream), "warm-up");
  cuda::EventStopwatch stopwatch;
  std::vector<double> times;
  double total = 0;
  while (static_cast<int>(times.size()) < max_runs &&
         (static_cast<int>(times.size()) < min_runs || total < min_total_ms)) {
    times.push_back(stopwatch.time_ms(stream, work));
    total += times.back();
  }
  std::sort(times.begin(), times.end());
  Timing timing;
  timing.runs = static_cast<int>(times.size());
  timing.median_ms = times.size() % 2
                         ? times[times.size() / 2]
                         : 0.5 * (times[times.size() / 2 - 1] + times[times.size() / 2]);
  timing.min_ms = times.front();
  return timing;
}

// GPU memory in use on the device, by this process and any other.
inline size_t used_gpu_bytes() {
  const auto [free_bytes, total_bytes] = cuda::device_memory();
  return total_bytes - free_bytes;
}

inline std::vector<int64_t> parse_list(const std::string& text) {
  std::vector<int64_t> values;
  size_t begin = 0;
  while (begin < text.size()) {
    const size_t end = std::min(text.find(',', begin), text.size());
    values.push_back(std::stoll(text.substr(begin, end - begin)));
    begin = end + 1;
  }
  return values;
}

// Calls take(flag, value) for each "--flag value" pair of the command line; a flag without a value,
// or one that take() does not know (returns false for), is an error.
inline void for_each_flag(
    int argc, char** argv,
    const std::function<bool(const std::string& flag, const std::string& value)>& take) {
  for (int i = 0; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) throw std::runtime_error("flag " + flag + " needs a value");
    const std::string value = argv[++i];
    if (!take(flag, value)) throw std::runtime_error("unknown flag " + flag);
  }
}

// The attention shape the attention benchmarks take on the command line.
struct AttentionBenchShape {
  explicit AttentionBenchShape(std::vector<int64_t> default_lengths)
      : lengths(std::move(default_lengths)) {}

  // Takes --lengths, --q-heads, --kv-heads and --head-dim; false for any other flag.
  bool take_flag(const std::string& flag, const std::string& value) {
    if (flag == "--lengths") {
      lengths = parse_list(value);
    } else if (flag == "--q-heads") {
      q_heads = std::stoll(value);
    } else if (flag == "--kv-heads") {
      kv_heads = std::stoll(value);
    } else if (flag == "--head-dim") {
      head_dim = std::stoll(value);
    } else {
      return false;
    }
    return true;
  }

  // The device and the heads into a report.
  void report_to(nlohmann::json& report) const {
    report["device"] = cuda::device_name();
    report["q_heads"] = q_heads;
    report["kv_heads"] = kv_heads;
    report["head_dim"] = head_dim;
  }

  std::vector<int64_t> lengths;
  int64_t q_heads = 32, kv_heads = 8, head_dim = 128;
};

// Random bf16 inputs of causal self-attention over n tokens, and its output. Queries ~ U(-2, 2)
// and keys ~ U(-1, 1): real spread in the scores; never zeros.
struct AttentionInputs {
  AttentionInputs(int64_t n, const AttentionBenchShape& dims, cudaStream_t stream)
      : q_count(static_cast<size_t>(n) * dims.q_heads * dims.head_dim),
        kv_count(static_cast<size_t>(dims.kv_heads) * n * dims.head_dim),
        q(q_count),
        k(kv_count),
        v(kv_count),
        out(q_count) {
    cuda::fill_uniform(q.data(), static_cast<int64_t>(q_count), 1000 + n, 2.0f, stream);
    cuda::fill_uniform(k.data(), static_cast<int64_t>(kv_count), 2000 + n, 1.0f, stream);
    cuda::fill_uniform(v.data(), static_cast<int64_t>(kv_count), 3000 + n, 1.0f, stream);
    shape.tokens = n;
    shape.q_heads = dims.q_heads;
    shape.kv_heads = dims.kv_heads;
    shape.head_dim = dims.head_dim;
    shape.cache_stride = n;
  }

  // Dense causal prefill of every query.
  void prefill(cuda::FlashKernel kernel, cudaStream_t stream) {
    cuda::flash_prefill(q.data(), k.data(), v.data(), shape, out.data(), stream, kernel);
  }

  size_t q_count, kv_count;
  cuda::DeviceBuffer<cuda::bf16> q, k, v, out;
  cuda::FlashShape shape;
};

// The inputs' keys and values staged as FP8 codes (what flash_prefill_fp8 and
// flash_prefill_block_sparse_fp8 read; a prefill stages each layer once).
struct Fp8StagedInputs {
  Fp8StagedInputs(const AttentionInputs& inputs, cudaStream_t stream)
      : buffers(inputs.shape.kv_heads, inputs.shape.head_dim, inputs.shape.tokens) {
    stage(inputs, stream);
  }
  void stage(const AttentionInputs& inputs, cudaStream_t stream) {
    cuda::stage_fp8_keys(inputs.k.data(), inputs.v.data(), inputs.shape.cache_stride,
                         inputs.shape.head_dim, inputs.shape.tokens, buffers.view, stream);
  }

  cuda::Fp8StagingBuffers buffers;
};

int run_attention_bench(int argc, char** argv);
int run_model_bench(int argc, char** argv);

}  // namespace entropyinfer::bench

// Block-sparse prefill against dense prefill at long lengths, on EntropyInfer's typical plan.
// For each length n:
//   dense        flash_prefill (causal);
//   method       flash_prefill_block_sparse with the method's plan shape: segments of S tokens that
//                start at or after the threshold, the last excepted, are sparse; each (KV head,
//                sparse segment) row reads `top` random distinct blocks of b keys before the
//                segment (all of them when fewer are visible) plus the segment's own keys;
//   all_visible  the same segments, every row selecting every visible block: the dense keys through
//                the sparse kernel's gather path (should run about as fast as dense).
// FLOPs are counted on the keys actually read: 4 * head_dim * (q_heads / kv_heads) *
// LayerPrefillPlan::keys_read(), i.e. 4 * head_dim per (query head, query, key read) (2 for
// Q K^T, 2 for P V); dense reads n (n + 1) / 2 keys per query head. Effective TFLOP/s of the
// sparse runs are thus comparable with the dense kernel's, and the speed-up is dense ms over
// sparse ms (the ideal is 1 / key-read fraction). With --kernel fp8 the three run in FP8
// (flash_prefill_fp8 and flash_prefill_block_sparse_fp8 over keys staged once, outside the timing;
// the staging is timed on its own).
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "attention/prefill_plan.h"
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/device_plans.h"
#include "backends/cuda/flash_attention.h"
#include "bench_common.h"

namespace entropyinfer::bench {
namespace {

struct PlanShape {
  int64_t tokens = 0;
  int kv_heads = 0;
  int segment_size = 512;
  int block_size = 8;
  int top_blocks = 256;
  int64_t threshold = 4096;
  bool all_visible = false;
};

LayerPrefillPlan method_plan(const PlanShape& shape, uint32_t seed) {
  std::mt19937 generator(seed);
  LayerPrefillPlan plan;
  plan.dense = false;
  plan.num_tokens = shape.tokens;
  plan.num_kv_heads = shape.kv_heads;
  plan.segment_size = shape.segment_size;
  plan.block_size = shape.block_size;
  plan.num_segments =
      static_cast<int>((shape.tokens + shape.segment_size - 1) / shape.segment_size);
  plan.segment_sparse.assign(static_cast<size_t>(plan.num_segments), 0);
  for (int s = 0; s + 1 < plan.num_segments; ++s) {
    plan.segment_sparse[s] = static_cast<int64_t>(s) * shape.segment_size >= shape.threshold;
  }
  const int64_t max_visible = shape.tokens / shape.block_size;
  std::vector<int32_t> all_blocks(static_cast<size_t>(max_visible));
  std::iota(all_blocks.begin(), all_blocks.end(), 0);
  plan.row_offsets = {0};
  for (int kv_head = 0; kv_head < shape.kv_heads; ++kv_head) {
    for (int s = 0; s < plan.num_segments; ++s) {
      if (plan.segment_sparse[s]) {
        const int64_t visible = static_cast<int64_t>(s) * shape.segment_size / shape.block_size;
        const int64_t count =
            shape.all_visible ? visible : std::min<int64_t>(visible, shape.top_blocks);
        // Selection sampling keeps the blocks ascending.
        std::sample(all_blocks.begin(), all_blocks.begin() + visible,
                    std::back_inserter(plan.block_indices), count, generator);
      }
      plan.row_offsets.push_back(static_cast<int32_t>(plan.block_indices.size()));
    }
  }
  return plan;
}

}  // namespace

int run_sparse_attention_bench(int argc, char** argv) {
  AttentionBenchShape dims({32768, 65536, 131072});
  PlanShape plan_shape;
  std::string kernel_name = "auto";
  std::string json_path;
  for_each_flag(argc, argv, [&](const std::string& flag, const std::string& value) {
    if (dims.take_flag(flag, value)) return true;
    if (flag == "--segment") {
      plan_shape.segment_size = std::stoi(value);
    } else if (flag == "--block") {
      plan_shape.block_size = std::stoi(value);
    } else if (flag == "--top-blocks") {
      plan_shape.top_blocks = std::stoi(value);
    } else if (flag == "--threshold") {
      plan_shape.threshold = std::stoll(value);
    } else if (flag == "--kernel") {
      kernel_name = value;
    } else if (flag == "--json") {
      json_path = value;
    } else {
      return false;
    }
    return true;
  });
  cuda::FlashKernel kernel = cuda::FlashKernel::kAuto;
  if (kernel_name == "wgmma") {
    kernel = cuda::FlashKernel::kWgmma;
  } else if (kernel_name == "wgmma_simple") {
    kernel = cuda::FlashKernel::kWgmmaSimple;
  } else if (kernel_name == "mma") {
    kernel = cuda::FlashKernel::kMma;
  } else if (kernel_name != "auto" && kernel_name != "fp8") {
    throw std::runtime_error("unknown kernel " + kernel_name +
                             " (auto, wgmma, wgmma_simple, mma, fp8)");
  }
  const bool fp8 = kernel_name == "fp8";
  if (fp8 && !cuda::fp8_attention_available())
    throw std::runtime_error("--kernel fp8 needs a Hopper GPU and a build for sm_90a");
  plan_shape.kv_heads = static_cast<int>(dims.kv_heads);
  const int64_t group = dims.q_heads / dims.kv_heads;

  nlohmann::json report;
  dims.report_to(report);
  report["segment_size"] = plan_shape.segment_size;
  report["block_size"] = plan_shape.block_size;
  report["top_blocks"] = plan_shape.top_blocks;
  report["threshold"] = plan_shape.threshold;
  report["kernel"] = kernel_name;
  report["flops_formula"] =
      "4 * head_dim * (q_heads / kv_heads) * keys_read, keys_read summed over KV heads and "
      "queries (LayerPrefillPlan::keys_read; dense: kv_heads * n (n + 1) / 2)";
  std::cout << "device " << report["device"].get<std::string>() << ", kernel " << kernel_name
            << "\n";

  struct Row {
    int64_t tokens;
    double dense_ms, dense_tflops;
    double method_ms, method_fraction, method_tflops;
    double all_ms, all_tflops;
    double staging_ms;  // fp8 only
  };
  std::vector<Row> rows;
  cudaStream_t stream = nullptr;
  for (const int64_t n : dims.lengths) {
    // The dense attention benchmark's inputs.
    AttentionInputs inputs(n, dims, stream);
    auto tflops_of = [&](int64_t keys_read, double ms) {
      return 4.0 * static_cast<double>(dims.head_dim) * static_cast<double>(group) *
             static_cast<double>(keys_read) / (ms * 1e-3) / 1e12;
    };

    plan_shape.tokens = n;
    plan_shape.all_visible = false;
    const LayerPrefillPlan method = method_plan(plan_shape, 17 + static_cast<uint32_t>(n));
    plan_shape.all_visible = true;
    const LayerPrefillPlan everything = method_plan(plan_shape, 0);
    const int64_t dense_keys = method.keys_read_dense();

    Row row{};
    row.tokens = n;
    std::unique_ptr<Fp8StagedInputs> staged;
    if (fp8) {
      staged = std::make_unique<Fp8StagedInputs>(inputs, stream);
      const Timing staging = time_runs([&] { staged->stage(inputs, stream); }, stream);
      row.staging_ms = staging.median_ms;
    }
    const Timing dense = time_runs(
        [&] {
          if (fp8) {
            cuda::flash_prefill_fp8(inputs.q.data(), staged->buffers.view, inputs.shape,
                                    inputs.out.data(), stream);
          } else {
            inputs.prefill(kernel, stream);
          }
        },
        stream);
    row.dense_ms = dense.median_ms;
    row.dense_tflops = tflops_of(dense_keys, dense.median_ms);

    auto time_plan = [&](const LayerPrefillPlan& plan) {
      const auto device_plan = cuda::DevicePrefillPlanStorage::upload(plan);
      return time_runs(
          [&] {
            if (fp8) {
              cuda::flash_prefill_block_sparse_fp8(inputs.q.data(), staged->buffers.view,
                                                   inputs.shape, device_plan.view,
                                                   inputs.out.data(), stream);
            } else {
              cuda::flash_prefill_block_sparse(inputs.q.data(), inputs.k.data(), inputs.v.data(),
                                               inputs.shape, device_plan.view, inputs.out.data(),
                                               stream, kernel);
            }
          },
          stream);
    };
    const Timing sparse = time_plan(method);
    row.method_ms = sparse.median_ms;
    row.method_fraction = static_cast<double>(method.keys_read()) / dense_keys;
    row.method_tflops = tflops_of(method.keys_read(), sparse.median_ms);
    const Timing all = time_plan(everything);
    row.all_ms = all.median_ms;
    row.all_tflops = tflops_of(everything.keys_read(), all.median_ms);
    rows.push_back(row);

    report["results"].push_back({{"tokens", n},
                                 {"dense_ms", row.dense_ms},
                                 {"dense_min_ms", dense.min_ms},
                                 {"dense_tflops", row.dense_tflops},
                                 {"method_ms", row.method_ms},
                                 {"method_min_ms", sparse.min_ms},
                                 {"method_keys_read", method.keys_read()},
                                 {"dense_keys_read", dense_keys},
                                 {"method_key_fraction", row.method_fraction},
                                 {"method_effective_tflops", row.method_tflops},
                                 {"method_speedup", row.dense_ms / row.method_ms},
                                 {"method_ideal_speedup", 1.0 / row.method_fraction},
                                 {"all_visible_ms", row.all_ms},
                                 {"all_visible_min_ms", all.min_ms},
                                 {"all_visible_tflops", row.all_tflops},
                                 {"all_visible_vs_dense", row.dense_ms / row.all_ms},
                                 {"fp8_staging_ms", row.staging_ms}});
    std::cout << "n=" << n << ": dense " << row.dense_ms << " ms (" << row.dense_tflops
              << " TFLOP/s), method " << row.method_ms << " ms (" << 100.0 * row.method_fraction
              << "% of key reads, " << row.method_tflops << " effective TFLOP/s, "
              << row.dense_ms / row.method_ms << "x), all visible " << row.all_ms << " ms ("
              << row.all_tflops << " TFLOP/s)\n";
  }

  std::cout
      << "\n| tokens | dense ms | dense TFLOP/s | method ms | key reads | method eff. TFLOP/s "
         "| speed-up (ideal) | all-visible ms | all-visible TFLOP/s |\n"
         "|---|---|---|---|---|---|---|---|---|\n";
  for (const Row& row : rows) {
    char line[256];
    std::snprintf(line, sizeof(line),
                  "| %lld | %.2f | %.0f | %.2f | %.1f%% | %.0f | %.2fx (%.2fx) | %.2f | %.0f |\n",
                  static_cast<long long>(row.tokens), row.dense_ms, row.dense_tflops, row.method_ms,
                  100.0 * row.method_fraction, row.method_tflops, row.dense_ms / row.method_ms,
                  1.0 / row.method_fraction, row.all_ms, row.all_tflops);
    std::cout << line;
  }
  if (!json_path.empty()) {
    std::ofstream file(json_path);
    file << report.dump(2) << "\n";
  }
  return 0;
}

}  // namespace entropyinfer::bench

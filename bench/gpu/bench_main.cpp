// entropyinfer_gpu_bench: GPU benchmarks. Subcommands:
//   attention  prefill kernels' TFLOP/s (causal) and split-KV decode bandwidth at several lengths
//   model      whole-model prefill and decode of a random-weight model of a real shape
//   sparse-attention  block-sparse prefill on EntropyInfer's typical plan against dense prefill
//   capacity   the longest prompt one GPU holds per attention method, found by constructing the
//   engine
//   gemm       the model's four linear products at the prefill chunk size (and one token)
//   serve      the serving scheduler under load on the CUDA batch executor
#include <cstring>
#include <exception>
#include <iostream>

#include "bench_common.h"

namespace entropyinfer::bench {
int run_sparse_attention_bench(int argc, char** argv);  // bench_sparse_attention.cpp
int run_capacity_bench(int argc, char** argv);          // bench_capacity.cpp
int run_gemm_bench(int argc, char** argv);              // bench_gemm.cpp
int run_serve_bench(int argc, char** argv);             // bench_serve.cpp
}  // namespace entropyinfer::bench

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0) {
    std::cerr
        << "usage: entropyinfer_gpu_bench attention [--lengths 8192,32768,131072] [--q-heads 32]\n"
           "         [--kv-heads 8] [--head-dim 128] [--kernels wgmma,wgmma_simple,mma] [--json "
           "PATH]\n"
           "       entropyinfer_gpu_bench model [--shape llama-3.1-8b] [--prefill "
           "16384,32768,65536,131072]\n"
           "         [--decode-contexts 32768,131072] [--decode-tokens 32] [--chunk 16384]\n"
           "         [--weights bf16|fp8] [--kv-cache bf16|fp8] [--json PATH] [--kernel-trace "
           "PATH]\n"
           "       entropyinfer_gpu_bench sparse-attention [--lengths 32768,65536,131072]\n"
           "         [--q-heads 32] [--kv-heads 8] [--head-dim 128] [--segment 512] [--block 8]\n"
           "         [--top-blocks 256] [--threshold 4096] [--kernel auto|wgmma|wgmma_simple|mma]\n"
           "         [--json PATH]\n"
           "       entropyinfer_gpu_bench capacity [--shape llama-3.1-8b] [--methods "
           "full,entropy+snapkv]\n"
           "         [--step 65536] [--max-context 8388608] [--decode-tokens 8] [--chunk 16384]\n"
           "         [--calibration-tokens 32768] [--max-prefill-seconds 400] [--json PATH]\n"
           "       entropyinfer_gpu_bench gemm [--shape llama-3.1-8b] [--tokens 16384,1] [--prompt "
           "131072]\n"
           "         [--json PATH]\n"
           "       entropyinfer_gpu_bench serve [--shape llama-3.1-8b] [--methods "
           "full,entropy+snapkv,entropy+latent]\n"
           "         [--scenario long,streams,floor,interference,capacity] [--clients 16] "
           "[--prompt "
           "130816]\n"
           "         [--output 256] (flags of each scenario: bench/gpu/bench_serve.cpp) [--json "
           "PATH]\n";
    return argc < 2 ? 2 : 0;
  }
  try {
    if (entropyinfer::cuda::device_count() == 0) {
      std::cerr << "error: no CUDA device\n";
      return 1;
    }
    if (std::strcmp(argv[1], "attention") == 0) {
      return entropyinfer::bench::run_attention_bench(argc - 2, argv + 2);
    }
    if (std::strcmp(argv[1], "model") == 0)
      return entropyinfer::bench::run_model_bench(argc - 2, argv + 2);
    if (std::strcmp(argv[1], "sparse-attention") == 0)
      return entropyinfer::bench::run_sparse_attention_bench(argc - 2, argv + 2);
    if (std::strcmp(argv[1], "capacity") == 0)
      return entropyinfer::bench::run_capacity_bench(argc - 2, argv + 2);
    if (std::strcmp(argv[1], "gemm") == 0)
      return entropyinfer::bench::run_gemm_bench(argc - 2, argv + 2);
    if (std::strcmp(argv[1], "serve") == 0)
      return entropyinfer::bench::run_serve_bench(argc - 2, argv + 2);
    std::cerr << "error: unknown benchmark '" << argv[1] << "'\n";
    return 2;
  } catch (const std::exception& error) {
    std::cerr << "error: " << error.what() << "\n";
    return 1;
  }
}

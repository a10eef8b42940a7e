// entropyinfer_gpu_bench: GPU benchmarks. Subcommands:
//   attention  prefill kernels' TFLOP/s (causal) and split-KV decode bandwidth at several lengths
#include <cstring>
#include <exception>
#include <iostream>

#include "bench_common.h"

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0) {
    std::cerr
        << "usage: entropyinfer_gpu_bench attention [--lengths 8192,32768,131072] [--q-heads 32]\n"
           "         [--kv-heads 8] [--head-dim 128] [--kernels wgmma,mma] [--json PATH]\n";
    return argc < 2 ? 2 : 0;
  }
  try {
    if (entropyinfer::cuda::device_count() == 0) {
      std::cerr << "error: no CUDA device\n";
      return 1;
    }
    if (std::strcmp(argv[1], "attention") == 0)
      return entropyinfer::bench::run_attention_bench(argc - 2, argv + 2);
    std::cerr << "error: unknown benchmark '" << argv[1] << "'\n";
    return 2;
  } catch (const std::exception& error) {
    std::cerr << "error: " << error.what() << "\n";
    return 1;
  }
}

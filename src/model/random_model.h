// Models of a real shape with random weights: speed does not depend on the values, so benchmarks
// use these where no checkpoint of the shape can be downloaded.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/model_weights.h"

namespace entropyinfer {

// Named shapes: "llama-100m" (hidden 768, 12 layers, 12/4 heads, MLP 2048, vocab 32000, tied; about
// 100M parameters), "heads-32x8x128" (Llama-3-8B's attention layout on 2 narrow layers),
// "llama-3.1-8b" (the whole 8B shape; 32 GB as fp32 on the host, so the CUDA backend draws its
// weights on the GPU instead). Throws Error for an unknown name.
ModelConfig random_model_config(const std::string& name);

// `length` token ids in [0, vocab), reproducible from the seed: the benchmarks' prompts.
std::vector<int32_t> random_prompt(int64_t length, int vocab, uint64_t seed);

// Weights drawn uniformly from [-scale, scale] with scale 1/sqrt(fan_in); norms at 1.
ModelWeights make_random_model(const ModelConfig& config, uint64_t seed);

}  // namespace entropyinfer

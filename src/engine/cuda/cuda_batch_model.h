// The CUDA BatchModel. One CudaTransformer does all the work: its own cache holds the one sequence
// that is prefilling (resident), layer by layer between decode steps; once that sequence's cache
// is final for now (right after the prompt, compressed or not, or after the latent gap's G tokens
// and their compression) it is stored into pages of one GPU pool, and all stored sequences decode
// together in one batched step (cuda::paged_decode reads each row's own pages).
//
// So the pool never holds an uncompressed prompt of a compressing method: what a sequence needs
// from it is its cache after compression plus room for its whole answer, reserved when it is
// stored. The resident cache is the model's full-context cache, allocated once beside the pool.
#pragma once

#include <cstdint>
#include <memory>

#include "engine/batch_model.h"
#include "model/model_weights.h"

namespace entropyinfer::cuda {

// options.pool_bytes 0: the GPU memory left free after the model, less headroom for the largest
// attention policy's buffers and the batched step's.
std::unique_ptr<BatchModel> make_cuda_batch_model(const ModelWeights& weights,
                                                  const BatchModelOptions& options);
// The same over a model of `config`'s shape with random weights drawn on the GPU (benchmarks);
// fp8_weights draws the projections in bf16 and quantizes each row (CudaModelOptions::fp8_weights).
std::unique_ptr<BatchModel> make_cuda_batch_model(const ModelConfig& config, uint64_t seed,
                                                  const BatchModelOptions& options,
                                                  bool fp8_weights = false);

}  // namespace entropyinfer::cuda

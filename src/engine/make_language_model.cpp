// The one place that chooses an executor for a device. Built into entropyinfer_engine rather than
// the core library, because only a build with the CUDA backend can name the CUDA executor.
#include <memory>

#include "core/error.h"
#include "engine/batch_model.h"
#include "engine/language_model.h"
#include "engine/transformer.h"

#ifdef ENTROPYINFER_WITH_CUDA
#include "backends/cuda/cuda_common.h"
#include "engine/cuda/cuda_batch_model.h"
#include "engine/cuda/cuda_transformer.h"
#endif

namespace entropyinfer {

bool device_available(Device device) {
  if (device == Device::kCpu) return true;
#ifdef ENTROPYINFER_WITH_CUDA
  return cuda::device_count() > 0;
#else
  return false;
#endif
}

void check_device(Device device) {
  if (device == Device::kCpu) return;
#ifdef ENTROPYINFER_WITH_CUDA
  if (cuda::device_count() == 0) throw Error("--device cuda: no CUDA device is present");
#else
  throw Error(
      "--device cuda: this build has no CUDA backend (configure with -DENTROPYINFER_CUDA=ON)");
#endif
}

std::unique_ptr<LanguageModel> make_language_model(const ModelWeights& weights,
                                                   const EngineOptions& options) {
  if (options.device == Device::kCpu) {
    return std::make_unique<Transformer>(weights, options.context_length, options.attention,
                                         options.fp8_kv_cache);
  }
  check_device(options.device);
#ifdef ENTROPYINFER_WITH_CUDA
  cuda::CudaModelOptions cuda_options;
  cuda_options.context_length = options.context_length;
  cuda_options.chunk_tokens = options.chunk_tokens;
  cuda_options.decode_room = options.decode_room;
  cuda_options.upload_progress = options.upload_progress;
  cuda_options.attention = options.attention;
  cuda_options.fp8_kv_cache = options.fp8_kv_cache;
  cuda_options.prompt_attention = options.prompt_attention;
  return std::make_unique<cuda::CudaTransformer>(weights, cuda_options);
#else
  (void)weights;
  return nullptr;  // check_device has thrown
#endif
}

std::unique_ptr<BatchModel> make_batch_model(const ModelWeights& weights,
                                             const BatchModelOptions& options) {
  if (options.device == Device::kCpu) return make_cpu_batch_model(weights, options);
  check_device(options.device);
#ifdef ENTROPYINFER_WITH_CUDA
  return cuda::make_cuda_batch_model(weights, options);
#else
  (void)weights;
  return nullptr;  // check_device has thrown
#endif
}

}  // namespace entropyinfer

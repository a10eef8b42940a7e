// Quantizing a model's projections to FP8 at load time (`--weights fp8`), for checkpoints stored in
// bf16, f16 or fp32.
#pragma once

#include "model/model_weights.h"

namespace entropyinfer {

// Every layer's q/k/v/o and gate/up/down matrix not already FP8 becomes E4M3 codes with one scale
// per output channel (the row's largest magnitude maps to 448, core/fp8.h), and its products
// quantize their inputs per token at run time, as vLLM's and TensorRT-LLM's FP8 modes do. The
// embedding and the classifier stay as stored. The codes are owned by `weights`; views of the
// original matrices are dropped (the mapping stays while other views use it).
void quantize_weights_fp8(ModelWeights& weights);

}  // namespace entropyinfer

// Rotary position embedding angles for every supported variant: default, linear, dynamic
// (NTK-aware), llama3 and yarn. Computed in double so that long positions keep their precision.
#pragma once

#include <cstdint>
#include <vector>

#include "model/model_config.h"

namespace entropyinfer {

struct RopeTables {
  std::vector<float> cos;  // [tokens, rotary_dim / 2]
  std::vector<float> sin;
};

// Inverse frequencies (rotary_dim / 2 of them). `sequence_length` (positions seen so far, including
// the ones being computed) matters only for dynamic scaling, which grows its base past the trained
// context exactly as transformers does.
std::vector<double> rope_inverse_frequencies(const ModelConfig& config, int64_t sequence_length);

// Scale applied to cos and sin (yarn's attention temperature; 1 otherwise).
double rope_attention_factor(const ModelConfig& config);

// cos/sin for positions first_position .. first_position + tokens - 1.
RopeTables rope_tables(const ModelConfig& config, int64_t first_position, int64_t tokens);

}  // namespace entropyinfer

// PyramidKV's per-layer budget (formula in pyramidkv.cpp), exposed for tests and reports.
#pragma once

#include <cstdint>

#include "attention/attention_config.h"

namespace entropyinfer {

// Entries kept per head in `layer` (window included) for a cache of cache_length > K entries.
int64_t pyramid_layer_budget(const DecodeParams& params, int layer, int num_layers,
                             int64_t cache_length);

}  // namespace entropyinfer

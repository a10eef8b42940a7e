// What a decode policy decides about one layer from the shape alone, before any score is computed:
// whether it compresses at all, the window it always keeps, how many candidates compete for how
// many places. Each method's counts live here once: the CPU policies follow them, the GPU
// compressor sizes its selection by them and the memory planner bounds the compressed caches with
// them (docs/method.md section 3).
#pragma once

#include <cstdint>

#include "attention/attention_config.h"

namespace entropyinfer {

struct DecodeSelection {
  bool compresses = false;  // false: the cache is within the layer's budget, nothing is dropped
  int lists = 0;            // kept lists: KV heads, or query heads when per_query_head
  int64_t window = 0;       // the last entries every list keeps
  int64_t candidates = 0;   // entries [0, candidates) compete for the rest (cache - window)
  int64_t keep = 0;         // candidates every list keeps (AdaKV: each head's floor)
  int64_t shared = 0;       // AdaKV: candidates the layer's lists share beyond their floors
  bool positional = false;  // StreamingLLM: entries kept by position alone, nothing scored
  int64_t sinks = 0;        // StreamingLLM: the first entries kept
  int64_t recent = 0;       // StreamingLLM: the last entries kept

  // The most entries one list can hold, and all lists together.
  int64_t longest_list() const;
  int64_t entries_bound() const;
};

// `method`'s selection for layer `layer` of `num_layers` over a cache of cache_length entries per
// head (kFull never compresses).
DecodeSelection decode_selection(DecodeMethod method, const DecodeParams& params, int num_q_heads,
                                 int num_kv_heads, int layer, int num_layers, int64_t cache_length);

// The largest longest_list() and entries_bound() of any layer for caches of up to max_cache_length
// entries (both grow with the cache length): what memory plans reserve.
struct DecodeSelectionBounds {
  int64_t longest_list = 0;
  int64_t entries = 0;
};
DecodeSelectionBounds decode_selection_bounds(DecodeMethod method, const DecodeParams& params,
                                              int num_q_heads, int num_kv_heads, int num_layers,
                                              int64_t max_cache_length);

}  // namespace entropyinfer

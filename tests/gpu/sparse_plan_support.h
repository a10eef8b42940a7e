// Random block-sparse prefill plans for the GPU attention tests (bf16 and FP8 kernels alike).
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "attention/prefill_plan.h"

namespace entropyinfer::gpu_test {

enum class RowChoice {
  kMixed,       // each row: empty, every visible block, a few blocks or a random subset
  kAllVisible,  // every row selects every visible block
};

// A plan over `tokens` tokens: segments sparse at random (about 3 in 4; with kAllVisible all of
// them), blocks of each sparse row drawn without repetition from those that end before the
// segment, ascending.
inline LayerPrefillPlan random_plan(int tokens, int kv_heads, int segment_size, int block_size,
                                    RowChoice choice, uint32_t seed) {
  std::mt19937 generator(seed);
  LayerPrefillPlan plan;
  plan.dense = false;
  plan.num_tokens = tokens;
  plan.num_kv_heads = kv_heads;
  plan.segment_size = segment_size;
  plan.block_size = block_size;
  plan.num_segments = (tokens + segment_size - 1) / segment_size;
  plan.segment_sparse.resize(static_cast<size_t>(plan.num_segments));
  for (auto& sparse : plan.segment_sparse) {
    sparse = choice == RowChoice::kAllVisible || generator() % 4 != 0;
  }
  plan.row_offsets = {0};
  for (int kv_head = 0; kv_head < kv_heads; ++kv_head) {
    for (int segment = 0; segment < plan.num_segments; ++segment) {
      if (plan.segment_sparse[segment]) {
        const int visible = segment * segment_size / block_size;
        std::vector<int32_t> blocks(static_cast<size_t>(visible));
        for (int j = 0; j < visible; ++j) blocks[j] = j;
        int count = visible;
        if (choice == RowChoice::kMixed) {
          switch (generator() % 4) {
            case 0:
              count = 0;
              break;
            case 1:
              count = visible;
              break;
            case 2:
              count = std::min(visible, 1 + static_cast<int>(generator() % 3));
              break;
            default:
              count = visible == 0 ? 0 : static_cast<int>(generator() % (visible + 1));
          }
          std::shuffle(blocks.begin(), blocks.end(), generator);
          blocks.resize(static_cast<size_t>(count));
          std::sort(blocks.begin(), blocks.end());
        }
        plan.block_indices.insert(plan.block_indices.end(), blocks.begin(), blocks.end());
      }
      plan.row_offsets.push_back(static_cast<int32_t>(plan.block_indices.size()));
    }
  }
  return plan;
}

}  // namespace entropyinfer::gpu_test

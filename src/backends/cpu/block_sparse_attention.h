// Prefill attention that follows a LayerPrefillPlan: the CPU reference for block-sparse prefill.
#pragma once

#include <cstdint>

#include "attention/prefill_plan.h"
#include "backends/cpu/cpu_ops.h"

namespace entropyinfer::cpu {

// Attention of a whole prompt's queries (positions 0 .. shape.tokens - 1) under `plan`:
//   - a query of a sparse segment attends to every key of its (KV head, segment) row's selected
//     blocks (all of which end before the segment) plus its own segment's keys up to itself;
//   - a query of a dense segment, or of any segment when plan.dense, attends causally to all keys.
// Shapes and layouts as cpu::causal_attention (q and out [tokens, q_heads, head_dim], caches per KV
// head [cache_stride, head_dim]); shape.first_position and shape.window must be 0 and the plan must
// describe shape.tokens tokens and shape.kv_heads heads (Error otherwise, also for a block index
// that does not end before its segment). Work follows the keys read: only the selected blocks are
// visited. Returns the keys read as the kernel attended them, per KV head (each key a query of the
// head's group attends counts once per query token): plan.keys_read() when the plan is followed.
int64_t block_sparse_attention(const float* q, const float* key_cache, const float* value_cache,
                               const AttentionShape& shape, const LayerPrefillPlan& plan,
                               float* out);

}  // namespace entropyinfer::cpu

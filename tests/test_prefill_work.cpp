// PrefillWork against costs worked by hand for a small shape: the token-layer splits into the
// q/k/v product's share and the rest's, and attention over a query range is the dense causal
// count of (query, key) pairs at the multiply-adds a pair costs, additive over adjacent ranges.
#include <gtest/gtest.h>

#include <vector>

#include "core/error.h"
#include "engine/prefill_work.h"

namespace entropyinfer {
namespace {

ModelConfig small_shape() {
  ModelConfig config;
  config.hidden_size = 64;
  config.intermediate_size = 128;
  config.num_heads = 4;
  config.num_kv_heads = 2;
  config.head_dim = 16;
  return config;
}

TEST(PrefillWork, SharesOfATokenLayerFollowTheProducts) {
  const PrefillWork work(small_shape());
  // q/k/v: 64 x (64 + 2 x 32) = 8192; output projection 64 x 64 = 4096; MLP 3 x 64 x 128 = 24576.
  const double total = 8192 + 4096 + 24576;
  EXPECT_DOUBLE_EQ(work.qkv_per_token(), 8192 / total);
  EXPECT_DOUBLE_EQ(work.qkv_per_token() + work.mlp_per_token(), 1.0);
}

TEST(PrefillWork, AttentionCountsCausalPairsAndAddsOverRanges) {
  const PrefillWork work(small_shape());
  const double per_key = 2.0 * 64 / (8192 + 4096 + 24576);  // q.k and p.v over 4 heads of 16
  // Queries at positions 0, 1, 2 see 1 + 2 + 3 keys.
  EXPECT_DOUBLE_EQ(work.attention(0, 3), 6 * per_key);
  // Positions 10 .. 19 see 11 .. 20 keys: 155 pairs.
  EXPECT_DOUBLE_EQ(work.attention(10, 20), 155 * per_key);
  EXPECT_NEAR(work.attention(0, 1000), work.attention(0, 512) + work.attention(512, 1000), 1e-9);
  EXPECT_EQ(work.attention(7, 7), 0.0);
  EXPECT_EQ(work.attention(9, 3), 0.0);
  EXPECT_DOUBLE_EQ(work.layer(3), 3 + 6 * per_key);
}

}  // namespace
}  // namespace entropyinfer

namespace entropyinfer {
namespace {

TEST(PrefillWork, SparseAttentionCountsTheSelectedBlocksAndTheOwnSegment) {
  const PrefillWork work(small_shape());
  const double per_key = 2.0 * 64 / (8192 + 4096 + 24576);
  // Three segments of 4 tokens over 2 KV heads, blocks of 2 keys. Segment 0 dense; segment 1
  // sparse, head 0 keeps one block, head 1 none; segment 2 dense.
  const std::vector<uint8_t> sparse = {0, 1, 0};
  const std::vector<int32_t> rows = {0, 0, 1, 1, 1, 1, 1};  // [head][segment] + 1
  // Dense segment 0, all of it: 1 + 2 + 3 + 4 keys per head.
  EXPECT_DOUBLE_EQ(work.sparse_attention(sparse, rows, 2, 4, 2, 0, 4), work.attention(0, 4));
  // Segment 1, queries 5 .. 7: own keys 2 + 3 + 4 = 9 per head, and head 0's 2 selected keys for
  // each of 3 queries: (9 + 6 + 9) pairs over 2 heads, each half the query heads.
  EXPECT_DOUBLE_EQ(work.sparse_attention(sparse, rows, 2, 4, 2, 5, 8), 24 * per_key / 2);
  // Across segments the parts add up.
  EXPECT_DOUBLE_EQ(work.sparse_attention(sparse, rows, 2, 4, 2, 0, 12),
                   work.attention(0, 4) + work.sparse_attention(sparse, rows, 2, 4, 2, 4, 8) +
                       work.attention(8, 12));
  EXPECT_THROW(work.sparse_attention(sparse, rows, 2, 4, 2, 0, 13), Error);
  EXPECT_THROW(work.sparse_attention(sparse, std::vector<int32_t>{0, 1}, 2, 4, 2, 0, 4), Error);
}

}  // namespace
}  // namespace entropyinfer

// cpu::causal_attention (FlashAttention-style tiles, online softmax) against attention computed
// here in double, one query at a time: GQA groups of 1, 3 and 4 query heads; head sizes 64, 128, 40
// and 37; prefill, chunks after a cache and decode; sliding windows; long decodes and short chunks
// whose keys are split into parts; and the same bits on one thread as on all of them. Also
// cpu::block_sparse_attention, which runs the same tiles, on segments many tiles long.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <iostream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "attention/prefill_plan.h"
#include "backends/cpu/block_sparse_attention.h"
#include "backends/cpu/cpu_ops.h"
#include "core/error.h"
#include "test_support.h"

namespace entropyinfer {
namespace {

using testing::random_vector;

// Errors are measured against the largest output magnitude of the case: outputs are convex
// combinations of values, so this is the scale float rounding works at.
constexpr double kTolerance = 2e-5;

struct AttentionCase {
  int64_t group = 1;
  int64_t head_dim = 64;
  int64_t tokens = 1;
  int64_t first_position = 0;
  int64_t window = 0;
  int64_t kv_heads = 2;

  std::string describe() const {
    std::ostringstream text;
    text << "group " << group << ", head_dim " << head_dim << ", tokens " << tokens
         << ", first_position " << first_position << ", window " << window << ", kv_heads "
         << kv_heads;
    return text.str();
  }
};

struct Inputs {
  cpu::AttentionShape shape;
  std::vector<float> q, keys, values;
};

Inputs random_inputs(const AttentionCase& c, uint32_t seed) {
  Inputs in;
  cpu::AttentionShape& s = in.shape;
  s.tokens = c.tokens;
  s.q_heads = c.kv_heads * c.group;
  s.kv_heads = c.kv_heads;
  s.head_dim = c.head_dim;
  s.first_position = c.first_position;
  s.cache_stride = c.first_position + c.tokens + 3;
  s.window = c.window;
  s.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  // Queries and keys of +-2 give scores with a spread of a few units: peaked softmaxes whose
  // running max changes from block to block.
  in.q = random_vector(s.tokens * s.q_heads * s.head_dim, seed, 2.0f);
  in.keys = random_vector(s.kv_heads * s.cache_stride * s.head_dim, seed + 1, 2.0f);
  in.values = random_vector(s.kv_heads * s.cache_stride * s.head_dim, seed + 2);
  // Cache rows past the last position are not filled yet: NaN there catches any read of them.
  for (int64_t h = 0; h < s.kv_heads; ++h) {
    for (int64_t row = s.first_position + s.tokens; row < s.cache_stride; ++row) {
      for (int64_t d = 0; d < s.head_dim; ++d) {
        const int64_t i = (h * s.cache_stride + row) * s.head_dim + d;
        in.keys[i] = in.values[i] = std::numeric_limits<float>::quiet_NaN();
      }
    }
  }
  return in;
}

// Per query: scores against every key it sees, softmax, weighted sum of the values. sees(kv_head,
// t, key) says whether query token t of the KV head's group sees the key.
std::vector<double> reference_attention(
    const Inputs& in, const std::function<bool(int64_t, int64_t, int64_t)>& sees) {
  const cpu::AttentionShape& s = in.shape;
  const int64_t group = s.q_heads / s.kv_heads;
  std::vector<double> out(s.tokens * s.q_heads * s.head_dim, 0.0);
  for (int64_t t = 0; t < s.tokens; ++t) {
    for (int64_t head = 0; head < s.q_heads; ++head) {
      const float* query = in.q.data() + (t * s.q_heads + head) * s.head_dim;
      const int64_t slab = head / group * s.cache_stride;
      std::vector<int64_t> keys;
      std::vector<double> scores;
      double largest = -std::numeric_limits<double>::infinity();
      for (int64_t key = 0; key <= s.first_position + t; ++key) {
        if (!sees(head / group, t, key)) continue;
        double dot = 0.0;
        for (int64_t d = 0; d < s.head_dim; ++d)
          dot += double{query[d]} * in.keys[(slab + key) * s.head_dim + d];
        keys.push_back(key);
        scores.push_back(dot * s.scale);
        largest = std::max(largest, scores.back());
      }
      double total = 0.0;
      for (double& score : scores) total += (score = std::exp(score - largest));
      double* result = out.data() + (t * s.q_heads + head) * s.head_dim;
      for (size_t j = 0; j < scores.size(); ++j) {
        const float* value = in.values.data() + (slab + keys[j]) * s.head_dim;
        for (int64_t d = 0; d < s.head_dim; ++d) result[d] += scores[j] / total * value[d];
      }
    }
  }
  return out;
}

// Causal attention: query t sees keys up to its position, within the window if there is one.
std::vector<double> reference_attention(const Inputs& in) {
  const cpu::AttentionShape& s = in.shape;
  return reference_attention(in, [&s](int64_t, int64_t t, int64_t key) {
    return s.window <= 0 || key > s.first_position + t - s.window;
  });
}

std::vector<float> run_attention(const Inputs& in) {
  std::vector<float> out(in.q.size(), std::numeric_limits<float>::quiet_NaN());
  cpu::causal_attention(in.q.data(), in.keys.data(), in.values.data(), in.shape, out.data());
  return out;
}

// max |out - expected| / max |expected|; NaN anywhere counts as infinitely wrong.
double relative_error(const std::vector<float>& out, const std::vector<double>& expected) {
  double largest_error = 0.0, largest_value = 0.0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (!std::isfinite(out[i])) return std::numeric_limits<double>::infinity();
    largest_error = std::max(largest_error, std::fabs(out[i] - expected[i]));
    largest_value = std::max(largest_value, std::fabs(expected[i]));
  }
  return largest_error / largest_value;
}

// Runs every case, checks each against the tolerance and prints the worst error seen.
void expect_cases_match_reference(const std::vector<AttentionCase>& cases,
                                  const std::string& name) {
  double worst = 0.0;
  std::string worst_case;
  uint32_t seed = 100;
  for (const AttentionCase& c : cases) {
    const Inputs in = random_inputs(c, seed += 3);
    const double error = relative_error(run_attention(in), reference_attention(in));
    EXPECT_LE(error, kTolerance) << c.describe();
    if (error >= worst) {
      worst = error;
      worst_case = c.describe();
    }
  }
  std::cout << "[ measure ] causal_attention vs double reference, " << name << " (" << cases.size()
            << " shapes): worst max|error| / max|output| = " << worst << " (" << worst_case
            << "), tolerance " << kTolerance << "\n";
}

TEST(CausalAttention, MatchesDoubleReferenceOverGroupsHeadSizesChunksAndWindows) {
  std::vector<AttentionCase> cases;
  for (int64_t group : {1, 3, 4}) {
    for (int64_t head_dim : {64, 128, 40, 37}) {
      for (int64_t tokens : {1, 7, 300}) {
        for (int64_t first_position : {0, 517}) {
          for (int64_t window : {0, 100}) {
            cases.push_back({group, head_dim, tokens, first_position, window});
          }
        }
      }
    }
  }
  expect_cases_match_reference(cases, "groups x head sizes x tokens x cache x window");
}

TEST(CausalAttention, LongDecodesAndShortChunksSplitTheirKeysAndStillMatch) {
  // Few tiles over thousands of keys: the keys are attended in parts and the parts combined.
  const std::vector<AttentionCase> cases = {
      {3, 64, 1, 5000, 0},    {4, 128, 1, 5000, 3000}, {3, 64, 7, 5000, 0},
      {1, 40, 7, 5000, 1500}, {3, 64, 7, 5000, 100},   {8, 64, 1, 4000, 0, 1},
      {1, 37, 2, 3000, 0, 1},
  };
  expect_cases_match_reference(cases, "split keys");
}

TEST(CausalAttention, OneThreadGivesTheSameBitsAsAll) {
  const int threads = omp_get_max_threads();
  for (const AttentionCase& c :
       {AttentionCase{3, 64, 300, 517, 0}, AttentionCase{4, 40, 1, 5000, 0},
        AttentionCase{1, 128, 7, 600, 100}}) {
    const Inputs in = random_inputs(c, 7);
    omp_set_num_threads(1);
    const std::vector<float> one = run_attention(in);
    omp_set_num_threads(threads);
    const std::vector<float> all = run_attention(in);
    EXPECT_EQ(0, std::memcmp(one.data(), all.data(), one.size() * sizeof(float)))
        << c.describe() << ", " << threads << " threads";
  }
}

TEST(BlockSparseAttentionTiles, SegmentsOfManyTilesMatchDoubleReference) {
  // Segments of 256 tokens hold several tiles (the last segment a short one, ending inside a
  // tile); sparse segments read random blocks before them, dense ones everything.
  double worst = 0.0;
  for (const AttentionCase& c :
       {AttentionCase{3, 64, 700}, AttentionCase{4, 40, 600}, AttentionCase{1, 37, 333, 0, 0, 1}}) {
    const Inputs in = random_inputs(c, 41);
    LayerPrefillPlan plan;
    plan.dense = false;
    plan.num_tokens = c.tokens;
    plan.num_kv_heads = static_cast<int>(c.kv_heads);
    plan.segment_size = 256;
    plan.block_size = 32;
    plan.num_segments = static_cast<int>((c.tokens + 255) / 256);
    std::mt19937 generator(5);
    for (int segment = 0; segment < plan.num_segments; ++segment)
      plan.segment_sparse.push_back(segment % 2 == 1 ? 1 : 0);
    plan.row_offsets.push_back(0);
    for (int h = 0; h < plan.num_kv_heads; ++h) {
      for (int segment = 0; segment < plan.num_segments; ++segment) {
        if (plan.segment_sparse[segment]) {
          for (int32_t block = 0; block < segment * 256 / 32; ++block) {
            if (generator() % 3 == 0) plan.block_indices.push_back(block);
          }
        }
        plan.row_offsets.push_back(static_cast<int32_t>(plan.block_indices.size()));
      }
    }
    const auto sees = [&plan](int64_t kv_head, int64_t t, int64_t key) {
      const int64_t segment = t / plan.segment_size;
      if (!plan.segment_sparse[segment] || key >= segment * plan.segment_size) return true;
      const int64_t row = kv_head * plan.num_segments + segment;
      for (int32_t i = plan.row_offsets[row]; i < plan.row_offsets[row + 1]; ++i) {
        if (key / plan.block_size == plan.block_indices[i]) return true;
      }
      return false;
    };
    std::vector<float> out(in.q.size(), std::numeric_limits<float>::quiet_NaN());
    cpu::block_sparse_attention(in.q.data(), in.keys.data(), in.values.data(), in.shape, plan,
                                out.data());
    const double error = relative_error(out, reference_attention(in, sees));
    EXPECT_LE(error, kTolerance) << c.describe();
    worst = std::max(worst, error);
  }
  std::cout
      << "[ measure ] block_sparse_attention vs double reference (3 shapes, segments of 256): "
         "worst max|error| / max|output| = "
      << worst << ", tolerance " << kTolerance << "\n";
}

TEST(CausalAttention, RejectsHeadsThatDoNotFormGroups) {
  cpu::AttentionShape shape;
  shape.tokens = 1;
  shape.q_heads = 5;
  shape.kv_heads = 2;
  shape.head_dim = 8;
  shape.cache_stride = 1;
  std::vector<float> data(5 * 8);
  EXPECT_THROW(cpu::causal_attention(data.data(), data.data(), data.data(), shape, data.data()),
               Error);
  shape.kv_heads = 0;
  EXPECT_THROW(cpu::causal_attention(data.data(), data.data(), data.data(), shape, data.data()),
               Error);
}

}  // namespace
}  // namespace entropyinfer

// AdaKV's budget sharing across the heads of a layer (see adakv.cpp), exposed for tests.
#pragma once

#include <cstdint>
#include <vector>

namespace entropyinfer {

// scores: [heads][candidates]. Each head first takes its own `floor_per_head` highest candidates;
// the remaining heads * candidate_budget - heads * floor_per_head slots go to the highest remaining
// scores over all heads together (equal scores: lower head, then lower index first). Returns, per
// head, its chosen candidate indices ascending.
std::vector<std::vector<int32_t>> adaptive_head_selection(const float* scores, int heads,
                                                          int64_t candidates,
                                                          int64_t candidate_budget,
                                                          int64_t floor_per_head);

}  // namespace entropyinfer

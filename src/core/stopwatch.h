// Wall-clock seconds since a steady_clock point: what the commands and benchmarks print and record.
#pragma once

#include <chrono>

namespace entropyinfer {

inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace entropyinfer

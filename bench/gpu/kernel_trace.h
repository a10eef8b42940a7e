// Where a decode step's time goes, kernel by kernel, as it runs: the GPU start and end of every
// kernel (those a CUDA graph launches included) from CUPTI's activity records. Nsight Compute
// times kernels one at a time with the others stopped, which hides what programmatic dependent
// launch overlaps; these records keep the overlap. CUPTI is loaded when a trace is first asked
// for, so the benchmark runs without it otherwise.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

namespace entropyinfer::bench {

struct KernelRecord {
  std::string name;  // demangled, without namespaces and parameters
  uint64_t start_ns = 0, end_ns = 0;
};

// Loads CUPTI and enables kernel records (a runtime_error naming what is missing otherwise). Call
// before the work to be traced is captured into graphs, so that their kernels are recorded too.
void enable_kernel_trace();

// Runs `work` (which must finish its GPU work before returning) and returns the kernels that ran
// meanwhile, by start time.
std::vector<KernelRecord> trace_kernels(const std::function<void()>& work);

// Per kernel name over `steps` traced runs: launches, mean duration, and the time it added to the
// run: a kernel's end past the latest end of the kernels that started before it (the added times
// of a run sum to its span, first start to last end). Writes a table, largest added time first.
nlohmann::json summarize_kernel_traces(const std::vector<std::vector<KernelRecord>>& steps,
                                       std::ostream& table);

}  // namespace entropyinfer::bench

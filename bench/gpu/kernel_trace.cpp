#include "kernel_trace.h"

#include <cupti_activity.h>
#include <cxxabi.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <iomanip>
#include <map>
#include <mutex>
#include <stdexcept>

namespace entropyinfer::bench {
namespace {

// The CUPTI entry points the trace uses, from the library loaded at run time.
struct Cupti {
  decltype(&cuptiActivityRegisterCallbacks) register_callbacks = nullptr;
  decltype(&cuptiActivityEnable) enable = nullptr;
  decltype(&cuptiActivityFlushAll) flush_all = nullptr;
  decltype(&cuptiActivityGetNextRecord) next_record = nullptr;
};

Cupti& cupti() {
  static Cupti api = [] {
    void* library = nullptr;
    for (const char* path : {"libcupti.so", "libcupti.so.13", "/usr/local/cuda/lib64/libcupti.so",
                             "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so"}) {
      library = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
      if (library != nullptr) break;
    }
    if (library == nullptr) throw std::runtime_error("kernel trace: libcupti.so was not found");
    Cupti loaded;
    const auto find = [&](auto& function, const char* symbol) {
      function =
          reinterpret_cast<std::remove_reference_t<decltype(function)>>(dlsym(library, symbol));
      if (function == nullptr) {
        throw std::runtime_error(std::string("kernel trace: CUPTI lacks ") + symbol);
      }
    };
    find(loaded.register_callbacks, "cuptiActivityRegisterCallbacks");
    find(loaded.enable, "cuptiActivityEnable");
    find(loaded.flush_all, "cuptiActivityFlushAll");
    find(loaded.next_record, "cuptiActivityGetNextRecord");
    return loaded;
  }();
  return api;
}

void check(CUptiResult result, const char* what) {
  if (result != CUPTI_SUCCESS) {
    throw std::runtime_error(std::string("kernel trace: ") + what + " failed (CUPTI error " +
                             std::to_string(static_cast<int>(result)) + ")");
  }
}

std::mutex records_mutex;
std::vector<KernelRecord> records;

// "ns::(anonymous namespace)::kernel<T, 1>(Params)" -> "kernel<T, 1>".
std::string short_name(const char* mangled) {
  int status = 0;
  char* demangled = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string name = status == 0 && demangled != nullptr ? demangled : mangled;
  std::free(demangled);
  int depth = 0;
  size_t last_scope = 0;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    if (c == '<') ++depth;
    if (c == '>') --depth;
    if (depth == 0 && c == '(' && name.compare(i, 21, "(anonymous namespace)") != 0) {
      name.resize(i);
      break;
    }
    if (depth == 0 && c == ':' && i + 1 < name.size() && name[i + 1] == ':') last_scope = i + 2;
  }
  name = name.substr(last_scope);
  // Drop the namespaces inside template arguments too.
  for (const std::string scope : {"entropyinfer::cuda::", "(anonymous namespace)::"}) {
    for (size_t at = name.find(scope); at != std::string::npos; at = name.find(scope))
      name.erase(at, scope.size());
  }
  return name;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *size = size_t{8} << 20;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, *size));
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  std::lock_guard lock(records_mutex);
  while (cupti().next_record(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    const auto* kernel = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    records.push_back({short_name(kernel->name), kernel->start, kernel->end});
  }
  std::free(buffer);
}

}  // namespace

void enable_kernel_trace() {
  static const bool enabled = [] {
    check(cupti().register_callbacks(buffer_requested, buffer_completed),
          "cuptiActivityRegisterCallbacks");
    check(cupti().enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable");
    return true;
  }();
  (void)enabled;
}

std::vector<KernelRecord> trace_kernels(const std::function<void()>& work) {
  enable_kernel_trace();
  check(cupti().flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
  {
    std::lock_guard lock(records_mutex);
    records.clear();
  }
  work();
  check(cupti().flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
  std::vector<KernelRecord> traced;
  {
    std::lock_guard lock(records_mutex);
    traced.swap(records);
  }
  std::sort(traced.begin(), traced.end(),
            [](const KernelRecord& a, const KernelRecord& b) { return a.start_ns < b.start_ns; });
  return traced;
}

nlohmann::json summarize_kernel_traces(const std::vector<std::vector<KernelRecord>>& steps,
                                       std::ostream& table) {
  struct Totals {
    int64_t launches = 0;
    double duration_ns = 0, added_ns = 0;
  };
  std::map<std::string, Totals> by_name;
  double span_ns = 0;
  for (const auto& step : steps) {
    if (step.empty()) continue;
    uint64_t frontier = step.front().start_ns;
    for (const KernelRecord& kernel : step) {
      Totals& totals = by_name[kernel.name];
      totals.launches += 1;
      totals.duration_ns += static_cast<double>(kernel.end_ns - kernel.start_ns);
      if (kernel.end_ns > frontier) {
        totals.added_ns += static_cast<double>(kernel.end_ns - std::max(frontier, kernel.start_ns));
        // Time between kernels (nothing running) is added to the kernel that ends the gap.
        if (kernel.start_ns > frontier)
          totals.added_ns += static_cast<double>(kernel.start_ns - frontier);
        frontier = kernel.end_ns;
      }
    }
    span_ns += static_cast<double>(frontier - step.front().start_ns);
  }
  const double runs = std::max<double>(1, static_cast<double>(steps.size()));
  std::vector<std::pair<std::string, Totals>> sorted(by_name.begin(), by_name.end());
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return a.second.added_ns > b.second.added_ns; });
  nlohmann::json summary;
  summary["runs"] = steps.size();
  summary["span_us_per_run"] = span_ns / runs / 1e3;
  table << "  span " << std::fixed << std::setprecision(1) << span_ns / runs / 1e3
        << " us per run; per kernel: launches per run, mean us, added us per run (share)\n";
  for (const auto& [name, totals] : sorted) {
    const double launches = static_cast<double>(totals.launches) / runs;
    const double mean_us = totals.duration_ns / static_cast<double>(totals.launches) / 1e3;
    const double added_us = totals.added_ns / runs / 1e3;
    summary["kernels"].push_back({{"name", name},
                                  {"launches_per_run", launches},
                                  {"mean_us", mean_us},
                                  {"added_us_per_run", added_us}});
    table << "  " << std::setw(8) << std::setprecision(1) << launches << std::setw(9)
          << std::setprecision(2) << mean_us << std::setw(10) << std::setprecision(1) << added_us
          << " (" << std::setw(4) << std::setprecision(1) << 100.0 * added_us * 1e3 * runs / span_ns
          << "%)  " << name << "\n";
  }
  return summary;
}

}  // namespace entropyinfer::bench

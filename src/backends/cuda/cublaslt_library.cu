#include <cuda_runtime.h>
#include <dlfcn.h>

#include <string>

#include "backends/cuda/cublaslt_library.h"
#include "core/error.h"

namespace entropyinfer::cuda::lt {
namespace {

void* open_library() {
  const std::string name = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
  if (void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) return handle;
  const char* reason = dlerror();
  const std::string first_error = reason ? reason : "not found";
  // The toolkit keeps it beside the CUDA runtime, which the program was linked with.
  Dl_info runtime{};
  if (dladdr(reinterpret_cast<const void*>(&cudaGetDeviceCount), &runtime) != 0 &&
      runtime.dli_fname != nullptr) {
    const std::string runtime_path = runtime.dli_fname;
    const std::string path = runtime_path.substr(0, runtime_path.find_last_of('/') + 1) + name;
    if (void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) return handle;
  }
  throw Error("cuBLASLt could not be opened (" + first_error +
              "): the GPU products need the CUDA toolkit's " + name);
}

template <typename Function>
void bind(void* handle, const char* symbol, Function& function) {
  void* address = dlsym(handle, symbol);
  if (address == nullptr) throw Error(std::string("cuBLASLt has no ") + symbol);
  function = reinterpret_cast<Function>(address);
}

}  // namespace

const Api& api() {
  // A failed first call throws and leaves this unset, so a later call tries again.
  static const Api loaded = [] {
    void* handle = open_library();
    Api functions;
#define ENTROPYINFER_CUBLASLT_BIND(name) bind(handle, "cublasLt" #name, functions.name);
    ENTROPYINFER_CUBLASLT_FUNCTIONS(ENTROPYINFER_CUBLASLT_BIND)
#undef ENTROPYINFER_CUBLASLT_BIND
    return functions;
  }();
  return loaded;
}

}  // namespace entropyinfer::cuda::lt

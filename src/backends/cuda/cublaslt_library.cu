#include <cuda_runtime.h>
#include <dlfcn.h>

#include <string>

#include "backends/cuda/cublaslt_library.h"
#include "core/error.h"

namespace entropyinfer::cuda::lt {
namespace {

struct Library {
  decltype(&::cublasLtCreate) create = nullptr;
  decltype(&::cublasLtDestroy) destroy = nullptr;
  decltype(&::cublasLtGetStatusString) status_string = nullptr;
  decltype(&::cublasLtMatmulDescCreate) desc_create = nullptr;
  decltype(&::cublasLtMatmulDescDestroy) desc_destroy = nullptr;
  decltype(&::cublasLtMatmulDescSetAttribute) desc_set = nullptr;
  decltype(&::cublasLtMatrixLayoutCreate) layout_create = nullptr;
  decltype(&::cublasLtMatrixLayoutDestroy) layout_destroy = nullptr;
  decltype(&::cublasLtMatmulPreferenceCreate) preference_create = nullptr;
  decltype(&::cublasLtMatmulPreferenceDestroy) preference_destroy = nullptr;
  decltype(&::cublasLtMatmulPreferenceSetAttribute) preference_set = nullptr;
  decltype(&::cublasLtMatmulAlgoGetHeuristic) heuristic = nullptr;
  decltype(&::cublasLtMatmul) matmul = nullptr;
};

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

const Library& library() {
  // A failed first call throws and leaves this unset, so a later call tries again.
  static const Library loaded = [] {
    void* handle = open_library();
    Library functions;
    bind(handle, "cublasLtCreate", functions.create);
    bind(handle, "cublasLtDestroy", functions.destroy);
    bind(handle, "cublasLtGetStatusString", functions.status_string);
    bind(handle, "cublasLtMatmulDescCreate", functions.desc_create);
    bind(handle, "cublasLtMatmulDescDestroy", functions.desc_destroy);
    bind(handle, "cublasLtMatmulDescSetAttribute", functions.desc_set);
    bind(handle, "cublasLtMatrixLayoutCreate", functions.layout_create);
    bind(handle, "cublasLtMatrixLayoutDestroy", functions.layout_destroy);
    bind(handle, "cublasLtMatmulPreferenceCreate", functions.preference_create);
    bind(handle, "cublasLtMatmulPreferenceDestroy", functions.preference_destroy);
    bind(handle, "cublasLtMatmulPreferenceSetAttribute", functions.preference_set);
    bind(handle, "cublasLtMatmulAlgoGetHeuristic", functions.heuristic);
    bind(handle, "cublasLtMatmul", functions.matmul);
    return functions;
  }();
  return loaded;
}

}  // namespace

void load() { library(); }

cublasStatus_t Create(cublasLtHandle_t* handle) { return library().create(handle); }
cublasStatus_t Destroy(cublasLtHandle_t handle) { return library().destroy(handle); }
const char* GetStatusString(cublasStatus_t status) { return library().status_string(status); }
cublasStatus_t MatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                cudaDataType_t scale) {
  return library().desc_create(desc, compute, scale);
}
cublasStatus_t MatmulDescDestroy(cublasLtMatmulDesc_t desc) { return library().desc_destroy(desc); }
cublasStatus_t MatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                      cublasLtMatmulDescAttributes_t attribute, const void* value,
                                      size_t bytes) {
  return library().desc_set(desc, attribute, value, bytes);
}
cublasStatus_t MatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type, uint64_t rows,
                                  uint64_t columns, int64_t leading) {
  return library().layout_create(layout, type, rows, columns, leading);
}
cublasStatus_t MatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  return library().layout_destroy(layout);
}
cublasStatus_t MatmulPreferenceCreate(cublasLtMatmulPreference_t* preference) {
  return library().preference_create(preference);
}
cublasStatus_t MatmulPreferenceDestroy(cublasLtMatmulPreference_t preference) {
  return library().preference_destroy(preference);
}
cublasStatus_t MatmulPreferenceSetAttribute(cublasLtMatmulPreference_t preference,
                                            cublasLtMatmulPreferenceAttributes_t attribute,
                                            const void* value, size_t bytes) {
  return library().preference_set(preference, attribute, value, bytes);
}
cublasStatus_t MatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t operation,
                                      cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                      cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                      cublasLtMatmulPreference_t preference, int requested,
                                      cublasLtMatmulHeuristicResult_t results[], int* returned) {
  return library().heuristic(handle, operation, a, b, c, d, preference, requested, results,
                             returned);
}
cublasStatus_t Matmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t operation, const void* alpha,
                      const void* a, cublasLtMatrixLayout_t a_layout, const void* b,
                      cublasLtMatrixLayout_t b_layout, const void* beta, const void* c,
                      cublasLtMatrixLayout_t c_layout, void* d, cublasLtMatrixLayout_t d_layout,
                      const cublasLtMatmulAlgo_t* algorithm, void* workspace,
                      size_t workspace_bytes, cudaStream_t stream) {
  return library().matmul(handle, operation, alpha, a, a_layout, b, b_layout, beta, c, c_layout, d,
                          d_layout, algorithm, workspace, workspace_bytes, stream);
}

}  // namespace entropyinfer::cuda::lt

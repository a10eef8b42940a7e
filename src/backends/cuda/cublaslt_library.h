// cuBLASLt, opened when the first product needs it rather than when the program starts. Linking
// the library runs its static initialisers in every process that links it, 0.37 s of CPU before
// main() on a machine without a GPU: every CPU-only run of the tool and every test process paid
// them. lt::api().Matmul(...) calls the library's cublasLtMatmul, and so on for each function the
// engine uses.
#pragma once

#include <cublasLt.h>

namespace entropyinfer::cuda::lt {

// The functions the engine calls, each named without the cublasLt prefix.
#define ENTROPYINFER_CUBLASLT_FUNCTIONS(X) \
  X(Create)                                \
  X(Destroy)                               \
  X(GetStatusString)                       \
  X(MatmulDescCreate)                      \
  X(MatmulDescDestroy)                     \
  X(MatmulDescSetAttribute)                \
  X(MatrixLayoutCreate)                    \
  X(MatrixLayoutDestroy)                   \
  X(MatmulPreferenceCreate)                \
  X(MatmulPreferenceDestroy)               \
  X(MatmulPreferenceSetAttribute)          \
  X(MatmulAlgoGetHeuristic)                \
  X(Matmul)

struct Api {
#define ENTROPYINFER_CUBLASLT_POINTER(name) decltype(&::cublasLt##name) name = nullptr;
  ENTROPYINFER_CUBLASLT_FUNCTIONS(ENTROPYINFER_CUBLASLT_POINTER)
#undef ENTROPYINFER_CUBLASLT_POINTER
};

// Opens the library (the one this build's headers belong to, libcublasLt.so.<major>: first where
// the dynamic linker looks, then beside the CUDA runtime the program runs with) on the first
// call; throws Error naming the library when it cannot be opened or lacks a function.
const Api& api();

}  // namespace entropyinfer::cuda::lt

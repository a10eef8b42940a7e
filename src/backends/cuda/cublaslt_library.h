// cuBLASLt, opened when the first product needs it rather than when the program starts. Linking
// the library runs its static initialisers in every process that links it, 0.37 s of CPU before
// main() on a machine without a GPU: every CPU-only run of the tool and every test process paid
// them. The functions here have cuBLASLt's signatures and call the library's own.
#pragma once

#include <cublasLt.h>

namespace entropyinfer::cuda::lt {

// Opens the library (the one this build's headers belong to, libcublasLt.so.<major>: first where
// the dynamic linker looks, then beside the CUDA runtime the program runs with) on the first
// call; throws Error naming the library when it cannot be opened.
void load();

cublasStatus_t Create(cublasLtHandle_t* handle);
cublasStatus_t Destroy(cublasLtHandle_t handle);
const char* GetStatusString(cublasStatus_t status);
cublasStatus_t MatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                cudaDataType_t scale);
cublasStatus_t MatmulDescDestroy(cublasLtMatmulDesc_t desc);
cublasStatus_t MatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                      cublasLtMatmulDescAttributes_t attribute, const void* value,
                                      size_t bytes);
cublasStatus_t MatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type, uint64_t rows,
                                  uint64_t columns, int64_t leading);
cublasStatus_t MatrixLayoutDestroy(cublasLtMatrixLayout_t layout);
cublasStatus_t MatmulPreferenceCreate(cublasLtMatmulPreference_t* preference);
cublasStatus_t MatmulPreferenceDestroy(cublasLtMatmulPreference_t preference);
cublasStatus_t MatmulPreferenceSetAttribute(cublasLtMatmulPreference_t preference,
                                            cublasLtMatmulPreferenceAttributes_t attribute,
                                            const void* value, size_t bytes);
cublasStatus_t MatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t operation,
                                      cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                      cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                      cublasLtMatmulPreference_t preference, int requested,
                                      cublasLtMatmulHeuristicResult_t results[], int* returned);
cublasStatus_t Matmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t operation, const void* alpha,
                      const void* a, cublasLtMatrixLayout_t a_layout, const void* b,
                      cublasLtMatrixLayout_t b_layout, const void* beta, const void* c,
                      cublasLtMatrixLayout_t c_layout, void* d, cublasLtMatrixLayout_t d_layout,
                      const cublasLtMatmulAlgo_t* algorithm, void* workspace,
                      size_t workspace_bytes, cudaStream_t stream);

}  // namespace entropyinfer::cuda::lt

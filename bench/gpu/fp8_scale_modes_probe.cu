// cuBLASLt's FP8 matmul at decode-batch sizes (16-64 rows), Llama-3.1-8B layer shapes, in several
// operand orders and scale modes, each with every algorithm the heuristic lists, over 8 layers'
// distinct weights (so that each product reads its weights from memory, not from L2). Standalone,
// outside the CMake build (it links cuBLASLt directly); on the GPU machine:
//   nvcc -O2 -std=c++17 -arch=sm_90a -o /tmp/probe bench/gpu/fp8_scale_modes_probe.cu -lcublasLt
//   /tmp/probe 16 32 64
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#define CK(x)                                                                  \
  do {                                                                         \
    cudaError_t e = (x);                                                       \
    if (e != cudaSuccess) {                                                    \
      std::printf("CUDA %s at %d: %s\n", #x, __LINE__, cudaGetErrorString(e)); \
      std::exit(1);                                                            \
    }                                                                          \
  } while (0)
#define LK(x)                                                                    \
  do {                                                                           \
    cublasStatus_t s = (x);                                                      \
    if (s != CUBLAS_STATUS_SUCCESS) {                                            \
      std::printf("cuBLASLt %s at %d: %d\n", #x, __LINE__, static_cast<int>(s)); \
      std::exit(1);                                                              \
    }                                                                            \
  } while (0)

struct Product {
  const char* name;
  int in, out;
  bool accumulate;  // fp32 y += ; else bf16 y =
};

__global__ void fill_codes(uint8_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    // E4M3 codes of moderate magnitude, both signs: exponent field 4..9.
    const uint8_t sign = (h & 1) << 7;
    const uint8_t exponent = 4 + ((h >> 1) % 6);
    const uint8_t mantissa = (h >> 5) & 7;
    p[i] = sign | (exponent << 3) | mantissa;
  }
}

__global__ void fill_scales(float* p, int n, float base) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    p[i] = base * (1.0f + 0.001f * (i % 97));
}

// raw (out x tokens col-major, or tokens x out col-major when transposed) -> y
template <bool kTransposed, bool kAccumulate>
__global__ void scale_out(const float* raw, const float* ws, const float* xs, int tokens, int out,
                          void* y) {
  const int o = blockIdx.x * blockDim.x + threadIdx.x;
  const int t = blockIdx.y;
  if (o >= out) return;
  const float v = (kTransposed ? raw[t + static_cast<size_t>(o) * tokens]
                               : raw[o + static_cast<size_t>(t) * out]) *
                  ws[o] * xs[t];
  if (kAccumulate) {
    static_cast<float*>(y)[static_cast<size_t>(t) * out + o] += v;
  } else {
    static_cast<__nv_bfloat16*>(y)[static_cast<size_t>(t) * out + o] = __float2bfloat16(v);
  }
}

enum class Order { kNormal, kSwapped };
enum class Scales { kOuterVector, kScalarThenKernel };

struct Config {
  Order order;
  Scales scales;
  bool row_major_out;  // swapped only: D laid out row-major (tokens x out, ld out)
  const char* name;
};

struct Plan {
  cublasLtMatmulDesc_t desc{};
  cublasLtMatrixLayout_t a{}, b{}, d{};
  std::vector<cublasLtMatmulHeuristicResult_t> algos;
  bool ok = false;
};

static cublasLtHandle_t handle;
static void* workspace;
static const size_t kWorkspace = 64u << 20;

Plan make_plan(const Config& c, int tokens, const Product& p, const float* ws, const float* xs,
               int want) {
  Plan plan;
  LK(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
  LK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)));
  LK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof(n)));
  const int8_t fast = 1;
  LK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast,
                                    sizeof(fast)));
  const bool swapped = c.order == Order::kSwapped;
  const int m = swapped ? tokens : p.out, ncols = swapped ? p.out : tokens;
  if (c.scales == Scales::kOuterVector) {
    const int32_t ov = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    LK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ov,
                                      sizeof(ov)));
    LK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &ov,
                                      sizeof(ov)));
    const float* a_scale = swapped ? xs : ws;
    const float* b_scale = swapped ? ws : xs;
    LK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale,
                                      sizeof(a_scale)));
    LK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale,
                                      sizeof(b_scale)));
  }
  LK(cublasLtMatrixLayoutCreate(&plan.a, CUDA_R_8F_E4M3, p.in, m, p.in));
  LK(cublasLtMatrixLayoutCreate(&plan.b, CUDA_R_8F_E4M3, p.in, ncols, p.in));
  // Outer-vector: the engine's outputs (bf16 or fp32 accumulate). Scalar: fp32 raw scratch.
  const cudaDataType_t dtype =
      (c.scales == Scales::kOuterVector && !p.accumulate) ? CUDA_R_16BF : CUDA_R_32F;
  if (swapped && c.row_major_out) {
    LK(cublasLtMatrixLayoutCreate(&plan.d, dtype, m, ncols, ncols));
    const cublasLtOrder_t row = CUBLASLT_ORDER_ROW;
    LK(cublasLtMatrixLayoutSetAttribute(plan.d, CUBLASLT_MATRIX_LAYOUT_ORDER, &row, sizeof(row)));
  } else {
    LK(cublasLtMatrixLayoutCreate(&plan.d, dtype, m, ncols, m));
  }
  cublasLtMatmulPreference_t pref;
  LK(cublasLtMatmulPreferenceCreate(&pref));
  LK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                          &kWorkspace, sizeof(kWorkspace)));
  plan.algos.resize(want);
  int found = 0;
  const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(
      handle, plan.desc, plan.a, plan.b, plan.d, plan.d, pref, want, plan.algos.data(), &found);
  cublasLtMatmulPreferenceDestroy(pref);
  plan.algos.resize(s == CUBLAS_STATUS_SUCCESS ? found : 0);
  plan.ok = !plan.algos.empty();
  return plan;
}

// One product in configuration c: the matmul (into y with its epilogue scales, or unscaled into
// raw), then, for the unscaled forms, the scaling kernel into y. False when cuBLASLt refuses.
bool run_product(const Config& c, const Plan& plan, const cublasLtMatmulAlgo_t& algo,
                 const Product& p, int tokens, const uint8_t* w, const float* ws, const uint8_t* x,
                 const float* xs, float* raw, float* y, cudaStream_t stream) {
  const bool swapped = c.order == Order::kSwapped;
  const bool scaled_in_epilogue = c.scales == Scales::kOuterVector;
  const float alpha = 1.0f, beta = scaled_in_epilogue && p.accumulate ? 1.0f : 0.0f;
  const void* a = swapped ? static_cast<const void*>(x) : w;
  const void* b = swapped ? static_cast<const void*>(w) : x;
  void* d = scaled_in_epilogue ? static_cast<void*>(y) : static_cast<void*>(raw);
  if (cublasLtMatmul(handle, plan.desc, &alpha, a, plan.a, b, plan.b, &beta, d, plan.d, d, plan.d,
                     &algo, workspace, kWorkspace, stream) != CUBLAS_STATUS_SUCCESS) {
    return false;
  }
  if (scaled_in_epilogue) return true;
  const dim3 grid((p.out + 255) / 256, tokens);
  auto* scale = swapped ? (p.accumulate ? scale_out<true, true> : scale_out<true, false>)
                        : (p.accumulate ? scale_out<false, true> : scale_out<false, false>);
  scale<<<grid, 256, 0, stream>>>(raw, ws, xs, tokens, p.out, y);
  return true;
}

struct Layer {
  uint8_t* w[4];
  float* ws[4];
};

int main(int argc, char** argv) {
  const int layers = 8;
  const Product products[4] = {{"qkv", 4096, 6144, false},
                               {"o", 4096, 4096, true},
                               {"gate_up", 4096, 28672, false},
                               {"down", 14336, 4096, true}};
  std::vector<int> rows = {16, 32, 64};
  if (argc > 1) {
    rows.clear();
    for (int i = 1; i < argc; ++i) rows.push_back(std::atoi(argv[i]));
  }
  LK(cublasLtCreate(&handle));
  int version = static_cast<int>(cublasLtGetVersion());
  std::printf("cuBLASLt %d\n", version);
  CK(cudaMalloc(&workspace, kWorkspace));
  cudaStream_t stream;
  CK(cudaStreamCreate(&stream));
  std::vector<Layer> weights(layers);
  size_t layer_bytes = 0;
  for (int l = 0; l < layers; ++l)
    for (int i = 0; i < 4; ++i) {
      const size_t n = static_cast<size_t>(products[i].in) * products[i].out;
      if (l == 0) layer_bytes += n + 4 * products[i].out;
      CK(cudaMalloc(&weights[l].w[i], n));
      CK(cudaMalloc(&weights[l].ws[i], 4 * products[i].out));
      fill_codes<<<1024, 256, 0, stream>>>(weights[l].w[i], n, 77 * l + i);
      fill_scales<<<64, 256, 0, stream>>>(weights[l].ws[i], products[i].out, 1e-3f);
    }
  const int max_rows = *std::max_element(rows.begin(), rows.end());
  uint8_t* x;
  float *xs, *raw, *y;
  CK(cudaMalloc(&x, static_cast<size_t>(max_rows) * 14336));
  CK(cudaMalloc(&xs, 4 * max_rows));
  CK(cudaMalloc(&raw, 4ull * max_rows * 28672));
  CK(cudaMalloc(&y, 4ull * max_rows * 28672));
  CK(cudaMemset(y, 0, 4ull * max_rows * 28672));
  fill_codes<<<256, 256, 0, stream>>>(x, static_cast<size_t>(max_rows) * 14336, 999);
  fill_scales<<<1, 256, 0, stream>>>(xs, max_rows, 1e-2f);

  // Copy bandwidth: 2 GB read + written.
  void *src, *dst;
  const size_t copy_bytes = 1ull << 30;
  CK(cudaMalloc(&src, copy_bytes));
  CK(cudaMalloc(&dst, copy_bytes));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  float best_copy = 1e9;
  for (int r = 0; r < 10; ++r) {
    CK(cudaEventRecord(e0, stream));
    CK(cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice, stream));
    CK(cudaEventRecord(e1, stream));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    best_copy = std::min(best_copy, ms);
  }
  const double copy_gbps = 2.0 * copy_bytes / (best_copy * 1e-3) / 1e9;
  std::printf("copy bandwidth %.0f GB/s (read + write); FP8 layer %.1f MB, floor %.1f us\n",
              copy_gbps, layer_bytes / 1e6, layer_bytes / copy_gbps / 1e3);
  CK(cudaFree(src));
  CK(cudaFree(dst));

  const Config configs[] = {
      {Order::kNormal, Scales::kOuterVector, false, "normal outer-vector"},
      {Order::kSwapped, Scales::kOuterVector, true, "swapped outer-vector row-major D"},
      {Order::kSwapped, Scales::kOuterVector, false, "swapped outer-vector col D (transposed y)"},
      {Order::kNormal, Scales::kScalarThenKernel, false, "normal scalar + scale kernel"},
      {Order::kSwapped, Scales::kScalarThenKernel, false, "swapped scalar + scale kernel"},
  };
  const int want = 24;
  for (const int tokens : rows) {
    std::printf("\n== %d rows\n", tokens);
    for (const Config& c : configs) {
      // Per product: time each algorithm over the 8 layers' weights (cold L2 for each product).
      double layer_best = 0, layer_first = 0;
      bool all_ok = true;
      std::string detail;
      for (int i = 0; i < 4; ++i) {
        const Product& p = products[i];
        std::vector<Plan> plans(layers);
        for (int l = 0; l < layers; ++l)
          plans[l] = make_plan(c, tokens, p, weights[l].ws[i], xs, want);
        if (!plans[0].ok) {
          all_ok = false;
          detail += std::string(" ") + p.name + ": no algorithm;";
          continue;
        }
        const int count = static_cast<int>(plans[0].algos.size());
        double best = 1e9, first = 0;
        int best_index = -1;
        for (int a = 0; a < count; ++a) {
          auto run_layer = [&](int l) {
            return run_product(c, plans[l], plans[0].algos[a].algo, p, tokens, weights[l].w[i],
                               weights[l].ws[i], x, xs, raw, y, stream);
          };
          bool ok = true;
          for (int l = 0; l < layers && ok; ++l) ok = run_layer(l);  // warm-up
          if (!ok || cudaStreamSynchronize(stream) != cudaSuccess) {
            cudaGetLastError();
            continue;
          }
          std::vector<float> times;
          for (int r = 0; r < 15; ++r) {
            CK(cudaEventRecord(e0, stream));
            for (int l = 0; l < layers; ++l) run_layer(l);
            CK(cudaEventRecord(e1, stream));
            CK(cudaEventSynchronize(e1));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            times.push_back(ms * 1000.0f / layers);
          }
          std::sort(times.begin(), times.end());
          const double median = times[times.size() / 2];
          if (a == 0) first = median;
          if (median < best) best = median, best_index = a;
        }
        for (auto& plan : plans) {
          cublasLtMatrixLayoutDestroy(plan.a);
          cublasLtMatrixLayoutDestroy(plan.b);
          cublasLtMatrixLayoutDestroy(plan.d);
          cublasLtMatmulDescDestroy(plan.desc);
        }
        const double bytes = static_cast<double>(p.in) * p.out;
        char buf[256];
        std::snprintf(buf, sizeof buf, " %s %.1f/%.1f us (algo %d of %d, %.2f of bw);", p.name,
                      first, best, best_index, count, bytes / (best * 1e-6) / 1e9 / copy_gbps);
        detail += buf;
        layer_best += best;
        layer_first += first;
      }
      std::printf("%-44s layer %s heuristic %.1f us, best %.1f us |%s\n", c.name,
                  all_ok ? "" : "(incomplete)", layer_first, layer_best, detail.c_str());
    }
  }
  // Correctness of the other forms against the normal one: 32 rows of down, accumulating into
  // zeros.
  {
    const int tokens = std::min(32, max_rows);
    const Product& p = products[3];
    std::vector<float> ref;
    for (const Config* c : {&configs[0], &configs[1], &configs[4]}) {
      Plan plan = make_plan(*c, tokens, p, weights[0].ws[3], xs, 1);
      if (!plan.ok) {
        std::printf("check %s: no algorithm\n", c->name);
        continue;
      }
      CK(cudaMemset(y, 0, 4ull * tokens * p.out));
      if (!run_product(*c, plan, plan.algos[0].algo, p, tokens, weights[0].w[3], weights[0].ws[3],
                       x, xs, raw, y, stream)) {
        std::printf("check %s: cuBLASLt refused its algorithm\n", c->name);
        continue;
      }
      std::vector<float> host(static_cast<size_t>(tokens) * p.out);
      CK(cudaMemcpy(host.data(), y, host.size() * 4, cudaMemcpyDeviceToHost));
      if (c == &configs[0]) {
        ref = host;
        continue;
      }
      double worst = 0, largest = 0;
      for (size_t i = 0; i < host.size(); ++i) {
        worst = std::max(worst, static_cast<double>(std::fabs(host[i] - ref[i])));
        largest = std::max(largest, static_cast<double>(std::fabs(ref[i])));
      }
      std::printf("check %s against normal: largest difference %.3g of largest %.3g\n", c->name,
                  worst, largest);
    }
  }
  return 0;
}

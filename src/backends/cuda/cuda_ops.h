// The CUDA backend's ops, one for each CPU op in backends/cpu/cpu_ops.h (same meaning, same
// argument order where it can be), on device pointers and a stream. Weights, activations between
// matrix products and the KV cache are bf16; the residual stream, norms' weights, RoPE tables and
// logits are fp32; every reduction accumulates in fp32.
#pragma once

#include <cublasLt.h>

#include <cstdint>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "backends/cuda/cuda_common.h"
#include "core/fp8.h"

namespace entropyinfer::cuda {

// Throws Error("<what> failed: <cuBLASLt's reason>") unless status is CUBLAS_STATUS_SUCCESS.
void check_blas(cublasStatus_t status, const char* what);

// A projection's weights on the GPU: bf16 rows [out][in], or FP8 E4M3 codes [out][in] with one
// fp32 scale per output row, whose products first quantize each input row (core/fp8.h: dynamic
// per token, or one static scale) and apply both scales to the fp32 sums.
struct DeviceMatrix {
  const bf16* values = nullptr;    // bf16 weights; null for FP8
  const uint8_t* codes = nullptr;  // FP8 codes; null for bf16
  const float* scales = nullptr;   // FP8: one per row
  int64_t in = 0;                  // elements per row
  Fp8Activations activations;      // FP8: kDynamicPerToken or kStaticPerTensor
  float input_scale = 0.0f;        // kStaticPerTensor's scale

  bool fp8() const { return codes != nullptr; }
  // The rows from `first` on.
  DeviceMatrix rows_from(int64_t first) const {
    DeviceMatrix rest = *this;
    if (values != nullptr) rest.values = values + first * in;
    if (codes != nullptr) {
      rest.codes = codes + first * in;
      rest.scales = scales + first;
    }
    return rest;
  }
};

// Matrix products through cuBLASLt: bf16 operands, fp32 accumulation. One instance per stream; it
// owns the handle, a workspace and the algorithm chosen for each shape.
class Blas {
 public:
  explicit Blas(cudaStream_t stream = nullptr, size_t workspace_bytes = size_t{32} << 20);
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;

  // y[t][o] = sum_k x[t][k] * w[o][k]; x is [tokens, in], w is [out, in] (nn.Linear layout), y is
  // [tokens, out] row-major with rows y_stride elements apart (0 means out).
  void linear(const bf16* x, int64_t tokens, int64_t in, const bf16* w, int64_t out, bf16* y,
              int64_t y_stride = 0);
  // fp32 output; accumulate adds the product to what y holds (y += x * w^T), which fuses the
  // residual add after the attention output and MLP down projections.
  void linear(const bf16* x, int64_t tokens, int64_t in, const bf16* w, int64_t out, float* y,
              bool accumulate = false, int64_t y_stride = 0);

  // The same over a DeviceMatrix: bf16 weights as above; FP8 ones quantize x's rows into scratch
  // and run cuBLASLt's FP8 product with both scale vectors applied in its epilogue, or, for one
  // token, an in-house FP8 GEMV that quantizes x in shared memory as it goes.
  void linear(const bf16* x, int64_t tokens, int64_t in, const DeviceMatrix& w, int64_t out,
              bf16* y, int64_t y_stride = 0);
  void linear(const bf16* x, int64_t tokens, int64_t in, const DeviceMatrix& w, int64_t out,
              float* y, bool accumulate = false, int64_t y_stride = 0);
  // y = (rms_norm(x) * norm_weight) w^T, the normed bf16 rows also written to `normed`: what
  // rms_norm and then linear give, bit for bit. For one token and FP8 weights the norm and the
  // GEMV's input quantization run as one kernel (a decode step has one launch fewer).
  void normed_linear(const float* x, const float* norm_weight, float eps, bf16* normed,
                     int64_t tokens, int64_t in, const DeviceMatrix& w, int64_t out, bf16* y);
  // y (+)= swiglu(gate, up) w^T, the activation rows (`in` wide) also written to `activation`; gate
  // and up rows are in_stride apart: what swiglu and then linear give, bit for bit. For one token
  // and FP8 weights SwiGLU and the GEMV's input quantization run as one kernel.
  void swiglu_linear(const bf16* gate, const bf16* up, int64_t tokens, int64_t in,
                     int64_t in_stride, bf16* activation, const DeviceMatrix& w, int64_t out,
                     float* y, bool accumulate);
  // Whether a product of this shape runs the FP8 GEMV (one token, in-house GEMV on, a quantized
  // input), reserving its input scratch outside graph capture: where the fused input kernels apply.
  bool fp8_gemv_runs(int64_t tokens, int64_t in, const DeviceMatrix& w);
  // Sizes the FP8 products' input scratch for `tokens` rows of `width`, so that products inside a
  // CUDA graph capture find it allocated (a capture cannot allocate; a product past the reserve
  // outside one grows it).
  void reserve_fp8_inputs(int64_t tokens, int64_t width);
  size_t fp8_input_bytes() const { return fp8_inputs_.bytes() + fp8_input_scales_.bytes(); }
  // cuBLASLt's FP8 products accumulate in the tensor cores' own precision (on by default, as vLLM's
  // and TensorRT-LLM's FP8 products do), or promote partial sums to fp32 at intervals (off:
  // slower, closer to an fp32 sum).
  void set_fp8_fast_accumulation(bool enabled) { fp8_fast_accumulation_ = enabled; }

  // Single-token products (decoding) run in an in-house GEMV kernel that streams the weights with
  // 16-byte loads; off sends them through cuBLASLt too (for comparison).
  void set_gemv(bool enabled) { gemv_ = enabled; }
  // FP8 products of 2-8 rows (small decode batches) run in an in-house tensor-core kernel that
  // streams the weights as the GEMV does and sums in fp32 (where the shapes allow: input width a
  // multiple of 64, output a multiple of 16); off sends them through cuBLASLt (for comparison).
  void set_fp8_small_batch(bool enabled) { small_batch_ = enabled; }
  static bool fp8_small_batch_applies(int64_t tokens, int64_t in, int64_t out);
  // Separate scaling (on by default): FP8 products of a few rows beyond the small-batch kernel
  // (up to kFp8SeparateScalingMaxRows) run cuBLASLt's FP8 matmul without scales into fp32 scratch,
  // then a kernel of their own applies the row and input scales. At these sizes cuBLASLt offers
  // one algorithm with per-row scales and several, faster ones without
  // (bench/results/gpu-2026-12-05-fp8-scale-modes.md). Off, they run the per-row-scale matmul.
  void set_fp8_separate_scaling(bool enabled) { separate_scaling_ = enabled; }
  static constexpr int64_t kFp8SeparateScalingMaxRows = 64;
  bool fp8_separate_scaling_applies(int64_t tokens, const DeviceMatrix& w, int64_t out) const;
  // GEMV tuning (off by default): a single-token shape's first run outside graph capture times the
  // kernel's configurations (loads in flight, threads per block) and keeps the fastest; untuned
  // shapes run 8 loads in flight and 256 threads. The configurations give identical results.
  void set_gemv_tuning(bool enabled) { tune_gemv_ = enabled; }

  // Autotuning (off by default): the first run of a product shape of at least `min_tokens` rows
  // times up to `candidates` of cuBLASLt's heuristic algorithms (into a scratch output, so y is
  // written once, by the chosen one) and keeps the fastest unless the heuristic's first choice is
  // within 3% of it; 0 or 1 keeps the heuristic's choice. Never tunes while the stream is being
  // captured into a graph, nor when the scratch output cannot be allocated. Algorithms sum in
  // different orders, so a tuned product may differ from the untuned one in the last bits.
  //
  // How a candidate is timed. kBurst: the median of 9 runs right after one untimed run, what a
  // product costs while the GPU has power to spare. kSustained: the mean over 60 ms of back-to-back
  // runs after 60 ms of them untimed, what it costs once the GPU sits at its power cap, as it does
  // through a long prefill; there an algorithm that spends less energy per product can be the
  // faster one. Sustained tuning takes about a second per product shape.
  enum class TuneLoad { kBurst, kSustained };
  void set_autotune(int candidates, int64_t min_tokens = 1, TuneLoad load = TuneLoad::kBurst) {
    autotune_candidates_ = candidates;
    autotune_min_tokens_ = min_tokens;
    autotune_load_ = load;
  }
  // For tuning benchmarks: the ms per run of each of cuBLASLt's first `candidates` algorithms for a
  // product shape (y_stride = out), in the heuristic's order, timed as `load` says; -1 for one
  // that refuses the operands. Leaves the plans that products run untouched.
  std::vector<float> time_candidates(const bf16* x, int64_t tokens, int64_t in, const bf16* w,
                                     int64_t out, bool fp32_out, int candidates, TuneLoad load);
  // Which of the heuristic's algorithms the product of this shape (y_stride = out) runs: 0 for its
  // first choice, -1 when the shape has not run yet.
  int chosen_candidate(int64_t tokens, int64_t in, int64_t out, bool fp32_out) const;

  cudaStream_t stream() const { return stream_; }

 private:
  struct Plan;
  // sweep_candidates > 0: a plan apart from the products', listing that many candidates.
  Plan& plan_for(int64_t tokens, int64_t in, int64_t out, int64_t y_stride, bool fp32_out,
                 int sweep_candidates = 0);
  void run(Plan& plan, const bf16* x, const bf16* w, void* y, bool accumulate);
  void tune(Plan& plan, const bf16* x, const bf16* w);
  std::vector<float> time_plan_candidates(const Plan& plan, int count, const bf16* x, const bf16* w,
                                          void* scratch, TuneLoad load);
  std::pair<int, int> gemv_configuration(const bf16* x, int64_t in, const bf16* w, int64_t out,
                                         bool fp32_out, bool accumulate);

  struct Fp8Plan;
  static void delete_fp8_plan(Fp8Plan* plan);  // where Fp8Plan is complete
  void linear_fp8(const bf16* x, int64_t tokens, int64_t in, const DeviceMatrix& w, int64_t out,
                  void* y, bool fp32_out, bool accumulate, int64_t y_stride);
  // Whether the FP8 products' input scratch holds `tokens` rows of `in` (fp16 for one token, the
  // GEMV's input): grows it outside graph capture; false inside one when it is too small.
  bool fp8_inputs_ready(int64_t tokens, int64_t in);
  // separate_scaling: no scales in the matmul, fp32 output of `out` rows per token (scratch).
  Fp8Plan& fp8_plan_for(int64_t tokens, int64_t in, int64_t out, int64_t y_stride, bool fp32_out,
                        bool separate_scaling, const float* weight_scales,
                        const float* input_scales);

  cudaStream_t stream_;
  cublasLtHandle_t handle_ = nullptr;
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, bool, bool, bool>, Fp8Plan*> fp8_plans_;
  bool fp8_fast_accumulation_ = true;
  DeviceBuffer<uint8_t> fp8_inputs_;
  DeviceBuffer<float> fp8_input_scales_;
  DeviceBuffer<float> fp8_unscaled_outputs_;
  DeviceBuffer<uint8_t> workspace_;
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, bool>, Plan*> plans_;
  bool gemv_ = true;
  bool small_batch_ = true;
  bool separate_scaling_ = true;
  bool tune_gemv_ = false;
  std::map<std::tuple<int64_t, int64_t, bool, bool>, std::pair<int, int>> gemv_configurations_;
  int autotune_candidates_ = 0;
  int64_t autotune_min_tokens_ = 1;
  TuneLoad autotune_load_ = TuneLoad::kBurst;
};

// The single-token product y (+)= x * w^T through the GEMV kernel with an explicit configuration,
// for tuning benchmarks: `in_flight` (4, 8 or 16) 16-byte weight loads per lane before each wait,
// `threads` (a multiple of 32, at most 1024) per block, one warp per output row. Blas::linear runs
// 8 and 256 untuned. Throws Error on any other configuration or when the operands do not fit.
void gemv_with_config(const bf16* x, const bf16* w, int64_t in, int64_t out, float* y,
                      bool accumulate, int in_flight, int threads, cudaStream_t stream = nullptr);

// Each row of x (bf16, rows x_stride elements apart) quantized as an FP8 product's input
// (core/fp8.h): codes [rows][width] and one scale per row (the static scale in every row under
// kStaticPerTensor). Bit for bit what the CPU reference computes from the same values.
void quantize_rows_fp8(const bf16* x, int64_t rows, int64_t width, int64_t x_stride,
                       const Fp8Activations& scheme, float static_scale, uint8_t* codes,
                       float* scales, cudaStream_t stream);
// Weight rows (bf16 [rows][width]) as E4M3 codes with one scale per row (fp8_weight_scale).
void quantize_weight_rows_fp8(const bf16* w, int64_t rows, int64_t width, uint8_t* codes,
                              float* scales, cudaStream_t stream);

// out[r] = x[r] / rms(x[r]) * weight, rows of `size` (rows `x_stride` / `out_stride` elements
// apart; 0 means size). One block per row; out may alias x when the types match.
void rms_norm(const float* x, const float* weight, int64_t rows, int64_t size, float eps, bf16* out,
              cudaStream_t stream);
void rms_norm(const bf16* x, const float* weight, int64_t rows, int64_t size, float eps, bf16* out,
              cudaStream_t stream, int64_t x_stride = 0, int64_t out_stride = 0);

// Per-head RMSNorm over heads of head_dim inside rows of `token_stride` elements (Qwen3's q/k
// norm), in place: x[t][h] at x + t * token_stride + h * head_dim.
void head_rms_norm(bf16* x, int64_t tokens, int64_t heads, int64_t head_dim, int64_t token_stride,
                   const float* weight, float eps, cudaStream_t stream);

// x[i] += y[i]
void add_inplace(float* x, const float* y, int64_t count, cudaStream_t stream);

// y[t][o] += bias[o] for rows of `width` that are `stride` elements apart.
void add_bias(bf16* y, const float* bias, int64_t rows, int64_t width, int64_t stride,
              cudaStream_t stream);
void add_bias(float* y, const float* bias, int64_t rows, int64_t width, int64_t stride,
              cudaStream_t stream);

// out[t][i] = silu(gate[t][i]) * up[t][i]; gate and up rows are in_stride elements apart (they may
// be the two halves of one fused [gate | up] product), out rows are width apart.
void swiglu(const bf16* gate, const bf16* up, int64_t rows, int64_t width, int64_t in_stride,
            bf16* out, cudaStream_t stream);

// Rotates each head of x in place: x[t][h] at x + t * token_stride + h * head_dim, with the angles
// in cos/sin ([tokens, rotary_dim / 2], fp32). adjacent_pairs: rotate (x[2i], x[2i+1]) as llama2.c
// does; otherwise (x[i], x[i + rotary_dim/2]) as Hugging Face models do. Dimensions past rotary_dim
// stay.
// With device_position set, the tables are read from row *device_position on (read when the kernel
// runs, for CUDA graphs replayed at every position).
void apply_rope(bf16* x, int64_t tokens, int64_t heads, int64_t head_dim, int64_t token_stride,
                const float* cos, const float* sin, int64_t rotary_dim, bool adjacent_pairs,
                cudaStream_t stream, const int* device_position = nullptr);
// The same over fused q/k rows whose first q_heads heads are queries, writing the rotated queries
// to q_out (rows q_out_stride apart) instead of in place; the other heads rotate in place. Saves
// the copy of the queries out of the fused rows that layer-by-layer prefill needs.
void apply_rope_queries_out(bf16* x, int64_t tokens, int64_t heads, int64_t head_dim,
                            int64_t token_stride, const float* cos, const float* sin,
                            int64_t rotary_dim, bool adjacent_pairs, int64_t q_heads, bf16* q_out,
                            int64_t q_out_stride, cudaStream_t stream);

// Copies keys and values of `tokens` new tokens ([t][kv_heads][head_dim] with rows token_stride
// apart) into head-major caches ([kv_heads][cache_stride][head_dim]) at rows first_position.. (or
// *device_position.., read when the kernel runs).
void append_kv(const bf16* keys, const bf16* values, int64_t tokens, int64_t token_stride,
               int64_t kv_heads, int64_t head_dim, bf16* key_cache, bf16* value_cache,
               int64_t cache_stride, int64_t first_position, cudaStream_t stream,
               const int* device_position = nullptr);

// out[t] = table[ids[t]] widened to fp32 ([tokens, hidden]). Ids must be inside the table (the
// caller validates them on the host, where an error can be reported).
void embedding(const bf16* table, const int32_t* ids, int64_t tokens, int64_t hidden, float* out,
               cudaStream_t stream);

// Scratch for argmax_rows to split each of up to `rows` rows over many blocks: their partial
// results and a per-row arrival counter (zeroed here, and left zeroed by every launch). One launch
// at a time may use it (its owner's stream).
class ArgmaxWorkspace {
 public:
  static constexpr int kSlices = 64;
  explicit ArgmaxWorkspace(int64_t rows = 1);
  int64_t rows() const { return rows_; }
  uint8_t* partials() { return partials_.data(); }
  unsigned* arrivals() { return arrivals_.data(); }

 private:
  int64_t rows_;
  DeviceBuffer<uint8_t> partials_;
  DeviceBuffer<unsigned> arrivals_;
};

// out[r] = the index of the largest value of row r (the first one on ties), rows of `count`; -1
// when the row holds a NaN or +inf, or nothing above -inf. One block per row; with a workspace
// holding the rows, up to 64 blocks per row (same result).
void argmax_rows(const float* x, int64_t rows, int64_t count, int32_t* out, cudaStream_t stream,
                 ArgmaxWorkspace* workspace = nullptr);

// x[i] = uniform in [-scale, scale) from a counter-based hash of (seed, i): random weights and
// benchmark inputs made on the GPU, reproducible for a seed.
void fill_uniform(bf16* x, int64_t count, uint64_t seed, float scale, cudaStream_t stream);
void fill_uniform(float* x, int64_t count, uint64_t seed, float scale, cudaStream_t stream);

// Element conversions.
void to_bf16(const float* x, int64_t count, bf16* out, cudaStream_t stream);
void to_float(const bf16* x, int64_t count, float* out, cudaStream_t stream);

}  // namespace entropyinfer::cuda

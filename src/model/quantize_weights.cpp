#include "model/quantize_weights.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/error.h"
#include "core/fp8.h"

namespace entropyinfer {
namespace {

void quantize_matrix(WeightView& view, ModelWeights& weights) {
  if (view.empty() || view.fp8()) return;
  const int64_t rows = view.shape.at(0), columns = view.shape.at(1);
  // Codes and scales live in owned float-unit buffers, as every owned tensor does.
  auto codes_buffer =
      std::make_unique_for_overwrite<float[]>(static_cast<size_t>((rows * columns + 3) / 4));
  auto scale_buffer = std::make_unique_for_overwrite<float[]>(static_cast<size_t>(rows));
  auto* codes = reinterpret_cast<uint8_t*>(codes_buffer.get());
  float* scales = scale_buffer.get();
#pragma omp parallel
  {
    std::vector<float> row_values(static_cast<size_t>(columns));
#pragma omp for schedule(static)
    for (int64_t row = 0; row < rows; ++row) {
      view.widen_row(row, row_values.data());
      float amax = 0.0f;
      for (const float value : row_values) amax = std::max(amax, std::fabs(value));
      const float scale = fp8_weight_scale(amax);
      scales[row] = scale;
      uint8_t* out = codes + row * columns;
      for (int64_t column = 0; column < columns; ++column)
        out[column] = f32_to_fp8_e4m3(row_values[static_cast<size_t>(column)] / scale);
    }
  }
  view.data = codes;
  view.dtype = TensorDtype::kF8E4M3;
  view.scales = scales;
  view.scale_count = rows;
  view.activations.kind = Fp8Activations::Kind::kDynamicPerToken;
  view.input_scale = 0.0f;
  weights.owned_bytes += static_cast<size_t>(rows * columns) + static_cast<size_t>(rows) * 4;
  weights.owned_buffers.push_back(std::move(codes_buffer));
  weights.owned_buffers.push_back(std::move(scale_buffer));
}

}  // namespace

void quantize_weights_fp8(ModelWeights& weights) {
  if (!weights.fp8_scheme.empty()) return;  // an FP8 checkpoint runs as it was quantized
  try {
    for (LayerWeights& layer : weights.layers) {
      for (WeightView* matrix : {&layer.q_proj, &layer.k_proj, &layer.v_proj, &layer.o_proj,
                                 &layer.gate_proj, &layer.up_proj, &layer.down_proj}) {
        quantize_matrix(*matrix, weights);
      }
    }
  } catch (const std::bad_alloc&) {
    throw Error("out of memory quantizing the weights to FP8");
  }
  weights.fp8_scheme = "quantized at load (channel scales, activations: dynamic per-token)";
}

}  // namespace entropyinfer

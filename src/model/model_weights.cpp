#include "model/model_weights.h"

#include <cstring>

#include "core/error.h"

namespace entropyinfer {

const float* WeightView::floats() const {
  if (data != nullptr && dtype != TensorDtype::kF32) {
    throw Error("internal: a 16-bit or FP8 weight matrix was read as fp32");
  }
  return static_cast<const float*>(data);
}

float WeightView::value(int64_t index) const {
  switch (dtype) {
    case TensorDtype::kF32:
      return static_cast<const float*>(data)[index];
    case TensorDtype::kBF16:
    case TensorDtype::kF16: {
      uint16_t bits;
      std::memcpy(&bits, static_cast<const uint8_t*>(data) + 2 * index, sizeof(bits));
      return dtype == TensorDtype::kBF16 ? bf16_to_f32(bits) : f16_to_f32(bits);
    }
    case TensorDtype::kF8E4M3:
      return fp8_e4m3_to_f32(static_cast<const uint8_t*>(data)[index]) *
             row_scale(index / shape.at(1));
  }
  return 0.0f;
}

void WeightView::widen_row(int64_t row, float* out) const {
  const int64_t width = shape.at(1);
  if (dtype == TensorDtype::kF32) {
    std::memcpy(out, static_cast<const float*>(data) + row * width, sizeof(float) * width);
    return;
  }
  for (int64_t i = 0; i < width; ++i) out[i] = value(row * width + i);
}

}  // namespace entropyinfer

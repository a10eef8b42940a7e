#include "engine/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace entropyinfer {
namespace {

int rotary_dim_of(const ModelConfig& config) {
  return config.rope.rotary_dim > 0 ? config.rope.rotary_dim : config.head_dim;
}

std::vector<double> default_frequencies(double theta, int rotary_dim) {
  std::vector<double> inverse(rotary_dim / 2);
  for (int i = 0; i < rotary_dim / 2; ++i) {
    inverse[i] = 1.0 / std::pow(theta, static_cast<double>(2 * i) / rotary_dim);
  }
  return inverse;
}

int original_context(const ModelConfig& config) {
  return config.rope.original_max_position_embeddings > 0
             ? config.rope.original_max_position_embeddings
             : config.max_position_embeddings;
}

// yarn's scaling factor. The config parser resolves it (transformers derives it from the ratio of
// the two contexts only when `factor` is absent), so the decoder takes it as given.
double yarn_factor(const ModelConfig& config) { return config.rope.factor; }

double yarn_mscale(double scale) { return scale <= 1.0 ? 1.0 : 0.1 * std::log(scale) + 1.0; }

std::vector<double> yarn_frequencies(const ModelConfig& config, int rotary_dim) {
  const RopeConfig& rope = config.rope;
  const double factor = yarn_factor(config);
  const double base = rope.theta;
  const double original = original_context(config);
  auto correction_dim = [&](double rotations) {
    return rotary_dim * std::log(original / (rotations * 2.0 * std::numbers::pi)) /
           (2.0 * std::log(base));
  };
  double low = std::max(0.0, std::floor(correction_dim(rope.beta_fast)));
  double high =
      std::min(static_cast<double>(rotary_dim - 1), std::ceil(correction_dim(rope.beta_slow)));
  if (low == high) high += 0.001;
  std::vector<double> inverse(rotary_dim / 2);
  for (int i = 0; i < rotary_dim / 2; ++i) {
    const double position_frequency = std::pow(base, static_cast<double>(2 * i) / rotary_dim);
    const double extrapolation = 1.0 / position_frequency;
    const double interpolation = 1.0 / (factor * position_frequency);
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    const double extrapolation_weight = 1.0 - ramp;
    inverse[i] =
        interpolation * (1.0 - extrapolation_weight) + extrapolation * extrapolation_weight;
  }
  return inverse;
}

std::vector<double> llama3_frequencies(const ModelConfig& config, int rotary_dim) {
  const RopeConfig& rope = config.rope;
  std::vector<double> inverse = default_frequencies(rope.theta, rotary_dim);
  const double original = original_context(config);
  const double low_frequency_wavelength = original / rope.low_freq_factor;
  const double high_frequency_wavelength = original / rope.high_freq_factor;
  for (double& frequency : inverse) {
    const double wavelength = 2.0 * std::numbers::pi / frequency;
    if (wavelength > low_frequency_wavelength) {
      frequency /= rope.factor;
    } else if (wavelength >= high_frequency_wavelength) {
      const double smooth = (original / wavelength - rope.low_freq_factor) /
                            (rope.high_freq_factor - rope.low_freq_factor);
      frequency = (1.0 - smooth) * frequency / rope.factor + smooth * frequency;
    }
  }
  return inverse;
}

}  // namespace

std::vector<double> rope_inverse_frequencies(const ModelConfig& config, int64_t sequence_length) {
  const int rotary_dim = rotary_dim_of(config);
  const RopeConfig& rope = config.rope;
  switch (rope.scaling) {
    case RopeScaling::kDefault:
      return default_frequencies(rope.theta, rotary_dim);
    case RopeScaling::kLinear: {
      std::vector<double> inverse = default_frequencies(rope.theta, rotary_dim);
      for (double& frequency : inverse) frequency /= rope.factor;
      return inverse;
    }
    case RopeScaling::kDynamic: {
      const double original = original_context(config);
      double base = rope.theta;
      if (sequence_length > original) {
        base = rope.theta * std::pow(rope.factor * sequence_length / original - (rope.factor - 1.0),
                                     static_cast<double>(rotary_dim) / (rotary_dim - 2));
      }
      return default_frequencies(base, rotary_dim);
    }
    case RopeScaling::kLlama3:
      return llama3_frequencies(config, rotary_dim);
    case RopeScaling::kYarn:
      return yarn_frequencies(config, rotary_dim);
  }
  return default_frequencies(rope.theta, rotary_dim);
}

double rope_attention_factor(const ModelConfig& config) {
  if (config.rope.scaling != RopeScaling::kYarn) return 1.0;
  if (config.rope.attention_factor.has_value()) return *config.rope.attention_factor;
  return yarn_mscale(yarn_factor(config));
}

RopeTables rope_tables(const ModelConfig& config, int64_t first_position, int64_t tokens) {
  const std::vector<double> inverse = rope_inverse_frequencies(config, first_position + tokens);
  const double attention_factor = rope_attention_factor(config);
  const size_t half = inverse.size();
  RopeTables tables;
  tables.cos.resize(static_cast<size_t>(tokens) * half);
  tables.sin.resize(static_cast<size_t>(tokens) * half);
  for (int64_t t = 0; t < tokens; ++t) {
    const double position = static_cast<double>(first_position + t);
    for (size_t i = 0; i < half; ++i) {
      const double angle = position * inverse[i];
      tables.cos[t * half + i] = static_cast<float>(std::cos(angle) * attention_factor);
      tables.sin[t * half + i] = static_cast<float>(std::sin(angle) * attention_factor);
    }
  }
  return tables;
}

}  // namespace entropyinfer

// SIMD helpers meant to be inlined into host inner loops (the CPU kernels', the policies' scoring),
// where the enclosing function's target clone (AVX2 with FMA, or the portable default) decides the
// vector width and whether multiply-adds become FMAs.
#pragma once

#include <bit>
#include <cstdint>

// Clones a kernel for x86-64-v3 (AVX2, FMA) next to the portable default; the choice is made once,
// by CPU features. (A clone for "arch=haswell" is only chosen on CPUs that are Haswell-family
// Intel parts, never on AMD ones.) Everything the hot loop calls must be inlined into the clone:
// a call to a separate function runs that function's default code.
// Defining it empty before this header builds the portable code alone (to test it on AVX2
// machines).
#ifndef ENTROPYINFER_SIMD_CLONES
#define ENTROPYINFER_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#endif

namespace entropyinfer::cpu {

inline float inline_dot(const float* a, const float* b, int64_t size) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < size; ++i) sum += a[i] * b[i];
  return sum;
}

// Returning a vector from these helpers would change the ABI between the AVX and the portable
// clone (GCC's -Wpsabi); they are always inlined, so no call ever crosses that boundary.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"

// Eight floats (or int32 lanes) as one value; GCC lowers it to one AVX register or two SSE ones
// depending on the target clone. aligned(4) allows unaligned loads straight from rows of any
// length.
typedef float Float8 __attribute__((vector_size(32), aligned(4)));
typedef int32_t Int8 __attribute__((vector_size(32), aligned(4)));

// For constants. GCC builds a vector from a run-time scalar inside a helper for the portable ISA
// before inlining (two SSE halves even in the AVX clone); in hot loops write vector * scalar
// instead, which becomes one broadcast load.
[[gnu::always_inline]] inline Float8 splat8(float value) {
  return Float8{value, value, value, value, value, value, value, value};
}

[[gnu::always_inline]] inline Int8 splat8i(int32_t value) {
  return Int8{value, value, value, value, value, value, value, value};
}

[[gnu::always_inline]] inline Float8 load8(const float* source) {
  return *reinterpret_cast<const Float8*>(source);
}

[[gnu::always_inline]] inline void store8(float* destination, Float8 value) {
  *reinterpret_cast<Float8*>(destination) = value;
}

[[gnu::always_inline]] inline float horizontal_sum8(Float8 v) {
  return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

[[gnu::always_inline]] inline Float8 max8(Float8 a, Float8 b) { return a > b ? a : b; }

// e^x lane by lane, within about two float ulps: x = n ln2 + r with |r| <= ln2 / 2 (ln2 split in
// two so n ln2 is exact), e^r by Cephes' degree-6 polynomial, 2^n written into the exponent bits.
// Inputs below -87 (including -infinity, a masked score) give exactly 0.
[[gnu::always_inline]] inline Float8 exp8(Float8 x) {
  const auto underflows = x < splat8(-87.0f);
  x = underflows ? splat8(-87.0f) : x;
  x = x > splat8(88.0f) ? splat8(88.0f) : x;
  // Adding 1.5 * 2^23 rounds to an integer; subtracting it again leaves that integer.
  const Float8 round_shift = splat8(12582912.0f);
  const Float8 n = (x * splat8(1.44269504088896341f) + round_shift) - round_shift;
  Float8 r = x - n * splat8(0.693359375f);
  r = r - n * splat8(-2.12194440e-4f);
  Float8 p = splat8(1.9875691500e-4f);
  p = p * r + splat8(1.3981999507e-3f);
  p = p * r + splat8(8.3334519073e-3f);
  p = p * r + splat8(4.1665795894e-2f);
  p = p * r + splat8(1.6666665459e-1f);
  p = p * r + splat8(5.0000001201e-1f);
  p = p * (r * r) + r + splat8(1.0f);
  const Int8 exponent = (__builtin_convertvector(n, Int8) + 127) << 23;
  const Float8 result = p * std::bit_cast<Float8>(exponent);
  return underflows ? splat8(0.0f) : result;
}

#pragma GCC diagnostic pop

}  // namespace entropyinfer::cpu

/**
 * @file half.h
 * @ingroup tools
 * @brief The two 16-bit float storage formats of the verify kit (and of safetensors' BF16 and
 *        F16 dtypes), converted from float by round-to-nearest-even, the IEEE default and what
 *        PyTorch's `.to(torch.bfloat16)` / `.half()` do.
 *
 *   BF16  1 sign, 8 exponent, 7 mantissa bits: float's range, unit roundoff 2^-8 (ulp 2^-7 at 1).
 *   F16   1 sign, 5 exponent, 10 mantissa bits: largest finite 65504, subnormals down to 2^-24,
 *         unit roundoff 2^-11.
 * Infinities stay infinite, a NaN stays a (quiet) NaN, finite values too large for F16 become ±inf
 * (as on every GPU). Every BF16 and F16 value is exactly a float, so widening is exact.
 */
#pragma once

#include <cstdint>

namespace mhar::io {

/// Bits of the BF16 nearest to x (ties to even).
uint16_t float_to_bf16_bits(float x);
/// The float equal to BF16 bits b (exact).
float bf16_bits_to_float(uint16_t b);
/// Bits of the F16 nearest to x (ties to even; overflow to ±inf; subnormals kept).
uint16_t float_to_f16_bits(float x);
/// The float equal to F16 bits h (exact).
float f16_bits_to_float(uint16_t h);

/// x rounded to the nearest BF16, as a float.
inline float round_to_bf16(float x) {
  return bf16_bits_to_float(float_to_bf16_bits(x));
}
/// x rounded to the nearest F16, as a float.
inline float round_to_f16(float x) {
  return f16_bits_to_float(float_to_f16_bits(x));
}

}  // namespace mhar::io

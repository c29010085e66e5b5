/**
 * @file half.cpp
 * @brief float → BF16 / F16 by round-to-nearest-even, and back (half.h).
 */
#include "half.h"

#include <bit>
#include <cmath>

namespace mhar::io {

uint16_t float_to_bf16_bits(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // NaN
  // Add just under half an ulp of BF16, plus one when the kept part is odd: ties go to even.
  // A carry out of the mantissa bumps the exponent, which is right (and overflows to inf).
  const uint32_t lsb = (u >> 16) & 1u;
  return static_cast<uint16_t>((u + 0x7fffu + lsb) >> 16);
}

float bf16_bits_to_float(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

uint16_t float_to_f16_bits(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;
  if (a >= 0x7f800000u)  // inf, or NaN (kept quiet, with what fits of its payload)
    return static_cast<uint16_t>(sign | 0x7c00u |
                                 (a > 0x7f800000u ? 0x0200u | ((a >> 13) & 0x3ffu) : 0u));
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // ≥ 65520 rounds to inf
  if (a < 0x38800000u) {
    // Below 2^-14, F16's smallest normal: a multiple of 2^-24. a · 2^24 is exact in float, and
    // nearbyint rounds it to the nearest integer, ties to even (the default rounding mode). A
    // result of 0x400 is the smallest normal, whose encoding is that same integer.
    const float scaled = std::bit_cast<float>(a) * 16777216.0f;
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(scaled)));
  }
  // Normal: rebias the exponent (127 → 15), keep 10 of 23 mantissa bits, round the 13 dropped.
  const uint32_t mant = a & 0x7fffffu;
  uint32_t h = (((a >> 23) - 127u + 15u) << 10) | (mant >> 13);
  const uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // a carry bumps the exponent: right
  return static_cast<uint16_t>(sign | h);
}

float f16_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: mant · 2^-24
    const float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp - 15u + 127u) << 23) | (mant << 13));
}

}  // namespace mhar::io

/**
 * @file cuda_test_util.h
 * @brief What every CUDA test shares: the announced skip without a GPU, random inputs, bitwise
 *        comparison, and asserting the rows of a check_* comparison.
 */
#pragma once

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/check/check_routing.h"
#include "cuda/device.h"
#include "tensor.h"

namespace mhar::cuda::test {

/// True when a CUDA device is present; otherwise announces the skip. ctest reads the marker
/// (SKIP_REGULAR_EXPRESSION "MHAR_SKIP:") and reports the case as skipped, not passed.
inline bool have_gpu() {
  std::string why;
  if (device_count(&why) > 0) return true;
  WARN("MHAR_SKIP: no CUDA device (" << why << ")");
  return false;
}

inline std::vector<float> random_vector(mhar::Rng& rng, std::size_t n, double mean = 0.0,
                                        double sd = 1.0) {
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(rng.normal(mean, sd));
  return v;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// Prints each row ("check …", collected by scripts/gpu-check.sh) and asserts it passed.
inline void check_rows(const std::vector<CheckRow>& rows) {
  for (const auto& r : rows) {
    const std::string line = format_check_row(r);
    std::printf("check %s\n", line.c_str());
    INFO(line);
    CHECK(r.pass);
  }
}

}  // namespace mhar::cuda::test

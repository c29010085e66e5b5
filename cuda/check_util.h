/**
 * @file check_util.h
 * @brief Internal to the cuda/check_*.cpp files: random inputs with exact double copies,
 *        flattening, NaN-poisoned outputs, and the "is there a GPU" guard they share.
 */
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/device.h"
#include "reference/tensor.h"

namespace mhar::cuda::check_detail {

/// A random float matrix and its exact double copy: input rounding is not counted as error.
struct Drawn {
  Mat<float> f;
  Mat<double> d;
};

/// rows × cols drawn from N(mean, sd²), rounded to float; never all zero.
inline Drawn draw(Rng& rng, Eigen::Index rows, Eigen::Index cols, double mean = 0.0,
                  double sd = 1.0) {
  Drawn m;
  m.f = rng.normal_matrix<double>(rows, cols, mean, sd).cast<float>();
  m.d = m.f.cast<double>();
  return m;
}

/// The elements of a (row-major) Eigen expression, in storage order.
template <typename Derived>
std::vector<typename Derived::Scalar> flatten(const Eigen::MatrixBase<Derived>& m) {
  const auto e = m.eval();
  return std::vector<typename Derived::Scalar>(e.data(), e.data() + e.size());
}

/// Concatenates matrices (row-major) into one flat vector: the device layout of N stacked
/// matrices (routing sources N × P × d, attention probs B·n_head × T × T).
template <typename T>
std::vector<T> flatten(const std::vector<Mat<T>>& ms) {
  std::vector<T> v;
  for (const auto& m : ms) v.insert(v.end(), m.data(), m.data() + m.size());
  return v;
}

/// A DeviceBuffer of `count` floats, every byte 0xFF (NaN): an element the kernel does not
/// write fails the comparison.
inline DeviceBuffer poisoned(std::size_t count) {
  DeviceBuffer b(count);
  b.fill_bytes(0xFF);
  return b;
}

/// Throws std::runtime_error("<where>: no CUDA device (<why>)") when there is no GPU.
inline void require_device(const char* where) {
  std::string why;
  if (device_count(&why) == 0)
    throw std::runtime_error(std::string(where) + ": no CUDA device (" + why + ")");
}

}  // namespace mhar::cuda::check_detail

/**
 * @file compare.h
 * @ingroup cuda
 * @brief The comparison every cuda/check/ file makes, and the helpers they share: CheckRow,
 *        compare_with_truth, random inputs with exact double copies, flattening, NaN-poisoned
 *        outputs and the "is there a GPU" guard.
 *
 * Tolerance (docs/style.md §7). Truth is the CPU reference in double on the same float inputs;
 * ref_f_err is the largest absolute error of the same reference run in float. A GPU result
 * passes when
 *     max |gpu − truth|  <=  8 · ref_f_err + 1e-6 · max |truth|
 * The 8 allows a different but equally good summation order (tree sums, online softmax
 * rescaling): 8× is ~3 more bits of float rounding than the reference's own, while a real bug
 * (a wrong index, a missing term) is off by O(max |truth|). The 1e-6 · max |truth| (~8 float
 * ulps of the largest value) covers outputs the float reference happens to get exact (N = 1).
 * Reported errors are relative: divided by max |truth|. The formula is the project's one,
 * mhar::earned_tolerance (reference/tolerance.h), with factor 8 and floor 1e-6 · max |truth|.
 *
 * Plain C++ (compiled by g++): links mhar_reference (Eigen) and mhar_cuda.
 */
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/device.h"
#include "reference/tensor.h"

namespace mhar::cuda {

/// One compared output: the step that produced it and the tensor it produced, kept apart so that
/// tables can group rows by step without reading names.
struct CheckRow {
  /// What ran: "forward", "backward" (routing), "rmsnorm_forward", "attention backward",
  /// "adamw_step"; in the model check "step t" (the loss) and "step t grad" (the gradients).
  std::string step;
  /// What was compared: "out", "dq", "y", "loss", "param (decay, step 1)"; for the model's
  /// gradients the parameter ("layers.0.wq"); empty when the step has one output (grad_sq_norm).
  std::string tensor;
  std::string version;       ///< version_name(): "naive", "fused"
  double worst_rel_err = 0;  ///< max |gpu − truth| / max |truth|
  double tolerance = 0;      ///< (8 · ref_f_err + 1e-6 · max |truth|) / max |truth|
  bool pass = false;         ///< worst_rel_err <= tolerance, and no NaN
  std::string shape;         ///< describe(shape)

  /// The name tables print: "forward out", "step 2 grad layers.0.wv", "grad_sq_norm (…)".
  std::string op() const { return tensor.empty() ? step : step + " " + tensor; }
};

/// "fused backward dq N=9 P=1000 d=256 H=4: worst relative error 1.2e-07 (tolerance 3.4e-07) ok"
std::string format_check_row(const CheckRow& r);

/// max_k |x_k − truth_k| (infinite on a NaN or a size mismatch).
double max_abs_diff(const std::vector<double>& truth, const std::vector<float>& x);

/// One comparison row: the GPU result passes when max |gpu − truth| ≤ 8 · max |ref_float − truth|
/// + 1e-6 · max |truth| (the tolerance above); errors are reported relative to max |truth|.
CheckRow compare_with_truth(const std::string& step, const std::string& tensor,
                            const std::string& version, const std::string& shape,
                            const std::vector<double>& truth, const std::vector<float>& ref_float,
                            const std::vector<float>& gpu);

}  // namespace mhar::cuda

/// Internal to the cuda/check/ files.
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

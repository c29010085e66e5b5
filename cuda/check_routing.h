/**
 * @file check_routing.h
 * @ingroup cuda
 * @brief Every routing kernel version against the CPU reference, on fresh random inputs and
 *        awkward shapes: what `mhar-toy check` prints and what tests/cuda asserts.
 *
 * Tolerance (docs/style.md §7). Truth is the reference (reference/routing.cpp) in double on the same
 * float inputs; ref_f_err is the largest absolute error of the same reference run in float. A
 * GPU result passes when
 *     max |gpu − truth|  <=  8 · ref_f_err + 1e-6 · max |truth|
 * The 8 allows a different but equally good summation order (tree sums, online softmax
 * rescaling): 8× is ~3 more bits of float rounding than the reference's own, while a real bug
 * (a wrong index, a missing term) is off by O(max |truth|). The 1e-6 · max |truth| (~8 float
 * ulps of the largest value) covers outputs the float reference happens to get exact (N = 1).
 * Reported errors are relative: divided by max |truth|.
 *
 * Plain C++ (compiled by g++): links mhar_reference (Eigen) and mhar_cuda.
 */
#pragma once

#include <string>
#include <vector>

#include "routing.h"

namespace mhar::cuda {

/// One routing site's dimensions (docs/design.md §1 letters).
struct RoutingShape {
  int N = 1, P = 1, d = 1, H = 1;
};

/// "N=9 P=1000 d=256 H=4"
std::string describe(const RoutingShape& s);

/// One compared output.
struct CheckRow {
  std::string
      op;  ///< "forward out", "forward alpha", "backward dsources", "backward dq", "backward dg"
  std::string version;       ///< version_name(): "naive", "fused"
  double worst_rel_err = 0;  ///< max |gpu − truth| / max |truth|
  double tolerance = 0;      ///< (8 · ref_f_err + 1e-6 · max |truth|) / max |truth|
  bool pass = false;         ///< worst_rel_err <= tolerance, and no NaN
  std::string shape;         ///< describe(shape)
};

/// "fused backward dq N=9 P=1000 d=256 H=4: worst relative error 1.2e-07 (tolerance 3.4e-07) ok"
std::string format_check_row(const CheckRow& r);

/// max_k |x_k − truth_k| (infinite on a NaN or a size mismatch).
double max_abs_diff(const std::vector<double>& truth, const std::vector<float>& x);

/// One comparison row: the GPU result passes when max |gpu − truth| ≤ 8 · max |ref_float − truth|
/// + 1e-6 · max |truth| (the tolerance above); errors are reported relative to max |truth|.
CheckRow compare_with_truth(const std::string& op, const std::string& version,
                            const std::string& shape, const std::vector<double>& truth,
                            const std::vector<float>& ref_float, const std::vector<float>& gpu);

/// The awkward shapes every version is checked on: N = 1, H = 1, H = d, K = d/H not a power of
/// two, P odd and P = 1, d = 1, d not a multiple of 32, a large shape, wide d (up to 6144: 16
/// columns per thread, > 48 KB of shared memory in the fused backward), and enough positions
/// that the fused backward's grid loops.
std::vector<RoutingShape> routing_check_shapes();

/// Forward at one shape: rows "forward out" and "forward alpha". out and alpha are poisoned with
/// NaN before the launch, so an element the kernel does not write fails. Needs a CUDA device.
std::vector<CheckRow> check_routing_forward(const RoutingShape& s, RoutingVersion v, unsigned seed);

/// Backward at one shape: rows "backward dsources", "backward dq", "backward dg". dsources, dq
/// and dg start from random values, so the check covers += . Needs a CUDA device.
std::vector<CheckRow> check_routing_backward(const RoutingShape& s, RoutingVersion v,
                                             unsigned seed);

/// Every version, forward and backward, on every shape of routing_check_shapes(). Throws
/// std::runtime_error when there is no CUDA device.
std::vector<CheckRow> check_routing(unsigned seed);

}  // namespace mhar::cuda

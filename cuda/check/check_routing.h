/**
 * @file check_routing.h
 * @ingroup cuda
 * @brief Every routing kernel version against the CPU reference, on fresh random inputs and
 *        awkward shapes: what `mhar-toy check` prints and what tests/cuda asserts.
 *
 * Tolerance: compare.h (a multiple of the float reference's own error).
 *
 * Plain C++ (compiled by g++): links mhar_reference (Eigen) and mhar_cuda.
 */
#pragma once

#include <string>
#include <vector>

#include "cuda/check/compare.h"
#include "cuda/routing.h"

namespace mhar::cuda {

/// One routing site's dimensions (docs/design.md §1 letters).
struct RoutingShape {
  int N = 1, P = 1, d = 1, H = 1;
};

/// "N=9 P=1000 d=256 H=4"
std::string describe(const RoutingShape& s);

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

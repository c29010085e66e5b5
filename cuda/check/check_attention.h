/**
 * @file check_attention.h
 * @ingroup cuda
 * @brief The attention twin (cuda/attention.h) against the CPU reference, on fresh random inputs
 *        and awkward shapes: what tests/cuda asserts.
 *
 * Tolerance (docs/style.md §7), as in check_routing.h and check_layers.h: truth is reference
 * attention_forward / attention_backward (reference/layers.cpp) in double on the same float
 * inputs; ref_f_err is the largest absolute error of the same reference run in float. A GPU
 * result passes when
 *     max |gpu − truth|  <=  8 · ref_f_err + 1e-6 · max |truth|
 * (compare.h says how the 8 and the 1e-6 were chosen). The backward reads the double
 * forward's probs, rounded to float, in all three runs.
 *
 * Plain C++ (compiled by g++): links mhar_reference (Eigen) and mhar_cuda.
 */
#pragma once

#include <string>
#include <vector>

#include "cuda/attention.h"
#include "cuda/check/check_routing.h"

namespace mhar::cuda {

/// The dimensions of one attention call (docs/design.md letters; cuda/attention.h).
struct AttentionShape {
  int B = 1;          ///< sequences
  int T = 1;          ///< tokens per sequence
  int n_head = 1;     ///< query heads, a multiple of n_kv_head
  int n_kv_head = 1;  ///< key/value heads
  int hd = 2;         ///< head width
};

/// "B=2 T=7 n_head=4 n_kv_head=2 hd=6"
std::string describe(const AttentionShape& s);

/// The awkward shapes: B = 1 and T = 1 (a single token), T odd, T > 32 and T > 64 (lanes loop
/// over keys), n_kv_head = 1 (multi-query) and n_kv_head = n_head (plain multi-head), G = 3,
/// hd = 2, hd odd, hd = 128 (four columns a lane), and a model-sized block.
std::vector<AttentionShape> attention_check_shapes();

// Each check poisons every output (all are written with `=`) with NaN before the launch, so an
// element the kernel does not write fails. Each needs a CUDA device. CheckRow::version is the
// kernel version's name ("rows", "gemm").

/// "attention forward out", "attention forward probs".
std::vector<CheckRow> check_attention_forward(const AttentionShape& s, unsigned seed,
                                              AttentionVersion version = AttentionVersion::Gemm);
/// "attention backward dq", "attention backward dk", "attention backward dv".
std::vector<CheckRow> check_attention_backward(const AttentionShape& s, unsigned seed,
                                               AttentionVersion version = AttentionVersion::Gemm);

/// Both checks, both versions, on every shape of attention_check_shapes(): 10 rows a shape. Throws
/// std::runtime_error when there is no CUDA device.
std::vector<CheckRow> check_attention(unsigned seed);

}  // namespace mhar::cuda

/**
 * @file known_bugs.h
 * @ingroup tools
 * @brief Hints for two bugs of a fused (online-softmax) routing forward that the tensor-by-tensor
 *        hints of verify.cpp would send elsewhere, recognised by what they compute.
 *
 * - **A running sum not rescaled** when the running max moves: acc ← acc + exp(z_i − m_i)·S_i
 *   instead of acc·exp(m_{i−1} − m_i) + exp(z_i − m_i)·S_i. α can still be right (it is
 *   recomputed at the end), and out = Σ_i α_i · exp(m_N − m_i) · S_i per head, where
 *   exp(m_N − m_i) = max_j α_j / max_{j≤i} α_j: computable from the true α and the sources.
 * - **A missing barrier** (a race): two runs of the same kernel on the same case give different
 *   bits. On a GPU that is the scheduler; on the CPU emulator (tests/emu) the threads of a block
 *   run in increasing order on one launch and decreasing on the next, so a candidate run twice,
 *   once in each order, shows it (`verify --repeat`).
 */
#pragma once

#include <string>
#include <vector>

#include "cases.h"

namespace mhar::verify {

/// out of case c as a forward that never rescales its running sum computes it (see above).
std::vector<double> out_without_rescale(const Case& c);

/// The hint when `out_got` failed and equals out_without_rescale within out's tolerance;
/// empty otherwise.
std::string missing_rescale_hint(const Case& c, const std::vector<double>& out_got);

/// The hint for a case whose two runs differ (`differ` says which tensors, how many elements).
std::string race_hint(const std::string& differ);

}  // namespace mhar::verify

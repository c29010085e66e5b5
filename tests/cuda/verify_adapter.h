/**
 * @file verify_adapter.h
 * @brief The project's own CUDA routing kernels (cuda/routing.h, every version) as a candidate of
 *        the verify kit (docs/verify.md): reads each case, runs the kernels, writes the results.
 *
 * The kernels have one convention (eps = kRoutingEps, scale 1, a gain, out = mix). The adapter
 * covers the others by composition, only where that is exact:
 *   scale s (a power of two)  pass s·q, and dq = s · (the kernel's dq)
 *   no gain                   pass g = 1, drop dg
 *   delta                     mix from the kernel; out = partial + gate·mix; the kernel's backward
 *                             gets dmix = gate·dout; dpartial = dout; dgate = Σ dout·mix
 *   bf16 / f16 inputs         exact as floats
 * A case it cannot serve (another eps, a scale that is not a power of two, a shape the version
 * does not support) gets a decline marker (verify.h decline_marker_name) instead of a results
 * file, so verify reports it as declined, never as a pass.
 */
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "cuda/routing.h"

namespace mhar::cuda::test {

/// A routing forward or backward with cuda/routing.h's signature (device pointers, version fixed).
using ForwardFn = std::function<void(float* out, float* alpha, const float* sources, const float* q,
                                     const float* g, int N, int P, int d, int H)>;
using BackwardFn = std::function<void(float* dsources, float* dq, float* dg, const float* dout,
                                      const float* out, const float* alpha, const float* sources,
                                      const float* q, const float* g, int N, int P, int d, int H)>;

/// A kernel candidate: its forward, its backward (empty: forward-only, writes out and alpha), and
/// the shapes it handles.
struct KernelCandidate {
  std::string name;
  ForwardFn forward;
  BackwardFn backward;
  std::function<bool(int d, int H)> supports;
};

/// Version v of the project's kernels as a candidate.
KernelCandidate project_kernels(RoutingVersion v);

struct AdapterRun {
  int served = 0;
  std::vector<std::pair<std::string, std::string>> not_served;  ///< case file, why not
};

/// Runs version v on every case of `cases`, writing `results`/<case file> (F32). Outputs are
/// poisoned (NaN) before the forward; the backward's accumulators start at zero.
AdapterRun run_kernel_candidate(const std::string& cases, const std::string& results,
                                const KernelCandidate& k);
/// run_kernel_candidate(cases, results, project_kernels(v)).
inline AdapterRun run_kernel_candidate(const std::string& cases, const std::string& results,
                                       RoutingVersion v) {
  return run_kernel_candidate(cases, results, project_kernels(v));
}

}  // namespace mhar::cuda::test

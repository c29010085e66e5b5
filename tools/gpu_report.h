/**
 * @file gpu_report.h
 * @ingroup tools
 * @brief The Markdown a user pastes into an issue or a pull request about their GPU: the card,
 *        the CUDA it runs under, the build, every check row, and the benchmarks, in the format of
 *        docs/gpu-results.md. Written by `mhar-toy check --report FILE`, and by the GPU
 *        self-check when it fails (gpu_selfcheck.h; without the benchmarks).
 *
 * Plain C++: it formats numbers measured elsewhere (cuda/check, cuda/bench), so it builds and is
 * tested without CUDA.
 */
#pragma once

#include <string>
#include <vector>

#include "cuda/bench/bench_routing.h"
#include "cuda/check/compare.h"
#include "cuda/device_info.h"

namespace mhar::toy {

/// One mode's training step in `bench step`'s terms.
struct StepTiming {
  std::string mode;   ///< "residual", "mhar", "mhar-warp"
  std::string heads;  ///< routing heads, "-" for residual
  double gpu_ms = 0;  ///< median GPU step
  double cpu_ms = 0;  ///< median CPU step at the same shape; 0 when not measured
};

/// A table of a report: its title ("tiny shape: N=9 P=2048 d=128 H=4") and rows.
template <typename Row>
struct Titled {
  std::string title;
  std::vector<Row> rows;
};

struct GpuReport {
  mhar::cuda::DeviceInfo device;
  std::string commit, flags;               ///< gpu_cache.h: build_commit(), build_flags()
  std::string command;                     ///< what wrote it: "mhar-toy check --report gpu.md"
  std::string date;                        ///< UTC, utc_now()
  double seconds = 0;                      ///< how long it took to make
  std::vector<mhar::cuda::CheckRow> rows;  ///< every comparison made
  std::string error;  ///< a CUDA error that stopped the comparisons ("" when none did)
  std::vector<Titled<mhar::cuda::BenchRow>> routing;  ///< `bench routing`, one table per shape
  std::vector<Titled<StepTiming>> steps;              ///< `bench step`, one table per shape
  std::vector<std::string> notes;                     ///< what could not be measured, and why
};

/// The comparison furthest over (or, when all pass, closest to) its tolerance: the row a verdict
/// names. rows must not be empty.
const mhar::cuda::CheckRow& worst_row(const std::vector<mhar::cuda::CheckRow>& rows);
/// The first comparison that failed, or rows.end(). The checks run kernels before whole steps,
/// so the first is the most specific: a wrong layer kernel fails its own row, then every step
/// row after it.
std::vector<mhar::cuda::CheckRow>::const_iterator first_failed(
    const std::vector<mhar::cuda::CheckRow>& rows);
/// worst_rel_err ÷ tolerance (∞ for a NaN).
double tolerance_ratio(const mhar::cuda::CheckRow& r);

/// The report as Markdown (docs/gpu-results.md, "Contributing your GPU's results").
std::string report_markdown(const GpuReport& r);

}  // namespace mhar::toy

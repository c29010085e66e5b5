/**
 * @file cli_bench.h
 * @ingroup tools
 * @brief What `mhar-toy check --report` (cli_check.cpp) takes from `mhar-toy bench`
 *        (cli_bench.cpp): the report's benchmarks. Everything else of bench stays in its file.
 */
#pragma once

#include "gpu_report.h"

namespace mhar::toy {

/// `check --report`'s benchmarks, added to r: `bench routing` at the tiny and (unless tiny_only)
/// the paper's 100M shape, the GPU step at the same shapes, and the tiny step on the CPU for
/// GPU ÷ CPU. A benchmark that fails (the 100M shape out of a small GPU's memory) becomes a note
/// in r instead of ending the report. Defined only in a CUDA build (MHAR_WITH_CUDA).
void report_benches(GpuReport& r, int repeats, bool tiny_only);

}  // namespace mhar::toy

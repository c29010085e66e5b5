/**
 * @file gpu_selfcheck.h
 * @ingroup tools
 * @brief The GPU self-check: before `train` or `bench step` trusts a GPU with a run, the kernels
 *        the run will use are compared with the CPU reference on that GPU, once per GPU,
 *        driver, CUDA runtime and build.
 *
 * What it compares (cuda/check/, the tolerance rule of compare.h), at shapes taken from the
 * run's own model with T ≤ 8 and two sequences: the routing versions the run uses (fused; and
 * warp where `bench step` times it), the layer twins (RMSNorm, RoPE, SwiGLU, embedding,
 * cross-entropy, AdamW, clipping), cuBLAS's matrix products (linear, MLP), attention, and one
 * whole training step (loss and every gradient) in the run's mode. A few seconds on a GPU.
 *
 * The verdict of a pass is cached (gpu_cache.h). A failure, or a CUDA error or kernel fault
 * during the check, is reported with the comparison that disagreed and by how much, and a report
 * in docs/gpu-results.md's format is written to the cache folder; then `--device auto` goes on
 * on the CPU and `--device cuda` stops with exit 1. Without a GPU none of this runs: no message,
 * no delay.
 */
#pragma once

#include <CLI/CLI.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "model.h"

namespace mhar::toy {

/// --recheck-gpu and --skip-gpu-check.
struct GpuCheckFlags {
  bool recheck = false;  ///< run the self-check even when a pass is cached
  bool skip = false;     ///< trust the GPU without checking it
};

/// Adds --recheck-gpu and --skip-gpu-check to `cmd` (train, bench).
void add_gpu_check_flags(CLI::App& cmd, GpuCheckFlags& flags);
/// Makes them the process's choice (as apply_cuda_sync does for --cuda-sync).
void apply_gpu_check_flags(const GpuCheckFlags& flags);

/// What a command will run on the GPU.
struct GpuWork {
  std::vector<Config> models;  ///< the models whose training step it takes
  bool warp = false;           ///< the Warp routing kernels run too (bench step's mhar-warp)
};

/// The self-check failed and --device cuda was asked: exit 1 (std::runtime_error's path).
class GpuCheckFailed : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/**
 * @brief pick_device(requested), and where that is the GPU, the self-check for `work` first
 *        (unless a pass is cached for this GPU, driver, runtime and build, or --skip-gpu-check).
 *
 * Returns "cuda", or "cpu" (a machine without a GPU; or --device auto after a failed check).
 * Progress and verdict lines go to stderr (none under `quiet` but a failure's). Throws
 * GpuCheckFailed for --device cuda after a failed check, and what pick_device throws.
 */
std::string pick_checked_device(const std::string& requested, const GpuWork& work, bool quiet);

}  // namespace mhar::toy

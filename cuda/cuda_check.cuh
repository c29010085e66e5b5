/**
 * @file cuda_check.cuh
 * @brief Internal to cuda/: turn a failed CUDA call into std::runtime_error with CUDA's message.
 */
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "device.h"

namespace mhar::cuda::detail {

/// True for the errors a kernel raises while it runs (7xx: illegal address, launch failure,
/// misaligned address, trap, …), as opposed to a refused launch (701: too many resources).
inline bool kernel_fault(cudaError_t status) {
  const int code = static_cast<int>(status);
  return code >= 700 && code < 800 && code != 701;
}

/// Throws std::runtime_error("<what>: <CUDA error name> (<CUDA error string>)") unless `status`
/// is cudaSuccess. A fault from inside a kernel, reported here without the debug switch, may
/// come from any kernel launched before: the message says so and how to find which.
inline void check(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  std::string message = std::string(what) + ": " + cudaGetErrorName(status) + " (" +
                        cudaGetErrorString(status) + ")";
  if (kernel_fault(status) && !sync_launches())
    message +=
        "; a fault inside a kernel surfaces at a later call, so it may come from an earlier "
        "kernel: rerun with MHAR_CUDA_SYNC=1 (or --cuda-sync) to have it named";
  throw std::runtime_error(message);
}

/// With sync_launches() on, waits for the work just launched (a kernel, a cuBLAS call) and,
/// if it faulted, throws naming `what`; otherwise nothing.
inline void sync_if_debugging(const char* what) {
  if (!sync_launches()) return;
  const cudaError_t status = cudaDeviceSynchronize();
  if (status != cudaSuccess)
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorName(status) + " (" +
                             cudaGetErrorString(status) +
                             "), raised while this kernel ran (MHAR_CUDA_SYNC: every launch is "
                             "synchronised and checked)");
}

/// Checks a kernel launch (bad configuration, too much shared memory, no device). With
/// sync_launches() on, also waits for the kernel and names it if it faulted.
inline void check_launch(const char* kernel) {
  check(cudaGetLastError(), kernel);
  sync_if_debugging(kernel);
}

}  // namespace mhar::cuda::detail

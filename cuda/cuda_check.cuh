/**
 * @file cuda_check.cuh
 * @brief Internal to cuda/: turn a failed CUDA call into std::runtime_error with CUDA's message.
 */
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace mhar::cuda::detail {

/// Throws std::runtime_error("<what>: <CUDA error string>") unless `status` is cudaSuccess.
inline void check(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  throw std::runtime_error(std::string(what) + ": " + cudaGetErrorName(status) + " (" +
                           cudaGetErrorString(status) + ")");
}

/// Checks a kernel launch (bad configuration, too much shared memory, no device).
inline void check_launch(const char* kernel) {
  check(cudaGetLastError(), kernel);
}

}  // namespace mhar::cuda::detail

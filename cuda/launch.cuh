/**
 * @file launch.cuh
 * @ingroup cuda
 * @brief Internal to cuda/ (layers.cu, optim.cu): grid sizes, grid-stride indices, warp and
 *        block sums in a fixed order, per-call scratch memory, and host-side argument checks.
 *
 * Every sum here runs in a fixed order (warp butterflies, a fixed tree), so a kernel built on
 * them gives the same bits on every run. routing.cu predates this header and keeps its own
 * copies of ceil_div, warp_sum and Scratch.
 */
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <utility>

#include "cuda_check.cuh"

namespace mhar::cuda::detail {

/// Threads per block of every kernel in layers.cu and optim.cu (block_sum assumes it).
inline constexpr int kThreads = 256;
/// Lanes per warp.
inline constexpr int kWarp = 32;

__host__ __device__ inline std::size_t ceil_div(std::size_t a, std::size_t b) {
  return (a + b - 1) / b;
}

/// Blocks of kThreads for a grid-stride loop over n items: one item per thread, capped at 2²⁰
/// blocks (the loop covers the rest). A function of n only, so the work split never changes.
inline unsigned grid_for(std::size_t n) {
  return static_cast<unsigned>(std::clamp<std::size_t>(ceil_div(n, kThreads), 1, 1u << 20));
}

/// Grid-stride loop: for (i = thread_index(); i < n; i += thread_stride()).
__device__ inline std::size_t thread_index() {
  return static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline std::size_t thread_stride() {
  return static_cast<std::size_t>(gridDim.x) * blockDim.x;
}

/// Sum over the 32 lanes of a warp (butterfly: every lane gets the same bits). All 32 lanes
/// must call it.
__device__ inline float warp_sum(float v) {
  for (int offset = kWarp / 2; offset > 0; offset >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

/// Maximum over the 32 lanes of a warp; all 32 lanes must call it.
__device__ inline float warp_max(float v) {
  for (int offset = kWarp / 2; offset > 0; offset >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

/// Sum of one double per thread over a block of exactly kThreads threads, as a fixed binary
/// tree in shared memory; every thread gets the result. Every thread of the block must call it.
__device__ inline double block_sum(double v) {
  __shared__ double buf[kThreads];
  buf[threadIdx.x] = v;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half >>= 1) {
    if (static_cast<int>(threadIdx.x) < half) buf[threadIdx.x] += buf[threadIdx.x + half];
    __syncthreads();
  }
  return buf[0];
}

/// Once per process: the default memory pool keeps what scratch buffers free instead of handing
/// it back to the driver at every synchronisation (release threshold: no limit), so a training
/// step's scratch is mapped once, not once a step. Where pools are not supported, nothing.
inline void keep_pool_memory() {
  static const bool done = [] {
    int device = 0;
    cudaMemPool_t pool;
    if (cudaGetDevice(&device) == cudaSuccess &&
        cudaDeviceGetDefaultMemPool(&pool, device) == cudaSuccess) {
      unsigned long long threshold = ~0ull;
      cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold);
    }
    cudaGetLastError();  // an unsupported pool is not an error here
    return true;
  }();
  (void)done;
}

/// `count` elements of device memory for one call, stream-ordered on the default stream (no
/// device-wide synchronisation); falls back to cudaMalloc where memory pools are unsupported.
template <typename T>
class Scratch {
 public:
  Scratch(std::size_t count, const char* where) {
    if (count == 0) return;
    keep_pool_memory();
    const std::size_t bytes = count * sizeof(T);
    void* p = nullptr;
    cudaError_t status = cudaMallocAsync(&p, bytes, 0);
    if (status == cudaErrorNotSupported) {
      cudaGetLastError();
      async_ = false;
      status = cudaMalloc(&p, bytes);
    }
    if (status != cudaSuccess) {
      cudaGetLastError();
      throw std::runtime_error(std::string(where) + ": scratch allocation of " +
                               std::to_string(bytes) +
                               " bytes failed: " + cudaGetErrorString(status));
    }
    ptr_ = static_cast<T*>(p);
  }
  ~Scratch() {
    if (!ptr_) return;
    if (async_)
      cudaFreeAsync(ptr_, 0);
    else
      cudaFree(ptr_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  T* get() const { return ptr_; }

 private:
  T* ptr_ = nullptr;
  bool async_ = true;
};

/// Throws std::invalid_argument("<where>: <message>") unless `ok`.
inline void require(bool ok, const char* where, const std::string& message) {
  if (!ok) throw std::invalid_argument(std::string(where) + ": " + message);
}

/// Throws std::invalid_argument unless value >= 1: "<where>: P = 0: <what> (P >= 1)".
inline void require_positive(const char* where, const char* name, long long value,
                             const char* what) {
  require(value >= 1, where,
          std::string(name) + " = " + std::to_string(value) + ": " + what + " (" + name + " >= 1)");
}

/// Throws std::invalid_argument naming the first null pointer.
inline void require_pointers(const char* where,
                             std::initializer_list<std::pair<const char*, const void*>> pointers) {
  for (const auto& [name, ptr] : pointers)
    require(ptr != nullptr, where, std::string(name) + " is a null pointer");
}

}  // namespace mhar::cuda::detail

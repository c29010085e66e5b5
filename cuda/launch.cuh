/**
 * @file launch.cuh
 * @ingroup cuda
 * @brief Internal to cuda/ (the kernel files): grid sizes, grid-stride indices, warp and
 *        block sums in a fixed order, per-call scratch memory, and host-side argument checks.
 *
 * Every sum here runs in a fixed order (warp butterflies, a fixed tree), so a kernel built on
 * them gives the same bits on every run.
 */
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>
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

/// Every scratch request is rounded up to a multiple of this many bytes, so that no two
/// buffers a pool carves out of one block share a 256-byte segment and every float4 (16 bytes)
/// stays inside its own buffer.
inline constexpr std::size_t kScratchRound = 256;

/// Per device, how scratch memory is allocated: from the device's memory pool
/// (cudaMallocAsync, stream-ordered, no device-wide synchronisation) or with plain cudaMalloc.
/// Decided once per device, at its first scratch buffer, from cudaDevAttrMemoryPoolsSupported
/// (a failed query counts as "not supported"), and kept; a pool that then refuses a request for
/// any reason but lack of memory (a sandboxed or virtualised driver) sends that device to
/// cudaMalloc for good.
class ScratchPolicy {
 public:
  static ScratchPolicy& get() {
    static ScratchPolicy policy;
    return policy;
  }
  /// True when `device` allocates scratch from its memory pool.
  bool uses_pool(int device) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto known = pool_.find(device);
    if (known != pool_.end()) return known->second;
    int supported = 0;
    const bool use = cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, device) ==
                         cudaSuccess &&
                     supported != 0;
    cudaGetLastError();  // a failed query is an answer ("no pools"), not an error
    if (use) keep_pool_memory(device);
    pool_[device] = use;
    return use;
  }
  /// From now on `device` allocates scratch with cudaMalloc.
  void avoid_pool(int device) {
    std::lock_guard<std::mutex> lock(mutex_);
    pool_[device] = false;
  }
  /// Forgets every device's choice (for tests: the emulator can change what it reports).
  void forget() {
    std::lock_guard<std::mutex> lock(mutex_);
    pool_.clear();
  }

 private:
  /// The pool keeps what scratch buffers free instead of handing it back to the driver at every
  /// synchronisation (release threshold: no limit), so a training step's scratch is mapped
  /// once, not once a step. Best effort: a refusal leaves the default threshold.
  static void keep_pool_memory(int device) {
    cudaMemPool_t pool;
    if (cudaDeviceGetDefaultMemPool(&pool, device) == cudaSuccess) {
      unsigned long long threshold = ~0ull;
      cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold);
    }
    cudaGetLastError();
  }

  std::mutex mutex_;
  std::map<int, bool> pool_;
};

/// `count` elements of device memory for one call, rounded up to kScratchRound bytes, from the
/// current device's pool or from cudaMalloc (ScratchPolicy). Throws std::runtime_error naming
/// `where` and the bytes when the allocation fails.
template <typename T>
class Scratch {
 public:
  Scratch(std::size_t count, const char* where) {
    if (count == 0) return;
    const std::size_t bytes = ceil_div(count * sizeof(T), kScratchRound) * kScratchRound;
    int device = 0;
    check(cudaGetDevice(&device), (std::string(where) + ": cudaGetDevice").c_str());
    ScratchPolicy& policy = ScratchPolicy::get();
    void* p = nullptr;
    cudaError_t status = cudaErrorMemoryAllocation;
    const char* how = "cudaMalloc";
    if (policy.uses_pool(device)) {
      status = cudaMallocAsync(&p, bytes, 0);
      how = "cudaMallocAsync";
      if (status != cudaSuccess && status != cudaErrorMemoryAllocation) {
        cudaGetLastError();
        policy.avoid_pool(device);
      } else {
        async_ = true;
      }
    }
    if (!async_) {
      status = cudaMalloc(&p, bytes);
      how = "cudaMalloc";
    }
    if (status != cudaSuccess) {
      cudaGetLastError();
      throw std::runtime_error(std::string(where) + ": scratch allocation of " +
                               std::to_string(bytes) + " bytes (" + how +
                               ") failed: " + cudaGetErrorString(status));
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
  bool async_ = false;
};

/// Throws std::runtime_error unless `ptr`, a buffer this code allocated itself (scratch), is a
/// multiple of `alignment` bytes: "<where>: scratch buffer <name> at 0x… is not 16-byte
/// aligned (<why>)". A kernel's float4 access to it would fault or read the wrong bytes.
inline void require_scratch_aligned(const char* where, const char* name, const void* ptr,
                                    std::size_t alignment, const char* why) {
  const auto at = reinterpret_cast<std::uintptr_t>(ptr);
  if (at % alignment == 0) return;
  char hex[32];
  std::snprintf(hex, sizeof hex, "%#llx", static_cast<unsigned long long>(at));
  throw std::runtime_error(std::string(where) + ": scratch buffer " + name + " at " + hex +
                           " is not " + std::to_string(alignment) + "-byte aligned (" + why + ")");
}

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

/// Throws std::invalid_argument naming the first pointer that is not a multiple of `bytes`:
/// "<where>: <name> is not 16-byte aligned (<why>)".
inline void require_aligned(const char* where, std::size_t bytes, const char* why,
                            std::initializer_list<std::pair<const char*, const void*>> pointers) {
  for (const auto& [name, ptr] : pointers)
    require(reinterpret_cast<std::uintptr_t>(ptr) % bytes == 0, where,
            std::string(name) + " is not " + std::to_string(bytes) + "-byte aligned (" + why + ")");
}

/// Turns a run-time value into a template argument: calls f(std::integral_constant<int, V>{})
/// for the V among Values that equals `value`, so a kernel templated on, say, its columns per
/// thread is launched as `with_constant<1, 2, 4, 8>(vpt, where, [&](auto V) { launch<V>(...); })`.
/// Throws std::logic_error naming `where` when no V matches (a layout function and its list of
/// compiled kernels disagree).
template <int... Values, typename F>
void with_constant(int value, const char* where, F&& f) {
  const bool found =
      ((value == Values ? (f(std::integral_constant<int, Values>{}), true) : false) || ...);
  if (!found)
    throw std::logic_error(std::string(where) + ": no kernel compiled for " +
                           std::to_string(value));
}

}  // namespace mhar::cuda::detail

/**
 * @file routing_shared.cu
 * @brief What the routing versions share (routing_versions.h): the dq, dg reduction of the
 *        per-team partial sums in a fixed order, the size of one wave of blocks, and the shapes
 *        the Warp version handles.
 */
#include <cuda_runtime.h>

#include <cstddef>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>

#include "launch.cuh"
#include "routing.h"
#include "routing_versions.h"

namespace mhar::cuda::routing_detail {

namespace {

using detail::ceil_div;
using detail::check;
using detail::check_launch;

/// Rows summed in parallel per column by reduce_columns.
constexpr int kReduceRows = 8;

/// dq_c += g_c · Σ_rows partial[row, c];  dg_c += q_c · Σ_rows partial[row, c].
/// Block (32, kReduceRows): thread (x, y) sums rows y, y + 8, … of column c; thread y = 0 then
/// adds the 8 sums in order. partial: rows × d.
__global__ void reduce_columns(float* __restrict__ dq, float* __restrict__ dg,
                               const float* __restrict__ partial, int rows,
                               const float* __restrict__ q, const float* __restrict__ g, int d) {
  __shared__ float sums[kReduceRows][32];
  const int c = blockIdx.x * 32 + threadIdx.x;
  float s = 0.f;
  if (c < d)
    for (int row = threadIdx.y; row < rows; row += kReduceRows)
      s += partial[static_cast<std::size_t>(row) * d + c];
  sums[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < d) {
    float total = 0.f;
    for (int y = 0; y < kReduceRows; ++y) total += sums[y][threadIdx.x];
    dq[c] += g[c] * total;
    dg[c] += q[c] * total;
  }
}

}  // namespace

void launch_reduce_columns(float* dq, float* dg, const float* partial, int rows, const float* q,
                           const float* g, int d) {
  const dim3 block(32, kReduceRows);
  reduce_columns<<<static_cast<unsigned>(ceil_div(d, 32)), block>>>(dq, dg, partial, rows, q, g, d);
  check_launch("routing: reduce_columns launch");
}

/// Blocks of `kernel` (with `threads` threads and `smem` bytes of shared memory) that fit on
/// the current device at once: the SM count × the occupancy calculator's blocks per SM, asked
/// once per (device, kernel, threads, smem) and kept, since a backward call would otherwise
/// repeat both queries every time. Throws when not even one block fits.
int blocks_per_wave(const void* kernel, int threads, std::size_t smem, const char* where) {
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  using Key = std::tuple<int, const void*, int, std::size_t>;
  static std::mutex mutex;
  static std::map<Key, int> known;
  const Key key{device, kernel, threads, smem};
  {
    std::lock_guard<std::mutex> lock(mutex);
    const auto it = known.find(key);
    if (it != known.end()) return it->second;
  }
  int sms = 0, per_sm = 0;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
        "cudaDeviceGetAttribute(MultiProcessorCount)");
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem),
        "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  if (per_sm < 1)
    throw std::runtime_error(std::string(where) + ": a block of " + std::to_string(threads) +
                             " threads and " + std::to_string(smem) +
                             " bytes of shared memory does not fit on this device");
  std::lock_guard<std::mutex> lock(mutex);
  known[key] = per_sm * sms;
  return per_sm * sms;
}

bool warp_supports(int d, int H) {
  if (d < 1 || H < 1 || d % H != 0 || d > kWarpMaxWidth) return false;
  const int K = d / H;
  if (K % 4 != 0) return false;
  if (K % 128 == 0) return true;
  const int lanes = K / 4;  // lanes per head in a chunk: a power of two below 32
  return lanes < 32 && (lanes & (lanes - 1)) == 0;
}

}  // namespace mhar::cuda::routing_detail

/**
 * @file bench_routing.cu
 * @brief bench_routing.h: cudaEvent timing of a plain copy kernel and of every routing version.
 */
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>

#include "cuda/bench/bench_routing.h"
#include "cuda/device.h"
#include "cuda/launch.cuh"
#include "cuda/routing.h"

namespace mhar::cuda {

namespace {

using detail::check;
using detail::check_launch;
using detail::grid_for;
using detail::kThreads;
using detail::thread_index;
using detail::thread_stride;

/// x[i] = lo + (hi − lo) · u(seed, i), u a hash of the index in [0, 1): no host round trip.
__global__ void fill_uniform(float* x, std::size_t n, std::uint32_t seed, float lo, float hi) {
  for (std::size_t i = thread_index(); i < n; i += thread_stride()) {
    std::uint32_t h =
        static_cast<std::uint32_t>(i) * 0x9E3779B9u ^ static_cast<std::uint32_t>(i >> 32) ^ seed;
    h ^= h >> 16;
    h *= 0x7FEB352Du;
    h ^= h >> 15;
    h *= 0x846CA68Bu;
    h ^= h >> 16;
    x[i] = lo + (hi - lo) * static_cast<float>(h >> 8) * (1.0f / 16777216.0f);
  }
}

/// The bandwidth yardstick: dst = src, float4 at a time (cudaMalloc memory is 256-byte aligned).
__global__ void copy_kernel(float4* __restrict__ dst, const float4* __restrict__ src,
                            std::size_t n4) {
  for (std::size_t i = thread_index(); i < n4; i += thread_stride()) dst[i] = src[i];
}

/// The 0–3 floats past the last whole float4.
__global__ void copy_tail(float* __restrict__ dst, const float* __restrict__ src, std::size_t from,
                          std::size_t n) {
  const std::size_t i = from + threadIdx.x;
  if (i < n) dst[i] = src[i];
}

void fill(DeviceBuffer& b, std::uint32_t seed, float lo, float hi) {
  fill_uniform<<<grid_for(b.size()), kThreads>>>(b.data(), b.size(), seed, lo, hi);
  check_launch("bench_routing: fill_uniform launch");
}

/// A cudaEvent that destroys itself.
class Event {
 public:
  Event() { check(cudaEventCreate(&e_), "cudaEventCreate"); }
  ~Event() { cudaEventDestroy(e_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_{};
};

/// Mean milliseconds of one call of `run`, after one warm-up call.
double time_ms(const std::function<void()>& run, int repeats) {
  run();
  Event start, stop;
  check(cudaEventRecord(start.get()), "cudaEventRecord");
  for (int r = 0; r < repeats; ++r) run();
  check(cudaEventRecord(stop.get()), "cudaEventRecord");
  check(cudaEventSynchronize(stop.get()), "cudaEventSynchronize");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, start.get(), stop.get()), "cudaEventElapsedTime");
  return static_cast<double>(ms) / repeats;
}

BenchRow row(const std::string& op, const std::string& version, double ms, double bytes,
             double copy_gbps) {
  BenchRow r{op, version, ms, bytes, bytes / (ms * 1e-3) / 1e9, 0};
  r.pct_copy = copy_gbps > 0 ? 100.0 * r.gbps / copy_gbps : 0;
  return r;
}

}  // namespace

double routing_forward_bytes(int N, int P, int d, int H) {
  const double NP = static_cast<double>(N) * P;
  return 4.0 * (NP * d + static_cast<double>(P) * d + NP * H);
}

double routing_backward_bytes(int N, int P, int d, int H) {
  const double NP = static_cast<double>(N) * P;
  return 4.0 * (3.0 * NP * d + 2.0 * static_cast<double>(P) * d + NP * H);
}

std::vector<BenchRow> bench_routing(int N, int P, int d, int H, int repeats) {
  if (N < 1 || P < 1 || d < 1 || H < 1 || d % H != 0 || repeats < 1)
    throw std::invalid_argument(
        "bench_routing: need N, P, d >= 1, H dividing d and repeats >= 1; got N = " +
        std::to_string(N) + ", P = " + std::to_string(P) + ", d = " + std::to_string(d) +
        ", H = " + std::to_string(H) + ", repeats = " + std::to_string(repeats));
  std::string why;
  if (device_count(&why) == 0)
    throw std::runtime_error("bench_routing: no CUDA device (" + why + ")");

  const std::size_t NPd = static_cast<std::size_t>(N) * P * d;
  const std::size_t Pd = static_cast<std::size_t>(P) * d;
  DeviceBuffer sources(NPd), dsources(NPd), out(Pd), dout(Pd),
      alpha(static_cast<std::size_t>(N) * P * H), q(d), g(d), dq(d), dg(d);
  const int K = d / H;
  fill(sources, 1, -1.f, 1.f);
  fill(dsources, 2, -1.f, 1.f);
  fill(dout, 3, -1.f, 1.f);
  // Logits of order one: q ~ U(−2/√K, 2/√K), so a head's sum over its K columns is O(1).
  const float qmax = 2.0f / std::sqrt(static_cast<float>(K));
  fill(q, 4, -qmax, qmax);
  fill(g, 5, 0.5f, 1.5f);
  fill(dq, 6, -1.f, 1.f);
  fill(dg, 7, -1.f, 1.f);

  std::vector<BenchRow> rows;
  // Copy: sources → dsources (dsources is refilled below before it is used as a gradient).
  const std::size_t n4 = NPd / 4;
  const double copy_bytes = 2.0 * 4.0 * static_cast<double>(NPd);
  const double copy_ms = time_ms(
      [&] {
        if (n4 > 0) {
          copy_kernel<<<grid_for(n4), kThreads>>>(reinterpret_cast<float4*>(dsources.data()),
                                                  reinterpret_cast<const float4*>(sources.data()),
                                                  n4);
          check_launch("bench_routing: copy_kernel launch");
        }
        if (NPd % 4 != 0) {
          copy_tail<<<1, 4>>>(dsources.data(), sources.data(), n4 * 4, NPd);
          check_launch("bench_routing: copy_tail launch");
        }
      },
      repeats);
  const double copy_gbps = copy_bytes / (copy_ms * 1e-3) / 1e9;
  rows.push_back({"copy", "kernel", copy_ms, copy_bytes, copy_gbps, 100.0});
  fill(dsources, 2, -1.f, 1.f);

  // Every version the shape allows; where the fused kernels take four columns a thread and the
  // build has it, the fused version a second time under __launch_bounds__(512, 1).
  struct Variant {
    RoutingVersion v;
    FusedBounds bounds;
    std::string name;
  };
  std::vector<Variant> variants;
  for (RoutingVersion v : kRoutingVersions) {
    if (!version_supports(v, d, H)) continue;
    variants.push_back({v, FusedBounds::Default, version_name(v)});
    if (v == RoutingVersion::Fused && fused4_applies(d) && fused4_one_block_built())
      variants.push_back({v, FusedBounds::OneBlockPerSM, kFusedOneBlockName});
  }
  const FusedBounds chosen = fused4_bounds();
  for (const Variant& x : variants) {
    set_fused4_bounds(x.bounds);
    const double ms = time_ms(
        [&] {
          routing_forward(out.data(), alpha.data(), sources.data(), q.data(), g.data(), N, P, d, H,
                          x.v);
        },
        repeats);
    rows.push_back(row("forward", x.name, ms, routing_forward_bytes(N, P, d, H), copy_gbps));
  }
  // The backward reads the forward's out and α (from the last version timed: any is correct).
  for (const Variant& x : variants) {
    set_fused4_bounds(x.bounds);
    const double ms = time_ms(
        [&] {
          routing_backward(dsources.data(), dq.data(), dg.data(), dout.data(), out.data(),
                           alpha.data(), sources.data(), q.data(), g.data(), N, P, d, H, x.v);
        },
        repeats);
    rows.push_back(row("backward", x.name, ms, routing_backward_bytes(N, P, d, H), copy_gbps));
  }
  set_fused4_bounds(chosen);
  synchronize();
  return rows;
}

}  // namespace mhar::cuda

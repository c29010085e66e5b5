/**
 * @file test_preflight.cpp
 * @brief What a GPU would exercise before anything else, checked on the emulator, which can be
 *        made to behave like an unusual driver (include/cuda_runtime.h): scratch memory from
 *        the pool or from cudaMalloc, decided per device; every request rounded up to 256 bytes;
 *        a misaligned float4 buffer refused by name; and the MHAR_CUDA_SYNC switch naming the
 *        kernel that faulted, where without it the fault surfaces under a later call's name.
 *
 * Emulator only: these cases set the emulator's knobs (mhar_emu::machine()), which a GPU lacks.
 */
#include <cuda_runtime.h>

#include <catch2/catch.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/check/check_routing.h"
#include "cuda/cuda_check.cuh"
#include "cuda/device.h"
#include "cuda/launch.cuh"
#include "cuda/routing.h"
#include "tensor.h"

using Catch::Matchers::Contains;
using mhar::cuda::DeviceBuffer;
using mhar::cuda::RoutingShape;
using mhar::cuda::RoutingVersion;
using mhar::cuda::detail::Scratch;
using mhar::cuda::detail::ScratchPolicy;

namespace {

/// Sets the emulator's memory-pool behaviour and makes the allocator decide again, as it would
/// in a new process on such a device. Restores the ordinary behaviour when it goes.
struct PoolDriver {
  PoolDriver(int supported, bool refuses, std::size_t misalign = 0) {
    mhar_emu::Machine& m = mhar_emu::machine();
    m.pools_supported = supported;
    m.pool_refuses = refuses;
    m.pool_misalign = misalign;
    ScratchPolicy::get().forget();
  }
  ~PoolDriver() {
    mhar_emu::Machine& m = mhar_emu::machine();
    m.pools_supported = 1;
    m.pool_refuses = false;
    m.pool_misalign = 0;
    ScratchPolicy::get().forget();
  }
  PoolDriver(const PoolDriver&) = delete;
  PoolDriver& operator=(const PoolDriver&) = delete;
};

/// cudaMallocAsync and cudaMalloc calls made while `f` runs.
template <typename F>
std::pair<long, long> allocations(F&& f) {
  const mhar_emu::Machine& m = mhar_emu::machine();
  const long async0 = m.malloc_async_calls, plain0 = m.malloc_calls;
  f();
  return {m.malloc_async_calls - async0, m.malloc_calls - plain0};
}

/// The warp routing backward (float4 loads, a float4 scratch buffer) against the reference.
void routing_backward_matches() {
  const RoutingShape shape{3, 37, 128, 4};
  for (const auto& r : mhar::cuda::check_routing_backward(shape, RoutingVersion::Warp, 7)) {
    INFO(mhar::cuda::format_check_row(r));
    CHECK(r.pass);
  }
}

// Test-only kernels, written as translate.cmake leaves a .cu file.
__global__ void faulting_kernel(float* out) {
  if (threadIdx.x == 5) __trap();
  out[threadIdx.x] = 1.f;
}
__global__ void next_kernel(float* out) {
  out[threadIdx.x] = 2.f;
}

}  // namespace

TEST_CASE("scratch comes from the pool where the device reports pools", "[emulator][preflight]") {
  PoolDriver driver(1, false);
  const auto [async, plain] = allocations([] {
    Scratch<float> a(10, "test");
    Scratch<float> b(10, "test");
    CHECK(a.get() != nullptr);
  });
  CHECK(async == 2);
  CHECK(plain == 0);
  routing_backward_matches();
}

TEST_CASE("scratch comes from cudaMalloc where the device reports no pools, never tried",
          "[emulator][preflight]") {
  PoolDriver driver(0, false);
  const auto [async, plain] = allocations([] {
    Scratch<float> a(10, "test");
    Scratch<double> b(3, "test");
    CHECK(a.get() != nullptr);
  });
  CHECK(async == 0);  // decided from cudaDevAttrMemoryPoolsSupported, not by a failed call
  CHECK(plain == 2);
  routing_backward_matches();
}

TEST_CASE("a pool that refuses (not for lack of memory) sends the device to cudaMalloc for good",
          "[emulator][preflight]") {
  PoolDriver driver(1, true);  // claims pools, then refuses with cudaErrorNotPermitted
  const auto first = allocations([] { Scratch<float> a(10, "test"); });
  CHECK(first.first == 1);  // tried once
  CHECK(first.second == 1);
  const auto later = allocations([] { Scratch<float> a(10, "test"); });
  CHECK(later.first == 0);  // the choice is kept
  CHECK(later.second == 1);
  routing_backward_matches();
}

TEST_CASE("the choice is made once per device, then kept", "[emulator][preflight]") {
  PoolDriver driver(1, false);
  const long queries = mhar_emu::machine().pool_queries;
  for (int k = 0; k < 3; ++k) Scratch<float> a(1, "test");
  CHECK(mhar_emu::machine().pool_queries == queries + 1);
}

TEST_CASE("every scratch request is rounded up to 256 bytes", "[emulator][preflight]") {
  PoolDriver driver(1, false);
  // What the code asks the allocator for (the emulator's malloc would space buffers anyway).
  for (const auto& [count, bytes] :
       std::vector<std::pair<std::size_t, std::size_t>>{{1, 256}, {64, 256}, {65, 512}, {200, 1024}}) {
    CAPTURE(count);
    Scratch<float> s(count, "test");
    CHECK(mhar_emu::machine().last_alloc_bytes == bytes);
  }
  Scratch<double> d(33, "test");  // 264 bytes
  CHECK(mhar_emu::machine().last_alloc_bytes == 512);
}

TEST_CASE("a misaligned float4 buffer is refused by name, and nothing is written",
          "[emulator][preflight]") {
  const int N = 3, P = 37, d = 128, H = 4;
  mhar::Rng rng(3);
  auto random = [&](std::size_t n) {
    std::vector<float> v(n);
    for (auto& x : v) x = static_cast<float>(rng.normal(0, 1));
    return v;
  };
  const std::size_t NPd = static_cast<std::size_t>(N) * P * d, Pd = static_cast<std::size_t>(P) * d;
  const std::vector<float> h_sources = random(NPd), h_dsources = random(NPd);
  DeviceBuffer sources(h_sources), dsources(h_dsources), out(random(Pd)), dout(random(Pd)),
      alpha(random(static_cast<std::size_t>(N) * P * H)), q(random(d)), g(random(d)),
      dq(random(d)), dg(random(d));
  SECTION("the warp backward's partial sums, when the pool hands out a misaligned block") {
    PoolDriver driver(1, false, 4);  // cudaMallocAsync returns 4 bytes past a 16-byte boundary
    CHECK_THROWS_WITH(
        mhar::cuda::routing_backward(dsources.data(), dq.data(), dg.data(), dout.data(),
                                     out.data(), alpha.data(), sources.data(), q.data(), g.data(),
                                     N, P, d, H, RoutingVersion::Warp),
        Contains("routing_backward (warp): scratch buffer partial at 0x") &&
            Contains("is not 16-byte aligned (the warp kernel stores float4 into it)"));
    CHECK(dsources.download() == h_dsources);
  }
  SECTION("a caller's pointer") {
    CHECK_THROWS_WITH(
        mhar::cuda::routing_backward(dsources.data(), dq.data(), dg.data(), dout.data(),
                                     out.data(), alpha.data(), sources.data() + 1, q.data(),
                                     g.data(), N, P - 1, d, H, RoutingVersion::Warp),
        Contains("sources is not 16-byte aligned (the warp kernels load float4; use "
                 "RoutingVersion::Fused)"));
    CHECK(dsources.download() == h_dsources);
  }
}

TEST_CASE("without MHAR_CUDA_SYNC a kernel's fault surfaces under a later call's name",
          "[emulator][preflight]") {
  using mhar::cuda::detail::check_launch;
  mhar::cuda::set_sync_launches(false);
  float* out = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&out), 32 * sizeof(float)) == cudaSuccess);
  mhar_emu::launch(faulting_kernel, mhar_emu::Config(1, 32))(out);
  CHECK_NOTHROW(check_launch("faulting_kernel launch"));  // the kernel "still runs"
  mhar_emu::launch(next_kernel, mhar_emu::Config(1, 32))(out);
  CHECK_THROWS_WITH(check_launch("next_kernel launch"),
                    Contains("next_kernel launch: cudaErrorLaunchFailure") &&
                        Contains("rerun with MHAR_CUDA_SYNC=1"));
  CHECK_THROWS_WITH(mhar::cuda::synchronize(), Contains("cudaErrorLaunchFailure"));  // sticky
  mhar_emu::clear_fault();
  cudaFree(out);
}

TEST_CASE("with MHAR_CUDA_SYNC the faulting kernel is named", "[emulator][preflight]") {
  using mhar::cuda::detail::check_launch;
  mhar::cuda::set_sync_launches(true);
  float* out = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&out), 32 * sizeof(float)) == cudaSuccess);
  SECTION("a test kernel that traps") {
    mhar_emu::launch(faulting_kernel, mhar_emu::Config(1, 32))(out);
    CHECK_THROWS_WITH(check_launch("faulting_kernel launch"),
                      Contains("faulting_kernel launch: cudaErrorLaunchFailure") &&
                          Contains("raised while this kernel ran"));
  }
  SECTION("a project kernel: the second launch of the naive forward faults") {
    const int N = 2, P = 5, d = 8, H = 2;
    DeviceBuffer o(static_cast<std::size_t>(P) * d), a(static_cast<std::size_t>(N) * P * H),
        s(std::vector<float>(static_cast<std::size_t>(N) * P * d, 0.5f)),
        q(std::vector<float>(d, 0.1f)), g(std::vector<float>(d, 1.f));
    mhar_emu::machine().fault_launch = mhar_emu::machine().launches + 2;
    CHECK_THROWS_WITH(mhar::cuda::routing_forward(o.data(), a.data(), s.data(), q.data(),
                                                  g.data(), N, P, d, H, RoutingVersion::Naive),
                      Contains("routing_forward (naive): logits_naive launch: "
                               "cudaErrorLaunchFailure"));
    mhar_emu::machine().fault_launch = 0;
  }
  SECTION("the fused forward's __launch_bounds__(512, 1) variant, when selected") {
    REQUIRE(mhar::cuda::fused4_one_block_built());
    const int N = 2, P = 5, d = 128, H = 4;
    DeviceBuffer o(static_cast<std::size_t>(P) * d), a(static_cast<std::size_t>(N) * P * H),
        s(std::vector<float>(static_cast<std::size_t>(N) * P * d, 0.5f)),
        q(std::vector<float>(d, 0.1f)), g(std::vector<float>(d, 1.f));
    mhar::cuda::set_fused4_bounds(mhar::cuda::FusedBounds::OneBlockPerSM);
    mhar_emu::machine().fault_launch = mhar_emu::machine().launches + 1;
    CHECK_THROWS_WITH(mhar::cuda::routing_forward(o.data(), a.data(), s.data(), q.data(),
                                                  g.data(), N, P, d, H, RoutingVersion::Fused),
                      Contains("routing_forward (fused): routing_forward_fused "
                               "__launch_bounds__(512, 1) launch: cudaErrorLaunchFailure"));
    mhar_emu::machine().fault_launch = 0;
    mhar::cuda::set_fused4_bounds(mhar::cuda::FusedBounds::Default);
  }
  mhar_emu::clear_fault();
  mhar::cuda::set_sync_launches(false);
  cudaFree(out);
}

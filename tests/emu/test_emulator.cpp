/**
 * @file test_emulator.cpp
 * @brief The emulator's own promises (include/cuda_runtime.h): barriers order the threads of a
 *        block, shuffles exchange lanes, launches the hardware refuses are refused, shared
 *        (dynamic, and static in every block) and allocated memory start as NaN, and a barrier
 *        that cannot complete aborts. Without these,
 *        a green "emu:" test would say little.
 */
#include <cuda_runtime.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <csignal>
#include <vector>

// The kernels below are written as translate.cmake leaves a .cu file: launches through
// mhar_emu::launch, the dynamic shared array through mhar_emu::dynamic_shared.
namespace {

// Each thread writes its index to shared memory, waits, then reads its neighbour's: correct only
// if every write happened before every read.
__global__ void rotate(float* out, int n) {
  float* smem = mhar_emu::dynamic_shared<float>();  // translate.cmake's `extern __shared__`
  const int t = static_cast<int>(threadIdx.x);
  smem[t] = static_cast<float>(t + 100 * static_cast<int>(blockIdx.x));
  __syncthreads();
  out[blockIdx.x * n + t] = smem[(t + 1) % n];
}

// The same without the barrier: in one of the two thread orders a read comes before the write.
__global__ void rotate_racy(float* out, int n) {
  float* smem = mhar_emu::dynamic_shared<float>();  // translate.cmake's `extern __shared__`
  const int t = static_cast<int>(threadIdx.x);
  smem[t] = static_cast<float>(t);
  out[t] = smem[(t + 1) % n];
}

// Butterfly sum over each warp: every lane ends with the warp's total.
__global__ void warp_total(float* out) {
  float v = static_cast<float>(threadIdx.x);
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  out[threadIdx.x] = v;
}

// Block 0 writes its static shared array; every block then reads its own. translate.cmake turns
// `__shared__ float cells[32];` into the line below.
__global__ void static_shared_per_block(float* out) {
  auto& cells = mhar_emu::static_shared<float[32]>([] {});
  if (blockIdx.x == 0) cells[threadIdx.x] = 7.f;
  __syncthreads();
  out[blockIdx.x * 32 + threadIdx.x] = cells[threadIdx.x];
}

__global__ void read_shared(float* out) {
  float* smem = mhar_emu::dynamic_shared<float>();  // translate.cmake's `extern __shared__`
  out[threadIdx.x] = smem[threadIdx.x];
}

// Half of the block returns before a barrier the other half waits at.
__global__ void half_return(float* out) {
  if (threadIdx.x < 16) return;
  __syncthreads();
  out[threadIdx.x] = 1.f;
}

__global__ void nothing(float*) {}

template <typename... Args>
void launch(void (*kernel)(Args...), dim3 grid, dim3 block, std::size_t smem, Args... args) {
  mhar_emu::launch(kernel, mhar_emu::Config(grid, block, smem))(args...);
}

}  // namespace

TEST_CASE("a barrier orders every write of the block before every read", "[emulator]") {
  const int n = 64, blocks = 3;
  std::vector<float> out(static_cast<std::size_t>(n) * blocks, -1.f);
  // Run twice: once with the threads in increasing order, once in decreasing order.
  for (int run = 0; run < 2; ++run) {
    launch(rotate, dim3(blocks), dim3(n), n * sizeof(float), out.data(), n);
    REQUIRE(cudaGetLastError() == cudaSuccess);
    for (int b = 0; b < blocks; ++b)
      for (int t = 0; t < n; ++t)
        CHECK(out[static_cast<std::size_t>(b * n + t)] ==
              static_cast<float>((t + 1) % n + 100 * b));
  }
}

TEST_CASE("a missing barrier shows: a read before the write finds NaN", "[emulator]") {
  const int n = 32;
  int runs_with_nan = 0;
  for (int run = 0; run < 2; ++run) {
    std::vector<float> out(n, 0.f);
    launch(rotate_racy, dim3(1), dim3(n), n * sizeof(float), out.data(), n);
    bool nan = false;
    for (float x : out) nan = nan || std::isnan(x);
    runs_with_nan += nan ? 1 : 0;
  }
  CHECK(runs_with_nan >= 1);
}

TEST_CASE("__shfl_xor_sync exchanges lanes within each warp", "[emulator]") {
  std::vector<float> out(64, 0.f);
  launch(warp_total, dim3(1), dim3(64), 0, out.data());
  for (int t = 0; t < 64; ++t) CHECK(out[static_cast<std::size_t>(t)] == (t < 32 ? 496.f : 1520.f));
}

TEST_CASE("shared and cudaMalloc'd memory start as NaN", "[emulator]") {
  std::vector<float> out(32, 0.f);
  launch(read_shared, dim3(1), dim3(32), 32 * sizeof(float), out.data());
  for (float x : out) CHECK(std::isnan(x));
  void* p = nullptr;
  REQUIRE(cudaMalloc(&p, 16 * sizeof(float)) == cudaSuccess);
  CHECK(std::isnan(static_cast<float*>(p)[7]));
  cudaFree(p);
}

TEST_CASE("static shared memory starts as NaN in every block", "[emulator]") {
  // Twice: the second launch must not see the first one's writes either.
  for (int run = 0; run < 2; ++run) {
    std::vector<float> out(3 * 32, 0.f);
    launch(static_shared_per_block, dim3(3), dim3(32), 0, out.data());
    REQUIRE(cudaGetLastError() == cudaSuccess);
    for (int t = 0; t < 32; ++t) {
      CAPTURE(run, t);
      CHECK(out[static_cast<std::size_t>(t)] == 7.f);            // block 0 wrote it
      CHECK(std::isnan(out[static_cast<std::size_t>(32 + t)]));  // blocks 1 and 2 did not
      CHECK(std::isnan(out[static_cast<std::size_t>(64 + t)]));
    }
  }
}

TEST_CASE("launches the hardware refuses are refused, as cudaGetLastError says", "[emulator]") {
  float x = 0.f;
  launch(nothing, dim3(1), dim3(1025), 0, &x);
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  CHECK(cudaGetLastError() == cudaSuccess);  // not sticky, as on a GPU
  launch(nothing, dim3(1, 70000), dim3(32), 0, &x);
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  launch(nothing, dim3(1), dim3(32), 49 * 1024, &x);  // above 48 KiB without opting in
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  REQUIRE(cudaFuncSetAttribute(nothing, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024) ==
          cudaSuccess);
  launch(nothing, dim3(1), dim3(32), 49 * 1024, &x);
  CHECK(cudaGetLastError() == cudaSuccess);
  CHECK(cudaFuncSetAttribute(nothing, cudaFuncAttributeMaxDynamicSharedMemorySize, 300 * 1024) ==
        cudaErrorInvalidValue);
}

TEST_CASE("a barrier some threads never reach aborts with a deadlock report", "[emulator]") {
  // In a child process: the emulator aborts, as a GPU would hang.
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    std::freopen("/dev/null", "w", stderr);
    std::vector<float> out(32, 0.f);
    launch(half_return, dim3(1), dim3(32), 0, out.data());
    std::_Exit(0);
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGABRT);
}

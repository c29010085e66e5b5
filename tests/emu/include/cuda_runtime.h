/**
 * @file cuda_runtime.h (emulator)
 * @brief A CPU stand-in for the CUDA runtime, so that the kernels of the .cu files in cuda/ run
 * unchanged on a machine without a GPU (tests/emu/README.md).
 *
 * What it emulates, and how:
 * - A launch `kernel<<<grid, block, smem>>>(args)` (rewritten by translate.cmake into
 *   `mhar_emu::launch(kernel, mhar_emu::Config(grid, block, smem))(args)`) runs the grid's blocks
 *   one after another. The threads of a block are fibers on one OS thread (a dozen instructions
 *   switch between them on x86-64, fiber.cpp; ucontext elsewhere): each runs
 *   until it reaches a barrier or returns, then the next one runs. Everything is deterministic.
 * - `__syncthreads()` waits for every thread of the block; `__shfl_xor_sync` and `__syncwarp` for
 *   every lane of the warp (32 threads). A barrier that can never complete (a thread returned, or
 *   took another branch) is reported as a deadlock and aborts: on a GPU it would hang or be
 *   undefined behaviour.
 * - Shared memory, dynamic (`extern __shared__`) and static (`__shared__ float s[8][32]`), is
 *   filled with NaN before each block, and cudaMalloc'd memory too, so a read before a write
 *   shows up as NaN in the result, and nothing carries over from one block to the next.
 * - The threads of a block run in increasing order on even launches and in decreasing order on
 *   odd ones: a missing barrier between a write by one thread and a read by another then reads
 *   NaN or a stale value in one of the two orders.
 * - A launch the hardware would refuse (more than 1024 threads, a grid too large, dynamic shared
 *   memory above 48 KiB without opting in, or above the Hopper opt-in limit) is not run; the next
 *   cudaGetLastError() returns cudaErrorInvalidConfiguration, as on a GPU.
 * - A fault inside a kernel (`__trap()`, or the launch numbered MHAR_EMU_FAULT_LAUNCH in the
 *   environment, counting from 1) stops that launch and behaves as on a GPU, where the kernel is
 *   still running when its launch returns: the launch itself reports success, the fault
 *   (cudaErrorLaunchFailure) surfaces at the next launch or synchronising call (cudaMemcpy,
 *   cudaDeviceSynchronize, …), and from then on it is sticky: every call returns it, no kernel
 *   runs. Only mhar_emu::clear_fault() (a test hook; on a GPU, a new process) ends it.
 * - A wrong kernel, planted for the GPU self-check's tests (tools/gpu_selfcheck.h): with
 *   MHAR_EMU_WRONG_KERNEL=<name> in the environment, every launch of the kernel of that name
 *   (as written before `<<<`) runs, then each float of device memory it changed is scaled by
 *   1 + 2⁻¹⁰. The switch exists only here: a build for a GPU has no such code.
 * - The device the emulator presents: MHAR_EMU_DEVICES=0 makes cudaGetDeviceCount report none
 *   (cudaErrorNoDevice, as a machine with a driver but no GPU does), and
 *   MHAR_EMU_DRIVER_VERSION what cudaDriverGetVersion reports (13000), so that the tests can
 *   show a machine without a GPU and a driver update.
 * - Memory pools: cudaDeviceGetAttribute(cudaDevAttrMemoryPoolsSupported) reports
 *   Machine::pools_supported (1; tests set 0). Where it is 0, or Machine::pool_refuses is set
 *   (a driver that claims pools but refuses them), cudaMallocAsync fails with
 *   cudaErrorNotSupported or cudaErrorNotPermitted; Machine::pool_misalign shifts what
 *   cudaMallocAsync returns by that many bytes. Machine counts cudaMalloc and cudaMallocAsync
 *   calls and pool queries, and keeps the last request's size, so a test can tell which path an
 *   allocator took and what it asked for.
 *
 * What it does not emulate: the memory model between threads running at once, speed, streams,
 * atomics, warp-level primitives other than the three above, texture memory; events time the
 * host.
 */
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#if !defined(__x86_64__) || defined(MHAR_EMU_UCONTEXT)
#define MHAR_EMU_UCONTEXT 1
#include <ucontext.h>
#endif

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
// No __shared__: translate.cmake rewrites every shared declaration (dynamic_shared,
// static_shared below), so one it missed fails to compile instead of being shared by all blocks.
#define __restrict__ __restrict

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct alignas(16) float4 {
  float x, y, z, w;
};

/// The running fiber's indices (set by the scheduler before it switches to a fiber).
inline dim3 threadIdx, blockIdx, blockDim, gridDim;

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorNoDevice = 100,
  cudaErrorLaunchFailure = 719,
  cudaErrorNotPermitted = 800,
  cudaErrorNotSupported = 801,
};

namespace mhar_emu {

/// Stack of one fiber; the kernels keep a few small arrays on it.
inline constexpr std::size_t kStackBytes = 128 * 1024;
/// Dynamic shared memory a block may use without opting in, and the opt-in ceiling (sm_90).
inline constexpr std::size_t kSmemDefault = 48 * 1024;
inline constexpr std::size_t kSmemOptin = 232448;

// --- fibers: a saved stack and how to switch to it ---------------------------------------------
#if MHAR_EMU_UCONTEXT
struct Context {
  ucontext_t uc{};
};
[[gnu::noinline]] inline void switch_context(Context& from, Context& to) {
  swapcontext(&from.uc, &to.uc);
}
/// Makes `c` start `fn` (which never returns) on `stack` at the next switch to it.
[[gnu::noinline]] inline void make_context(Context& c, char* stack, std::size_t bytes,
                                           void (*fn)()) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = bytes;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, fn, 0);
}
#else
}  // namespace mhar_emu
/// fiber.cpp: pushes the callee-saved registers, saves the stack pointer in *save_sp, loads
/// load_sp, pops the registers saved there and returns into that fiber.
extern "C" void mhar_emu_switch(void** save_sp, void* load_sp);
namespace mhar_emu {
struct Context {
  void* sp = nullptr;
};
inline void switch_context(Context& from, Context& to) {
  mhar_emu_switch(&from.sp, to.sp);
}
/// Makes `c` start `fn` (which never returns) on `stack` at the next switch to it: the stack
/// holds six zero registers for mhar_emu_switch to pop, then `fn` as the address it returns to.
inline void make_context(Context& c, char* stack, std::size_t bytes, void (*fn)()) {
  void** sp = reinterpret_cast<void**>(reinterpret_cast<std::uintptr_t>(stack + bytes) &
                                       ~std::uintptr_t{15});
  *--sp = nullptr;                              // fn's own return address: never used
  *--sp = reinterpret_cast<void*>(fn);          // where mhar_emu_switch returns to
  for (int i = 0; i < 6; ++i) *--sp = nullptr;  // rbp, rbx, r12 … r15
  c.sp = sp;
}
#endif

enum class State { Ready, AtBlockBarrier, AtWarpBarrier, Done };

struct Fiber {
  Context context;
  dim3 index;
  State state = State::Ready;
  const char* where = "";  ///< the barrier it waits at (for the deadlock report)
};

struct Machine {
  Context scheduler;
  std::vector<Fiber> fibers;
  std::unique_ptr<char[]> stacks;
  std::size_t stack_count = 0;
  int current = 0;
  int threads = 0;  ///< threads of the running block
  int finished = 0;
  int block_arrived = 0;
  std::vector<int> warp_arrived;
  std::vector<float> lanes;                       ///< one value per thread, for shuffles
  std::vector<float> shared;                      ///< dynamic shared memory of the running block
  std::function<void()> body;                     ///< the kernel call of the running launch
  std::map<const void*, std::size_t> smem_optin;  ///< per kernel, from cudaFuncSetAttribute
  cudaError_t last_error = cudaSuccess;
  long launches = 0;
  long blocks_started = 0;  ///< blocks run so far, all launches (static shared memory's clock)
  // Faults (see the file comment).
  cudaError_t fault = cudaSuccess;  ///< a kernel's fault, sticky once visible
  bool fault_visible = false;       ///< false while "the faulting kernel still runs"
  bool trapped = false;             ///< the running block called __trap()
  long fault_launch = [] {          ///< MHAR_EMU_FAULT_LAUNCH: this launch faults (0: none)
    const char* v = std::getenv("MHAR_EMU_FAULT_LAUNCH");
    return v ? std::atol(v) : 0L;
  }();
  /// MHAR_EMU_WRONG_KERNEL: every launch of the kernel of this name comes out slightly wrong.
  std::string wrong_kernel = [] {
    const char* v = std::getenv("MHAR_EMU_WRONG_KERNEL");
    return std::string(v ? v : "");
  }();
  /// MHAR_EMU_DEVICES: how many devices cudaGetDeviceCount reports (1; 0 reports none).
  int devices = [] {
    const char* v = std::getenv("MHAR_EMU_DEVICES");
    return v ? std::atoi(v) : 1;
  }();
  /// MHAR_EMU_DRIVER_VERSION: what cudaDriverGetVersion reports (13000 = 13.0).
  int driver_version = [] {
    const char* v = std::getenv("MHAR_EMU_DRIVER_VERSION");
    return v ? std::atoi(v) : 13000;
  }();
  std::map<void*, std::size_t> live;  ///< what cudaMalloc(Async) returned → its bytes
  // Memory pools (see the file comment).
  int pools_supported = 1;
  bool pool_refuses = false;
  std::size_t pool_misalign = 0;
  std::map<void*, void*> shifted;  ///< what cudaMallocAsync returned → what malloc returned
  long malloc_calls = 0, malloc_async_calls = 0;
  long pool_queries = 0;             ///< cudaDevAttrMemoryPoolsSupported queries
  std::size_t last_alloc_bytes = 0;  ///< bytes of the last cudaMalloc or cudaMallocAsync
};

inline Machine& machine() {
  static Machine m;
  return m;
}

[[noreturn]] inline void fail(const std::string& what) {
  std::fprintf(stderr, "mhar CUDA emulator: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

/// The sticky fault, made visible: what a call after a faulting kernel returns (cudaSuccess
/// when no kernel faulted).
inline cudaError_t sticky() {
  Machine& m = machine();
  if (m.fault != cudaSuccess) m.fault_visible = true;
  return m.fault;
}

/// Test hook: forgets a kernel's fault (on a GPU only a new process does).
inline void clear_fault() {
  Machine& m = machine();
  m.fault = cudaSuccess;
  m.fault_visible = false;
  m.last_error = cudaSuccess;
}

inline void yield(State why, const char* where) {
  Machine& m = machine();
  Fiber& f = m.fibers[static_cast<std::size_t>(m.current)];
  f.state = why;
  f.where = where;
  switch_context(f.context, m.scheduler);
}

inline int warp_lanes(int warp) {
  return std::min(32, machine().threads - 32 * warp);
}

/// Every lane of the running thread's warp waits here until all of them have arrived.
inline void warp_barrier(const char* where) {
  Machine& m = machine();
  const int w = m.current / 32;
  if (warp_lanes(w) != 32) fail(std::string(where) + " with a full mask in a partial warp");
  if (++m.warp_arrived[static_cast<std::size_t>(w)] == 32) {
    m.warp_arrived[static_cast<std::size_t>(w)] = 0;
    for (int t = 32 * w; t < 32 * w + 32; ++t)
      if (m.fibers[static_cast<std::size_t>(t)].state == State::AtWarpBarrier)
        m.fibers[static_cast<std::size_t>(t)].state = State::Ready;
    return;
  }
  yield(State::AtWarpBarrier, where);
}

/// A fiber's life: the kernel, then back to the scheduler for good.
inline void entry() {
  Machine& m = machine();
  m.body();
  Fiber& f = m.fibers[static_cast<std::size_t>(m.current)];
  f.state = State::Done;
  ++m.finished;
  switch_context(f.context, m.scheduler);
  fail("a finished fiber was resumed");
}

/// A launch's configuration: `<<<grid, block, smem>>>`.
struct Config {
  dim3 grid, block;
  std::size_t smem;
  Config(dim3 g, dim3 b, std::size_t s = 0, int /*stream*/ = 0) : grid(g), block(b), smem(s) {}
};

inline bool refuse(const Config& c, const void* kernel) {
  const unsigned long long n = 1ull * c.block.x * c.block.y * c.block.z;
  const auto optin = machine().smem_optin.find(kernel);
  const std::size_t smem_limit = optin == machine().smem_optin.end() ? kSmemDefault : optin->second;
  return n == 0 || n > 1024 || c.block.z > 64 || c.grid.x == 0 || c.grid.y == 0 || c.grid.z == 0 ||
         c.grid.x > 2147483647u || c.grid.y > 65535 || c.grid.z > 65535 || c.smem > smem_limit;
}

template <typename Kernel, typename... Args>
void run(Kernel kernel, const Config& c, Args... args) {
  Machine& m = machine();
  if (sticky() != cudaSuccess) {  // after a fault no kernel runs
    m.last_error = m.fault;
    return;
  }
  if (refuse(c, reinterpret_cast<const void*>(kernel))) {
    m.last_error = cudaErrorInvalidConfiguration;
    return;
  }
  if (m.fault_launch > 0 && m.launches + 1 == m.fault_launch) {  // MHAR_EMU_FAULT_LAUNCH
    ++m.launches;
    m.fault = cudaErrorLaunchFailure;
    m.fault_visible = false;
    return;
  }
  const int n = static_cast<int>(c.block.x * c.block.y * c.block.z);
  if (m.stack_count < static_cast<std::size_t>(n)) {
    m.stacks.reset(new char[kStackBytes * static_cast<std::size_t>(n)]);
    m.stack_count = static_cast<std::size_t>(n);
  }
  m.fibers.assign(static_cast<std::size_t>(n), Fiber{});
  m.warp_arrived.assign(static_cast<std::size_t>((n + 31) / 32), 0);
  m.lanes.assign(static_cast<std::size_t>(n), 0.f);
  m.shared.assign((c.smem + sizeof(float) - 1) / sizeof(float), 0.f);
  m.threads = n;
  m.body = [&] { kernel(args...); };
  gridDim = c.grid;
  blockDim = c.block;
  const bool reverse = (m.launches++ % 2) == 1;
  m.trapped = false;
  for (unsigned bz = 0; bz < c.grid.z && !m.trapped; ++bz)
    for (unsigned by = 0; by < c.grid.y && !m.trapped; ++by)
      for (unsigned bx = 0; bx < c.grid.x && !m.trapped; ++bx) {
        std::fill(m.shared.begin(), m.shared.end(), std::numeric_limits<float>::quiet_NaN());
        ++m.blocks_started;
        m.finished = 0;
        m.block_arrived = 0;
        for (int t = 0; t < n; ++t) {
          Fiber& f = m.fibers[static_cast<std::size_t>(t)];
          f.state = State::Ready;
          f.index = dim3(static_cast<unsigned>(t) % c.block.x,
                         (static_cast<unsigned>(t) / c.block.x) % c.block.y,
                         static_cast<unsigned>(t) / (c.block.x * c.block.y));
          make_context(f.context, m.stacks.get() + kStackBytes * static_cast<std::size_t>(t),
                       kStackBytes, entry);
        }
        while (m.finished < n) {
          bool progressed = false;
          for (int k = 0; k < n; ++k) {
            const int t = reverse ? n - 1 - k : k;
            Fiber& f = m.fibers[static_cast<std::size_t>(t)];
            if (f.state != State::Ready) continue;
            progressed = true;
            m.current = t;
            blockIdx = dim3(bx, by, bz);
            threadIdx = f.index;
            switch_context(m.scheduler, f.context);
            if (m.trapped) break;
          }
          if (m.trapped) break;  // the kernel is aborted: its other threads never resume
          if (!progressed) {
            std::string waits;
            for (int t = 0; t < n; ++t)
              if (m.fibers[static_cast<std::size_t>(t)].state != State::Done) {
                waits += " thread " + std::to_string(t) + " at " +
                         m.fibers[static_cast<std::size_t>(t)].where;
                break;
              }
            fail("deadlock in block (" + std::to_string(bx) + "," + std::to_string(by) + "," +
                 std::to_string(bz) + "): " + std::to_string(n - m.finished) +
                 " threads wait at a barrier the others never reach (first:" + waits + ")");
          }
        }
      }
  m.body = nullptr;
  if (m.trapped) {
    m.trapped = false;
    m.fault = cudaErrorLaunchFailure;
    m.fault_visible = false;
  }
}

/// `kernel<<<config>>>(args)` becomes `launch(kernel, config)(args)`.
template <typename Kernel>
auto launch(Kernel kernel, Config c) {
  return [kernel, c](auto... args) { run(kernel, c, args...); };
}

/// The planted fault (MHAR_EMU_WRONG_KERNEL=name): the launch runs, then every float of device
/// memory that it changed is made larger by a factor 1 + 2⁻¹⁰, as a kernel with a wrong constant
/// would leave it. An error of ~1e-3 relative, far above any tolerance, yet finite: a check
/// must report by how much a kernel is off, not only that it wrote NaN.
template <typename Kernel, typename... Args>
void run_wrong(Kernel kernel, const Config& c, Args... args) {
  Machine& m = machine();
  std::vector<std::vector<float>> before;
  for (const auto& [p, bytes] : m.live) {
    const float* f = static_cast<const float*>(p);
    before.emplace_back(f, f + bytes / sizeof(float));
  }
  run(kernel, c, args...);
  std::size_t k = 0;
  for (const auto& [p, bytes] : m.live) {
    float* f = static_cast<float*>(p);
    for (std::size_t i = 0; i < bytes / sizeof(float); ++i)
      if (std::memcmp(&f[i], &before[k][i], sizeof(float)) != 0) f[i] *= 1.0f + 0x1p-10f;
    ++k;
  }
}

/// What translate.cmake writes for `kernel<<<config>>>(args)`: the launch, with the kernel's
/// name for the planted fault.
template <typename Kernel>
auto launch(Kernel kernel, const char* name, Config c) {
  return [kernel, name, c](auto... args) {
    if (!machine().wrong_kernel.empty() && machine().wrong_kernel == name)
      run_wrong(kernel, c, args...);
    else
      run(kernel, c, args...);
  };
}

/// The block's `extern __shared__` array.
template <typename T>
T* dynamic_shared() {
  return reinterpret_cast<T*>(machine().shared.data());
}

/// A static `__shared__` array of type T (an array type, `float[8][32]`): translate.cmake turns
/// `__shared__ float s[8][32];` into `auto& s = static_shared<float[8][32]>([] {});`, the
/// lambda's type naming the declaration, so each declaration has one array (shared by every
/// TU, like a static local of an inline function). The first thread of a block to reach the
/// declaration fills it with NaN bytes (0xFF); the others of that block find it as written.
template <typename T, typename Site>
T& static_shared(Site) {
  static T storage;
  static long filled_for = -1;
  Machine& m = machine();
  if (filled_for != m.blocks_started) {
    std::memset(&storage, 0xFF, sizeof storage);
    filled_for = m.blocks_started;
  }
  return storage;
}

}  // namespace mhar_emu

// --- device functions ---------------------------------------------------------------------------

inline void __syncthreads() {
  mhar_emu::Machine& m = mhar_emu::machine();
  if (++m.block_arrived == m.threads) {
    m.block_arrived = 0;
    for (auto& f : m.fibers)
      if (f.state == mhar_emu::State::AtBlockBarrier) f.state = mhar_emu::State::Ready;
    return;
  }
  mhar_emu::yield(mhar_emu::State::AtBlockBarrier, "__syncthreads");
}

/// Aborts the kernel: the running thread stops here and no other thread of the launch runs on
/// (cudaErrorLaunchFailure, reported as a GPU reports a fault: later, and sticky).
inline void __trap() {
  mhar_emu::Machine& m = mhar_emu::machine();
  m.trapped = true;
  mhar_emu::yield(mhar_emu::State::Done, "__trap");
  mhar_emu::fail("a trapped fiber was resumed");
}

inline void __syncwarp(unsigned mask = 0xffffffffu) {
  if (mask != 0xffffffffu) mhar_emu::fail("__syncwarp with a partial mask is not emulated");
  mhar_emu::warp_barrier("__syncwarp");
}

inline float __shfl_xor_sync(unsigned mask, float v, int lane_mask) {
  if (mask != 0xffffffffu) mhar_emu::fail("__shfl_xor_sync with a partial mask is not emulated");
  mhar_emu::Machine& m = mhar_emu::machine();
  const int me = m.current;
  m.lanes[static_cast<std::size_t>(me)] = v;
  mhar_emu::warp_barrier("__shfl_xor_sync");
  const float r = m.lanes[static_cast<std::size_t>((me & ~31) | ((me & 31) ^ (lane_mask & 31)))];
  mhar_emu::warp_barrier("__shfl_xor_sync");
  return r;
}

// --- host API -----------------------------------------------------------------------------------

enum cudaMemcpyKind {
  cudaMemcpyHostToHost,
  cudaMemcpyHostToDevice,
  cudaMemcpyDeviceToHost,
  cudaMemcpyDeviceToDevice,
  cudaMemcpyDefault
};
enum cudaDeviceAttr {
  cudaDevAttrMaxSharedMemoryPerBlockOptin,
  cudaDevAttrMultiProcessorCount,
  cudaDevAttrMemoryPoolsSupported
};
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize };
struct cudaDeviceProp {
  char name[256];
  int major, minor, multiProcessorCount;
};
using cudaStream_t = int;

namespace mhar_emu {
/// The name and the text the CUDA runtime gives each error this emulator can raise.
struct ErrorText {
  cudaError_t code;
  const char* name;
  const char* text;
};
inline const ErrorText& error_text(cudaError_t e) {
  static constexpr ErrorText kTexts[] = {
      {cudaSuccess, "cudaSuccess", "no error"},
      {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
      {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
      {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration",
       "invalid configuration argument"},
      {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
      {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
      {cudaErrorNotPermitted, "cudaErrorNotPermitted", "operation not permitted"},
      {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
  };
  for (const ErrorText& t : kTexts)
    if (t.code == e) return t;
  return kTexts[std::size(kTexts) - 1];
}
}  // namespace mhar_emu

inline const char* cudaGetErrorString(cudaError_t e) {
  return mhar_emu::error_text(e).text;
}
inline const char* cudaGetErrorName(cudaError_t e) {
  return mhar_emu::error_text(e).name;
}
inline cudaError_t cudaGetLastError() {
  if (mhar_emu::machine().fault_visible) return mhar_emu::machine().fault;  // sticky
  const cudaError_t e = mhar_emu::machine().last_error;
  mhar_emu::machine().last_error = cudaSuccess;
  return e;
}
inline cudaError_t cudaGetDeviceCount(int* n) {
  if (mhar_emu::machine().devices <= 0) return cudaErrorNoDevice;  // as a driver without a GPU
  *n = mhar_emu::machine().devices;
  return cudaSuccess;
}
inline cudaError_t cudaDriverGetVersion(int* v) {
  *v = mhar_emu::machine().driver_version;
  return cudaSuccess;
}
inline cudaError_t cudaRuntimeGetVersion(int* v) {
  *v = 13000;
  return cudaSuccess;
}
inline cudaError_t cudaGetDevice(int* d) {
  *d = 0;
  return cudaSuccess;
}
inline cudaError_t cudaDeviceSynchronize() {
  return mhar_emu::sticky();
}
/// Three "SMs": grids sized from the SM count (the fused routing backward) then take more than
/// one pass of their grid-stride loops at the test shapes.
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int) {
  std::snprintf(p->name, sizeof p->name, "%s", "mhar CPU emulator");
  p->major = 9;
  p->minor = 0;
  p->multiProcessorCount = 3;
  return cudaSuccess;
}
inline cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr a, int) {
  switch (a) {
    case cudaDevAttrMultiProcessorCount:
      *v = 3;
      break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *v = static_cast<int>(mhar_emu::kSmemOptin);
      break;
    case cudaDevAttrMemoryPoolsSupported:
      ++mhar_emu::machine().pool_queries;
      *v = mhar_emu::machine().pools_supported;
      break;
  }
  return cudaSuccess;
}
template <typename F>
cudaError_t cudaFuncSetAttribute(F kernel, cudaFuncAttribute, int bytes) {
  if (bytes < 0 || static_cast<std::size_t>(bytes) > mhar_emu::kSmemOptin)
    return cudaErrorInvalidValue;
  mhar_emu::machine().smem_optin[reinterpret_cast<const void*>(kernel)] =
      static_cast<std::size_t>(bytes);
  return cudaSuccess;
}
template <typename F>
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* n, F, int threads, std::size_t) {
  *n = threads <= 1024 ? 2 : 0;
  return cudaSuccess;
}
/// Device memory is host memory, filled with NaN bytes (0xFF) like a poisoned buffer.
namespace mhar_emu {
inline cudaError_t allocate(void** p, std::size_t n, std::size_t shift) {
  if (const cudaError_t e = sticky()) return e;
  machine().last_alloc_bytes = n;
  char* base = static_cast<char*>(std::malloc(n + shift == 0 ? 1 : n + shift));
  if (!base) return cudaErrorMemoryAllocation;
  std::memset(base, 0xFF, n + shift);
  *p = base + shift;
  if (shift) machine().shifted[*p] = base;
  machine().live[*p] = n;
  return cudaSuccess;
}
}  // namespace mhar_emu
inline cudaError_t cudaMalloc(void** p, std::size_t n) {
  ++mhar_emu::machine().malloc_calls;
  return mhar_emu::allocate(p, n, 0);
}
inline cudaError_t cudaMallocAsync(void** p, std::size_t n, cudaStream_t) {
  mhar_emu::Machine& m = mhar_emu::machine();
  ++m.malloc_async_calls;
  if (!m.pools_supported) return cudaErrorNotSupported;
  if (m.pool_refuses) return cudaErrorNotPermitted;
  return mhar_emu::allocate(p, n, m.pool_misalign);
}
inline cudaError_t cudaFree(void* p) {
  mhar_emu::Machine& m = mhar_emu::machine();
  m.live.erase(p);
  const auto shifted = m.shifted.find(p);
  if (shifted != m.shifted.end()) {
    p = shifted->second;
    m.shifted.erase(shifted);
  }
  std::free(p);
  return mhar_emu::sticky();
}
inline cudaError_t cudaFreeAsync(void* p, cudaStream_t) {
  return cudaFree(p);
}
inline cudaError_t cudaMemcpy(void* d, const void* s, std::size_t n, cudaMemcpyKind) {
  if (const cudaError_t e = mhar_emu::sticky()) return e;
  if (n) std::memcpy(d, s, n);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void* d, const void* s, std::size_t n, cudaMemcpyKind k,
                                   cudaStream_t) {
  return cudaMemcpy(d, s, n, k);
}
inline cudaError_t cudaMemset(void* d, int v, std::size_t n) {
  if (const cudaError_t e = mhar_emu::sticky()) return e;
  if (n) std::memset(d, v, n);
  return cudaSuccess;
}
inline cudaError_t cudaMemsetAsync(void* d, int v, std::size_t n, cudaStream_t) {
  return cudaMemset(d, v, n);
}
/// Events: a host clock (everything before a record has already run on the emulator).
struct EmuEvent {
  std::chrono::steady_clock::time_point at;
};
using cudaEvent_t = EmuEvent*;
inline cudaError_t cudaEventCreate(cudaEvent_t* e) {
  *e = new EmuEvent{};
  return cudaSuccess;
}
inline cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete e;
  return cudaSuccess;
}
inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t = 0) {
  e->at = std::chrono::steady_clock::now();
  return cudaSuccess;
}
inline cudaError_t cudaEventSynchronize(cudaEvent_t) {
  return mhar_emu::sticky();
}
inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t stop) {
  *ms = std::chrono::duration<float, std::milli>(stop->at - start->at).count();
  return cudaSuccess;
}

/// Memory pools: the default pool's settings are accepted and ignored (the emulator's
/// allocations are plain malloc).
using cudaMemPool_t = struct EmuMemPool*;
enum cudaMemPoolAttr { cudaMemPoolAttrReleaseThreshold };
inline cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* pool, int) {
  *pool = nullptr;
  return cudaSuccess;
}
inline cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t, cudaMemPoolAttr, void*) {
  return cudaSuccess;
}
inline cudaError_t cudaMemGetInfo(std::size_t* free_bytes, std::size_t* total_bytes) {
  *free_bytes = std::size_t(8) << 30;
  *total_bytes = std::size_t(16) << 30;
  return cudaSuccess;
}

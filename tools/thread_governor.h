/**
 * @file thread_governor.h
 * @ingroup tools
 * @brief How many OpenMP threads the next CPU training steps use when `--threads 0` (the
 *        default): as many as there are idle cores, re-read from the load every half second.
 *
 * Why: a step is hundreds of short parallel regions (every Eigen matrix product, every routing
 * pass), and each ends at a barrier that waits for its slowest thread. When another process keeps
 * one of the cores busy, the thread that shares a core with it is descheduled for a time slice at
 * a time, and every barrier waits for it: two threads on two cores with one core busy ran at
 * 0.25–0.34× the speed of one thread (docs/benchmarks.md, "Threads under load"). One thread per
 * idle core keeps each thread on a core of its own.
 *
 * How: the CPUs this process may run on (sched_getaffinity) and, from /proc/stat, how much of
 * them was busy since the last reading; this process's own CPU time (CLOCK_PROCESS_CPUTIME_ID)
 * is taken off, and what remains is the other processes' load, in cores. The thread count is the
 * number of CPUs less that load, rounded, between 1 and the CPUs. Where /proc/stat cannot be read
 * (not Linux), every CPU is used, as before. Thread counts change only between steps.
 *
 * What it does not change: the numbers. The CPU step cuts its batch into shards() shards,
 * whatever the thread count, and k threads run those shards k at a time (tools/backend.cpp), so
 * with `--threads 0` the bits of a run do not depend on the load: the same command on the same
 * machine gives the same losses and checkpoints whether a core was busy or none. With
 * `--threads N` the step cuts N shards, as it always did.
 */
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>

namespace mhar::toy {

/// Busy and total jiffies of the CPUs this process may use (/proc/stat); empty where unreadable.
struct CpuTimes {
  std::uint64_t busy = 0;   ///< user + nice + system + irq + softirq + steal
  std::uint64_t total = 0;  ///< busy + idle + iowait
};
std::optional<CpuTimes> read_cpu_times();

/// The CPUs this process may run on (sched_getaffinity), at least 1.
int usable_cpus();

/// The most threads `--threads` may ask for, more than the largest machines have: a team of
/// 20,000 OpenMP threads took minutes and gigabytes to start before a step ran.
constexpr int kMaxThreads = 1024;

/// The thread count for `cpus` CPUs of which `others` cores' worth were busy with other work:
/// round(cpus − others), between 1 and cpus. Exposed for its test.
int threads_for_load(int cpus, double others);

/// OpenMP's thread count set to 1 for a scope and put back at its end: a forward shared between
/// threads sums its matrix products in another order than one thread does, so a result that
/// must not follow the thread count (heatmap, probe, grad) computes its forward inside one.
class OneThread {
 public:
  OneThread();
  ~OneThread();
  OneThread(const OneThread&) = delete;
  OneThread& operator=(const OneThread&) = delete;

 private:
  int before_;
};

class ThreadGovernor {
 public:
  /// fixed > 0: always `fixed` threads (--threads N), nothing is read. fixed == 0: adapt.
  explicit ThreadGovernor(int fixed);
  /// Before each step: at most every `interval`, reads the load and sets omp_set_num_threads.
  void before_step();
  /// The thread count the last before_step set.
  int threads() const { return threads_; }
  /// The CPUs this process may run on.
  int cpus() const { return cpus_; }
  /// The shards a CPU step cuts its batch into (make_backend): --threads N gives N, and
  /// --threads 0 the CPUs, however many threads the load leaves.
  int shards() const { return shards_; }

 private:
  void sample(std::chrono::steady_clock::time_point now);

  bool adapt_ = false;
  int cpus_ = 1;
  int threads_ = 1;
  int shards_ = 1;
  std::chrono::steady_clock::duration interval_ = std::chrono::milliseconds(500);
  std::chrono::steady_clock::time_point last_wall_{};
  double last_own_s_ = 0;  ///< this process's CPU time at the last reading, in seconds
  CpuTimes last_{};
  bool have_last_ = false;
};

}  // namespace mhar::toy

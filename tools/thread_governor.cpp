/**
 * @file thread_governor.cpp
 * @ingroup tools
 * @brief The thread count from the load (see thread_governor.h).
 */
#include "thread_governor.h"

#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace mhar::toy {
namespace {

int allowed_cpus(cpu_set_t& set) {
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 0;
  return CPU_COUNT(&set);
}

double own_cpu_seconds() {
  timespec ts{};
  if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) != 0) return 0;
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace

int usable_cpus() {
  cpu_set_t set;
  return std::max(1, allowed_cpus(set));
}

std::optional<CpuTimes> read_cpu_times() {
  cpu_set_t set;
  if (allowed_cpus(set) == 0) return std::nullopt;
  std::ifstream in("/proc/stat");
  if (!in) return std::nullopt;
  CpuTimes t;
  bool any = false;
  std::string line;
  while (std::getline(in, line)) {
    // "cpuN user nice system idle iowait irq softirq steal …"; the summary line "cpu " is skipped.
    if (line.rfind("cpu", 0) != 0 || line.size() < 4 || line[3] == ' ') continue;
    std::istringstream fields(line.substr(3));
    int cpu = -1;
    std::uint64_t user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0,
                  steal = 0;
    fields >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal;
    if (!fields && !fields.eof()) continue;
    if (cpu < 0 || cpu >= CPU_SETSIZE || !CPU_ISSET(cpu, &set)) continue;
    const std::uint64_t busy = user + nice + system + irq + softirq + steal;
    t.busy += busy;
    t.total += busy + idle + iowait;
    any = true;
  }
  if (!any) return std::nullopt;
  return t;
}

int threads_for_load(int cpus, double others) {
  const int free = static_cast<int>(std::lround(static_cast<double>(cpus) - others));
  return std::clamp(free, 1, std::max(cpus, 1));
}

OneThread::OneThread() : before_(omp_get_max_threads()) {
  omp_set_num_threads(1);
}

OneThread::~OneThread() {
  omp_set_num_threads(before_);
}

ThreadGovernor::ThreadGovernor(int fixed) {
  cpus_ = usable_cpus();
  shards_ = fixed > 0 ? fixed : cpus_;
  if (fixed > 0) {
    threads_ = fixed;
  } else {
    threads_ = cpus_;
    if (const auto t = read_cpu_times()) {
      adapt_ = true;
      last_ = *t;
      have_last_ = true;
      last_wall_ = std::chrono::steady_clock::now();
      last_own_s_ = own_cpu_seconds();
      // The first reading comes at the first step, after start-up (at least 50 ms later).
      interval_ = std::chrono::milliseconds(50);
    }
  }
#ifdef _OPENMP
  omp_set_num_threads(threads_);
#endif
}

void ThreadGovernor::before_step() {
  if (!adapt_) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_wall_ < interval_) return;
  sample(now);
  interval_ = std::chrono::milliseconds(500);
}

void ThreadGovernor::sample(std::chrono::steady_clock::time_point now) {
  const auto t = read_cpu_times();
  if (!t) return;
  const double own = own_cpu_seconds();
  const double wall = std::chrono::duration<double>(now - last_wall_).count();
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  if (have_last_ && wall > 0 && ticks > 0 && t->total > last_.total) {
    const double busy_s = static_cast<double>(t->busy - last_.busy) / ticks;
    const double others = std::max(0.0, (busy_s - (own - last_own_s_)) / wall);
    threads_ = threads_for_load(cpus_, others);
#ifdef _OPENMP
    omp_set_num_threads(threads_);
#endif
  }
  last_ = *t;
  have_last_ = true;
  last_wall_ = now;
  last_own_s_ = own;
}

}  // namespace mhar::toy

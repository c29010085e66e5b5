/**
 * @file test_thread_governor.cpp
 * @brief The thread count of `--threads 0` (tools/thread_governor.h): the rounding rule, a fixed
 *        count left alone, and, with every CPU but one kept busy by `--busy`'s spinning processes
 *        (tools/busy_load.h), one thread. Only "fewer threads under load" is asserted: on a shared
 *        CI machine an idle reading cannot be promised, but more load can only lower the count;
 *        and the shards a step cuts its batch into, which the load never changes.
 */
#include <catch2/catch.hpp>
#include <sched.h>

#include <chrono>
#include <thread>

#include "busy_load.h"
#include "thread_governor.h"

#ifdef _OPENMP
#include <omp.h>
#endif

using namespace mhar::toy;

TEST_CASE("threads_for_load: CPUs less the others' load, rounded, between 1 and the CPUs") {
  CHECK(threads_for_load(2, 0.0) == 2);
  CHECK(threads_for_load(2, 0.4) == 2);
  CHECK(threads_for_load(2, 0.6) == 1);
  CHECK(threads_for_load(2, 1.0) == 1);
  CHECK(threads_for_load(2, 3.5) == 1);
  CHECK(threads_for_load(8, 2.2) == 6);
  CHECK(threads_for_load(1, 0.0) == 1);
}

TEST_CASE("a fixed --threads N is kept, whatever the load") {
  ThreadGovernor g(3);
  g.before_step();
  CHECK(g.threads() == 3);
#ifdef _OPENMP
  CHECK(omp_get_max_threads() == 3);
#endif
}

TEST_CASE("with all CPUs but one spinning, --threads 0 takes one thread") {
  cpu_set_t set;
  CPU_ZERO(&set);
  REQUIRE(sched_getaffinity(0, sizeof set, &set) == 0);
  const int cpus = CPU_COUNT(&set);
  if (cpus < 2 || !read_cpu_times()) {
    WARN("MHAR_SKIP: needs 2 or more CPUs and a readable /proc/stat (this machine: "
         << cpus << " CPUs)");
    return;
  }
  ThreadGovernor g(0);
  CHECK(g.threads() == cpus);  // before any reading: every CPU, as before
  const BusyLoad busy(cpus - 1);
  // Two readings 0.6 s apart, each over a window in which the spinners ran: the first one (50 ms
  // after start) may still see start-up, the second is over load only.
  for (int i = 0; i < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(600));
    g.before_step();
  }
  CHECK(g.threads() == 1);
  CHECK(g.shards() == cpus);  // the step's shards stay: its bits do not follow the load
}

TEST_CASE("the shards of a step: --threads N cuts N, --threads 0 one per CPU") {
  CHECK(ThreadGovernor(3).shards() == 3);
  CHECK(ThreadGovernor(1).shards() == 1);
  CHECK(ThreadGovernor(0).shards() == usable_cpus());
  cpu_set_t set;
  CPU_ZERO(&set);
  REQUIRE(sched_getaffinity(0, sizeof set, &set) == 0);
  CHECK(usable_cpus() == CPU_COUNT(&set));
}

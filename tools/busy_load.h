/**
 * @file busy_load.h
 * @ingroup tools
 * @brief `bench step --busy N`: N other processes, each spinning on one core, for as long as the
 *        object lives, so that anyone can reproduce a training step on a machine where other work
 *        keeps cores busy (a browser, a build, another user's tests).
 *
 * Processes, not threads of this one: the load that slows a step down is other processes', and it
 * is other processes' CPU time that the thread governor (thread_governor.h) reads to choose the
 * thread count. Each child dies with its parent (PR_SET_PDEATHSIG), so a killed bench leaves none
 * spinning.
 */
#pragma once

#include <sys/types.h>

#include <vector>

namespace mhar::toy {

class BusyLoad {
 public:
  /// Starts n spinning child processes (none for n = 0). Throws std::runtime_error when fork fails.
  explicit BusyLoad(int n);
  ~BusyLoad();
  BusyLoad(const BusyLoad&) = delete;
  BusyLoad& operator=(const BusyLoad&) = delete;

 private:
  std::vector<pid_t> children_;
};

}  // namespace mhar::toy

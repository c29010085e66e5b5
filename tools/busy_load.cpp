/**
 * @file busy_load.cpp
 * @ingroup tools
 * @brief Spinning child processes for `bench step --busy N` (see busy_load.h).
 */
#include "busy_load.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

namespace mhar::toy {

BusyLoad::BusyLoad(int n) {
  const pid_t parent = getpid();
  for (int i = 0; i < n; ++i) {
    const pid_t pid = fork();
    if (pid < 0) {
      const std::string why = std::strerror(errno);
      for (const pid_t c : children_) kill(c, SIGKILL);
      for (const pid_t c : children_) waitpid(c, nullptr, 0);
      throw std::runtime_error("--busy: cannot start a spinning process: " + why);
    }
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(0);  // the parent died before the line above
      volatile unsigned long spin = 0;
      for (;;) spin = spin + 1;
    }
    children_.push_back(pid);
  }
}

BusyLoad::~BusyLoad() {
  for (const pid_t c : children_) kill(c, SIGKILL);
  for (const pid_t c : children_) waitpid(c, nullptr, 0);
}

}  // namespace mhar::toy

/**
 * @file sweep_jobs.h
 * @ingroup tools
 * @brief The sweep's job pool: child processes of mhar-toy, J at a time, each writing to its own
 *        log, a line as each one ends (with an ETA), and Ctrl-C passed on to the running children
 *        so that each saves its checkpoint and exits 130 (errors.h).
 */
#pragma once

#include <cstddef>
#include <deque>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace mhar::toy {

/// One child process: `exe args…`, its stdout and stderr appended to `log`.
struct Job {
  std::string name;               ///< what the progress lines call it (the run's name)
  std::vector<std::string> args;  ///< the arguments after the program ("train", …)
  std::filesystem::path log;
};

/// How the pool ended.
struct JobsResult {
  int done = 0;                 ///< exited 0
  int failed = 0;               ///< exited otherwise, or died, without a Ctrl-C
  int stopped = 0;              ///< exited 130, or ended after a Ctrl-C
  std::size_t not_started = 0;  ///< left in the queue by a Ctrl-C
  bool interrupted = false;     ///< a SIGINT came while the pool ran
};

/**
 * @brief Runs `jobs` in order as children `exe args…`, at most `parallel` at a time, and waits
 * for all of them. As each ends it prints (and flushes) one line:
 *
 *     [k/n] NAME: NOTE; R runs left, ETA 3m07s     exit 0; NOTE is done_note(job)
 *     stopped NAME: checkpoint saved (exit C)      exit 130, or any exit after a Ctrl-C
 *     FAILED  NAME: exit C; see LOG                any other exit (128 + signal when killed)
 *
 * A SIGINT while it runs starts no further job and is sent on to every running child; the pool
 * still waits for them. Its handler is installed only while the pool runs. A child dies with
 * the process that started it (PR_SET_PDEATHSIG), however that one ends.
 */
JobsResult run_jobs(const std::string& exe, std::deque<Job> jobs, int parallel,
                    const std::function<std::string(const Job&)>& done_note);

}  // namespace mhar::toy

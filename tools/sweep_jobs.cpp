/**
 * @file sweep_jobs.cpp
 * @brief sweep_jobs.h: fork/exec of the children, waitpid, the progress lines and the SIGINT,
 *        SIGTERM and SIGHUP handling of the sweep's job pool.
 */
#include "sweep_jobs.h"

#include <fmt/format.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <map>
#include <stdexcept>

#include "errors.h"
#include "train.h"

namespace mhar::toy {

namespace {

volatile std::sig_atomic_t g_interrupted = 0;
extern "C" void on_pool_stop(int) {
  g_interrupted = 1;
}

/// Sets g_interrupted on SIGINT, SIGTERM or SIGHUP (as train stops on each) from construction to
/// destruction, then puts the old handlers back. sigaction, not std::signal as train does:
/// glibc's signal() sets SA_RESTART, so waitpid would go on waiting after a Ctrl-C until some
/// child ended, and a signal sent to the sweep alone (`kill`, a job scheduler's time limit; not a
/// terminal's Ctrl-C, which reaches the children too) would not reach them. Without SA_RESTART
/// waitpid returns at once with EINTR and the pool passes it on.
class StopHandler {
 public:
  StopHandler() {
    g_interrupted = 0;
    struct sigaction sa {};
    sa.sa_handler = on_pool_stop;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
    sigaction(SIGHUP, &sa, &old_hup_);
  }
  ~StopHandler() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
    sigaction(SIGHUP, &old_hup_, nullptr);
  }
  StopHandler(const StopHandler&) = delete;
  StopHandler& operator=(const StopHandler&) = delete;

 private:
  struct sigaction old_int_ {};
  struct sigaction old_term_ {};
  struct sigaction old_hup_ {};
};

/// Starts `exe job.args…` with stdout and stderr appended to job.log, after a line that gives the
/// command; returns the child's pid.
pid_t spawn(const std::string& exe, const Job& job) {
  std::string line = "$ " + exe;  // built here: the child only writes it
  for (const auto& a : job.args) line += " " + a;
  line += "\n";
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error(std::string("sweep: fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    // The child dies with the sweep, however the sweep dies (its run directory is kill-safe,
    // run_dir.h); should the sweep be gone already, so is the child.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(137);
    std::FILE* f = std::fopen(job.log.c_str(), "a");
    if (f) {
      dup2(fileno(f), STDOUT_FILENO);
      dup2(fileno(f), STDERR_FILENO);
      if (write(STDOUT_FILENO, line.data(), line.size()) < 0) {
      }  // a log that cannot take the line cannot take the run's output either: go on
    }
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(exe.c_str()));
    for (const auto& a : job.args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(exe.c_str(), argv.data());
    std::fprintf(stderr, "sweep: cannot run %s: %s\n", exe.c_str(), std::strerror(errno));
    _exit(127);
  }
  return pid;
}

/// The pool's state while run_jobs runs.
class Pool {
 public:
  Pool(const std::string& exe, std::deque<Job> queue, int parallel,
       const std::function<std::string(const Job&)>& done_note)
      : exe_(exe),
        queue_(std::move(queue)),
        parallel_(parallel),
        note_(done_note),
        total_(queue_.size()) {}

  JobsResult run() {
    const StopHandler handler;
    while (!queue_.empty() || !running_.empty()) {
      start_more();
      if (g_interrupted && !forwarded_) {
        for (const auto& entry : running_) kill(entry.first, SIGINT);
        forwarded_ = true;
      }
      if (!wait_one()) break;
    }
    r_.interrupted = g_interrupted != 0;
    r_.not_started = queue_.size();
    return r_;
  }

 private:
  void start_more() {
    while (!g_interrupted && !queue_.empty() && static_cast<int>(running_.size()) < parallel_) {
      Job j = std::move(queue_.front());
      queue_.pop_front();
      const pid_t pid = spawn(exe_, j);
      running_.emplace(pid, std::move(j));
    }
  }

  /// Waits for one child to end and reports it; false when there is none to wait for.
  bool wait_one() {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, 0);
    if (pid < 0) return errno == EINTR;  // a signal: the loop looks at g_interrupted again
    const auto it = running_.find(pid);
    if (it == running_.end()) return true;
    const Job job = std::move(it->second);
    running_.erase(it);
    report(job, WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
    return true;
  }

  void report(const Job& job, int code) {
    if (code == 0) {
      ++r_.done;
      const double el =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
      const std::size_t left = total_ - static_cast<std::size_t>(r_.done + r_.failed + r_.stopped);
      fmt::print("[{}/{}] {}: {}; {} run{} left, ETA {}\n", r_.done, total_, job.name, note_(job),
                 left, left == 1 ? "" : "s",
                 fmt_duration(el / static_cast<double>(r_.done) * static_cast<double>(left)));
    } else if (code == kInterrupted || g_interrupted) {
      ++r_.stopped;
      fmt::print("stopped {}: checkpoint saved (exit {})\n", job.name, code);
    } else {
      ++r_.failed;
      fmt::print("FAILED  {}: exit {}; see {}\n", job.name, code, job.log.string());
    }
    std::fflush(stdout);
  }

  const std::string exe_;
  std::deque<Job> queue_;
  const int parallel_;
  const std::function<std::string(const Job&)>& note_;
  const std::size_t total_;
  const std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
  std::map<pid_t, Job> running_;
  JobsResult r_;
  bool forwarded_ = false;
};

}  // namespace

JobsResult run_jobs(const std::string& exe, std::deque<Job> jobs, int parallel,
                    const std::function<std::string(const Job&)>& done_note) {
  return Pool(exe, std::move(jobs), parallel, done_note).run();
}

}  // namespace mhar::toy

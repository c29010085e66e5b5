/**
 * @file cli_sweep.cpp
 * @brief `mhar-toy sweep`: runs the grid of sweep.h as J child `mhar-toy train` processes, each
 *        with cores / J threads, then writes the summary. Ctrl-C reaches every child (each saves
 *        its checkpoint and exits 130); the same command resumes.
 */
#include <fmt/format.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "checkpoint.h"
#include "cli_common.h"
#include "errors.h"
#include "figures.h"
#include "json_types.h"
#include "run_dir.h"
#include "sweep.h"
#include "train.h"

namespace mhar::toy {

namespace fs = std::filesystem;

namespace {

volatile std::sig_atomic_t g_sweep_interrupted = 0;
void on_sweep_sigint(int) { g_sweep_interrupted = 1; }

std::vector<int> parse_ints(const std::string& list, const char* flag) {
  std::vector<int> v;
  std::stringstream ss(list);
  for (std::string item; std::getline(ss, item, ',');) {
    try {
      std::size_t used = 0;
      v.push_back(std::stoi(item, &used));
      if (used != item.size()) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      throw UsageError(fmt::format("{}: '{}' is not an integer (give a list like 1,2,3)", flag, item));
    }
  }
  return v;
}

std::vector<std::string> parse_words(const std::string& list) {
  std::vector<std::string> v;
  std::stringstream ss(list);
  for (std::string item; std::getline(ss, item, ',');) v.push_back(item);
  return v;
}

/// Starts `exe args…` with stdout and stderr appended to `log`; returns the child's pid.
pid_t spawn(const std::string& exe, const std::vector<std::string>& args, const fs::path& log) {
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error(std::string("sweep: fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    // The child dies with the sweep, however the sweep dies (its run directory is kill-safe,
    // run_dir.h); should the sweep be gone already, so is the child.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(137);
    std::FILE* f = std::fopen(log.c_str(), "a");
    if (f) {
      dup2(fileno(f), STDOUT_FILENO);
      dup2(fileno(f), STDERR_FILENO);
    }
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(exe.c_str()));
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(exe.c_str(), argv.data());
    std::fprintf(stderr, "sweep: cannot run %s: %s\n", exe.c_str(), std::strerror(errno));
    _exit(127);
  }
  return pid;
}

/// The step a run's checkpoint holds, and the steps its config asks for; -1 when absent.
std::pair<long, long> run_progress(const fs::path& run) {
  long have = -1, want = -1;
  if (fs::exists(run / "checkpoint.safetensors")) have = load_checkpoint(run.string()).step;
  std::ifstream in(run / "config.json");
  if (in) try {
      want = nlohmann::json::parse(in).at("train").at("steps").get<long>();
    } catch (const std::exception&) {
      want = -1;
    }
  return {have, want};
}

double final_val(const fs::path& run) {
  double val = std::nan("");
  for (const MetricsRow& row : read_metrics(run / "metrics.jsonl"))
    if (row.val_loss) val = *row.val_loss;
  return val;
}

}  // namespace

Subcommand register_sweep(CLI::App& app) {
  struct Opts {
    std::string modes = "residual,attnres,mhar", widths = "64,128,256", heads = "0",
                seeds = "1,2,3", out, summary;
    double ffn_ratio = 2.75;
    int jobs = 0;
    Config base;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand(
      "sweep",
      "A grid of training runs (modes × widths × heads × seeds), J at a time, then a summary "
      "table (summary.csv, summary.md) with each mode's validation loss and learned excess");
  cmd->add_option("--modes", o->modes, "residual, attnres, mhar, block, delta (comma list)")
      ->capture_default_str();
  cmd->add_option("--widths", o->widths, "model widths d (comma list)")->capture_default_str();
  cmd->add_option("--heads", o->heads,
                  "routing heads H for mhar, block, delta (comma list; 0 = n_kv_head)")
      ->capture_default_str();
  cmd->add_option("--seeds", o->seeds, "seeds (comma list)")->capture_default_str();
  cmd->add_option("--ffn-ratio", o->ffn_ratio, "ffn = ratio · d, rounded to a multiple of 8")
      ->capture_default_str()
      ->check(positive());
  cmd->add_option("--layers,-L", o->base.L, "transformer blocks")
      ->capture_default_str()
      ->check(positive());
  cmd->add_option("--n-head", o->base.n_head, "query heads")
      ->capture_default_str()
      ->check(positive());
  cmd->add_option("--n-kv-head", o->base.n_kv_head, "key/value heads")
      ->capture_default_str()
      ->check(positive());
  cmd->add_option("--seq-len,-T", o->base.T, "tokens per sequence")
      ->capture_default_str()
      ->check(positive());
  cmd->add_option("--blocks", o->base.n_blocks, "blocks of block and delta")
      ->capture_default_str()
      ->check(positive());
  cmd->add_option("--out,-o", o->out, "directory of the runs and the summary");
  cmd->add_option("--jobs,-j", o->jobs,
                  "runs at a time (default: one per core, each with cores/J threads)")
      ->check(non_negative());
  cmd->add_option("--summary", o->summary, "only (re)write the summary of the sweep in this directory");
  cmd->allow_extras();
  cmd->footer(
      "Any other flag goes to every `train` (--steps, --lr, --batch, --eval-every, --data, …).\n"
      "Run names: <mode>-d<d>[-H<H>]-seed<s>. Calling the same sweep again skips finished runs\n"
      "and resumes interrupted ones from their checkpoints; Ctrl-C stops every run with a\n"
      "checkpoint saved.");
  return {cmd, [o, cmd]() -> int {
            if (!o->summary.empty()) {
              std::vector<std::string> unfinished;
              const auto rows = summarize_sweep(o->summary, &unfinished);
              write_sweep_summary(o->summary, rows);
              fmt::print("wrote {0}/summary.csv and {0}/summary.md ({1} rows; {2} unfinished "
                         "runs left out)\n",
                         o->summary, rows.size(), unfinished.size());
              return kOk;
            }
            if (o->out.empty()) throw UsageError("sweep: --out DIR is required (or --summary DIR)");
            SweepGrid g;
            g.modes = parse_words(o->modes);
            g.widths = parse_ints(o->widths, "--widths");
            g.heads = parse_ints(o->heads, "--heads");
            g.seeds = parse_ints(o->seeds, "--seeds");
            g.ffn_ratio = o->ffn_ratio;
            g.base = o->base;
            const std::vector<SweepRun> runs = expand_grid(g);
            std::vector<std::string> extras = cmd->remaining();
            for (const std::string& a : extras)
              for (const char* own : {"--mode", "--d", "--heads", "-H", "--seed", "--out", "-o",
                                      "--ffn", "--threads", "--resume"})
                if (a == own || a.rfind(std::string(own) + "=", 0) == 0)
                  throw UsageError(fmt::format("sweep: {} is set by the sweep for each run", a));
            const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
            const int jobs = o->jobs > 0 ? o->jobs : static_cast<int>(cores);
            const int threads = std::max(1, static_cast<int>(cores) / jobs);
            auto train_args = [&](const SweepRun& r) {
              std::vector<std::string> a = {
                  "train", "--mode", r.mode, "--d", std::to_string(r.d), "--ffn",
                  std::to_string(r.ffn), "--seed", std::to_string(r.seed), "--layers",
                  std::to_string(g.base.L), "--n-head", std::to_string(g.base.n_head),
                  "--n-kv-head", std::to_string(g.base.n_kv_head), "--seq-len",
                  std::to_string(g.base.T), "--blocks", std::to_string(g.base.n_blocks),
                  "--threads", std::to_string(threads), "-q", "--out",
                  (fs::path(o->out) / r.name).string()};
              if (r.H > 0) a.insert(a.end(), {"--heads", std::to_string(r.H)});
              a.insert(a.end(), extras.begin(), extras.end());
              return a;
            };
            // The pass-through flags are checked once by train's own parser, before any run.
            {
              CLI::App probe_app;
              const Subcommand keep = register_train(probe_app);  // owns what the flags bind to
              (void)keep;
              std::vector<std::string> a = train_args(runs.front());
              std::reverse(a.begin(), a.end());
              try {
                probe_app.parse(a);
              } catch (const CLI::ParseError& e) {
                throw UsageError(fmt::format("sweep: a flag passed to train is not valid: {}",
                                             e.what()));
              }
            }
            std::error_code ec;
            fs::create_directories(fs::path(o->out) / "logs", ec);
            if (ec)
              throw UsageError(fmt::format("sweep: cannot create '{}': {}", o->out, ec.message()));
            const DirLock lock(o->out, "sweep");  // one sweep at a time in a directory
            const std::string exe = fs::read_symlink("/proc/self/exe").string();

            // What each run needs: skip, resume, restart or start.
            struct Job {
              SweepRun run;
              std::vector<std::string> args;
            };
            std::deque<Job> queue;
            int skipped = 0;
            for (const SweepRun& r : runs) {
              const fs::path dir = fs::path(o->out) / r.name;
              const auto [have, want] = run_progress(dir);
              if (have >= 0 && want >= 0 && have >= want) {
                fmt::print("skip    {}: finished (step {}), val {:.4f}\n", r.name, have,
                           final_val(dir));
                ++skipped;
              } else if (have >= 0) {
                fmt::print("resume  {}: from step {} of {}\n", r.name, have, want);
                queue.push_back({r, {"train", "--resume", dir.string(), "-q"}});
              } else {
                if (fs::exists(dir / "config.json")) {
                  fmt::print("restart {}: stopped before its first checkpoint\n", r.name);
                  fs::remove_all(dir);
                } else {
                  fmt::print("start   {}\n", r.name);
                }
                queue.push_back({r, train_args(r)});
              }
            }
            fmt::print("sweep: {} runs ({} finished already, {} to run), {} at a time with {} "
                       "thread{} each; logs in {}/logs\n",
                       runs.size(), skipped, queue.size(), jobs, threads, threads == 1 ? "" : "s",
                       o->out);
            std::fflush(stdout);

            g_sweep_interrupted = 0;
            struct sigaction sa {};
            sa.sa_handler = on_sweep_sigint;
            sigemptyset(&sa.sa_mask);
            struct sigaction old {};
            sigaction(SIGINT, &sa, &old);
            const auto t0 = std::chrono::steady_clock::now();
            std::map<pid_t, SweepRun> running;
            const std::size_t total = queue.size();
            std::size_t done = 0;
            int failed = 0, stopped = 0;
            bool forwarded = false;
            while (!queue.empty() || !running.empty()) {
              while (!g_sweep_interrupted && !queue.empty() &&
                     static_cast<int>(running.size()) < jobs) {
                Job j = std::move(queue.front());
                queue.pop_front();
                const fs::path log = fs::path(o->out) / "logs" / (j.run.name + ".log");
                running[spawn(exe, j.args, log)] = j.run;
              }
              if (g_sweep_interrupted && !forwarded) {
                for (const auto& [pid, r] : running) kill(pid, SIGINT);
                forwarded = true;
              }
              int status = 0;
              const pid_t pid = waitpid(-1, &status, 0);
              if (pid < 0) {
                if (errno == EINTR) continue;
                break;
              }
              const auto it = running.find(pid);
              if (it == running.end()) continue;
              const SweepRun r = it->second;
              running.erase(it);
              const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
              const fs::path dir = fs::path(o->out) / r.name;
              if (code == 0) {
                ++done;
                const double el =
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
                const std::size_t left = total - done - failed - stopped;
                fmt::print("[{}/{}] {}: val {:.4f}; {} run{} left, ETA {}\n", done, total, r.name,
                           final_val(dir), left, left == 1 ? "" : "s",
                           fmt_duration(el / static_cast<double>(done) * static_cast<double>(left)));
              } else if (code == kInterrupted || g_sweep_interrupted) {
                ++stopped;
                fmt::print("stopped {}: checkpoint saved (exit {})\n", r.name, code);
              } else {
                ++failed;
                fmt::print("FAILED  {}: exit {}; see {}/logs/{}.log\n", r.name, code, o->out,
                           r.name);
              }
              std::fflush(stdout);
            }
            sigaction(SIGINT, &old, nullptr);
            if (g_sweep_interrupted) {
              fmt::print(stderr,
                         "interrupted: {} run{} stopped with their checkpoints, {} not started; "
                         "run the same command again to resume\n",
                         stopped, stopped == 1 ? "" : "s", queue.size());
              return kInterrupted;
            }
            std::vector<std::string> unfinished;
            const auto rows = summarize_sweep(o->out, &unfinished);
            write_sweep_summary(o->out, rows);
            fmt::print("wrote {0}/summary.csv and {0}/summary.md{1}\n", o->out,
                       io::kFiguresBuilt ? ", val-vs-width and excess-vs-width (png, svg)"
                                         : " (figures are off in this build)");
            std::ifstream md(fs::path(o->out) / "summary.md");
            fmt::print("{}", std::string(std::istreambuf_iterator<char>(md), {}));
            return failed > 0 ? kFailure : kOk;
          }};
}

}  // namespace mhar::toy

/**
 * @file cli_sweep.cpp
 * @brief `mhar-toy sweep`: runs the grid of sweep.h as J child `mhar-toy train` processes
 *        (sweep_jobs.h), each with cores / J threads, then writes the summary. Ctrl-C reaches
 *        every child (each saves its checkpoint and exits 130); the same command resumes.
 */
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <thread>
#include <utility>

#include "checkpoint.h"
#include "cli_common.h"
#include "cli_train.h"
#include "errors.h"
#include "figures.h"
#include "gpu_selfcheck.h"
#include "json_types.h"
#include "run_dir.h"
#include "strict_json.h"
#include "sweep.h"
#include "sweep_jobs.h"
#include "train.h"

namespace mhar::toy {

namespace fs = std::filesystem;

namespace {

/// The sweep's own flags; every other flag is a training flag for every run (pass_through).
struct SweepFlags {
  SweepGrid grid;
  std::string out, summary;
  int jobs = 0;
};

/// Each item of a comma list of integers: "--widths: 'abc' is not an integer (…)", exit 2.
const CLI::Validator& integer_item() {
  static const CLI::Validator v(
      [](std::string& item) -> std::string {
        try {
          std::size_t used = 0;
          (void)std::stoi(item, &used);
          if (used == item.size()) return {};
        } catch (const std::exception&) {
        }
        return "'" + item + "' is not an integer (give a list like 1,2,3)";
      },
      "");
  return v;
}

/// A comma list flag (`--widths 64,128,256`) whose default is shown as it is typed.
template <typename T>
CLI::Option* add_list(CLI::App& cmd, const std::string& name, std::vector<T>& v,
                      const std::string& help) {
  return cmd.add_option(name, v, help)
      ->delimiter(',')
      ->default_str(fmt::format("{}", fmt::join(v, ",")));
}

void add_sweep_flags(CLI::App& cmd, SweepFlags& o) {
  add_list(cmd, "--modes", o.grid.modes, "residual, attnres, mhar, block, delta (comma list)");
  add_list(cmd, "--widths", o.grid.widths, "model widths d (comma list)")->check(integer_item());
  add_list(cmd, "--heads", o.grid.heads,
           "routing heads H for mhar, block, delta (comma list; 0 = n_kv_head)")
      ->check(integer_item());
  add_list(cmd, "--seeds", o.grid.seeds, "seeds (comma list)")
      ->check(integer_item())
      ->check(non_negative());
  cmd.add_option("--ffn-ratio", o.grid.ffn_ratio, "ffn = ratio · d, rounded to a multiple of 8")
      ->check(positive());
  cmd.add_option("--layers,-L", o.grid.base.L, "transformer blocks")->check(positive());
  cmd.add_option("--n-head", o.grid.base.n_head, "query heads")->check(positive());
  cmd.add_option("--n-kv-head", o.grid.base.n_kv_head, "key/value heads")->check(positive());
  cmd.add_option("--seq-len,-T", o.grid.base.T, "tokens per sequence")->check(positive());
  cmd.add_option("--blocks", o.grid.base.n_blocks, "blocks of block and delta")->check(positive());
  cmd.add_option("--out,-o", o.out, "directory of the runs and the summary");
  cmd.add_option("--jobs,-j", o.jobs,
                 "runs at a time (default: one per core, each with cores/J threads)")
      ->check(non_negative());
  cmd.add_option("--summary", o.summary,
                 "only (re)write the summary of the sweep in this directory");
  cmd.allow_extras();
  cmd.footer(
      "Any other flag of `train` that is not the run's model, seed, --out or --threads goes to\n"
      "every run (--steps, --lr, --batch, --eval-every, --data, --routing, …).\n"
      "Run names: <mode>-d<d>[-H<H>]-seed<s>. Calling the same sweep again skips finished runs\n"
      "and resumes interrupted ones from their checkpoints; Ctrl-C (or SIGTERM, or SIGHUP) stops\n"
      "every run with a checkpoint saved.");
}

/// What the sweep passes on to every run: train's options, and the process-wide flags of train
/// (--cuda-sync, --recheck-gpu, --skip-gpu-check) that TrainOptions does not hold.
struct PassedOn {
  TrainOptions train;
  std::vector<std::string> process_flags;
};

/// Reads the passed-on flags with train's own parser before any run starts. Throws UsageError
/// (exit 2) on a flag train refuses and on one the sweep sets itself.
PassedOn pass_through(const std::vector<std::string>& extras) {
  PassedOn p;
  std::string mode;
  bool cuda_sync = false;
  GpuCheckFlags gpu;
  CLI::App parser;
  parser.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // as train
  add_train_options(parser, p.train, mode);
  add_cuda_sync_flag(parser, cuda_sync);
  add_gpu_check_flags(parser, gpu);
  std::vector<std::string> args(extras.rbegin(), extras.rend());  // CLI11 reads from the back
  try {
    parser.parse(args);
  } catch (const CLI::ExtrasError&) {
    throw UsageError(fmt::format(
        "sweep: {}, taken neither by the sweep nor by train (mhar-toy sweep --help, mhar-toy "
        "train --help)",
        unexpected_arguments(parser, extras)));
  } catch (const CLI::ParseError& e) {
    throw UsageError(fmt::format("sweep: a flag passed to train is not valid: {}",
                                 parse_error_words(parser, e)));
  }
  for (const char* own : {"--mode", "--d", "--heads", "--ffn", "--seed", "--threads"})
    if (parser.get_option(own)->count() > 0)
      throw UsageError(fmt::format("sweep: {} is set by the sweep for each run", own));
  for (const auto& [on, flag] : {std::pair{cuda_sync, "--cuda-sync"},
                                 std::pair{gpu.recheck, "--recheck-gpu"},
                                 std::pair{gpu.skip, "--skip-gpu-check"}})
    if (on) p.process_flags.emplace_back(flag);
  return p;
}

/// `train …` for one run: the passed-on options `t` with the run's model, seed and directory,
/// `threads` threads, quiet (its output goes to its log).
std::vector<std::string> start_args(TrainOptions t, const Config& base, const SweepRun& r,
                                    const fs::path& dir, int threads) {
  t.cfg = base;
  t.cfg.mode = parse_mode(r.mode);
  t.cfg.d = r.d, t.cfg.H = r.H, t.cfg.ffn = r.ffn;
  t.seed = static_cast<std::uint64_t>(r.seed);
  t.out = dir.string();
  t.threads = threads;
  t.quiet = true;
  std::vector<std::string> args = t.to_args();
  args.insert(args.begin(), "train");
  return args;
}

/// The step a run's checkpoint holds, and the steps its config.json asks for; -1 when absent
/// (or unreadable: `train --resume` then says what is wrong with it).
std::pair<long, long> run_progress(const fs::path& run) {
  long have = -1, want = -1;
  if (fs::exists(run / "checkpoint.safetensors")) have = load_checkpoint(run.string()).step;
  const fs::path cfg = run / "config.json";
  if (fs::exists(cfg)) try {
      // As summarize_sweep and resume read it (train.h), so that all three agree on "finished".
      want = train_options_from_json(io::read_json_file_strict(cfg.string()), cfg.string()).steps;
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

/// What each run needs, printed as it is decided: skip (finished), resume (from its checkpoint),
/// restart (stopped before its first checkpoint: its directory goes) or start. Returns the jobs;
/// `skipped` counts the finished runs.
std::deque<Job> plan_jobs(const std::vector<SweepRun>& runs, const fs::path& out,
                          const std::function<std::vector<std::string>(const SweepRun&)>& start,
                          int& skipped) {
  std::deque<Job> jobs;
  for (const SweepRun& r : runs) {
    const fs::path dir = out / r.name, log = out / "logs" / (r.name + ".log");
    const auto [have, want] = run_progress(dir);
    if (have >= 0 && want >= 0 && have >= want) {
      fmt::print("skip    {}: finished (step {}), val {:.4f}\n", r.name, have, final_val(dir));
      ++skipped;
    } else if (have >= 0) {
      fmt::print("resume  {}: from step {} of {}\n", r.name, have, want);
      jobs.push_back({r.name, {"train", "--resume", dir.string(), "-q"}, log});
    } else {
      if (fs::exists(dir / "config.json")) {
        fmt::print("restart {}: stopped before its first checkpoint\n", r.name);
        fs::remove_all(dir);
      } else {
        fmt::print("start   {}\n", r.name);
      }
      jobs.push_back({r.name, start(r), log});
    }
  }
  return jobs;
}

/// Writes the summary of `dir` and prints it; the exit code of the sweep.
int write_summary(const std::string& dir, const JobsResult& ran) {
  std::vector<std::string> unfinished;
  const auto rows = summarize_sweep(dir, &unfinished);
  write_sweep_summary(dir, rows);
  fmt::print("wrote {0}/summary.csv and {0}/summary.md{1}\n", dir,
             io::kFiguresBuilt ? ", val-vs-width and excess-vs-width (png, svg)"
                               : " (figures are off in this build)");
  std::ifstream md(fs::path(dir) / "summary.md");
  fmt::print("{}", std::string(std::istreambuf_iterator<char>(md), {}));
  return ran.failed > 0 ? kFailure : kOk;
}

/// `--summary DIR`: only rewrites the summary.
int summary_only(const std::string& dir) {
  std::vector<std::string> unfinished;
  const auto rows = summarize_sweep(dir, &unfinished);
  write_sweep_summary(dir, rows);
  fmt::print("wrote {0}/summary.csv and {0}/summary.md ({1} rows; {2} unfinished runs left out)\n",
             dir, rows.size(), unfinished.size());
  return kOk;
}

int run_sweep(const SweepFlags& o, const std::vector<std::string>& extras) {
  if (o.out.empty()) throw UsageError("sweep: --out DIR is required (or --summary DIR)");
  const std::vector<SweepRun> runs = expand_grid(o.grid);
  const PassedOn passed = pass_through(extras);
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const int jobs = o.jobs > 0 ? o.jobs : static_cast<int>(cores);
  const int threads = std::max(1, static_cast<int>(cores) / jobs);
  const fs::path out = o.out;
  std::error_code ec;
  fs::create_directories(out / "logs", ec);
  if (ec) throw UsageError(fmt::format("sweep: cannot create '{}': {}", o.out, ec.message()));
  const DirLock lock(out, "sweep");  // one sweep at a time in a directory
  int skipped = 0;
  std::deque<Job> queue = plan_jobs(
      runs, out,
      [&](const SweepRun& r) {
        return start_args(passed.train, o.grid.base, r, out / r.name, threads);
      },
      skipped);
  for (Job& job : queue)  // started or resumed, each run gets them
    job.args.insert(job.args.end(), passed.process_flags.begin(), passed.process_flags.end());
  fmt::print(
      "sweep: {} runs ({} finished already, {} to run), {} at a time with {} thread{} "
      "each; logs in {}/logs\n",
      runs.size(), skipped, queue.size(), jobs, threads, threads == 1 ? "" : "s", o.out);
  std::fflush(stdout);
  const JobsResult ran =
      run_jobs(fs::read_symlink("/proc/self/exe").string(), std::move(queue), jobs,
               [&](const Job& j) { return fmt::format("val {:.4f}", final_val(out / j.name)); });
  if (ran.interrupted) {
    fmt::print(stderr,
               "interrupted: {} run{} stopped with their checkpoints, {} not started; run the "
               "same command again to resume\n",
               ran.stopped, ran.stopped == 1 ? "" : "s", ran.not_started);
    return kInterrupted;
  }
  return write_summary(o.out, ran);
}

}  // namespace

Subcommand register_sweep(CLI::App& app) {
  auto o = std::make_shared<SweepFlags>();
  auto* cmd = app.add_subcommand(
      "sweep",
      "A grid of training runs (modes × widths × heads × seeds), J at a time, then a summary "
      "table (summary.csv, summary.md) with each mode's validation loss and learned excess");
  add_sweep_flags(*cmd, *o);
  return {cmd, [o, cmd]() -> int {
            return o->summary.empty() ? run_sweep(*o, cmd->remaining()) : summary_only(o->summary);
          }};
}

}  // namespace mhar::toy

/**
 * @file cli_check.cpp
 * @brief `mhar-toy check`: every CUDA kernel and the whole GPU training step against the CPU
 *        reference (the comparisons are cuda/check/'s; this file prints them as one table), and
 *        with `--report FILE` a Markdown report of this GPU (gpu_report.h) that adds the
 *        benchmarks of `bench` (cli_bench.h).
 *
 * Without a CUDA build or a GPU it says why and exits 4 (docs/cli.md, "check").
 */
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cli_bench.h"
#include "cli_common.h"
#include "device_select.h"
#include "errors.h"
#include "gpu_cache.h"
#include "gpu_report.h"
#include "io/file_util.h"

#ifdef MHAR_WITH_CUDA
#include "cuda/check/check_attention.h"
#include "cuda/check/check_layers.h"
#include "cuda/check/check_model.h"
#include "cuda/check/check_routing.h"
#include "cuda/device.h"
#endif

namespace mhar::toy {

namespace {

/// `check`'s flags.
struct CheckOptions {
  unsigned seed = 1;
  bool cuda_sync = false;
  std::string report;           ///< --report FILE ("" = none)
  std::string benches = "all";  ///< the report's benchmarks: all, tiny, none
  int repeats = 5;
};

#ifdef MHAR_WITH_CUDA
using mhar::cuda::CheckRow;

/// One line of the table; `op` replaces the row's own name (the model's summary lines).
void print_row(const CheckRow& r, const std::string& op) {
  fmt::print("{:<34} {:<7} {:<40} {:>10.2e} {:>10.2e}  {}\n", op, r.version, r.shape,
             r.worst_rel_err, r.tolerance, r.pass ? "pass" : "FAIL");
}

void print_row(const CheckRow& r) {
  print_row(r, r.op());
}

/// One model case's rows as the table shows them. Every gradient tensor is compared, but a
/// training step's gradients share one line: the rows are grouped by their step, a step with one
/// row (the loss, step "step t") shows it, and a step with several (the gradients, step
/// "step t grad") shows the passing one closest to its tolerance, after the case's other lines.
/// A failing row always shows, where it comes.
void print_model_rows(const std::vector<CheckRow>& rows) {
  std::map<std::string, int> rows_of_step;
  for (const CheckRow& r : rows) ++rows_of_step[r.step];
  std::vector<std::string> grouped;       // the grouped steps, in the order they come
  std::map<std::string, CheckRow> worst;  // per grouped step
  for (const CheckRow& r : rows) {
    if (rows_of_step[r.step] == 1 || !r.pass) {
      print_row(r);
      continue;
    }
    const auto [it, first] = worst.try_emplace(r.step, r);
    if (first)
      grouped.push_back(r.step);
    else if (tolerance_ratio(r) > tolerance_ratio(it->second))
      it->second = r;
  }
  for (const std::string& step : grouped) {
    const CheckRow& w = worst.at(step);
    print_row(w, fmt::format("{}s, worst {}", w.step, w.tensor));  // "step 2 grads, worst wq"
  }
}

/// Writes `check --report`'s file: the check's rows (in r), then the benchmarks. Returns an exit
/// code.
int write_check_report(GpuReport r, const CheckOptions& o,
                       std::chrono::steady_clock::time_point t0) {
  r.commit = build_commit();
  r.flags = build_flags();
  r.date = utc_now();
  r.command =
      fmt::format("mhar-toy check --seed {} --report {} --benches {}", o.seed, o.report, o.benches);
  if (o.benches != "none") {
    r.command += fmt::format(" --repeats {}", o.repeats);
    report_benches(r, o.repeats, o.benches == "tiny");
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  io::write_text_file_atomic(o.report, report_markdown(r));
  fmt::print("report written to {} ({:.1f} s in all); docs/gpu-results.md says where to send it\n",
             o.report, r.seconds);
  return std::all_of(r.rows.begin(), r.rows.end(), [](auto& x) { return x.pass; }) ? kOk : kFailure;
}

/// The whole check on device 0: the table (kernels, then the model case by case), its verdict
/// line, and the report when asked for. Returns an exit code.
int run_check(const CheckOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  GpuReport report;  // every row, for --report
  report.device = mhar::cuda::device_info(0);
  fmt::print("device: {}\n", mhar::cuda::device_name(0));
  fmt::print("{:<34} {:<7} {:<40} {:>10} {:>10}  {}\n", "op", "version", "shape", "worst rel",
             "tolerance", "verdict");
  auto keep = [&](const std::vector<CheckRow>& rows) {
    report.rows.insert(report.rows.end(), rows.begin(), rows.end());
  };
  for (auto* check :
       {mhar::cuda::check_routing, mhar::cuda::check_layers, mhar::cuda::check_attention}) {
    const std::vector<CheckRow> rows = check(o.seed);
    for (const CheckRow& r : rows) print_row(r);
    keep(rows);
  }
  for (const auto& c : mhar::cuda::model_check_cases()) {
    const std::vector<CheckRow> rows = mhar::cuda::check_model_step(c, 3, o.seed);
    print_model_rows(rows);
    keep(rows);
  }
  const long failed = std::count_if(report.rows.begin(), report.rows.end(),
                                    [](const CheckRow& r) { return !r.pass; });
  fmt::print("{} comparisons: {}\n", report.rows.size(),
             failed == 0 ? "all pass" : fmt::format("{} FAILED", failed));
  if (o.report.empty()) return failed == 0 ? kOk : kFailure;
  return write_check_report(std::move(report), o, t0);
}
#endif

}  // namespace

Subcommand register_check(CLI::App& app) {
  auto o = std::make_shared<CheckOptions>();
  auto* cmd = app.add_subcommand(
      "check",
      "Compare every CUDA kernel and the whole GPU training step with the CPU reference on this "
      "machine's GPU");
  cmd->add_option("--seed", o->seed, "seed of the random inputs");
  cmd->add_option("--report", o->report,
                  "also write FILE: a Markdown report of this GPU (card, driver, build, every "
                  "row, bench routing, bench step) to share (docs/gpu-results.md)")
      ->type_name("FILE");
  cmd->add_option("--benches", o->benches,
                  "the report's benchmarks: all (tiny and paper 100M shapes), tiny, none")
      ->check(one_of({"all", "tiny", "none"}));
  cmd->add_option("--repeats", o->repeats, "the report's benchmarks: timed repetitions")
      ->check(positive());
  add_cuda_sync_flag(*cmd, o->cuda_sync);
  return {cmd, [o]() -> int {
            apply_cuda_sync(o->cuda_sync);
            const std::string why = cuda_unavailable();
            if (!why.empty()) {
              fmt::print(stderr, "mhar-toy check: nothing to check: {}\n", why);
              return kUnavailable;
            }
            const auto report_dir = std::filesystem::path(o->report).parent_path();
            if (!report_dir.empty() && !std::filesystem::is_directory(report_dir))
              throw UsageError("--report " + o->report + ": no folder " + report_dir.string());
#ifdef MHAR_WITH_CUDA
            return run_check(*o);
#else
            return kUnavailable;
#endif
          }};
}

}  // namespace mhar::toy

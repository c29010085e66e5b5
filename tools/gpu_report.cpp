/**
 * @file gpu_report.cpp
 * @brief gpu_report.h: the GPU report as Markdown.
 */
#include "gpu_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "gpu_cache.h"

namespace mhar::toy {

using mhar::cuda::BenchRow;
using mhar::cuda::CheckRow;

double tolerance_ratio(const CheckRow& r) {
  if (std::isnan(r.worst_rel_err)) return std::numeric_limits<double>::infinity();
  return r.tolerance > 0 ? r.worst_rel_err / r.tolerance : r.worst_rel_err;
}

const CheckRow& worst_row(const std::vector<CheckRow>& rows) {
  // A failing row (one with a NaN included) outranks every passing one.
  return *std::max_element(rows.begin(), rows.end(), [](const CheckRow& a, const CheckRow& b) {
    if (a.pass != b.pass) return a.pass;
    return tolerance_ratio(a) < tolerance_ratio(b);
  });
}

std::vector<CheckRow>::const_iterator first_failed(const std::vector<CheckRow>& rows) {
  return std::find_if(rows.begin(), rows.end(), [](const CheckRow& x) { return !x.pass; });
}

namespace {

std::string header_table(const GpuReport& r) {
  const auto& d = r.device;
  std::string s = fmt::format("### {}, sm_{}{} — {}\n\n| | |\n|---|---|\n", d.name, d.cc_major,
                              d.cc_minor, r.date);
  s += fmt::format("| card | {} ({} SMs) |\n", d.name, d.sms);
  s += fmt::format("| compute capability | {}.{} |\n", d.cc_major, d.cc_minor);
  s += fmt::format("| driver | CUDA {} ({}) |\n", cuda_version_text(d.driver_version),
                   d.driver_version);
  s += fmt::format("| runtime | CUDA {} ({}) |\n", cuda_version_text(d.runtime_version),
                   d.runtime_version);
  s += fmt::format("| commit | {} |\n| build flags | {} |\n", r.commit, r.flags);
  s += fmt::format("| command | `{}` |\n| time taken | {:.1f} s |\n\n", r.command, r.seconds);
  return s;
}

std::string verdict_line(const GpuReport& r) {
  const long failed = std::count_if(r.rows.begin(), r.rows.end(), [](auto& x) { return !x.pass; });
  std::string s;
  if (!r.error.empty()) s += fmt::format("**check stopped by a CUDA error:** `{}`\n\n", r.error);
  if (r.rows.empty()) return s + "**check:** no comparison finished.\n\n";
  const CheckRow& w = worst_row(r.rows);
  if (failed == 0)
    return s + fmt::format(
                   "**check: {} comparisons, all pass.** Closest to its tolerance: {} ({}, {}) "
                   "at {:.2f} of it.\n\n",
                   r.rows.size(), w.op(), w.version, w.shape, tolerance_ratio(w));
  auto named = [](const CheckRow& x) {
    return fmt::format("{} ({}, {}): relative error {:.2e}, tolerance {:.2e}", x.op(), x.version,
                       x.shape, x.worst_rel_err, x.tolerance);
  };
  return s + fmt::format("**check: {} of {} comparisons FAIL.** First: {}. Worst: {}.\n\n", failed,
                         r.rows.size(), named(*first_failed(r.rows)), named(w));
}

std::string check_rows(const std::vector<CheckRow>& rows) {
  if (rows.empty()) return "";
  std::string s = fmt::format(
      "<details><summary>every comparison ({} rows)</summary>\n\n"
      "| op | version | shape | worst rel | tolerance | verdict |\n"
      "|---|---|---|---:|---:|---|\n",
      rows.size());
  for (const CheckRow& x : rows)
    s += fmt::format("| {} | {} | {} | {:.2e} | {:.2e} | {} |\n", x.op(), x.version, x.shape,
                     x.worst_rel_err, x.tolerance, x.pass ? "pass" : "**FAIL**");
  return s + "\n</details>\n\n";
}

std::string routing_tables(const std::vector<Titled<BenchRow>>& tables) {
  std::string s;
  for (const auto& t : tables) {
    s += fmt::format(
        "**bench routing**, {}:\n\n| op | version | ms | MB | GB/s | % copy |\n"
        "|---|---|---:|---:|---:|---:|\n",
        t.title);
    for (const BenchRow& b : t.rows)
      s += fmt::format("| {} | {} | {:.4f} | {:.2f} | {:.1f} | {:.1f} % |\n", b.op, b.version, b.ms,
                       b.bytes / 1e6, b.gbps, b.pct_copy);
    s += "\n";
  }
  return s;
}

std::string step_tables(const std::vector<Titled<StepTiming>>& tables) {
  std::string s;
  for (const auto& t : tables) {
    if (t.rows.empty()) continue;
    s += fmt::format(
        "**bench step**, {}:\n\n| mode | H | GPU step (ms) | ÷ residual | CPU step (ms) | "
        "GPU ÷ CPU |\n|---|---|---:|---:|---:|---:|\n",
        t.title);
    const double residual = t.rows.front().gpu_ms;
    for (const StepTiming& x : t.rows) {
      const bool cpu = x.cpu_ms > 0;
      s += fmt::format("| {} | {} | {:.2f} | {:.3f}× | {} | {} |\n", x.mode, x.heads, x.gpu_ms,
                       x.gpu_ms / residual, cpu ? fmt::format("{:.2f}", x.cpu_ms) : "-",
                       cpu ? fmt::format("{:.3f}×", x.gpu_ms / x.cpu_ms) : "-");
    }
    s += "\n";
  }
  return s;
}

}  // namespace

std::string report_markdown(const GpuReport& r) {
  std::string notes;
  for (const std::string& n : r.notes) notes += "- " + n + "\n";
  return header_table(r) + verdict_line(r) + check_rows(r.rows) + routing_tables(r.routing) +
         step_tables(r.steps) + notes;
}

}  // namespace mhar::toy

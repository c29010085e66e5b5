/**
 * @file sweep_stats.cpp
 * @brief The sweep's paired statistics and its Δ-over-width figure (see sweep_stats.h).
 */
#include "sweep_stats.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numbers>
#include <stdexcept>

#include "figures.h"

namespace mhar::toy {

double student_t_central(double t, int dof) {
  if (dof < 1) throw std::invalid_argument("student_t_central: dof must be at least 1");
  // θ = atan(|t| / √ν); A&S 26.7.3 (ν odd) and 26.7.4 (ν even).
  const double theta = std::atan(std::abs(t) / std::sqrt(static_cast<double>(dof)));
  const double s = std::sin(theta), c2 = std::cos(theta) * std::cos(theta);
  if (dof % 2 == 1) {
    // A = (2/π)(θ + sinθ (cosθ + (2/3) cos³θ + (2·4)/(3·5) cos⁵θ + … up to cos^(ν−2)θ))
    double term = std::cos(theta), sum = dof > 1 ? term : 0;
    for (int k = 3; k <= dof - 2; k += 2) sum += term *= (k - 1.0) / k * c2;
    return 2 / std::numbers::pi * (theta + s * sum);
  }
  // A = sinθ (1 + (1/2) cos²θ + (1·3)/(2·4) cos⁴θ + … up to cos^(ν−2)θ)
  double term = 1, sum = 1;
  for (int k = 2; k <= dof - 2; k += 2) sum += term *= (k - 1.0) / k * c2;
  return s * sum;
}

double student_t_quantile(double p, int dof) {
  if (!(p > 0 && p < 1) || dof < 1)
    throw std::invalid_argument(fmt::format(
        "student_t_quantile: need 0 < p < 1 and dof ≥ 1 (got p = {}, dof = {})", p, dof));
  if (p < 0.5) return -student_t_quantile(1 - p, dof);
  const double target = 2 * p - 1;  // P(|T| < t) for the upper quantile
  double lo = 0, hi = 1;
  while (student_t_central(hi, dof) < target) lo = hi, hi *= 2;
  while (hi - lo > 1e-12 * hi) {
    const double mid = 0.5 * (lo + hi);
    (student_t_central(mid, dof) < target ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

PairedStat paired_difference(const std::map<int, double>& a, const std::map<int, double>& b) {
  std::vector<double> diff;
  PairedStat st;
  for (const auto& [seed, va] : a) {
    const auto it = b.find(seed);
    if (it == b.end()) continue;
    diff.push_back(va - it->second);
    if (va < it->second) ++st.a_wins;
  }
  st.n = static_cast<int>(diff.size());
  const double nan = std::nan("");
  st.mean = st.n > 0 ? 0 : nan;
  for (double x : diff) st.mean += x / st.n;
  st.sd = st.lo = st.hi = nan;
  if (st.n >= 2) {
    double ss = 0;
    for (double x : diff) ss += (x - st.mean) * (x - st.mean);
    st.sd = std::sqrt(ss / (st.n - 1));
    // mean ± t_{0.975, n−1} · sd / √n
    const double half = student_t_quantile(0.975, st.n - 1) * st.sd / std::sqrt(st.n);
    st.lo = st.mean - half, st.hi = st.mean + half;
  }
  return st;
}

std::string config_label(const SweepRow& r) {
  return r.H > 1 ? fmt::format("{} H={}", r.mode, r.H) : r.mode;
}

std::vector<PairedStat> paired_stats(const std::vector<SweepRow>& rows) {
  std::vector<PairedStat> out;
  for (std::size_t j = 0; j < rows.size(); ++j)
    for (std::size_t i = 0; i < j; ++i) {
      if (rows[i].d != rows[j].d) continue;
      PairedStat st = paired_difference(rows[j].val_by_seed, rows[i].val_by_seed);
      if (st.n == 0) continue;
      st.a = config_label(rows[j]), st.b = config_label(rows[i]), st.d = rows[j].d;
      out.push_back(st);
    }
  // by width, and within a width in the order above
  std::stable_sort(out.begin(), out.end(),
                   [](const PairedStat& x, const PairedStat& y) { return x.d < y.d; });
  return out;
}

namespace {

std::string num(double v, const char* f) {
  return std::isnan(v) ? std::string() : fmt::format(fmt::runtime(f), v);
}

}  // namespace

std::string paired_markdown(const std::vector<PairedStat>& stats) {
  std::string md =
      "\n## Paired differences by seed\n\n"
      "A − B of the final validation loss at each width, over the seeds both finished (runs with "
      "the same seed see the same batches); negative: A is lower (better). sd over seeds; the 95 % "
      "interval of the mean is mean ± t(0.975, n − 1) · sd / √n; \"A lower\" counts the seeds "
      "where A's loss is below B's.\n\n"
      "| d | A − B | n | mean | sd | 95 % interval | A lower |\n"
      "|---|---|---|---|---|---|---|\n";
  for (const PairedStat& s : stats)
    md += fmt::format(
        "| {} | {} − {} | {} | {:+.4f} | {} | {} | {} of {} |\n", s.d, s.a, s.b, s.n, s.mean,
        num(s.sd, "{:.4f}"),
        std::isnan(s.lo) ? std::string("-") : fmt::format("[{:+.4f}, {:+.4f}]", s.lo, s.hi),
        s.a_wins, s.n);
  return md;
}

std::string paired_csv(const std::vector<PairedStat>& stats) {
  std::string csv = "d,a,b,n,mean,sd,ci_lo,ci_hi,a_wins\n";
  for (const PairedStat& s : stats)
    csv += fmt::format("{},{},{},{},{:.6f},{},{},{},{}\n", s.d, s.a, s.b, s.n, s.mean,
                       num(s.sd, "{:.6f}"), num(s.lo, "{:.6f}"), num(s.hi, "{:.6f}"), s.a_wins);
  return csv;
}

std::vector<std::string> write_delta_figure(const std::string& dir,
                                            const std::vector<PairedStat>& stats) {
  if (!io::kFiguresBuilt) return {};
  io::LinePlot plot;
  plot.title = "Δ final validation loss against residual, paired by seed (mean, 95 % t interval)";
  plot.x_label = "model width d";
  plot.y_label = "Δ validation loss (nats/byte)";
  std::map<std::string, std::pair<io::Series, io::ErrorBars>> by_pair;
  std::vector<std::string> order;  // the pairs in order of first appearance
  double x_lo = INFINITY, x_hi = -INFINITY;
  for (const PairedStat& s : stats) {
    if (s.b != "residual") continue;
    const std::string label = s.a + " − " + s.b;
    if (!by_pair.count(label)) order.push_back(label), by_pair[label].first.label = label;
    auto& [se, bars] = by_pair[label];
    se.x.push_back(s.d), se.y.push_back(s.mean);
    bars.lo.push_back(s.lo), bars.hi.push_back(s.hi);
    x_lo = std::min(x_lo, static_cast<double>(s.d)),
    x_hi = std::max(x_hi, static_cast<double>(s.d));
  }
  if (order.empty()) return {};
  for (const std::string& label : order) {
    by_pair[label].second.series = plot.series.size();
    plot.series.push_back(by_pair[label].first);
    plot.error_bars.push_back(by_pair[label].second);
  }
  plot.series.push_back({"0: no difference", {x_lo, x_hi}, {0, 0}, true});
  return io::write_lineplot((std::filesystem::path(dir) / "delta-vs-width").string(),
                            {io::Format::png, io::Format::svg}, plot);
}

}  // namespace mhar::toy

/**
 * @file probe.cpp
 * @brief The forced-compromise probe (see probe.h for the definitions).
 */
#include "probe.h"

#include <fmt/format.h>

#include <cmath>
#include <random>

#include "errors.h"
#include "heatmap.h"
#include "routing.h"
#include "routing_versions.h"
#include "thread_governor.h"

namespace mhar::toy {

namespace {

/// log softmax of z (length N), computed with the maximum subtracted.
std::vector<double> log_softmax(const std::vector<double>& z) {
  double m = -INFINITY;
  for (double v : z) m = std::max(m, v);
  double sum = 0;
  for (double v : z) sum += std::exp(v - m);
  const double lse = m + std::log(sum);
  std::vector<double> out(z.size());
  for (std::size_t n = 0; n < z.size(); ++n) out[n] = z[n] - lse;
  return out;
}

double mean_of(const std::vector<SiteProbe>& s, double SiteProbe::*field) {
  double t = 0;
  for (const auto& x : s) t += x.*field;
  return s.empty() ? 0.0 : t / static_cast<double>(s.size());
}

}  // namespace

double width_disagreement(std::span<const Mat<double>> sources, const RowVec<double>& q,
                          const RowVec<double>& g, int slices) {
  const auto N = static_cast<int>(sources.size());
  const auto P = sources[0].rows();
  const int d = static_cast<int>(sources[0].cols());
  if (slices < 1 || d % slices != 0)
    throw UsageError(fmt::format("--slices = {} must divide the width d = {}", slices, d));
  const int W = d / slices;
  const RowVec<double> qg = q.cwiseProduct(g);
  double total = 0;
  std::vector<double> z(N);
  std::vector<std::vector<double>> zs(slices, std::vector<double>(N));
  for (Eigen::Index p = 0; p < P; ++p) {
    for (int n = 0; n < N; ++n) {
      const auto row = sources[n].row(p);
      // r_n = 1 / sqrt(mean_c S_n[p,c]² + eps), over the full width
      const double r = 1.0 / std::sqrt(row.squaredNorm() / d + kRoutingEps);
      // z_{s,n} = Σ_{c∈s} q_c · g_c · r_n · S_n[p,c];  z_n = Σ_s z_{s,n}
      z[n] = 0;
      for (int s = 0; s < slices; ++s) {
        zs[s][n] = r * row.segment(s * W, W).dot(qg.segment(s * W, W));
        z[n] += zs[s][n];
      }
    }
    const std::vector<double> log_alpha = log_softmax(z);
    for (int s = 0; s < slices; ++s) {
      // KL(a_s ‖ α) = Σ_n a_s[n] · (log a_s[n] − log α[n])
      const std::vector<double> log_a = log_softmax(zs[s]);
      double kl = 0;
      for (int n = 0; n < N; ++n) kl += std::exp(log_a[n]) * (log_a[n] - log_alpha[n]);
      total += kl;
    }
  }
  return total / (static_cast<double>(P) * slices);
}

double source_collinearity(std::span<const Mat<double>> sources) {
  const auto N = static_cast<int>(sources.size());
  if (N < 2) return 0.0;
  const auto P = sources[0].rows();
  double total = 0;
  long pairs = 0;
  for (int i = 0; i < N; ++i)
    for (int j = i + 1; j < N; ++j, ++pairs) {
      double sum = 0;
      for (Eigen::Index p = 0; p < P; ++p) {
        const double ni = sources[i].row(p).norm(), nj = sources[j].row(p).norm();
        if (ni > 0 && nj > 0) sum += std::abs(sources[i].row(p).dot(sources[j].row(p))) / (ni * nj);
      }
      total += sum / static_cast<double>(P);
    }
  return total / static_cast<double>(pairs);
}

RowVec<double> null_query(const RowVec<double>& q, std::uint64_t seed, int draw) {
  Rng rng(seed * 1000003ull + static_cast<std::uint64_t>(draw));
  RowVec<double> r(q.size());
  for (Eigen::Index c = 0; c < r.size(); ++c) r(c) = rng.normal();
  const double norm = q.norm(), rn = r.norm();
  if (norm == 0 || rn == 0) return RowVec<double>::Zero(q.size());
  return r * (norm / rn);
}

ProbeResult probe_model(const Config& cfg, const Params<float>& pf, const Batch& batch, int B,
                        const ProbeOptions& opt) {
  if (!cfg.routed())
    throw UsageError(
        "a 'residual' model has no routing query to probe (train attnres, mhar, block or delta)");
  if (opt.slices < 1 || cfg.d % opt.slices != 0)
    throw UsageError(fmt::format("--slices = {} must divide the width d = {}", opt.slices, cfg.d));
  if (opt.null_draws < 1)
    throw UsageError(fmt::format("--null-draws must be positive, got {}", opt.null_draws));
  const Params<double> p = cast_params<double>(pf);
  Cache<double> cache;
  cache.routing = &fast_routing<double>();
  {
    const OneThread one;  // the same numbers on any thread count (a few windows: no time lost)
    model_forward<double>(cfg, p, batch.tokens, batch.targets, B, &cache);
  }
  ProbeResult res;
  res.H = cfg.route_heads();
  std::vector<double> disagreement;
  if (res.H > 1) disagreement = routing_map(cfg, pf, batch, B).disagreement;
  const std::vector<std::string> names = site_names(cfg);
  for (int s = 0; s < cfg.n_sites(); ++s) {
    // The sources site s read: the first s + 1 primitives (attnres, mhar), or the gathered groups.
    const std::span<const Mat<double>> src =
        cache.site_sources[s].empty()
            ? std::span<const Mat<double>>(cache.prims.data(), static_cast<std::size_t>(s) + 1)
            : std::span<const Mat<double>>(cache.site_sources[s]);
    if (src.size() < 2) continue;
    const RowVec<double> q = p.route_q.row(s), g = p.route_g.row(s);
    SiteProbe sp;
    sp.site = names[s];
    sp.n_sources = static_cast<int>(src.size());
    sp.kl_trained = width_disagreement(src, q, g, opt.slices);
    std::vector<double> nulls;
    for (int k = 0; k < opt.null_draws; ++k)
      nulls.push_back(
          width_disagreement(src, null_query(q, opt.null_seed + s * 7919ull, k), g, opt.slices));
    double mean = 0, var = 0;
    for (double v : nulls) mean += v;
    mean /= static_cast<double>(nulls.size());
    for (double v : nulls) var += (v - mean) * (v - mean);
    sp.kl_null = mean;
    sp.kl_null_sd = nulls.size() > 1 ? std::sqrt(var / static_cast<double>(nulls.size() - 1)) : 0;
    sp.excess = sp.kl_trained - sp.kl_null;
    sp.collinearity = source_collinearity(src);
    sp.head_disagreement = res.H > 1 ? disagreement[s] : 0.0;
    res.sites.push_back(sp);
  }
  res.mean.site = "mean";
  res.mean.kl_trained = mean_of(res.sites, &SiteProbe::kl_trained);
  res.mean.kl_null = mean_of(res.sites, &SiteProbe::kl_null);
  res.mean.kl_null_sd = mean_of(res.sites, &SiteProbe::kl_null_sd);
  res.mean.excess = mean_of(res.sites, &SiteProbe::excess);
  res.mean.collinearity = mean_of(res.sites, &SiteProbe::collinearity);
  res.mean.head_disagreement = mean_of(res.sites, &SiteProbe::head_disagreement);
  return res;
}

}  // namespace mhar::toy

/**
 * @file test_probe.cpp
 * @brief The forced-compromise probe (tools/probe.h) against an independent loop written here,
 *        its exact zero on fresh queries, reproducible null draws, and refusals.
 */
#include <catch2/catch.hpp>
#include <cmath>

#include "errors.h"
#include "probe.h"

using namespace mhar;
using namespace mhar::toy;

namespace {

Config tiny(Mode mode, int H) {
  Config c;
  c.mode = mode;
  c.d = 24, c.L = 3, c.n_head = 2, c.n_kv_head = 1, c.ffn = 32, c.T = 12, c.H = H, c.n_blocks = 2;
  return c;
}

/// Parameters with non-zero queries and non-unit gains, as after training.
Params<float> trained_like(const Config& cfg, std::uint64_t seed) {
  Rng rng(seed);
  Params<float> p = init_params<float>(cfg, rng);
  for (Eigen::Index i = 0; i < p.route_q.size(); ++i) {
    p.route_q.data()[i] = static_cast<float>(rng.normal(0, 2.0));
    p.route_g.data()[i] = static_cast<float>(1 + rng.normal(0, 0.3));
  }
  if (p.delta_gate.size() > 0) p.delta_gate.setConstant(0.5f);
  return p;
}

Batch random_tokens(int B, int T, std::uint64_t seed) {
  Rng rng(seed);
  Batch b;
  for (int i = 0; i < B * T; ++i) {
    b.tokens.push_back(static_cast<int>(rng.below(256)));
    b.targets.push_back(static_cast<int>(rng.below(256)));
  }
  return b;
}

/// The probe's statistic written as plain loops over std::vector, from the definition:
/// per position, per slice, KL(softmax of the slice's logits ‖ softmax of the full logits).
double kl_by_loops(const std::vector<Mat<double>>& S, const Mat<double>& q, const Mat<double>& g,
                   int site, int slices) {
  const std::size_t N = S.size();
  const long P = S[0].rows(), d = S[0].cols(), W = d / slices;
  double total = 0;
  for (long p = 0; p < P; ++p) {
    std::vector<double> r(N);
    for (std::size_t n = 0; n < N; ++n) {
      double ss = 0;
      for (long c = 0; c < d; ++c) ss += S[n](p, c) * S[n](p, c);
      r[n] = 1.0 / std::sqrt(ss / static_cast<double>(d) + 1e-6);
    }
    auto softmax = [&](long lo, long hi) {
      std::vector<double> z(N), a(N);
      double mx = -1e300, sum = 0;
      for (std::size_t n = 0; n < N; ++n) {
        for (long c = lo; c < hi; ++c) z[n] += q(site, c) * g(site, c) * r[n] * S[n](p, c);
        mx = std::max(mx, z[n]);
      }
      for (std::size_t n = 0; n < N; ++n) sum += std::exp(z[n] - mx);
      for (std::size_t n = 0; n < N; ++n) a[n] = std::exp(z[n] - mx) / sum;
      return a;
    };
    const std::vector<double> alpha = softmax(0, d);
    for (int s = 0; s < slices; ++s) {
      const std::vector<double> a = softmax(s * W, (s + 1) * W);
      for (std::size_t n = 0; n < N; ++n) total += a[n] * std::log(a[n] / alpha[n]);
    }
  }
  return total / static_cast<double>(P * slices);
}

}  // namespace

TEST_CASE("probe: the KL per site equals an independent loop", "[probe]") {
  const auto [mode, H] = GENERATE(std::pair{Mode::AttnRes, 1}, std::pair{Mode::Mhar, 4},
                                  std::pair{Mode::Block, 2}, std::pair{Mode::Delta, 3});
  const int slices = GENERATE(1, 4, 6);
  const Config cfg = tiny(mode, H);
  CAPTURE(mode_name(mode), H, slices);
  const Params<float> pf = trained_like(cfg, 7);
  const Batch b = random_tokens(2, cfg.T, 3);
  ProbeOptions opt;
  opt.slices = slices;
  opt.null_draws = 3;
  const ProbeResult r = probe_model(cfg, pf, b, 2, opt);

  // The sources of every site, gathered here from the primitives by their groups.
  const Params<double> p = cast_params<double>(pf);
  Cache<double> cache;
  model_forward<double>(cfg, p, b.tokens, b.targets, 2, &cache);
  std::size_t k = 0;
  for (int s = 0; s < cfg.n_sites(); ++s) {
    std::vector<Mat<double>> S;
    for (const SourceGroup& grp : site_groups(cfg, s)) {
      Mat<double> m = Mat<double>::Zero(cache.prims[0].rows(), cfg.d);
      for (int prim : grp.prims)
        m += prim == kNullSource ? Mat<double>(p.delta_null.replicate(m.rows(), 1))
                                 : cache.prims[prim];
      S.push_back(m);
    }
    if (S.size() < 2) continue;
    REQUIRE(k < r.sites.size());
    CAPTURE(r.sites[k].site);
    CHECK(r.sites[k].n_sources == static_cast<int>(S.size()));
    const double want = kl_by_loops(S, p.route_q, p.route_g, s, slices);
    CHECK(r.sites[k].kl_trained == Approx(want).epsilon(1e-9).margin(1e-14));
    if (slices == 1) CHECK(std::abs(r.sites[k].kl_trained) < 1e-14);  // one slice is α itself
    ++k;
  }
  CHECK(k == r.sites.size());
  CHECK(k > 0);
}

TEST_CASE("probe: a fresh model (q = 0) has zero width disagreement at every site", "[probe]") {
  const Mode mode = GENERATE(Mode::AttnRes, Mode::Mhar, Mode::Block, Mode::Delta);
  const Config cfg = tiny(mode, mode == Mode::AttnRes ? 1 : 2);
  Rng rng(1);
  const Params<float> p = init_params<float>(cfg, rng);
  const ProbeResult r = probe_model(cfg, p, random_tokens(2, cfg.T, 5), 2, ProbeOptions{});
  REQUIRE_FALSE(r.sites.empty());
  for (const auto& s : r.sites) {
    CAPTURE(s.site);
    CHECK(s.kl_trained == 0.0);
    CHECK(s.collinearity >= 0.0);  // ν = 0 (delta) is collinear with nothing
    CHECK(s.collinearity <= 1.0);
  }
}

TEST_CASE("probe: null draws are reproducible from their seed, and differ between seeds",
          "[probe]") {
  RowVec<double> q(16);
  for (int c = 0; c < 16; ++c) q(c) = std::sin(c + 1.0);
  const RowVec<double> a = null_query(q, 5, 2), b = null_query(q, 5, 2), c = null_query(q, 6, 2),
                       e = null_query(q, 5, 3);
  CHECK(a == b);
  CHECK(a != c);
  CHECK(a != e);
  CHECK(a.norm() == Approx(q.norm()).epsilon(1e-12));
  CHECK(null_query(RowVec<double>::Zero(16), 5, 2).isZero(0));

  const Config cfg = tiny(Mode::AttnRes, 1);
  const Params<float> p = trained_like(cfg, 11);
  const Batch bt = random_tokens(2, cfg.T, 4);
  ProbeOptions opt;
  opt.null_draws = 4;
  const ProbeResult r1 = probe_model(cfg, p, bt, 2, opt), r2 = probe_model(cfg, p, bt, 2, opt);
  opt.null_seed = 2;
  const ProbeResult r3 = probe_model(cfg, p, bt, 2, opt);
  REQUIRE(r1.sites.size() == r3.sites.size());
  for (std::size_t i = 0; i < r1.sites.size(); ++i) {
    CHECK(r1.sites[i].kl_null == r2.sites[i].kl_null);
    CHECK(r1.sites[i].kl_null_sd == r2.sites[i].kl_null_sd);
    CHECK(r1.sites[i].kl_null != r3.sites[i].kl_null);
    CHECK(r1.sites[i].kl_null_sd > 0);
    CHECK(r1.sites[i].excess == r1.sites[i].kl_trained - r1.sites[i].kl_null);
  }
}

TEST_CASE("probe: bad slices, no null draws and a residual model are refused", "[probe]") {
  const Config cfg = tiny(Mode::AttnRes, 1);
  Rng rng(1);
  const Params<float> p = init_params<float>(cfg, rng);
  const Batch b = random_tokens(1, cfg.T, 1);
  ProbeOptions opt;
  opt.slices = 5;
  CHECK_THROWS_WITH(probe_model(cfg, p, b, 1, opt),
                    Catch::Contains("--slices = 5 must divide the width d = 24"));
  opt.slices = 0;
  CHECK_THROWS_AS(probe_model(cfg, p, b, 1, opt), UsageError);
  opt.slices = 4;
  opt.null_draws = 0;
  CHECK_THROWS_WITH(probe_model(cfg, p, b, 1, opt), Catch::Contains("--null-draws"));
  const Config res = tiny(Mode::Residual, 1);
  Rng rng2(1);
  CHECK_THROWS_WITH(probe_model(res, init_params<float>(res, rng2), b, 1, ProbeOptions{}),
                    Catch::Contains("'residual' model has no routing query"));
}

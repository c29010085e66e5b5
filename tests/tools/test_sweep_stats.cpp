/**
 * @file test_sweep_stats.cpp
 * @brief The sweep's paired statistics (tools/sweep_stats.h): Student t quantiles against
 *        published table values and closed forms, and the paired difference against a case
 *        computed by hand.
 */
#include <catch2/catch.hpp>
#include <cmath>
#include <numbers>

#include "sweep_stats.h"

using namespace mhar::toy;

TEST_CASE("sweep stats: t quantiles match the published table", "[sweep]") {
  struct Row {
    double p;
    int dof;
    double t;  // from standard t tables (8 significant digits)
  };
  const Row table[] = {{0.975, 1, 12.706205},  {0.975, 2, 4.3026527}, {0.975, 3, 3.1824463},
                       {0.975, 4, 2.7764451},  {0.975, 5, 2.5705818}, {0.975, 10, 2.2281389},
                       {0.975, 30, 2.0422725}, {0.95, 1, 6.3137515},  {0.995, 4, 4.6040949},
                       {0.9, 7, 1.4149239}};
  for (const Row& r : table) {
    CAPTURE(r.p, r.dof);
    CHECK(student_t_quantile(r.p, r.dof) == Approx(r.t).epsilon(2e-7));
    CHECK(student_t_quantile(1 - r.p, r.dof) == Approx(-r.t).epsilon(2e-7));
  }
  // Closed forms: ν = 1 is Cauchy, t_p = tan(π(p − ½)); ν = 2: t_p = (2p − 1) √(2 / (4p(1 − p))).
  for (double p : {0.6, 0.8, 0.99}) {
    CAPTURE(p);
    CHECK(student_t_quantile(p, 1) ==
          Approx(std::tan(std::numbers::pi * (p - 0.5))).epsilon(1e-10));
    CHECK(student_t_quantile(p, 2) ==
          Approx((2 * p - 1) * std::sqrt(2 / (4 * p * (1 - p)))).epsilon(1e-10));
  }
  CHECK(student_t_quantile(0.5, 3) == Approx(0).margin(1e-12));
  // Large ν tends to the normal quantile 1.959964 (Cornish–Fisher to 1/ν²: 1.9611508).
  CHECK(student_t_quantile(0.975, 2000) == Approx(1.9611508).epsilon(1e-6));
  CHECK_THROWS_AS(student_t_quantile(1.0, 3), std::invalid_argument);
  CHECK_THROWS_AS(student_t_quantile(0.9, 0), std::invalid_argument);
}

TEST_CASE("sweep stats: the paired difference of a hand-computed case", "[sweep]") {
  // A − B by seed: −0.1, 0, −0.2 (seed 4 is A's only: left out). mean −0.1;
  // sd = √((0² + 0.1² + 0.1²) / 2) = 0.1; half-width = t(0.975, 2) · 0.1 / √3 = 0.2484138;
  // A is lower at seeds 1 and 3 (seed 2 is a tie, not a win).
  const std::map<int, double> a = {{1, 2.0}, {2, 2.1}, {3, 2.3}, {4, 1.0}};
  const std::map<int, double> b = {{1, 2.1}, {2, 2.1}, {3, 2.5}};
  const PairedStat s = paired_difference(a, b);
  CHECK(s.n == 3);
  CHECK(s.mean == Approx(-0.1).margin(1e-12));
  CHECK(s.sd == Approx(0.1).epsilon(1e-9));
  CHECK(s.lo == Approx(-0.1 - 0.2484138).epsilon(1e-6));
  CHECK(s.hi == Approx(-0.1 + 0.2484138).epsilon(1e-6));
  CHECK(s.a_wins == 2);
  // One common seed: a difference, no spread and no interval.
  const PairedStat one = paired_difference({{1, 2.0}}, b);
  CHECK(one.n == 1);
  CHECK(one.mean == Approx(-0.1));
  CHECK(std::isnan(one.sd));
  CHECK(std::isnan(one.lo));
}

TEST_CASE("sweep stats: pairs within each width, later configuration minus earlier", "[sweep]") {
  const auto row = [](std::string mode, int d, int H, std::map<int, double> v) {
    SweepRow r;
    r.mode = std::move(mode), r.d = d, r.H = H, r.val_by_seed = std::move(v);
    return r;
  };
  const std::vector<SweepRow> rows = {
      row("residual", 32, 0, {{1, 2.5}, {2, 2.6}}), row("attnres", 32, 0, {{1, 2.4}, {2, 2.65}}),
      row("mhar", 32, 4, {{1, 2.3}, {2, 2.5}}), row("residual", 64, 0, {{1, 2.1}})};
  const std::vector<PairedStat> st = paired_stats(rows);
  REQUIRE(st.size() == 3);  // d 64 has one configuration: no pair
  CHECK((st[0].a == "attnres" && st[0].b == "residual" && st[0].d == 32));
  CHECK(st[0].mean == Approx(-0.025));
  CHECK(st[0].a_wins == 1);
  CHECK((st[1].a == "mhar H=4" && st[1].b == "residual"));
  CHECK(st[1].a_wins == 2);
  CHECK((st[2].a == "mhar H=4" && st[2].b == "attnres"));
  CHECK(st[2].mean == Approx(-0.125));
  const std::string md = paired_markdown(st);
  CHECK_THAT(md, Catch::Contains("| 32 | mhar H=4 − attnres | 2 | -0.1250 |"));
  CHECK_THAT(paired_csv(st),
             Catch::StartsWith("d,a,b,n,mean,sd,ci_lo,ci_hi,a_wins\n32,attnres,residual,2,"));
}

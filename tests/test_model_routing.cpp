/**
 * @file test_model_routing.cpp
 * @brief The model under the fast CPU routing (cpu/routing_versions.h) against the same model
 *        under the reference's routing: a whole training step (loss, every gradient, the
 *        parameters after one AdamW step) in every mode, and the decoder's logits.
 *
 * The truth is the reference in double (docs/style.md §7). In float, the fast routing's error
 * against it may be a small multiple of the reference's own float error: the fast versions sum
 * in another order, so they round differently, but no more.
 */
#include <catch2/catch.hpp>

#include "decode.h"
#include "gradcheck.h"
#include "model.h"
#include "perturbed.h"
#include "routing_versions.h"

using namespace mhar;
using mhar::test::perturbed;
using mhar::test::WorstError;

namespace {

/// Two sequences of T = 40 (P = 80: three blocks of kRoutingBlock = 32 positions, the last one
/// partial). d 32 with H 4 gives heads of 8 values (B3's row-by-row order); d 24 with H 2 gives
/// heads of 12 (its site-by-site order, and vector loops with a scalar tail).
Config shape(Mode mode, int d, int H) {
  Config c;
  c.d = d;
  c.L = 2;
  c.n_head = 2;
  c.n_kv_head = 1;
  c.ffn = 40;
  c.T = 40;
  c.mode = mode;
  c.H = H;
  c.n_blocks = 2;
  return c;
}
constexpr int kBatch = 2;

/// AdamW's moments after a first step (the reference in double, on another batch): the step
/// compared below is the second, whose update divides by √v of both steps' gradients. (At the
/// first step it would divide each gradient by its own magnitude, turning the rounding of a
/// gradient near AdamW's eps into a change of lr in its parameter, in any float run.)
struct Moments {
  Params<double> m, v;
};

/// One training step: the loss, every gradient, the clipped norm and the parameters after the
/// AdamW step, from the moments `prior`.
template <typename T>
struct Step {
  double loss = 0, norm = 0;
  Params<T> grads, after;
};

template <typename T>
Step<T> train_step(const Config& cfg, const Params<T>& p, const std::vector<int>& x,
                   const std::vector<int>& y, const Moments& prior, const Routing<T>& routing) {
  Step<T> s;
  Cache<T> cache;
  cache.routing = &routing;
  s.loss = model_forward(cfg, p, x, y, kBatch, &cache);
  model_backward(s.grads, cfg, p, cache);
  s.norm = clip_grad_norm(s.grads, 1.0);
  s.after = p;
  Params<T> m = cast_params<T>(prior.m), v = cast_params<T>(prior.v);
  adamw_step(s.after, m, v, s.grads, 2, 1e-3, AdamWHyper{});
  return s;
}

/// The worst error of a step against the truth, each tensor on its own scale.
///
/// After the AdamW step, the query and key gain of a site with one source are left out: that
/// site's softmax is 1 whatever its logits, so their gradient is 0 in exact arithmetic and any
/// float run gives rounding noise there (in the reference's as much as in the fast one's), which
/// AdamW, dividing by √v, turns into a change of up to lr. Their gradients are compared.
template <typename T>
double step_error(const Config& cfg, const Step<T>& a, const Step<double>& truth) {
  WorstError worst;
  worst.value = std::max(std::abs(a.loss - truth.loss) / std::abs(truth.loss),
                         std::abs(a.norm - truth.norm) / truth.norm);
  for_each_tensor(
      [&](const std::string&, bool, const Mat<T>& g, const Mat<double>& tg) { worst.add(g, tg); },
      a.grads, truth.grads);
  for_each_tensor(
      [&](const std::string& name, bool, const Mat<T>& w, const Mat<double>& tw) {
        Mat<double> x = w.template cast<double>();
        if (name == "route.q" || name == "route.g")
          for (int s = 0; s < cfg.n_sites(); ++s)
            if (site_groups(cfg, s).size() == 1) x.row(s) = tw.row(s);
        worst.add(x, tw);
      },
      a.after, truth.after);
  return worst.value;
}

}  // namespace

TEST_CASE("a training step under the fast CPU routing matches the reference's, every mode",
          "[model][routing][fast]") {
  const Mode mode = GENERATE(from_range(std::begin(kModes), std::end(kModes)));
  const auto [d, H] = GENERATE(std::pair{32, 4}, std::pair{24, 2});
  const Config cfg = shape(mode, d, H);
  CAPTURE(mode_name(mode), d, H);
  Rng rng(4100 + static_cast<int>(mode) * 13 + d);
  std::vector<int> x(kBatch * cfg.T), y(x.size());
  for (auto& t : x) t = static_cast<int>(rng.below(256));
  for (auto& t : y) t = static_cast<int>(rng.below(256));
  const Params<double> p = perturbed(cfg, rng);
  const Params<float> pf = cast_params<float>(p);
  Moments prior{zero_params<double>(cfg), zero_params<double>(cfg)};
  {
    std::vector<int> x0(x.size()), y0(x.size());
    for (auto& t : x0) t = static_cast<int>(rng.below(256));
    for (auto& t : y0) t = static_cast<int>(rng.below(256));
    Cache<double> cache;
    Params<double> g, first = p;
    model_forward(cfg, p, x0, y0, kBatch, &cache);
    model_backward(g, cfg, p, cache);
    clip_grad_norm(g, 1.0);
    adamw_step(first, prior.m, prior.v, g, 1, 1e-3, AdamWHyper{});
  }

  const Step<double> truth = train_step(cfg, p, x, y, prior, reference_routing<double>());
  // Double: the two orders of summation round differently, by a few ulps of each tensor's scale;
  // 1e-11 is ~50000 ulps (2.2e-16), far above that and far below any wrong term.
  const double err_double =
      step_error(cfg, train_step(cfg, p, x, y, prior, fast_routing<double>()), truth);
  CAPTURE(err_double);
  CHECK(err_double < 1e-11);

  // Float: the fast routing's error may be a small multiple of the reference's own float error
  // (docs/style.md §7); the floor of 1e-7 (≈ one float ulp of 1) covers a reference error that
  // happens to be ~0.
  const double err_ref =
      step_error(cfg, train_step(cfg, pf, x, y, prior, reference_routing<float>()), truth);
  const double err_fast =
      step_error(cfg, train_step(cfg, pf, x, y, prior, fast_routing<float>()), truth);
  CAPTURE(err_ref, err_fast);
  CHECK(err_fast <= mhar::test::version_tolerance(err_ref));
}

TEST_CASE("the decoder under the fast CPU routing gives the reference's logits, every mode",
          "[decode][routing][fast]") {
  const Mode mode = GENERATE(from_range(std::begin(kModes), std::end(kModes)));
  Config cfg = shape(mode, 24, 2);
  cfg.T = 12;
  CAPTURE(mode_name(mode));
  Rng rng(4200 + static_cast<int>(mode));
  const Params<double> p = perturbed(cfg, rng);
  std::vector<int> tokens(cfg.T);
  for (auto& t : tokens) t = static_cast<int>(rng.below(256));

  // `fast` is not made for cfg yet: the prefill makes it (decode_start) and keeps its routing.
  DecodeState<double> ref = decode_start<double>(cfg), fast;
  fast.routing = &fast_routing<double>();
  const std::vector<int> prompt(tokens.begin(), tokens.begin() + 5);
  WorstError worst;  // in double, as in the training step above: 1e-11
  worst.add(decode_prefill(cfg, p, fast, prompt), decode_prefill(cfg, p, ref, prompt));
  for (int t = 5; t < cfg.T; ++t)
    worst.add(decode_step(cfg, p, fast, tokens[t]), decode_step(cfg, p, ref, tokens[t]));
  CAPTURE(worst.value);
  CHECK(worst.value < 1e-11);
  CHECK(fast.routing == &fast_routing<double>());
}

TEST_CASE("the CPU routing names parse back, and a bad one is refused with the allowed names",
          "[routing][bad-input]") {
  for (const std::string& name : cpu_routing_names())
    CHECK(cpu_routing_name(parse_cpu_routing(name)) == name);
  CHECK_THROWS_WITH(
      parse_cpu_routing("warp"),
      Catch::Matchers::Contains("'warp'") && Catch::Matchers::Contains("allowed: reference, fast"));
}

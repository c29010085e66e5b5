/**
 * @file test_backend.cpp
 * @brief The CPU backend's data-parallel step (tools/backend.cpp) against the one-thread step:
 *        in every mode, with shards of unequal rows, the loss and every gradient agree with the
 *        truth in double as closely as the one-thread step does (version_tolerance of
 *        tests/gradcheck.h, the CPU versions' rule), and a step with the same thread count is
 *        bit for bit the same twice.
 */
#include <omp.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "backend.h"
#include "gradcheck.h"
#include "model.h"
#include "perturbed.h"

using namespace mhar;
using mhar::toy::Batch;

namespace {

Config small(Mode mode, int H) {
  Config c;
  c.d = 16, c.L = 2, c.n_head = 2, c.n_kv_head = 1, c.ffn = 24, c.T = 8;
  c.mode = mode, c.H = H, c.n_blocks = 2;
  return c;
}

/// The loss and the gradients (every tensor, for_each order) of one step on `threads` threads.
struct StepOut {
  double loss = 0;
  std::vector<Mat<double>> grads;
};

StepOut cpu_step(const Config& c, const Params<float>& start, const Batch& b, int rows,
                 int threads) {
  omp_set_num_threads(threads);
  Params<float> p = start, m = zero_params<float>(c), v = zero_params<float>(c);
  auto backend = toy::make_backend("cpu", c, rows, p, m, v, CpuRouting::Fast);
  StepOut out;
  out.loss = backend->forward(b);
  backend->backward();
  backend->clip(0);  // 0: no clipping
  AdamWHyper hy;
  backend->adamw(1, 0.0, hy);  // lr 0: p stays; after step 1, m = (1 − β1) · grad
  m.for_each([&](const std::string&, const Mat<float>& t, bool) {
    out.grads.push_back(t.cast<double>() / (1.0 - hy.beta1));
  });
  omp_set_num_threads(1);
  return out;
}

StepOut truth(const Config& c, const Params<float>& p, const Batch& b, int rows) {
  const Params<double> pd = cast_params<double>(p);
  Cache<double> cache;
  StepOut out;
  out.loss = model_forward<double>(c, pd, b.tokens, b.targets, rows, &cache);
  Params<double> g;
  model_backward(g, c, pd, cache);
  g.for_each([&](const std::string&, const Mat<double>& t, bool) { out.grads.push_back(t); });
  return out;
}

}  // namespace

TEST_CASE("backend: the data-parallel CPU step gives the one-thread step's loss and gradients",
          "[backend]") {
  const auto [mode, H] = GENERATE(std::pair{Mode::Residual, 0}, std::pair{Mode::AttnRes, 1},
                                  std::pair{Mode::Mhar, 4}, std::pair{Mode::Block, 2},
                                  std::pair{Mode::Delta, 2});
  const int threads = GENERATE(2, 3, 8);  // 5 rows: shards of 2 and 3; 1, 2, 2; 1 each (5 ≤ 8)
  CAPTURE(mode_name(mode), H, threads);
  const Config c = small(mode, H);
  const int rows = 5;
  Rng rng(7);
  const Params<float> p = cast_params<float>(test::perturbed(c, rng));
  Batch b;
  for (int i = 0; i < rows * c.T; ++i) {
    b.tokens.push_back(static_cast<int>(rng.below(256)));
    b.targets.push_back(static_cast<int>(rng.below(256)));
  }
  const StepOut want = truth(c, p, b, rows), one = cpu_step(c, p, b, rows, 1),
                par = cpu_step(c, p, b, rows, threads), again = cpu_step(c, p, b, rows, threads);
  const double loss_one = std::abs(one.loss - want.loss) / want.loss;
  CHECK(std::abs(par.loss - want.loss) / want.loss <= test::version_tolerance(loss_one));
  REQUIRE(par.grads.size() == want.grads.size());
  for (std::size_t t = 0; t < want.grads.size(); ++t) {
    CAPTURE(t);
    const double err_one = test::scaled_error(one.grads[t], want.grads[t]);
    CHECK(test::scaled_error(par.grads[t], want.grads[t]) <= test::version_tolerance(err_one));
    CHECK((par.grads[t].array() == again.grads[t].array()).all());  // deterministic
  }
  CHECK(par.loss == again.loss);
}

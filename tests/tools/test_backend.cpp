/**
 * @file test_backend.cpp
 * @brief The CPU backend's data-parallel step (tools/backend.cpp) against the step on one shard:
 *        in every mode, with shards of unequal rows, the loss and every gradient agree with the
 *        truth in double as closely as the one-shard step does (version_tolerance of
 *        tests/gradcheck.h, the CPU versions' rule), and with the same shards the step and the
 *        validation loss are bit for bit the same on 1, 2 and 3 threads.
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

/// The loss and the gradients (every tensor, for_each order) of one step on `threads` threads
/// and `shards` shards, and then the validation loss of the same batch.
struct StepOut {
  double loss = 0, val = 0;
  std::vector<Mat<double>> grads;
};

StepOut cpu_step(const Config& c, const Params<float>& start, const Batch& b, int rows, int threads,
                 int shards) {
  omp_set_num_threads(threads);
  Params<float> p = start, m = zero_params<float>(c), v = zero_params<float>(c);
  auto backend = toy::make_backend("cpu", c, rows, p, m, v, CpuRouting::Fast, shards);
  StepOut out;
  out.loss = backend->forward(b);
  backend->backward();
  backend->clip(0);  // 0: no clipping
  AdamWHyper hy;
  backend->adamw(1, 0.0, hy);  // lr 0: p stays; after step 1, m = (1 − β1) · grad
  out.val = backend->loss(b);
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

TEST_CASE(
    "backend: the data-parallel CPU step gives the one-shard step's loss and gradients, "
    "the same bits on any thread count",
    "[backend]") {
  const auto [mode, H] =
      GENERATE(std::pair{Mode::Residual, 0}, std::pair{Mode::AttnRes, 1}, std::pair{Mode::Mhar, 4},
               std::pair{Mode::Block, 2}, std::pair{Mode::Delta, 2});
  const int shards = GENERATE(2, 3, 8);  // 5 rows: shards of 2 and 3; 1, 2, 2; 1 each (5 ≤ 8)
  CAPTURE(mode_name(mode), H, shards);
  const Config c = small(mode, H);
  const int rows = 5;
  Rng rng(7);
  const Params<float> p = cast_params<float>(test::perturbed(c, rng));
  Batch b;
  for (int i = 0; i < rows * c.T; ++i) {
    b.tokens.push_back(static_cast<int>(rng.below(256)));
    b.targets.push_back(static_cast<int>(rng.below(256)));
  }
  const StepOut want = truth(c, p, b, rows), one = cpu_step(c, p, b, rows, 1, 1);
  const double loss_one = std::abs(one.loss - want.loss) / want.loss;
  // the same shards on 1, 2 and 3 threads (3 > the 2 shards of the first case)
  std::vector<StepOut> runs;
  for (const int threads : {1, 2, 3}) runs.push_back(cpu_step(c, p, b, rows, threads, shards));
  const StepOut& par = runs[1];
  CHECK(std::abs(par.loss - want.loss) / want.loss <= test::version_tolerance(loss_one));
  REQUIRE(par.grads.size() == want.grads.size());
  for (std::size_t t = 0; t < want.grads.size(); ++t) {
    CAPTURE(t);
    const double err_one = test::scaled_error(one.grads[t], want.grads[t]);
    CHECK(test::scaled_error(par.grads[t], want.grads[t]) <= test::version_tolerance(err_one));
    for (const StepOut& r : runs)  // bit for bit, whatever the thread count
      CHECK((r.grads[t].array() == par.grads[t].array()).all());
  }
  for (const StepOut& r : runs) {
    CHECK(r.loss == par.loss);
    CHECK(r.val == par.val);
  }
}

/**
 * @file test_cuda_model.cpp
 * @brief The whole training step on the GPU (cuda/model.cpp) against the CPU reference, in
 *        every residual mode: loss and every parameter gradient over three steps of a training
 *        trajectory (cuda/check/check_model.h), determinism, and bad input.
 *
 * Without a CUDA device each [gpu] case prints "MHAR_SKIP: no CUDA device (...)" and returns,
 * which ctest reports as Skipped. The bad-input case needs no device: the checks run first.
 */
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "cuda/check/check_model.h"
#include "cuda/device.h"
#include "cuda/model.h"
#include "cuda_test_util.h"
#include "model.h"

using namespace mhar::cuda;
using namespace mhar::cuda::test;

TEST_CASE("GPU training step matches the reference in every mode (loss, every gradient)",
          "[gpu][model]") {
  if (!have_gpu()) return;
  const ModelCheckCase c = GENERATE(from_range(model_check_cases()));
  CAPTURE(c.name);
  check_rows(check_model_step(c, 3, 2024));
}

TEST_CASE("GPU training step is deterministic: same loss and gradient bits on every run",
          "[gpu][model]") {
  if (!have_gpu()) return;
  for (mhar::Mode mode : {mhar::Mode::Mhar, mhar::Mode::Delta}) {
    mhar::Config cfg;
    cfg.d = 32;
    cfg.L = 2;
    cfg.T = 9;
    cfg.ffn = 48;
    cfg.mode = mode;
    cfg.H = 4;
    mhar::Rng rng(5);
    mhar::Params<float> p = mhar::init_params<float>(cfg, rng);
    p.route_q = rng.normal_matrix<float>(p.route_q.rows(), p.route_q.cols(), 0, 0.5);
    if (mode == mhar::Mode::Delta) p.delta_gate.setConstant(0.3f);
    std::vector<int> x(3 * 9), y(3 * 9);
    for (std::size_t i = 0; i < x.size(); ++i) {
      x[i] = static_cast<int>(rng.below(256));
      y[i] = static_cast<int>(rng.below(256));
    }
    DeviceParams dp(cfg, p), g1(cfg), g2(cfg);
    DeviceCache cache;
    const float l1 = model_forward(cfg, dp, x, y, 3, cache);
    model_backward(g1, cfg, dp, cache);
    cache.poison();
    const float l2 = model_forward(cfg, dp, x, y, 3, cache);
    model_backward(g2, cfg, dp, cache);
    CAPTURE(mhar::mode_name(mode));
    CHECK(same_bits({l1}, {l2}));
    CHECK(same_bits(g1.download_flat(), g2.download_flat()));
  }
}

TEST_CASE("GPU model rejects a bad batch before touching the device", "[model][bad-input]") {
  using Catch::Matchers::Contains;
  mhar::Config cfg;
  cfg.T = 4;
  DeviceParams none;  // never dereferenced: the checks fail first
  DeviceCache cache;
  const std::vector<int> ok(8, 1), short_batch(7, 1);
  std::vector<int> bad = ok;
  bad[5] = 256;
  CHECK_THROWS_WITH(model_forward(cfg, none, short_batch, ok, 2, cache),
                    Contains("tokens has 7 entries, expected B·T = 8"));
  CHECK_THROWS_WITH(model_forward(cfg, none, ok, bad, 2, cache),
                    Contains("targets 256 at position 5 is outside the vocabulary [0, 256)"));
  CHECK_THROWS_WITH(model_forward(cfg, none, ok, ok, 0, cache), Contains("B must be positive"));
  cfg.H = 3;  // does not divide d = 128
  CHECK_THROWS_WITH(model_forward(cfg, none, ok, ok, 2, cache), Contains("must divide d = 128"));
  cfg.H = 0;
  CHECK_THROWS_WITH(model_forward(cfg, none, ok, ok, 2, cache),
                    Contains("parameters do not match the config"));
  CHECK_THROWS_WITH(model_backward(none, cfg, none, cache), Contains("holds no loss"));
}

TEST_CASE("GPU model refuses a cache made for another model shape, reallocates for another B",
          "[gpu][model]") {
  using Catch::Matchers::Contains;
  if (!have_gpu()) return;
  mhar::Config cfg;
  cfg.d = 32;
  cfg.L = 2;
  cfg.T = 9;
  cfg.ffn = 48;
  cfg.H = 4;
  mhar::Rng rng(11);
  auto batch = [&](int B) {
    std::vector<int> x(static_cast<std::size_t>(B * 9));
    for (auto& t : x) t = static_cast<int>(rng.below(256));
    return x;
  };
  const std::vector<int> x3 = batch(3), y3 = batch(3), x2 = batch(2), y2 = batch(2);
  DeviceParams dp(cfg, mhar::init_params<float>(cfg, rng)), grads(cfg);
  DeviceCache cache;
  cache.routing = RoutingVersion::Warp;
  model_forward(cfg, dp, x3, y3, 3, cache);
  CHECK(cache.B == 3);

  // Another B: the cache is reallocated for it, its routing version kept.
  model_forward(cfg, dp, x2, y2, 2, cache);
  CHECK(cache.B == 2);
  CHECK(cache.P == 18);
  CHECK(cache.routing == RoutingVersion::Warp);
  model_backward(grads, cfg, dp, cache);

  // Another shape: refused with what differs.
  for (int k = 0; k < 5; ++k) {
    mhar::Config other = cfg;
    std::string expected;
    switch (k) {
      case 0:
        other.d = 64;
        expected = "d 32 (cache) vs 64";
        break;
      case 1:
        other.L = 3;
        expected = "L 2 (cache) vs 3";
        break;
      case 2:
        other.mode = mhar::Mode::Delta;
        expected = "mode mhar (cache) vs delta";
        break;
      case 3:
        other.H = 2;
        expected = "routing heads 4 (cache) vs 2";
        break;
      case 4:
        other.ffn = 64;
        expected = "ffn 48 (cache) vs 64";
        break;
    }
    CAPTURE(expected);
    mhar::Rng r2(12);
    DeviceParams other_p(other, mhar::init_params<float>(other, r2)), other_g(other);
    CHECK_THROWS_WITH(model_forward(other, other_p, x2, y2, 2, cache),
                      Contains("cuda::model_forward: the cache was made for another model") &&
                          Contains(expected));
    CHECK_THROWS_WITH(model_backward(other_g, other, other_p, cache),
                      Contains("cuda::model_backward: the cache was made for another model") &&
                          Contains(expected));
    // What the refusal leaves: the cache as it was, still usable with its own model.
    CHECK(cache.B == 2);
    CHECK(cache.shape_mismatch(cfg).empty());
  }
}

/**
 * @file test_cuda_layers.cpp
 * @brief Layer and optimiser twins (cuda/layers.cu, cuda/linear.cu, cuda/optim.cu) against the CPU
 * reference; the determinism of their reductions; and argument checks that need no GPU.
 *
 * The comparisons and their tolerance live in cuda/check/check_layers.cpp: each check poisons the
 * `=` outputs with NaN before the launch and starts the `+=` outputs from random values; this
 * file asserts them, shape by shape. Without a CUDA device each [gpu] case prints
 * "MHAR_SKIP: no CUDA device (...)" and returns, which ctest reports as Skipped.
 */
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/check/check_layers.h"
#include "cuda/device.h"
#include "cuda/layers.h"
#include "cuda/linear.h"
#include "cuda/optim.h"
#include "cuda/tensor_ops.h"
#include "cuda_test_util.h"
#include "tensor.h"

using namespace mhar::cuda;

using namespace mhar::cuda::test;

TEST_CASE("rmsnorm twin matches the reference (y, rinv, dx, dgain accumulating)", "[gpu][layers]") {
  if (!have_gpu()) return;
  const LayerShape s = GENERATE(from_range(layer_check_shapes()));
  CAPTURE(describe(s));
  check_rows(check_rmsnorm(s, 2024));
}

TEST_CASE("rope twin matches the reference (forward, backward)", "[gpu][layers]") {
  if (!have_gpu()) return;
  const LayerShape s = GENERATE(from_range(layer_check_shapes()));
  CAPTURE(describe(s));
  check_rows(check_rope(s, 2024));
}

TEST_CASE("swiglu twin matches the reference MLP's middle step (h, dgate, dup)", "[gpu][layers]") {
  if (!have_gpu()) return;
  const LayerShape s = GENERATE(from_range(layer_check_shapes()));
  CAPTURE(describe(s));
  check_rows(check_swiglu(s, 2024));
}

TEST_CASE("linear twin (cuBLAS) matches the reference (y, dx, dW accumulating)", "[gpu][layers]") {
  if (!have_gpu()) return;
  const LayerShape s = GENERATE(from_range(layer_check_shapes()));
  CAPTURE(describe(s));
  check_rows(check_linear(s, 2024));
}

TEST_CASE("SwiGLU MLP twin matches the reference (y, gate, up, then dx, dW accumulating)",
          "[gpu][layers]") {
  if (!have_gpu()) return;
  const LayerShape s = GENERATE(from_range(layer_check_shapes()));
  CAPTURE(describe(s));
  check_rows(check_mlp(s, 2024));
}

TEST_CASE("embedding twin matches the reference (x, dE accumulating)", "[gpu][layers]") {
  if (!have_gpu()) return;
  const LayerShape s = GENERATE(from_range(layer_check_shapes()));
  CAPTURE(describe(s));
  check_rows(check_embedding(s, 2024));
}

TEST_CASE("cross-entropy twin matches the reference (loss, probs, dlogits)", "[gpu][layers]") {
  if (!have_gpu()) return;
  const LayerShape s = GENERATE(from_range(layer_check_shapes()));
  CAPTURE(describe(s));
  check_rows(check_cross_entropy(s, 2024));
}

TEST_CASE("adamw twin matches the reference (param, m, v, with and without decay)",
          "[gpu][optim]") {
  if (!have_gpu()) return;
  const LayerShape s = GENERATE(from_range(layer_check_shapes()));
  CAPTURE(describe(s));
  check_rows(check_adamw(s, 2024));
}

TEST_CASE("clipping twins match the reference (grad_sq_norm accumulating, scale)", "[gpu][optim]") {
  if (!have_gpu()) return;
  const LayerShape s = GENERATE(from_range(layer_check_shapes()));
  CAPTURE(describe(s));
  check_rows(check_clip(s, 2024));
}

TEST_CASE("column_sum_add matches a double sum, over several chunks of rows", "[gpu][layers]") {
  if (!have_gpu()) return;
  // P spans several 64-row chunks and ends in a partial one; d is odd. out starts non-zero (+=).
  const int P = GENERATE(1, 63, 64, 1000), d = 37;
  CAPTURE(P);
  mhar::Rng rng(7);
  const auto x = random_vector(rng, std::size_t(P) * d), out0 = random_vector(rng, d);
  std::vector<double> truth(d);
  std::vector<float> ref_float(d);
  for (int c = 0; c < d; ++c) {
    double t = 0.0;
    float f = 0.f;
    for (int p = 0; p < P; ++p) {
      t += x[std::size_t(p) * d + c];
      f += x[std::size_t(p) * d + c];
    }
    truth[c] = out0[c] + t;
    ref_float[c] = out0[c] + f;
  }
  DeviceBuffer dx(x), dout(out0);
  column_sum_add(dout.data(), dx.data(), P, d);
  check_rows({compare_with_truth("column_sum_add", "", "v1", "P=" + std::to_string(P) + " d=37",
                                 truth, ref_float, dout.download())});
}

TEST_CASE("check_layers passes on every shape for several seeds", "[gpu][layers]") {
  if (!have_gpu()) return;
  const unsigned seed = GENERATE(1u, 2u);
  CAPTURE(seed);
  const auto rows = check_layers(seed);
  // Rows per shape: rmsnorm 4, rope 2, swiglu 3, linear 3, MLP 7, embedding 2, cross-entropy 3,
  // adamw 6, clip 2.
  CHECK(rows.size() == layer_check_shapes().size() * 32);
  check_rows(rows);
}

TEST_CASE("layer reductions are deterministic: same bits on every run", "[gpu][layers]") {
  if (!have_gpu()) return;
  // Several dgain chunks, many cross-entropy rows, several grad_sq_norm blocks, repeated tokens.
  const int P = 5001, d = 96, vocab = 256;
  const std::size_t Pd = std::size_t(P) * d;
  mhar::Rng rng(99);
  const auto x = random_vector(rng, Pd), dy = random_vector(rng, Pd),
             gain = random_vector(rng, d, 1.0, 0.3), dgain0 = random_vector(rng, d),
             logits = random_vector(rng, std::size_t(P) * vocab, 0.0, 2.0),
             dE0 = random_vector(rng, std::size_t(vocab) * d);
  std::vector<int> tokens(P);
  for (int& t : tokens) t = static_cast<int>(rng.below(vocab));
  DeviceBuffer d_x(x), d_dy(dy), d_gain(gain), d_logits(logits), d_tokens = upload_ints(tokens);
  DeviceBuffer y(Pd), rinv(P);
  rmsnorm_forward(y.data(), rinv.data(), d_x.data(), d_gain.data(), P, d);

  std::vector<std::vector<float>> runs;
  for (int run = 0; run < 2; ++run) {
    DeviceBuffer dx(Pd), dgain(dgain0);
    rmsnorm_backward(dx.data(), dgain.data(), d_dy.data(), rinv.data(), d_x.data(), d_gain.data(),
                     P, d);
    runs.push_back(dx.download());
    runs.push_back(dgain.download());
    DeviceBuffer loss(1), probs(std::size_t(P) * vocab);
    cross_entropy_forward(loss.data(), probs.data(), d_logits.data(), device_ints(d_tokens), P,
                          vocab);
    runs.push_back(loss.download());
    runs.push_back(probs.download());
    DeviceBuffer sq(std::vector<float>{0.0f});
    grad_sq_norm(sq.data(), d_x.data(), Pd);
    runs.push_back(sq.download());
    DeviceBuffer dE(dE0);
    embedding_backward(dE.data(), d_dy.data(), device_ints(d_tokens), P, d, vocab);
    runs.push_back(dE.download());
  }
  const char* names[] = {"rmsnorm dx",          "rmsnorm dgain", "cross-entropy loss",
                         "cross-entropy probs", "grad_sq_norm",  "embedding dE"};
  const std::size_t per_run = runs.size() / 2;
  for (std::size_t k = 0; k < per_run; ++k) {
    INFO(names[k]);
    CHECK(same_bits(runs[k], runs[k + per_run]));
  }
}

TEST_CASE("layer and optimiser twins reject bad arguments before touching the device",
          "[layers][optim][bad-input]") {
  // Never dereferenced: every call below fails its argument check first.
  float host[4] = {};
  float* p = host;
  const int tokens[2] = {};
  const int* t = tokens;
  using Catch::Matchers::Contains;

  CHECK_THROWS_WITH(rmsnorm_forward(p, p, p, p, 0, 8), Contains("P = 0"));
  CHECK_THROWS_WITH(rmsnorm_forward(p, p, p, p, 3, 0), Contains("d = 0"));
  CHECK_THROWS_WITH(rmsnorm_forward(p, nullptr, p, p, 3, 8), Contains("rinv is a null pointer"));
  CHECK_THROWS_WITH(rmsnorm_backward(p, p, p, p, p, p, -1, 8), Contains("P = -1"));
  CHECK_THROWS_WITH(rmsnorm_backward(p, nullptr, p, p, p, p, 3, 8),
                    Contains("dgain is a null pointer"));

  CHECK_THROWS_WITH(rope_forward(p, p, 6, 4, 2, 8),
                    Contains("not a whole number of sequences of T = 4"));
  CHECK_THROWS_WITH(rope_forward(p, p, 4, 4, 2, 7), Contains("hd = 7 must be even"));
  CHECK_THROWS_WITH(rope_forward(p, p, 4, 4, 2, 0), Contains("hd = 0"));
  CHECK_THROWS_WITH(rope_backward(p, p, 4, 0, 2, 8), Contains("T = 0"));
  CHECK_THROWS_WITH(rope_backward(p, p, 4, 4, 0, 8), Contains("n_heads = 0"));
  CHECK_THROWS_WITH(rope_backward(nullptr, p, 4, 4, 1, 8), Contains("dx is a null pointer"));

  CHECK_THROWS_WITH(swiglu_forward(p, p, p, 2, 0), Contains("f = 0"));
  CHECK_THROWS_WITH(swiglu_forward(p, p, nullptr, 2, 3), Contains("up is a null pointer"));
  CHECK_THROWS_WITH(swiglu_backward(p, p, nullptr, p, p, 2, 3), Contains("dh is a null pointer"));

  CHECK_THROWS_WITH(embedding_forward(p, t, p, 2, 4, 0), Contains("vocab = 0"));
  CHECK_THROWS_WITH(embedding_forward(p, nullptr, p, 2, 4, 5),
                    Contains("tokens is a null pointer"));
  CHECK_THROWS_WITH(embedding_backward(p, p, t, 0, 4, 5), Contains("P = 0"));
  CHECK_THROWS_WITH(embedding_backward(nullptr, p, t, 2, 4, 5), Contains("dE is a null pointer"));

  CHECK_THROWS_WITH(cross_entropy_forward(p, p, p, t, 2, 0), Contains("vocab = 0"));
  CHECK_THROWS_WITH(cross_entropy_forward(nullptr, p, p, t, 2, 3),
                    Contains("loss is a null pointer"));
  CHECK_THROWS_WITH(cross_entropy_backward(p, p, nullptr, 2, 3),
                    Contains("targets is a null pointer"));
  CHECK_THROWS_WITH(cross_entropy_backward(p, p, t, 0, 3), Contains("P = 0"));

  CHECK_THROWS_WITH(adamw_step(p, p, p, p, 4, 0, 1e-3, 0.9, 0.95, 1e-8, 0.1, true),
                    Contains("step counts from 1, got 0"));
  CHECK_THROWS_WITH(adamw_step(p, p, p, p, 0, 1, 1e-3, 0.9, 0.95, 1e-8, 0.1, true),
                    Contains("n = 0"));
  CHECK_THROWS_WITH(adamw_step(p, p, p, p, 4, 1, 1e-3, 1.0, 0.95, 1e-8, 0.1, true),
                    Contains("beta1 = 1"));
  CHECK_THROWS_WITH(adamw_step(p, p, p, p, 4, 1, 1e-3, 0.9, -0.5, 1e-8, 0.1, true),
                    Contains("beta2 = -0.5"));
  CHECK_THROWS_WITH(adamw_step(p, p, p, p, 4, 1, 1e-3, 0.9, 0.95, -1.0, 0.1, true),
                    Contains("eps = -1"));
  CHECK_THROWS_WITH(adamw_step(p, p, p, nullptr, 4, 1, 1e-3, 0.9, 0.95, 1e-8, 0.1, false),
                    Contains("grad is a null pointer"));
  CHECK_THROWS_WITH(grad_sq_norm(nullptr, p, 4), Contains("out is a null pointer"));
  CHECK_THROWS_WITH(grad_sq_norm(p, p, 0), Contains("n = 0"));
  CHECK_THROWS_WITH(scale(nullptr, 0.5f, 4), Contains("x is a null pointer"));
  CHECK_THROWS_AS(scale(p, 0.5f, 0), std::invalid_argument);

  CHECK_THROWS_WITH(gemm(false, false, 0, 2, 2, 1.f, p, p, 0.f, p), Contains("M = 0"));
  CHECK_THROWS_WITH(gemm(false, false, 2, 2, 2, 1.f, p, nullptr, 0.f, p),
                    Contains("B is a null pointer"));
  CHECK_THROWS_WITH(linear_forward(p, p, p, 2, 0, 3), Contains("K = 0"));
  CHECK_THROWS_WITH(linear_backward(p, nullptr, p, p, p, 2, 2, 3),
                    Contains("dW is a null pointer"));
  CHECK_THROWS_WITH(mlp_forward(p, p, p, p, p, p, p, 2, 4, 0), Contains("f = 0"));
  CHECK_THROWS_WITH(mlp_backward(p, p, p, p, p, p, p, p, p, p, p, 2, 4, 3),
                    Contains("dx must not alias dy"));

  CHECK_THROWS_WITH(add(p, nullptr, 4), Contains("x is a null pointer"));
  CHECK_THROWS_WITH(add_scaled(p, p, p, 0), Contains("n = 0"));
  CHECK_THROWS_WITH(add_row(p, p, 0, 4), Contains("P = 0"));
  CHECK_THROWS_WITH(column_sum_add(nullptr, p, 2, 2), Contains("out is a null pointer"));
  CHECK_THROWS_WITH(dot_add(p, p, nullptr, 4), Contains("y is a null pointer"));
}

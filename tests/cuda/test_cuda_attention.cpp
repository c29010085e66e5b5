/**
 * @file test_cuda_attention.cpp
 * @brief The attention twin (cuda/attention.cu) against the CPU reference; the determinism of
 *        its backward; and argument checks that need no GPU.
 *
 * The comparisons and their tolerance live in cuda/check/check_attention.cpp: each check poisons the
 * outputs with NaN before the launch; this file asserts them, shape by shape. Without a CUDA
 * device each [gpu] case prints "MHAR_SKIP: no CUDA device (...)" and returns, which ctest
 * reports as Skipped.
 */
#include <catch2/catch.hpp>
#include <cstddef>
#include <string>
#include <vector>

#include "cuda/attention.h"
#include "cuda/check/check_attention.h"
#include "cuda/device.h"
#include "cuda_test_util.h"
#include "tensor.h"

using namespace mhar::cuda;

using namespace mhar::cuda::test;

TEST_CASE("attention twin forward matches the reference (out, probs)", "[gpu][attention]") {
  if (!have_gpu()) return;
  const AttentionShape s = GENERATE(from_range(attention_check_shapes()));
  const AttentionVersion v = GENERATE(AttentionVersion::Rows, AttentionVersion::Gemm);
  CAPTURE(describe(s), attention_version_name(v));
  check_rows(check_attention_forward(s, 2024, v));
}

TEST_CASE("attention twin backward matches the reference (dq, dk, dv)", "[gpu][attention]") {
  if (!have_gpu()) return;
  const AttentionShape s = GENERATE(from_range(attention_check_shapes()));
  const AttentionVersion v = GENERATE(AttentionVersion::Rows, AttentionVersion::Gemm);
  CAPTURE(describe(s), attention_version_name(v));
  check_rows(check_attention_backward(s, 2024, v));
}

TEST_CASE("check_attention passes on every shape for several seeds", "[gpu][attention]") {
  if (!have_gpu()) return;
  const unsigned seed = GENERATE(1u, 2u);
  CAPTURE(seed);
  const auto rows = check_attention(seed);
  // Rows per shape and version (rows, gemm): forward out, probs; backward dq, dk, dv.
  CHECK(rows.size() == attention_check_shapes().size() * 2 * 5);
  check_rows(rows);
}

TEST_CASE("attention is deterministic: same bits on every run", "[gpu][attention]") {
  if (!have_gpu()) return;
  // T > 64 (lanes own several keys), G = 4 (dk, dv sum four heads), several blocks.
  const AttentionVersion version = GENERATE(AttentionVersion::Rows, AttentionVersion::Gemm);
  CAPTURE(attention_version_name(version));
  const int B = 2, T = 130, n_head = 8, n_kv_head = 2, hd = 64;
  const std::size_t P = std::size_t(B) * T;
  mhar::Rng rng(99);
  const auto q = random_vector(rng, P * n_head * hd, 0.0, 1.5),
             k = random_vector(rng, P * n_kv_head * hd), v = random_vector(rng, P * n_kv_head * hd),
             dout = random_vector(rng, P * n_head * hd);
  DeviceBuffer d_q(q), d_k(k), d_v(v), d_dout(dout);

  std::vector<std::vector<float>> runs;
  for (int run = 0; run < 2; ++run) {
    DeviceBuffer out(P * n_head * hd), probs(std::size_t(B) * n_head * T * T);
    attention_forward(out.data(), probs.data(), d_q.data(), d_k.data(), d_v.data(), B, T, n_head,
                      n_kv_head, hd, version);
    DeviceBuffer dq(P * n_head * hd), dk(P * n_kv_head * hd), dv(P * n_kv_head * hd);
    attention_backward(dq.data(), dk.data(), dv.data(), d_dout.data(), probs.data(), d_q.data(),
                       d_k.data(), d_v.data(), B, T, n_head, n_kv_head, hd, version);
    for (const DeviceBuffer* b : {&out, &probs, &dq, &dk, &dv}) runs.push_back(b->download());
  }
  const char* names[] = {"out", "probs", "dq", "dk", "dv"};
  const std::size_t per_run = runs.size() / 2;
  for (std::size_t i = 0; i < per_run; ++i) {
    INFO(names[i]);
    CHECK(same_bits(runs[i], runs[i + per_run]));
  }
}

TEST_CASE("attention twin rejects bad arguments before touching the device",
          "[attention][bad-input]") {
  // Never dereferenced: every call below fails its argument check first.
  float host[4] = {};
  float* p = host;
  using Catch::Matchers::Contains;

  CHECK_THROWS_WITH(attention_forward(p, p, p, p, p, 0, 4, 2, 1, 8), Contains("B = 0"));
  CHECK_THROWS_WITH(attention_forward(p, p, p, p, p, 2, 0, 2, 1, 8), Contains("T = 0"));
  CHECK_THROWS_WITH(attention_forward(p, p, p, p, p, 2, 4, 0, 1, 8), Contains("n_head = 0"));
  CHECK_THROWS_WITH(attention_forward(p, p, p, p, p, 2, 4, 2, -1, 8), Contains("n_kv_head = -1"));
  CHECK_THROWS_WITH(attention_forward(p, p, p, p, p, 2, 4, 2, 1, 0), Contains("hd = 0"));
  CHECK_THROWS_WITH(attention_forward(p, p, p, p, p, 2, 4, 3, 2, 8),
                    Contains("n_head = 3 must be a multiple of n_kv_head = 2"));
  CHECK_THROWS_WITH(attention_forward(p, nullptr, p, p, p, 2, 4, 2, 1, 8),
                    Contains("probs is a null pointer"));
  CHECK_THROWS_WITH(attention_forward(p, p, p, p, nullptr, 2, 4, 2, 1, 8),
                    Contains("v is a null pointer"));
  CHECK_THROWS_WITH(
      attention_forward(p, p, p, p, p, 2, 4, 2, 1, 8, static_cast<AttentionVersion>(9)),
      Contains("unknown AttentionVersion 9"));

  CHECK_THROWS_WITH(attention_backward(p, p, p, p, p, p, p, p, 2, 4, 4, 3, 8),
                    Contains("n_head = 4 must be a multiple of n_kv_head = 3"));
  CHECK_THROWS_WITH(attention_backward(p, p, p, p, p, p, p, p, 2, 4, 2, 1, -8),
                    Contains("hd = -8"));
  CHECK_THROWS_WITH(attention_backward(p, nullptr, p, p, p, p, p, p, 2, 4, 2, 1, 8),
                    Contains("dk is a null pointer"));
  CHECK_THROWS_WITH(attention_backward(p, p, p, p, nullptr, p, p, p, 2, 4, 2, 1, 8),
                    Contains("probs is a null pointer"));
  CHECK_THROWS_AS(attention_backward(p, p, p, p, p, p, p, p, 1, 1, 1, 1, 0), std::invalid_argument);
}

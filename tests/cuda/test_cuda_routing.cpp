/**
 * @file test_cuda_routing.cpp
 * @brief Routing kernels (cuda/routing.cu and routing_{naive,fused,warp}.cu), every version, against the CPU reference; their
 *        determinism; and argument checks that need no GPU.
 *
 * The comparisons and their tolerance live in cuda/check/check_routing.cpp (the code `mhar-toy check`
 * runs); this file asserts them. Without a CUDA device each [gpu] case prints
 * "MHAR_SKIP: no CUDA device (...)" and returns, which ctest reports as Skipped.
 */
#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/check/check_routing.h"
#include "cuda/device.h"
#include "cuda/routing.h"
#include "cuda_test_util.h"
#include "tensor.h"

using namespace mhar::cuda;

using namespace mhar::cuda::test;

TEST_CASE("routing forward matches the reference (out, alpha)", "[gpu][routing]") {
  if (!have_gpu()) return;
  const RoutingShape shape = GENERATE(from_range(routing_check_shapes()));
  const RoutingVersion v =
      GENERATE(from_range(std::begin(kRoutingVersions), std::end(kRoutingVersions)));
  CAPTURE(shape.N, shape.P, shape.d, shape.H, version_name(v));
  if (!version_supports(v, shape.d, shape.H)) return;  // e.g. warp at K = 24 (tested below)
  check_rows(check_routing_forward(shape, v, 2024));
}

TEST_CASE("routing backward matches the reference (dsources, dq, dg, accumulating)",
          "[gpu][routing]") {
  if (!have_gpu()) return;
  const RoutingShape shape = GENERATE(from_range(routing_check_shapes()));
  const RoutingVersion v =
      GENERATE(from_range(std::begin(kRoutingVersions), std::end(kRoutingVersions)));
  CAPTURE(shape.N, shape.P, shape.d, shape.H, version_name(v));
  if (!version_supports(v, shape.d, shape.H)) return;  // e.g. warp at K = 24 (tested below)
  check_rows(check_routing_backward(shape, v, 2024));
}

TEST_CASE("routing versions agree on fresh inputs for several seeds", "[gpu][routing]") {
  if (!have_gpu()) return;
  const unsigned seed = GENERATE(1u, 2u, 3u);
  const RoutingShape shape{7, 33, 72, 3};  // K = 24, P odd
  CAPTURE(seed);
  for (RoutingVersion v : {RoutingVersion::Naive, RoutingVersion::Fused}) {
    check_rows(check_routing_forward(shape, v, seed));
    check_rows(check_routing_backward(shape, v, seed));
  }
  const RoutingShape wide{5, 41, 256, 4};  // K = 64: every version, warp included
  for (RoutingVersion v : kRoutingVersions) {
    check_rows(check_routing_forward(wide, v, seed));
    check_rows(check_routing_backward(wide, v, seed));
  }
}

TEST_CASE("the fused kernels under __launch_bounds__(512, 1) match the reference",
          "[gpu][routing]") {
  if (!have_gpu()) return;
  if (!fused4_one_block_built()) {
    WARN("MHAR_SKIP: built with MHAR_FUSED4_ONE_BLOCK=OFF (no such variant)");
    return;
  }
  struct Restore {
    ~Restore() { set_fused4_bounds(FusedBounds::Default); }
  } restore;
  set_fused4_bounds(FusedBounds::OneBlockPerSM);
  // d = 128 (the tiny model), 512 (the paper's), 2048 (the widest at four columns a thread),
  // with awkward N, P and K.
  for (const RoutingShape& shape :
       {RoutingShape{9, 37, 128, 4}, RoutingShape{5, 33, 512, 4}, RoutingShape{3, 7, 2048, 8},
        RoutingShape{4, 9, 200, 5}}) {
    CAPTURE(describe(shape));
    REQUIRE(fused4_applies(shape.d));
    check_rows(check_routing_forward(shape, RoutingVersion::Fused, 31));
    check_rows(check_routing_backward(shape, RoutingVersion::Fused, 31));
  }
  CHECK_FALSE(fused4_applies(64));    // two columns a thread
  CHECK_FALSE(fused4_applies(4096));  // eight
}

TEST_CASE("routing is deterministic: same bits on every run", "[gpu][routing]") {
  if (!have_gpu()) return;
  const RoutingVersion v =
      GENERATE(from_range(std::begin(kRoutingVersions), std::end(kRoutingVersions)));
  const RoutingShape s = GENERATE(RoutingShape{5, 3001, 96, 4}, RoutingShape{3, 20000, 40, 5},
                                  RoutingShape{4, 3001, 128, 4});
  CAPTURE(s.N, s.P, s.d, s.H, version_name(v));
  if (!version_supports(v, s.d, s.H)) return;
  mhar::Rng rng(99);
  const std::size_t NPd = std::size_t(s.N) * s.P * s.d, Pd = std::size_t(s.P) * s.d;
  const auto S = random_vector(rng, NPd), q = random_vector(rng, s.d, 0.0, 0.3),
             g = random_vector(rng, s.d, 1.0, 0.3), dout = random_vector(rng, Pd),
             dS0 = random_vector(rng, NPd), dq0 = random_vector(rng, s.d),
             dg0 = random_vector(rng, s.d);
  DeviceBuffer sources(S), dq_in(q), dg_in(g), d_dout(dout);
  DeviceBuffer out(Pd), alpha(std::size_t(s.N) * s.P * s.H);
  routing_forward(out.data(), alpha.data(), sources.data(), dq_in.data(), dg_in.data(), s.N, s.P,
                  s.d, s.H, v);
  const auto out1 = out.download(), alpha1 = alpha.download();
  routing_forward(out.data(), alpha.data(), sources.data(), dq_in.data(), dg_in.data(), s.N, s.P,
                  s.d, s.H, v);
  CHECK(same_bits(out1, out.download()));
  CHECK(same_bits(alpha1, alpha.download()));

  std::vector<std::vector<float>> runs;
  for (int run = 0; run < 2; ++run) {
    DeviceBuffer dsources(dS0), dq(dq0), dg(dg0);
    routing_backward(dsources.data(), dq.data(), dg.data(), d_dout.data(), out.data(), alpha.data(),
                     sources.data(), dq_in.data(), dg_in.data(), s.N, s.P, s.d, s.H, v);
    runs.push_back(dsources.download());
    runs.push_back(dq.download());
    runs.push_back(dg.download());
  }
  CHECK(same_bits(runs[0], runs[3]));  // dsources
  CHECK(same_bits(runs[1], runs[4]));  // dq
  CHECK(same_bits(runs[2], runs[5]));  // dg
}

TEST_CASE("routing rejects bad arguments before touching the device", "[routing][bad-input]") {
  // Never dereferenced: every call below fails its argument check first.
  alignas(16) float host[8] = {};
  float* p = host;
  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(routing_forward(p, p, p, p, p, 2, 3, 8, 3),
                    Contains("H = 3 must divide d = 8"));
  CHECK_THROWS_WITH(routing_forward(p, p, p, p, p, 2, 3, 8, 0), Contains("must divide"));
  CHECK_THROWS_WITH(routing_forward(p, p, p, p, p, 0, 3, 8, 1), Contains("at least one source"));
  CHECK_THROWS_WITH(routing_forward(p, p, p, p, p, 2, 0, 8, 1), Contains("P = 0"));
  CHECK_THROWS_WITH(routing_forward(p, p, p, p, p, 2, 3, 0, 1), Contains("d = 0"));
  CHECK_THROWS_WITH(routing_forward(p, nullptr, p, p, p, 2, 3, 8, 1),
                    Contains("alpha is a null pointer"));
  CHECK_THROWS_WITH(routing_forward(p, p, p, p, p, 2, 3, 8192 + 8, 2, RoutingVersion::Fused),
                    Contains("use RoutingVersion::Naive"));
  CHECK_THROWS_WITH(routing_forward(p, p, p, p, p, 2, 3, 8, 2, static_cast<RoutingVersion>(7)),
                    Contains("unknown RoutingVersion 7"));
  // Warp: K = 24 would put a float4 across two heads; d = 2048 is past its width; float4 loads
  // need 16-byte aligned rows.
  CHECK_THROWS_WITH(routing_forward(p, p, p, p, p, 2, 3, 96, 4, RoutingVersion::Warp),
                    Contains("use RoutingVersion::Fused"));
  CHECK_THROWS_WITH(routing_forward(p, p, p, p, p, 2, 3, 2048, 2, RoutingVersion::Warp),
                    Contains("d <= 1024"));
  CHECK_THROWS_WITH(
      routing_backward(p, p, p, p, p + 1, p, p, p, p, 2, 3, 32, 2, RoutingVersion::Warp),
      Contains("out is not 16-byte aligned"));
  CHECK(version_supports(RoutingVersion::Warp, 512, 4));  // the paper's shape
  CHECK(version_supports(RoutingVersion::Warp, 128, 4));  // the tiny config
  CHECK_FALSE(version_supports(RoutingVersion::Warp, 96, 4));
  CHECK(version_supports(RoutingVersion::Fused, 96, 4));
  CHECK_THROWS_AS(routing_backward(p, p, p, p, p, p, p, p, p, 2, 3, 8, 3), std::invalid_argument);
  CHECK_THROWS_WITH(routing_backward(p, nullptr, p, p, p, p, p, p, p, 2, 3, 8, 2),
                    Contains("dq is a null pointer"));
  CHECK_THROWS_WITH(routing_backward(p, p, p, p, p, p, p, p, p, 1, 1, 7, 2, RoutingVersion::Naive),
                    Contains("H = 2 must divide d = 7"));
}

TEST_CASE("device query never throws", "[routing]") {
  std::string why;
  const int n = device_count(&why);
  CHECK(n >= 0);
  if (n == 0) CHECK(!why.empty());
  std::printf("cuda devices: %d%s%s\n", n, why.empty() ? "" : ", ", why.c_str());
}

/**
 * @file test_model.cpp
 * @brief The whole model: finite-difference gradients of the loss with respect to every parameter
 *        tensor in every residual mode; mode equivalences; delta conversion; bad configurations.
 */
#include <catch2/catch.hpp>

#include "gradcheck.h"
#include "model.h"
#include "perturbed.h"

using namespace mhar;
using Catch::Matchers::Contains;
using mhar::test::check_gradient;
using mhar::test::sample_indices;
using mhar::test::perturbed;

namespace {

Config tiny(Mode mode, int H = 0, int T = 3, int L = 2, int n_blocks = 2) {
  Config c;
  c.d = 12;  // not a multiple of 8
  c.L = L;
  c.n_head = 2;  // hd = 6
  c.n_kv_head = 1;
  c.ffn = 10;
  c.T = T;
  c.mode = mode;
  c.H = H;
  c.n_blocks = n_blocks;
  return c;
}

/// Random tokens and targets for B sequences.
void random_batch(Rng& rng, const Config& c, int B, std::vector<int>& x, std::vector<int>& y) {
  x.resize(static_cast<std::size_t>(B) * c.T);
  y.resize(x.size());
  for (auto& t : x) t = static_cast<int>(rng.below(256));
  for (auto& t : y) t = static_cast<int>(rng.below(256));
}

/// Central differences of the loss against model_backward, for every parameter tensor (24
/// elements spread over each), in one mode and shape.
void check_model_gradient(const char* name, const Config& cfg, int B) {
  Rng rng(300 + static_cast<int>(cfg.mode) * 17 + cfg.H);
  std::vector<int> x, y;
  random_batch(rng, cfg, B, x, y);
  Params<double> p = perturbed(cfg, rng);
  Cache<double> cache;
  model_forward(cfg, p, x, y, B, &cache);
  Params<double> grads;
  model_backward(grads, cfg, p, cache);

  auto loss = [&] { return model_forward<double>(cfg, p, x, y, B, nullptr); };
  std::vector<std::pair<std::string, Mat<double>*>> ptensors, gtensors;
  p.for_each([&](const std::string& n, Mat<double>& m, bool) { ptensors.emplace_back(n, &m); });
  grads.for_each([&](const std::string& n, Mat<double>& m, bool) { gtensors.emplace_back(n, &m); });
  REQUIRE(ptensors.size() == gtensors.size());
  for (std::size_t t = 0; t < ptensors.size(); ++t) {
    const auto& [tensor, m] = ptensors[t];
    CAPTURE(name, tensor);
    const auto rep = check_gradient(std::string("model[") + name + "] " + tensor, *m,
                                    *gtensors[t].second, loss, sample_indices(*m, 24));
    CHECK(rep.pass);
  }
}

}  // namespace

TEST_CASE("model gradient, residual", "[model][grad]") {
  check_model_gradient("residual", tiny(Mode::Residual), 2);
}
TEST_CASE("model gradient, attnres", "[model][grad]") {
  check_model_gradient("attnres", tiny(Mode::AttnRes), 2);
}
TEST_CASE("model gradient, mhar H=2", "[model][grad]") {
  check_model_gradient("mhar H=2", tiny(Mode::Mhar, 2), 2);
}
TEST_CASE("model gradient, mhar H=d", "[model][grad]") {
  check_model_gradient("mhar H=d", tiny(Mode::Mhar, 12), 1);
}
TEST_CASE("model gradient, mhar T=1", "[model][grad]") {
  check_model_gradient("mhar T=1", tiny(Mode::Mhar, 3, 1), 3);
}
TEST_CASE("model gradient, block", "[model][grad]") {
  check_model_gradient("block", tiny(Mode::Block, 2, 3, 3, 2), 2);
}
TEST_CASE("model gradient, block H=1", "[model][grad]") {
  check_model_gradient("block H=1", tiny(Mode::Block, 1, 2, 2, 1), 1);
}
TEST_CASE("model gradient, delta", "[model][grad]") {
  check_model_gradient("delta", tiny(Mode::Delta, 4, 3, 3, 2), 2);
}

TEST_CASE("mhar with H = 1 is exactly attnres", "[model][property]") {
  Rng rng(301);
  const Config a = tiny(Mode::AttnRes), m = tiny(Mode::Mhar, 1);
  std::vector<int> x, y;
  random_batch(rng, a, 2, x, y);
  const Params<double> p = perturbed(a, rng);
  Cache<double> ca, cm;
  const double la = model_forward(a, p, x, y, 2, &ca), lm = model_forward(m, p, x, y, 2, &cm);
  CHECK(la == lm);
  Params<double> ga, gm;
  model_backward(ga, a, p, ca);
  model_backward(gm, m, p, cm);
  CHECK((ga.route_q - gm.route_q).cwiseAbs().maxCoeff() == 0.0);
}

TEST_CASE("every routed mode starts as a uniform average over its sources", "[model][property]") {
  const Mode mode = GENERATE(Mode::AttnRes, Mode::Mhar, Mode::Block);
  Rng rng(302);
  const Config c = tiny(mode, 2);
  std::vector<int> x, y;
  random_batch(rng, c, 1, x, y);
  const Params<double> p = init_params<double>(c, rng);
  Cache<double> cache;
  model_forward(c, p, x, y, 1, &cache);
  for (const auto& r : cache.route) {
    const double n = static_cast<double>(r.alpha.size());
    for (const auto& a : r.alpha) CHECK((a.array() - 1.0 / n).abs().maxCoeff() < 1e-15);
  }
}

TEST_CASE("a delta model converted from a residual model gives the same logits", "[model][delta]") {
  const int H = GENERATE(1, 3), n_blocks = GENERATE(1, 2);
  CAPTURE(H, n_blocks);
  Rng rng(303);
  const Config r = tiny(Mode::Residual, 0, 4, 3);
  std::vector<int> x, y;
  random_batch(rng, r, 2, x, y);
  Params<double> pr = perturbed(r, rng);
  Config dcfg;
  const Params<double> pd = convert_residual_to_delta(dcfg, r, pr, H, n_blocks);
  CHECK(dcfg.mode == Mode::Delta);
  const Mat<double> lr = model_logits(r, pr, x, 2), ld = model_logits(dcfg, pd, x, 2);
  const double diff = (lr - ld).cwiseAbs().maxCoeff();
  INFO("max |logits difference| = " << diff);
  CHECK(diff < 1e-12);
  // ... and once a gate opens, the models differ.
  Params<double> pd2 = pd;
  pd2.delta_gate(0, 1) = 0.5;
  pd2.route_q.setConstant(0.3);
  CHECK((lr - model_logits(dcfg, pd2, x, 2)).cwiseAbs().maxCoeff() > 1e-6);
}

TEST_CASE("routing sources and sites are named for heatmaps", "[model]") {
  Config c = tiny(Mode::Mhar, 2, 3, 2);
  CHECK(site_names(c) == std::vector<std::string>{"attn0", "mlp0", "attn1", "mlp1", "final"});
  CHECK(site_source_names(c, 4) ==
        std::vector<std::string>{"emb", "attn0", "mlp0", "attn1", "mlp1"});
  c = tiny(Mode::Block, 2, 3, 3, 2);  // blocks of 2 layers: [0, 1], [2]
  CHECK(site_source_names(c, 0) == std::vector<std::string>{"emb"});
  CHECK(site_source_names(c, 3) == std::vector<std::string>{"emb", "partial"});
  CHECK(site_source_names(c, 4) == std::vector<std::string>{"emb", "block1"});
  CHECK(site_source_names(c, 5) == std::vector<std::string>{"emb", "block1", "partial"});
  CHECK(site_source_names(c, 6) == std::vector<std::string>{"emb", "block1", "block2"});
  c.mode = Mode::Delta;
  CHECK(site_source_names(c, 1) == std::vector<std::string>{"null", "emb", "partial"});
  CHECK(c.n_sites() == 6);
}

TEST_CASE("bad configurations are rejected with clear messages", "[model][bad-input]") {
  Config c = tiny(Mode::Mhar, 5);
  CHECK_THROWS_WITH(
      c.validate(),
      Contains("routing heads H = 5 must divide d = 12 (allowed: 1, 2, 3, 4, 6, 12)"));
  c = tiny(Mode::Mhar);
  c.n_head = 3;
  c.n_kv_head = 2;
  CHECK_THROWS_WITH(c.validate(), Contains("n_head = 3 must be a multiple of n_kv_head = 2"));
  c = tiny(Mode::Mhar);
  c.d = 0;
  CHECK_THROWS_WITH(c.validate(), Contains("d must be positive"));
  c = tiny(Mode::Mhar);
  c.T = 0;
  CHECK_THROWS_WITH(c.validate(), Contains("T (sequence length) must be positive"));
  c = tiny(Mode::Block);
  c.n_blocks = 3;
  CHECK_THROWS_WITH(c.validate(), Contains("n_blocks must be in [1, L = 2]"));
  c = tiny(Mode::Mhar);
  c.n_head = 4;  // hd = 3
  CHECK_THROWS_WITH(c.validate(), Contains("must be even"));
  CHECK_THROWS_WITH(
      parse_mode("mha"),
      Contains("unknown residual mode 'mha' (allowed: residual, attnres, mhar, block, delta)"));

  c = tiny(Mode::Mhar, 2);
  Rng rng(304);
  const Params<double> p = init_params<double>(c, rng);
  std::vector<int> x(7, 1), y(6, 1);
  CHECK_THROWS_WITH(
      model_forward<double>(c, p, x, y, 2, nullptr),
      Contains("targets has 6 entries, expected B·T = 6") || Contains("tokens has 7 entries"));
  x.resize(6);
  CHECK_THROWS_WITH(model_forward<double>(c, p, x, y, 0, nullptr),
                    Contains("batch B must be positive"));
  Config other = tiny(Mode::Residual);
  CHECK_THROWS_WITH(model_forward<double>(other, p, x, y, 2, nullptr),
                    Contains("parameters do not match the config"));
  Config dc;
  CHECK_THROWS_WITH(convert_residual_to_delta(dc, c, p, 2, 1), Contains("must be 'residual'"));
}

TEST_CASE("the parameter count matches the shapes", "[model]") {
  Config c = tiny(Mode::Mhar, 2);
  const long per_layer = 2 * 12 + 12 * 12 + 2 * 12 * 6 + 12 * 12 + 3 * 12 * 10;
  const long routing = 2 * 12 * (2 * c.L + 1);  // 2d · (2L + 1), docs/design.md §2
  CHECK(count_params(zero_params<double>(c)) == 256 * 12 + c.L * per_layer + 12 + routing);
}

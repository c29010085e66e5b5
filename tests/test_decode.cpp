/**
 * @file test_decode.cpp
 * @brief Decoding with a cache (reference/decode.h): in double, in every mode and at every
 *        position, the step's logits equal the full forward's on that prefix; prefill then steps
 *        equals steps alone; the cache is really read; bad input.
 */
#include <catch2/catch.hpp>
#include <cstdio>
#include <limits>

#include "decode.h"
#include "perturbed.h"

using namespace mhar;
using Catch::Matchers::Contains;
using mhar::test::perturbed;

namespace {

/// Grouped-query attention (4 query heads over 2 key/value heads), hd = 4, T = 12.
Config small(Mode mode, int H = 0, int L = 2, int n_blocks = 2) {
  Config c;
  c.d = 16;
  c.L = L;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.ffn = 20;
  c.T = 12;
  c.mode = mode;
  c.H = H;
  c.n_blocks = n_blocks;
  return c;
}

std::vector<int> random_bytes(Rng& rng, int n) {
  std::vector<int> x(n);
  for (auto& t : x) t = static_cast<int>(rng.below(256));
  return x;
}

/// The full forward's logits for the byte after tokens[0 … t]: model_logits on that prefix.
RowVec<double> full_logits(const Config& cfg, const Params<double>& p,
                           const std::vector<int>& tokens, int t) {
  Config c = cfg;
  c.T = t + 1;
  const std::vector<int> prefix(tokens.begin(), tokens.begin() + t + 1);
  const Mat<double> logits = model_logits<double>(c, p, prefix, 1);
  return logits.row(t);
}

struct Case {
  const char* name;
  Config cfg;
};

/// A test's random inputs for one case: perturbed parameters, then n random bytes, drawn in that
/// order from Rng(base + mode · stride + H), so that each test and case has its own draw.
struct Drawn {
  Params<double> p;
  std::vector<int> tokens;
};
Drawn draw(const Config& cfg, int base, int stride, int n) {
  Rng rng(base + static_cast<int>(cfg.mode) * stride + cfg.H);
  Params<double> p = perturbed(cfg, rng);
  return {std::move(p), random_bytes(rng, n)};
}

std::vector<Case> all_cases() {
  const int d = small(Mode::Mhar).d;
  return {
      {"residual", small(Mode::Residual)},
      {"attnres", small(Mode::AttnRes)},
      {"mhar H=1", small(Mode::Mhar, 1)},
      {"mhar H=2", small(Mode::Mhar, 2)},
      {"mhar H=d", small(Mode::Mhar, d)},
      {"block L=3/2", small(Mode::Block, 2, 3, 2)},  // blocks of 2 and 1 layers: uneven last
      {"delta L=3/2", small(Mode::Delta, 2, 3, 2)},  // open gates a_j ≈ 1
  };
}

}  // namespace

TEST_CASE("decode step equals the full forward on every prefix, every mode (double)", "[decode]") {
  for (const Case& k : all_cases()) {
    const Config& cfg = k.cfg;
    const auto [p, tokens] = draw(cfg, 900, 13, cfg.T);
    DecodeState<double> state = decode_start<double>(cfg);
    double worst = 0, worst_prev = 1e300;
    for (int t = 0; t < cfg.T; ++t) {
      const RowVec<double> step = decode_step(cfg, p, state, tokens[t]);
      const RowVec<double> full = full_logits(cfg, p, tokens, t);
      worst = std::max(worst, (step - full).cwiseAbs().maxCoeff());
      // the comparison discriminates: the previous prefix's logits are far from this step's
      if (t > 0)
        worst_prev =
            std::min(worst_prev, (step - full_logits(cfg, p, tokens, t - 1)).cwiseAbs().maxCoeff());
    }
    std::printf("decode equality: %-12s worst |step - full| over %d positions = %.3e\n", k.name,
                cfg.T, worst);
    CAPTURE(k.name, worst, worst_prev);
    CHECK(state.n == cfg.T);
    CHECK(worst <= 1e-12);
    CHECK(worst_prev > 1e-3);
  }
}

TEST_CASE("prefill followed by steps equals steps alone", "[decode]") {
  for (const Case& k : all_cases()) {
    const Config& cfg = k.cfg;
    const auto [p, tokens] = draw(cfg, 950, 7, cfg.T);
    DecodeState<double> alone = decode_start<double>(cfg);
    std::vector<RowVec<double>> alone_logits;
    for (int t = 0; t < cfg.T; ++t) alone_logits.push_back(decode_step(cfg, p, alone, tokens[t]));
    for (int m : {1, 2, 5, cfg.T - 1, cfg.T}) {
      CAPTURE(k.name, m);
      DecodeState<double> s = decode_start<double>(cfg);
      const RowVec<double> pre = decode_prefill(cfg, p, s, {tokens.begin(), tokens.begin() + m});
      REQUIRE(pre.cols() == cfg.vocab);
      REQUIRE(s.n == m);
      double worst = (pre - alone_logits[m - 1]).cwiseAbs().maxCoeff();  // the next byte's
      for (int t = m; t < cfg.T; ++t)
        worst = std::max(
            worst, (decode_step(cfg, p, s, tokens[t]) - alone_logits[t]).cwiseAbs().maxCoeff());
      double worst_kv = 0;
      for (int l = 0; l < cfg.L; ++l)
        worst_kv = std::max({worst_kv, (s.k[l] - alone.k[l]).cwiseAbs().maxCoeff(),
                             (s.v[l] - alone.v[l]).cwiseAbs().maxCoeff()});
      CHECK(worst <= 1e-12);
      CHECK(worst_kv <= 1e-12);
    }
  }
}

TEST_CASE("model_keys_values gives model_logits's keys and values, bit for bit", "[decode]") {
  // The prefill's batched pass stops after the last layer's keys and values; what it keeps must
  // be exactly what the whole forward computes, in every mode.
  for (const Case& k : all_cases()) {
    const Config& cfg = k.cfg;
    const auto [p, tokens] = draw(cfg, 930, 11, cfg.T);
    Cache<double> whole, kv;
    model_logits<double>(cfg, p, tokens, 1, &whole);
    model_keys_values<double>(cfg, p, tokens, kv);
    CAPTURE(k.name);
    REQUIRE(kv.k.size() == static_cast<std::size_t>(cfg.L));
    for (int l = 0; l < cfg.L; ++l) {
      REQUIRE(kv.k[l].rows() == cfg.T);
      CHECK((kv.k[l].array() == whole.k[l].array()).all());
      CHECK((kv.v[l].array() == whole.v[l].array()).all());
    }
  }
}

TEST_CASE("a step reads the cached keys and values of earlier positions", "[decode]") {
  const Config cfg = small(Mode::Mhar, 2);
  Rng rng(977);
  const Params<double> p = perturbed(cfg, rng);
  const std::vector<int> tokens = random_bytes(rng, 6);
  DecodeState<double> a = decode_start<double>(cfg);
  decode_prefill(cfg, p, a, {tokens.begin(), tokens.begin() + 5});
  DecodeState<double> b = a;
  b.v[1].row(2).setZero();  // forget one earlier position's values in the last layer
  const RowVec<double> la = decode_step(cfg, p, a, tokens[5]);
  const RowVec<double> lb = decode_step(cfg, p, b, tokens[5]);
  CHECK((la - lb).cwiseAbs().maxCoeff() > 1e-6);
}

TEST_CASE("a step reads nothing of the scratch an earlier step left in the state", "[decode]") {
  // DecodeState::Scratch is kept between steps only to be reused: poison all of it (NaN in every
  // working row, routing's and the MLP's saved values, primitives of the wrong size) and the
  // step must give the same bits, in every mode.
  for (const Case& k : all_cases()) {
    const Config& cfg = k.cfg;
    const auto [p, tokens] = draw(cfg, 990, 5, 4);
    DecodeState<double> clean = decode_start<double>(cfg);
    decode_prefill(cfg, p, clean, {tokens.begin(), tokens.begin() + 2});
    decode_step(cfg, p, clean, tokens[2]);  // the scratch now holds that step's rows
    DecodeState<double> poisoned = clean;
    const double nan = std::numeric_limits<double>::quiet_NaN();
    auto& s = poisoned.scratch;
    for (Mat<double>* m : {&s.h, &s.input, &s.normed, &s.q, &s.k, &s.v, &s.q_rot, &s.k_rot, &s.attn,
                           &s.routed, &s.final_normed, &s.mlp.gate, &s.mlp.up})
      m->setConstant(nan);
    s.rinv.setConstant(nan);
    s.scores.setConstant(nan);
    for (auto& a : s.routing.alpha) a.setConstant(nan);
    for (auto& r : s.routing.rinv) r.setConstant(nan);
    for (auto& m : s.prims) m = Mat<double>::Constant(2, cfg.d + 1, nan);
    REQUIRE_FALSE(s.prims.empty());
    CAPTURE(k.name);
    const RowVec<double> a = decode_step(cfg, p, clean, tokens[3]);
    const RowVec<double> b = decode_step(cfg, p, poisoned, tokens[3]);
    CHECK(a.allFinite());
    CHECK((a.array() == b.array()).all());
    for (int l = 0; l < cfg.L; ++l) CHECK((clean.k[l].array() == poisoned.k[l].array()).all());
  }
}

TEST_CASE("a prefill into a used state reads nothing of what it held", "[decode]") {
  // sample restarts its window with decode_prefill into the state it has been stepping, which
  // then keeps its storage: fill every row of that state with NaN, and a prefill and steps must
  // give the same bits as from a fresh state, in every mode. A state made for another window
  // length is made again.
  for (const Case& k : all_cases()) {
    const Config& cfg = k.cfg;
    const auto [p, tokens] = draw(cfg, 1010, 3, cfg.T);
    const int m = cfg.T / 2;
    DecodeState<double> fresh = decode_start<double>(cfg);
    const RowVec<double> a = decode_prefill(cfg, p, fresh, {tokens.begin(), tokens.begin() + m});
    DecodeState<double> used = decode_start<double>(cfg);
    decode_prefill(cfg, p, used, {tokens.rbegin(), tokens.rbegin() + m});  // other bytes
    while (used.n < cfg.T) decode_step(cfg, p, used, tokens[used.n]);      // the window is full
    const double nan = std::numeric_limits<double>::quiet_NaN();
    for (int l = 0; l < cfg.L; ++l) {
      used.k[l].setConstant(nan);
      used.v[l].setConstant(nan);
    }
    CAPTURE(k.name);
    const RowVec<double> b = decode_prefill(cfg, p, used, {tokens.begin(), tokens.begin() + m});
    CHECK((a.array() == b.array()).all());
    REQUIRE(used.n == m);
    for (int t = m; t < cfg.T; ++t) {
      const RowVec<double> la = decode_step(cfg, p, fresh, tokens[t]);
      const RowVec<double> lb = decode_step(cfg, p, used, tokens[t]);
      CHECK(la.allFinite());
      CHECK((la.array() == lb.array()).all());
    }
  }
  const Config cfg = small(Mode::Mhar, 2);
  Rng rng(1019);
  const Params<double> p = perturbed(cfg, rng);
  Config shorter = cfg;
  shorter.T = cfg.T / 2;
  DecodeState<double> s = decode_start<double>(shorter);
  decode_prefill(cfg, p, s, random_bytes(rng, cfg.T - 1));
  REQUIRE(s.k[0].rows() == cfg.T);
  CHECK(s.rope.cos.rows() == cfg.T);
  CHECK(decode_step(cfg, p, s, 65).allFinite());
}

TEST_CASE("the decode state's size is 2·L·T·n_kv_head·hd in every mode", "[decode]") {
  Config c;  // the default model: L 4, T 128, 2 key/value heads of width 32
  CHECK(decode_state_scalars(c) == 65536);
  for (Mode m : {Mode::Residual, Mode::AttnRes, Mode::Mhar, Mode::Block, Mode::Delta}) {
    c.mode = m;
    const DecodeState<float> s = decode_start<float>(c);
    long n = 0;
    for (int l = 0; l < c.L; ++l) n += s.k[l].size() + s.v[l].size();
    CHECK(n == decode_state_scalars(c));
  }
  Config paper;  // the paper's 100M shape
  paper.L = 12;
  paper.d = 512;
  paper.n_head = 8;
  paper.n_kv_head = 4;
  paper.T = 2048;
  CHECK(decode_state_scalars(paper) == 12582912L);
}

TEST_CASE("decode: bad input gets a clear error", "[decode][bad-input]") {
  const Config cfg = small(Mode::Block, 2, 3, 2);
  Rng rng(991);
  const Params<double> p = perturbed(cfg, rng);
  DecodeState<double> s = decode_start<double>(cfg);
  CHECK_THROWS_WITH(decode_prefill(cfg, p, s, {}), Contains("1 … T = 12"));
  CHECK_THROWS_WITH(decode_prefill(cfg, p, s, std::vector<int>(13, 65)), Contains("got 13"));
  CHECK_THROWS_WITH(decode_step(cfg, p, s, 256), Contains("outside the vocabulary"));
  // a bad byte anywhere in a prompt, first or last, is refused before the state is touched
  decode_prefill(cfg, p, s, {65, 66, 67});
  const DecodeState<double> before = s;
  for (const std::vector<int>& bad :
       {std::vector<int>{256, 65, 66}, std::vector<int>{65, 66, -1}}) {
    CHECK_THROWS_WITH(decode_prefill(cfg, p, s, bad), Contains("outside the vocabulary"));
    CHECK(s.n == before.n);
    for (int l = 0; l < cfg.L; ++l) CHECK((s.k[l].array() == before.k[l].array()).all());
  }
  decode_prefill(cfg, p, s, std::vector<int>(12, 65));
  CHECK_THROWS_WITH(decode_step(cfg, p, s, 65), Contains("the window is full"));
  DecodeState<double> other = decode_start<double>(small(Mode::Block, 2, 2, 2));
  CHECK_THROWS_WITH(decode_step(cfg, p, other, 65), Contains("another config"));
}

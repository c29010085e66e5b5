/**
 * @file test_layers.cpp
 * @brief Finite-difference gradient checks of every building block, plus their bad input.
 *
 * Each op's loss is ⟨op(x), W⟩ for a fixed random W, so its gradient is op's backward given W.
 */
#include <catch2/catch.hpp>

#include "gradcheck.h"
#include "layers.h"

using namespace mhar;
using Catch::Matchers::Contains;
using mhar::test::check_gradient;
using mhar::test::sample_indices;

TEST_CASE("op gradient, rmsnorm", "[rmsnorm][grad]") {
  const int P = GENERATE(1, 5), d = GENERATE(3, 12);
  CAPTURE(P, d);
  Rng rng(100 + P * 10 + d);
  Mat<double> x = rng.normal_matrix<double>(P, d);
  Mat<double> gain = rng.normal_matrix<double>(1, d, 1.0, 0.2);
  const Mat<double> W = rng.normal_matrix<double>(P, d);
  auto loss = [&] {
    Mat<double> y;
    Vec<double> r;
    rmsnorm_forward<double>(y, r, x, gain);
    return y.cwiseProduct(W).sum();
  };
  Mat<double> y, dx;
  Vec<double> r;
  rmsnorm_forward<double>(y, r, x, gain);
  Mat<double> dgain = Mat<double>::Zero(1, d);
  rmsnorm_backward<double>(dx, dgain.row(0), W, r, x, gain);
  const std::string tag = "rmsnorm(P=" + std::to_string(P) + ",d=" + std::to_string(d) + ")";
  CHECK(check_gradient(tag + " dx", x, dx, loss, sample_indices(x)).pass);
  CHECK(check_gradient(tag + " dgain", gain, dgain, loss, sample_indices(gain)).pass);
}

TEST_CASE("op gradient, linear", "[linear][grad]") {
  Rng rng(101);
  Mat<double> x = rng.normal_matrix<double>(7, 5), Wt = rng.normal_matrix<double>(5, 3);
  const Mat<double> W = rng.normal_matrix<double>(7, 3);
  auto loss = [&] {
    Mat<double> y;
    linear_forward(y, x, Wt);
    return y.cwiseProduct(W).sum();
  };
  Mat<double> dx, dWt = Mat<double>::Zero(5, 3);
  linear_backward(dx, dWt, W, x, Wt);
  CHECK(check_gradient("linear dx", x, dx, loss, sample_indices(x)).pass);
  CHECK(check_gradient("linear dW", Wt, dWt, loss, sample_indices(Wt)).pass);
}

TEST_CASE("op gradient, rope (and it preserves norms)", "[rope][grad]") {
  const int T_len = GENERATE(1, 4), heads = GENERATE(1, 3);
  CAPTURE(T_len, heads);
  Rng rng(102 + T_len + heads);
  Mat<double> x = rng.normal_matrix<double>(2 * T_len, heads * 6);
  const Mat<double> W = rng.normal_matrix<double>(2 * T_len, heads * 6);
  auto loss = [&] {
    Mat<double> y;
    rope_forward(y, x, T_len, heads);
    return y.cwiseProduct(W).sum();
  };
  Mat<double> y, dx;
  rope_forward(y, x, T_len, heads);
  CHECK(std::abs(y.norm() - x.norm()) < 1e-12 * x.norm());  // a rotation
  // position 0 is not rotated
  CHECK((y.row(0) - x.row(0)).cwiseAbs().maxCoeff() < 1e-15);
  rope_backward(dx, W, T_len, heads);
  CHECK(
      check_gradient("rope(T=" + std::to_string(T_len) + ",heads=" + std::to_string(heads) + ") dx",
                     x, dx, loss, sample_indices(x))
          .pass);
}

TEST_CASE("rope at an offset rotates row p as position first + p", "[rope]") {
  const int T_len = 7, heads = 3;
  Rng rng(105);
  const Mat<double> x = rng.normal_matrix<double>(T_len, heads * 6);
  Mat<double> whole, tail, one;
  rope_forward(whole, x, T_len, heads);
  rope_forward_at(tail, Mat<double>(x.bottomRows(3)), 4, heads);  // positions 4, 5, 6
  CHECK(tail == whole.bottomRows(3));  // the same angles, so the same bits
  rope_forward_at(one, Mat<double>(x.row(5)), 5, heads);
  CHECK(one == whole.row(5));
  CHECK((one - x.row(5)).cwiseAbs().maxCoeff() > 1e-3);  // and it does rotate
  CHECK_THROWS_WITH(rope_forward_at(one, Mat<double>(x.row(0)), -1, heads), Contains("0 or more"));
}

TEST_CASE("rope from a table made once gives the same bits as rope computed per call", "[rope]") {
  const int T_len = 9, heads = 2, hd = 8;
  Rng rng(106);
  const Mat<float> x = rng.normal_matrix<float>(T_len, heads * hd);
  const RopeTable<float> table = rope_table<float>(T_len, hd);
  Mat<float> whole, from_table;
  rope_forward(whole, x, T_len, heads);
  for (int t = 0; t < T_len; ++t) {  // one row at a time, as the decode step does
    rope_forward_at(from_table, Mat<float>(x.row(t)), t, heads, table);
    CHECK(from_table == whole.row(t));
  }
  rope_forward_at(from_table, Mat<float>(x.bottomRows(4)), 5, heads, table);  // positions 5 … 8
  CHECK(from_table == whole.bottomRows(4));
  // a position past the table, or a table for another head width, is refused
  CHECK_THROWS_WITH(rope_forward_at(from_table, Mat<float>(x.row(0)), T_len, heads, table),
                    Contains("not all in the table"));
  CHECK_THROWS_WITH(rope_forward_at(from_table, Mat<float>(x.row(0)), 0, 4, table),
                    Contains("head width"));
}

TEST_CASE("op gradient, causal grouped-query attention", "[attention][grad]") {
  struct Case {
    int B, T, nh, nkv, hd;
  };
  const Case cs =
      GENERATE(Case{2, 3, 4, 2, 2}, Case{1, 1, 2, 1, 4}, Case{3, 5, 3, 3, 2}, Case{1, 4, 4, 1, 3});
  CAPTURE(cs.B, cs.T, cs.nh, cs.nkv, cs.hd);
  Rng rng(103 + cs.B + cs.T * 3 + cs.nh * 7);
  const int P = cs.B * cs.T;
  Mat<double> q = rng.normal_matrix<double>(P, cs.nh * cs.hd);
  Mat<double> k = rng.normal_matrix<double>(P, cs.nkv * cs.hd);
  Mat<double> v = rng.normal_matrix<double>(P, cs.nkv * cs.hd);
  const Mat<double> W = rng.normal_matrix<double>(P, cs.nh * cs.hd);
  auto loss = [&] {
    Mat<double> out;
    std::vector<Mat<double>> probs;
    attention_forward(out, probs, q, k, v, cs.B, cs.T, cs.nh, cs.nkv);
    return out.cwiseProduct(W).sum();
  };
  Mat<double> out, dq, dk, dv;
  std::vector<Mat<double>> probs;
  attention_forward(out, probs, q, k, v, cs.B, cs.T, cs.nh, cs.nkv);
  attention_backward(dq, dk, dv, W, probs, q, k, v, cs.B, cs.T, cs.nh, cs.nkv);
  const std::string tag = "attention(B=" + std::to_string(cs.B) + ",T=" + std::to_string(cs.T) +
                          ",nh=" + std::to_string(cs.nh) + ",nkv=" + std::to_string(cs.nkv) + ")";
  CHECK(check_gradient(tag + " dq", q, dq, loss, sample_indices(q)).pass);
  CHECK(check_gradient(tag + " dk", k, dk, loss, sample_indices(k)).pass);
  CHECK(check_gradient(tag + " dv", v, dv, loss, sample_indices(v)).pass);
}

TEST_CASE("attention is causal: the future does not change the past", "[attention]") {
  Rng rng(104);
  Mat<double> q = rng.normal_matrix<double>(4, 4), k = rng.normal_matrix<double>(4, 4),
              v = rng.normal_matrix<double>(4, 4);
  Mat<double> out1, out2;
  std::vector<Mat<double>> probs;
  attention_forward(out1, probs, q, k, v, 1, 4, 2, 2);
  k.row(3).setConstant(5.0);
  v.row(3).setConstant(-3.0);
  attention_forward(out2, probs, q, k, v, 1, 4, 2, 2);
  CHECK((out1.topRows(3) - out2.topRows(3)).cwiseAbs().maxCoeff() == 0.0);
  CHECK((out1.row(3) - out2.row(3)).cwiseAbs().maxCoeff() > 1e-3);
}

TEST_CASE("op gradient, SwiGLU MLP", "[mlp][grad]") {
  Rng rng(105);
  Mat<double> x = rng.normal_matrix<double>(5, 6), wg = rng.normal_matrix<double>(6, 7),
              wu = rng.normal_matrix<double>(6, 7), wd = rng.normal_matrix<double>(7, 6);
  const Mat<double> W = rng.normal_matrix<double>(5, 6);
  auto loss = [&] {
    Mat<double> y;
    MlpSaved<double> s;
    mlp_forward(y, s, x, wg, wu, wd);
    return y.cwiseProduct(W).sum();
  };
  Mat<double> y, dx;
  MlpSaved<double> s;
  mlp_forward(y, s, x, wg, wu, wd);
  Mat<double> dwg = Mat<double>::Zero(6, 7), dwu = Mat<double>::Zero(6, 7),
              dwd = Mat<double>::Zero(7, 6);
  mlp_backward(dx, dwg, dwu, dwd, W, s, x, wg, wu, wd);
  CHECK(check_gradient("mlp dx", x, dx, loss, sample_indices(x)).pass);
  CHECK(check_gradient("mlp dw_gate", wg, dwg, loss, sample_indices(wg)).pass);
  CHECK(check_gradient("mlp dw_up", wu, dwu, loss, sample_indices(wu)).pass);
  CHECK(check_gradient("mlp dw_down", wd, dwd, loss, sample_indices(wd)).pass);
}

TEST_CASE("op gradient, embedding + tied LM head + cross-entropy", "[loss][grad]") {
  Rng rng(106);
  const int V = 11, d = 5;
  Mat<double> E = rng.normal_matrix<double>(V, d);
  const std::vector<int> tokens = {3, 0, 10, 3, 7}, targets = {1, 3, 3, 10, 0};
  auto loss = [&] {
    Mat<double> x, probs;
    embedding_forward(x, tokens, E);
    return cross_entropy_forward<double>(probs, x * E.transpose(), targets);
  };
  Mat<double> x, probs, dlogits;
  embedding_forward(x, tokens, E);
  const double l = cross_entropy_forward<double>(probs, x * E.transpose(), targets);
  CHECK(l > 0.0);
  cross_entropy_backward(dlogits, probs, targets);
  // logits = x · Eᵀ with x = E[tokens]: both paths reach E
  Mat<double> dE = dlogits.transpose() * x;
  embedding_backward<double>(dE, dlogits * E, tokens);
  CHECK(check_gradient("embedding+head+xent dE", E, dE, loss, sample_indices(E)).pass);
}

TEST_CASE("cross-entropy of uniform logits is log(vocab)", "[loss]") {
  Mat<double> probs;
  const double l = cross_entropy_forward<double>(probs, Mat<double>::Zero(3, 256), {1, 2, 255});
  CHECK(std::abs(l - std::log(256.0)) < 1e-12);
}

TEST_CASE("building blocks reject bad shapes with clear messages", "[bad-input]") {
  Rng rng(107);
  Mat<double> y, x = rng.normal_matrix<double>(4, 6);
  Vec<double> r;
  const RowVec<double> g5 = RowVec<double>::Ones(5);
  CHECK_THROWS_WITH(rmsnorm_forward<double>(y, r, x, g5), Contains("gain has 5 entries"));
  CHECK_THROWS_WITH(linear_forward(y, x, Mat<double>(5, 3)), Contains("does not match weight"));
  CHECK_THROWS_WITH(rope_forward(y, Mat<double>(4, 6), 4, 2), Contains("must be even"));
  CHECK_THROWS_WITH(rope_forward(y, Mat<double>(5, 8), 4, 2),
                    Contains("whole number of sequences"));
  std::vector<Mat<double>> probs;
  CHECK_THROWS_WITH(attention_forward(y, probs, Mat<double>(4, 6), Mat<double>(4, 4),
                                      Mat<double>(4, 4), 1, 4, 3, 2),
                    Contains("must be a positive multiple of n_kv_head"));
  CHECK_THROWS_WITH(attention_forward(y, probs, Mat<double>(4, 8), Mat<double>(4, 4),
                                      Mat<double>(4, 4), 2, 4, 2, 1),
                    Contains("B·T = 8 rows"));
  MlpSaved<double> s;
  CHECK_THROWS_WITH(mlp_forward(y, s, x, Mat<double>(6, 4), Mat<double>(6, 5), Mat<double>(4, 6)),
                    Contains("weights must be"));
  CHECK_THROWS_WITH(embedding_forward<double>(y, {1, 256}, Mat<double>::Zero(256, 4)),
                    Contains("token 256 at position 1 is outside the vocabulary"));
  CHECK_THROWS_WITH(embedding_forward<double>(y, {}, Mat<double>::Zero(256, 4)),
                    Contains("at least one"));
  CHECK_THROWS_WITH(cross_entropy_forward<double>(y, Mat<double>::Zero(2, 4), {1}),
                    Contains("2 rows but there are 1 targets"));
}

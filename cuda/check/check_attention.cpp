/**
 * @file check_attention.cpp
 * @brief check_attention.h: run the attention twin and the reference (double and float) on the
 *        same float inputs and measure the GPU's error against the reference's own.
 */
#include "cuda/check/check_attention.h"

#include <stdexcept>
#include <utility>

#include "cuda/attention.h"
#include "cuda/check/compare.h"
#include "cuda/device.h"
#include "reference/layers.h"

namespace mhar::cuda {

namespace {

using check_detail::draw;
using check_detail::Drawn;
using check_detail::flatten;
using check_detail::poisoned;
using check_detail::require_device;

/// One shape's inputs. q has sd 1.5 and k sd 1, so the scores q·k/√hd are of order one: the
/// softmax is neither uniform nor one-hot. Never zero.
struct Inputs {
  Drawn q, k, v, dout;
};
Inputs draw_inputs(const AttentionShape& s, Rng& rng) {
  const Eigen::Index P = static_cast<Eigen::Index>(s.B) * s.T;
  Inputs in;
  in.q = draw(rng, P, s.n_head * s.hd, 0.0, 1.5);
  in.k = draw(rng, P, s.n_kv_head * s.hd);
  in.v = draw(rng, P, s.n_kv_head * s.hd);
  in.dout = draw(rng, P, s.n_head * s.hd);
  return in;
}

CheckRow compare(const std::string& step, const std::string& tensor, AttentionVersion v,
                 const AttentionShape& s, const std::vector<double>& truth,
                 const std::vector<float>& ref_float, const std::vector<float>& gpu) {
  return compare_with_truth(step, tensor, attention_version_name(v), describe(s), truth, ref_float,
                            gpu);
}

unsigned mix_seed(unsigned seed, const AttentionShape& s, unsigned salt) {
  return seed * 1000003u +
         static_cast<unsigned>(s.B * 7919 + s.T * 104729 + s.n_head * 31 + s.n_kv_head * 13 +
                               s.hd) +
         salt * 65537u;
}

}  // namespace

std::string describe(const AttentionShape& s) {
  return "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) +
         " n_head=" + std::to_string(s.n_head) + " n_kv_head=" + std::to_string(s.n_kv_head) +
         " hd=" + std::to_string(s.hd);
}

std::vector<AttentionShape> attention_check_shapes() {
  return {
      // B, T, n_head, n_kv_head, hd
      {1, 1, 1, 1, 2},     // a single token (probs = 1, ds = 0); one head; hd = 2
      {2, 7, 4, 2, 6},     // T odd; G = 2; hd = 6
      {3, 5, 3, 1, 16},    // n_kv_head = 1 (multi-query), G = 3
      {2, 6, 4, 4, 2},     // n_kv_head = n_head (plain multi-head); hd = 2
      {1, 9, 2, 1, 5},     // hd odd
      {2, 33, 4, 1, 64},   // T > 32: a lane owns two keys
      {1, 70, 2, 2, 128},  // T > 64; hd = 128: four columns a lane
      {2, 64, 8, 2, 32},   // a model-sized block
  };
}

std::vector<CheckRow> check_attention_forward(const AttentionShape& s, unsigned seed,
                                              AttentionVersion version) {
  require_device("check_attention_forward");
  Rng rng(mix_seed(seed, s, 1));
  const Inputs in = draw_inputs(s, rng);
  const std::size_t P = static_cast<std::size_t>(s.B) * s.T;

  // Truth (double) and the honest baseline (the same reference in float).
  Mat<double> out_d;
  std::vector<Mat<double>> probs_d;
  mhar::attention_forward<double>(out_d, probs_d, in.q.d, in.k.d, in.v.d, s.B, s.T, s.n_head,
                                  s.n_kv_head);
  Mat<float> out_f;
  std::vector<Mat<float>> probs_f;
  mhar::attention_forward<float>(out_f, probs_f, in.q.f, in.k.f, in.v.f, s.B, s.T, s.n_head,
                                 s.n_kv_head);

  DeviceBuffer q(flatten(in.q.f)), k(flatten(in.k.f)), v(flatten(in.v.f));
  DeviceBuffer out = poisoned(P * s.n_head * s.hd),
               probs = poisoned(static_cast<std::size_t>(s.B) * s.n_head * s.T * s.T);
  attention_forward(out.data(), probs.data(), q.data(), k.data(), v.data(), s.B, s.T, s.n_head,
                    s.n_kv_head, s.hd, version);
  return {compare("attention forward", "out", version, s, flatten(out_d), flatten(out_f),
                  out.download()),
          compare("attention forward", "probs", version, s, flatten(probs_d), flatten(probs_f),
                  probs.download())};
}

std::vector<CheckRow> check_attention_backward(const AttentionShape& s, unsigned seed,
                                               AttentionVersion version) {
  require_device("check_attention_backward");
  Rng rng(mix_seed(seed, s, 2));
  const Inputs in = draw_inputs(s, rng);
  const std::size_t P = static_cast<std::size_t>(s.B) * s.T;

  // The double forward's probs, rounded to float: the same backward input for all three runs.
  Mat<double> out_d;
  std::vector<Mat<double>> probs_d;
  mhar::attention_forward<double>(out_d, probs_d, in.q.d, in.k.d, in.v.d, s.B, s.T, s.n_head,
                                  s.n_kv_head);
  std::vector<Mat<float>> probs_f;
  for (auto& a : probs_d) {
    probs_f.push_back(a.cast<float>());
    a = probs_f.back().cast<double>();
  }

  Mat<double> dq_d, dk_d, dv_d;
  mhar::attention_backward<double>(dq_d, dk_d, dv_d, in.dout.d, probs_d, in.q.d, in.k.d, in.v.d,
                                   s.B, s.T, s.n_head, s.n_kv_head);
  Mat<float> dq_f, dk_f, dv_f;
  mhar::attention_backward<float>(dq_f, dk_f, dv_f, in.dout.f, probs_f, in.q.f, in.k.f, in.v.f, s.B,
                                  s.T, s.n_head, s.n_kv_head);

  DeviceBuffer q(flatten(in.q.f)), k(flatten(in.k.f)), v(flatten(in.v.f)), dout(flatten(in.dout.f)),
      probs(flatten(probs_f));
  DeviceBuffer dq = poisoned(P * s.n_head * s.hd), dk = poisoned(P * s.n_kv_head * s.hd),
               dv = poisoned(P * s.n_kv_head * s.hd);
  attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), probs.data(), q.data(), k.data(),
                     v.data(), s.B, s.T, s.n_head, s.n_kv_head, s.hd, version);
  const std::string step = "attention backward";
  return {compare(step, "dq", version, s, flatten(dq_d), flatten(dq_f), dq.download()),
          compare(step, "dk", version, s, flatten(dk_d), flatten(dk_f), dk.download()),
          compare(step, "dv", version, s, flatten(dv_d), flatten(dv_f), dv.download())};
}

std::vector<CheckRow> check_attention(unsigned seed) {
  require_device("check_attention");
  std::vector<CheckRow> rows;
  for (const AttentionShape& s : attention_check_shapes())
    for (AttentionVersion v : {AttentionVersion::Rows, AttentionVersion::Gemm})
      for (auto check : {check_attention_forward, check_attention_backward})
        for (auto& r : check(s, seed, v)) rows.push_back(std::move(r));
  return rows;
}

}  // namespace mhar::cuda

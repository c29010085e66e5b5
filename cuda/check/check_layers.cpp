/**
 * @file check_layers.cpp
 * @brief check_layers.h: run each layer and optimiser twin and the reference (double and float)
 *        on the same float inputs and measure the GPU's error against the reference's own.
 */
#include "cuda/check/check_layers.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <span>
#include <stdexcept>
#include <utility>

#include "cuda/check/compare.h"
#include "cuda/layers.h"
#include "cuda/linear.h"
#include "cuda/optim.h"
#include "reference/layers.h"
#include "reference/optim.h"

namespace mhar::cuda {

namespace {

using check_detail::draw;
using check_detail::Drawn;
using check_detail::flatten;
using check_detail::poisoned;
using check_detail::require_device;

template <typename Derived>
Mat<float> to_float(const Eigen::MatrixBase<Derived>& m) {
  return m.template cast<float>();
}

/// rows × cols float matrix rounded from `m`, and its exact double copy.
Drawn rounded(const Mat<double>& m) {
  Drawn r;
  r.f = to_float(m);
  r.d = r.f.cast<double>();
  return r;
}

/// a followed by b.
template <typename T>
std::vector<T> joined(std::vector<T> a, const std::vector<T>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

/// Tokens drawn uniformly from [0, vocab).
std::vector<int> draw_tokens(Rng& rng, int P, int vocab) {
  std::vector<int> t(static_cast<std::size_t>(P));
  for (int& x : t) x = static_cast<int>(rng.below(static_cast<std::uint64_t>(vocab)));
  return t;
}

CheckRow compare(const std::string& step, const std::string& tensor, const LayerShape& s,
                 const std::vector<double>& truth, const std::vector<float>& ref_float,
                 const std::vector<float>& gpu) {
  return compare_with_truth(step, tensor, "v1", describe(s), truth, ref_float, gpu);
}

unsigned mix_seed(unsigned seed, const LayerShape& s, unsigned salt) {
  return seed * 1000003u +
         static_cast<unsigned>(s.P * 7919 + s.d * 31 + s.vocab * 104729 + s.f * 13 + s.hd) +
         salt * 65537u;
}

std::size_t numel(int rows, int cols) {
  return static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols);
}

}  // namespace

std::string describe(const LayerShape& s) {
  return "P=" + std::to_string(s.P) + " T=" + std::to_string(s.T) + " d=" + std::to_string(s.d) +
         " heads=" + std::to_string(s.n_heads) + " hd=" + std::to_string(s.hd) +
         " f=" + std::to_string(s.f) + " vocab=" + std::to_string(s.vocab);
}

std::vector<LayerShape> layer_check_shapes() {
  return {
      // P, T, d, heads, hd, f, vocab
      {1, 1, 3, 1, 2, 1, 1},              // a single token; hd = 2; vocab = 1 (loss 0)
      {7, 7, 40, 5, 8, 72, 19},           // P odd, d not a multiple of 32, repeated tokens
      {12, 4, 96, 48, 2, 33, 256},        // hd = 2 with many heads; the byte vocabulary
      {33, 11, 256, 4, 64, 688, 256},     // a model-sized block
      {1000, 250, 36, 2, 18, 100, 300},   // four dgain chunks; vocab > 256; P ≫ vocab
      {5, 1, 3000, 1, 3000, 1000, 1000},  // T = 1 (no rotation); wide rows
  };
}

std::vector<CheckRow> check_rmsnorm(const LayerShape& s, unsigned seed) {
  require_device("check_rmsnorm");
  Rng rng(mix_seed(seed, s, 1));
  const Drawn x = draw(rng, s.P, s.d, 0.0, 1.5), dy = draw(rng, s.P, s.d);
  const RowVec<float> gain_f = to_float(rng.normal_matrix<double>(1, s.d, 1.0, 0.3));
  const RowVec<double> gain_d = gain_f.cast<double>();
  RowVec<float> dgain_f = to_float(rng.normal_matrix<double>(1, s.d));
  RowVec<double> dgain_d = dgain_f.cast<double>();
  DeviceBuffer d_x(flatten(x.f)), d_gain(flatten(gain_f)), d_dy(flatten(dy.f));
  DeviceBuffer d_dgain(flatten(dgain_f));  // += starts from random values

  // Forward.
  Mat<double> y_d;
  Vec<double> rinv_d;
  mhar::rmsnorm_forward<double>(y_d, rinv_d, x.d, gain_d);
  Mat<float> y_f;
  Vec<float> rinv_f;
  mhar::rmsnorm_forward<float>(y_f, rinv_f, x.f, gain_f);
  DeviceBuffer y = poisoned(numel(s.P, s.d)), rinv = poisoned(numel(s.P, 1));
  rmsnorm_forward(y.data(), rinv.data(), d_x.data(), d_gain.data(), s.P, s.d);
  std::vector<CheckRow> rows{
      compare("rmsnorm_forward", "y", s, flatten(y_d), flatten(y_f), y.download()),
      compare("rmsnorm_forward", "rinv", s, flatten(rinv_d), flatten(rinv_f), rinv.download())};

  // Backward, from the double forward's rinv rounded to float.
  const Vec<float> saved_f = rinv_d.cast<float>();
  const Vec<double> saved_d = saved_f.cast<double>();
  Mat<double> dx_d;
  mhar::rmsnorm_backward<double>(dx_d, dgain_d, dy.d, saved_d, x.d, gain_d);
  Mat<float> dx_f;
  mhar::rmsnorm_backward<float>(dx_f, dgain_f, dy.f, saved_f, x.f, gain_f);
  DeviceBuffer d_saved(flatten(saved_f)), dx = poisoned(numel(s.P, s.d));
  rmsnorm_backward(dx.data(), d_dgain.data(), d_dy.data(), d_saved.data(), d_x.data(),
                   d_gain.data(), s.P, s.d);
  rows.push_back(compare("rmsnorm_backward", "dx", s, flatten(dx_d), flatten(dx_f), dx.download()));
  rows.push_back(compare("rmsnorm_backward", "dgain", s, flatten(dgain_d), flatten(dgain_f),
                         d_dgain.download()));
  return rows;
}

std::vector<CheckRow> check_rope(const LayerShape& s, unsigned seed) {
  require_device("check_rope");
  Rng rng(mix_seed(seed, s, 2));
  const int width = s.n_heads * s.hd;
  const Drawn x = draw(rng, s.P, width), dy = draw(rng, s.P, width);
  DeviceBuffer d_x(flatten(x.f)), d_dy(flatten(dy.f));

  Mat<double> y_d, dx_d;
  Mat<float> y_f, dx_f;
  mhar::rope_forward<double>(y_d, x.d, s.T, s.n_heads);
  mhar::rope_forward<float>(y_f, x.f, s.T, s.n_heads);
  mhar::rope_backward<double>(dx_d, dy.d, s.T, s.n_heads);
  mhar::rope_backward<float>(dx_f, dy.f, s.T, s.n_heads);

  DeviceBuffer y = poisoned(numel(s.P, width)), dx = poisoned(numel(s.P, width));
  rope_forward(y.data(), d_x.data(), s.P, s.T, s.n_heads, s.hd);
  rope_backward(dx.data(), d_dy.data(), s.P, s.T, s.n_heads, s.hd);
  return {compare("rope_forward", "y", s, flatten(y_d), flatten(y_f), y.download()),
          compare("rope_backward", "dx", s, flatten(dx_d), flatten(dx_f), dx.download())};
}

namespace {

/// reference mlp_forward / mlp_backward with 0/1 weights whose matmuls copy exactly:
/// x = [gate | up] (P × 2f), W_gate = [I; 0], W_up = [0; I] (2f × f), W_down = [I | 0] (f × 2f).
/// Then y = [h | 0], and for dy = [dh | 0], dx = [dgate | dup].
template <typename T>
struct SwigluThroughMlp {
  Mat<T> x, w_gate, w_up, w_down;
  MlpSaved<T> saved;

  SwigluThroughMlp(const Mat<T>& gate, const Mat<T>& up) {
    const Eigen::Index P = gate.rows(), f = gate.cols();
    x.resize(P, 2 * f);
    x << gate, up;
    w_gate = Mat<T>::Zero(2 * f, f);
    w_gate.topRows(f).setIdentity();
    w_up = Mat<T>::Zero(2 * f, f);
    w_up.bottomRows(f).setIdentity();
    w_down = Mat<T>::Zero(f, 2 * f);
    w_down.leftCols(f).setIdentity();
  }
  /// h = silu(gate) ⊙ up.
  Mat<T> forward() {
    Mat<T> y;
    mhar::mlp_forward<T>(y, saved, x, w_gate, w_up, w_down);
    return y.leftCols(w_gate.cols());
  }
  /// [dgate | dup] for dh (after forward()).
  Mat<T> backward(const Mat<T>& dh) {
    const Eigen::Index f = w_gate.cols();
    Mat<T> dy = Mat<T>::Zero(dh.rows(), 2 * f);
    dy.leftCols(f) = dh;
    Mat<T> dx, dw_gate = Mat<T>::Zero(2 * f, f), dw_up = Mat<T>::Zero(2 * f, f),
               dw_down = Mat<T>::Zero(f, 2 * f);
    mhar::mlp_backward<T>(dx, dw_gate, dw_up, dw_down, dy, saved, x, w_gate, w_up, w_down);
    return dx;
  }
};

}  // namespace

std::vector<CheckRow> check_swiglu(const LayerShape& s, unsigned seed) {
  require_device("check_swiglu");
  Rng rng(mix_seed(seed, s, 3));
  const Drawn gate = draw(rng, s.P, s.f, 0.0, 2.0), up = draw(rng, s.P, s.f),
              dh = draw(rng, s.P, s.f);
  SwigluThroughMlp<double> mlp_d(gate.d, up.d);
  SwigluThroughMlp<float> mlp_f(gate.f, up.f);
  const Mat<double> h_d = mlp_d.forward(), dx_d = mlp_d.backward(dh.d);
  const Mat<float> h_f = mlp_f.forward(), dx_f = mlp_f.backward(dh.f);

  DeviceBuffer d_gate(flatten(gate.f)), d_up(flatten(up.f)), d_dh(flatten(dh.f));
  DeviceBuffer h = poisoned(numel(s.P, s.f)), dgate = poisoned(numel(s.P, s.f)),
               dup = poisoned(numel(s.P, s.f));
  swiglu_forward(h.data(), d_gate.data(), d_up.data(), s.P, s.f);
  swiglu_backward(dgate.data(), dup.data(), d_dh.data(), d_gate.data(), d_up.data(), s.P, s.f);
  return {compare("swiglu_forward", "h", s, flatten(h_d), flatten(h_f), h.download()),
          compare("swiglu_backward", "dgate", s, flatten(dx_d.leftCols(s.f)),
                  flatten(dx_f.leftCols(s.f)), dgate.download()),
          compare("swiglu_backward", "dup", s, flatten(dx_d.rightCols(s.f)),
                  flatten(dx_f.rightCols(s.f)), dup.download())};
}

std::vector<CheckRow> check_linear(const LayerShape& s, unsigned seed) {
  require_device("check_linear");
  Rng rng(mix_seed(seed, s, 8));
  const Drawn x = draw(rng, s.P, s.d), W = draw(rng, s.d, s.f, 0.0, 0.2), dy = draw(rng, s.P, s.f);
  Drawn dW = draw(rng, s.d, s.f);  // += starts from random values
  Mat<double> y_d, dx_d, dW_d = dW.d;
  Mat<float> y_f, dx_f, dW_f = dW.f;
  mhar::linear_forward<double>(y_d, x.d, W.d);
  mhar::linear_forward<float>(y_f, x.f, W.f);
  mhar::linear_backward<double>(dx_d, dW_d, dy.d, x.d, W.d);
  mhar::linear_backward<float>(dx_f, dW_f, dy.f, x.f, W.f);

  DeviceBuffer d_x(flatten(x.f)), d_W(flatten(W.f)), d_dy(flatten(dy.f)), d_dW(flatten(dW.f));
  DeviceBuffer y = poisoned(numel(s.P, s.f)), dx = poisoned(numel(s.P, s.d));
  linear_forward(y.data(), d_x.data(), d_W.data(), s.P, s.d, s.f);
  linear_backward(dx.data(), d_dW.data(), d_dy.data(), d_x.data(), d_W.data(), s.P, s.d, s.f);
  return {compare("linear_forward", "y", s, flatten(y_d), flatten(y_f), y.download()),
          compare("linear_backward", "dx", s, flatten(dx_d), flatten(dx_f), dx.download()),
          compare("linear_backward", "dW", s, flatten(dW_d), flatten(dW_f), d_dW.download())};
}

std::vector<CheckRow> check_mlp(const LayerShape& s, unsigned seed) {
  require_device("check_mlp");
  Rng rng(mix_seed(seed, s, 9));
  const Drawn x = draw(rng, s.P, s.d), wg = draw(rng, s.d, s.f, 0.0, 0.3),
              wu = draw(rng, s.d, s.f, 0.0, 0.3), wd = draw(rng, s.f, s.d, 0.0, 0.3),
              dy = draw(rng, s.P, s.d);
  Drawn dwg = draw(rng, s.d, s.f), dwu = draw(rng, s.d, s.f), dwd = draw(rng, s.f, s.d);
  Mat<double> y_d, dx_d, dwg_d = dwg.d, dwu_d = dwu.d, dwd_d = dwd.d;
  Mat<float> y_f, dx_f, dwg_f = dwg.f, dwu_f = dwu.f, dwd_f = dwd.f;
  MlpSaved<double> sv_d;
  MlpSaved<float> sv_f;
  mhar::mlp_forward<double>(y_d, sv_d, x.d, wg.d, wu.d, wd.d);
  mhar::mlp_forward<float>(y_f, sv_f, x.f, wg.f, wu.f, wd.f);
  DeviceBuffer d_x(flatten(x.f)), d_wg(flatten(wg.f)), d_wu(flatten(wu.f)), d_wd(flatten(wd.f)),
      d_dy(flatten(dy.f)), d_dwg(flatten(dwg.f)), d_dwu(flatten(dwu.f)), d_dwd(flatten(dwd.f));
  DeviceBuffer y = poisoned(numel(s.P, s.d)), gate = poisoned(numel(s.P, s.f)),
               up = poisoned(numel(s.P, s.f)), dx = poisoned(numel(s.P, s.d));
  mlp_forward(y.data(), gate.data(), up.data(), d_x.data(), d_wg.data(), d_wu.data(), d_wd.data(),
              s.P, s.d, s.f);
  std::vector<CheckRow> rows{
      compare("mlp_forward", "y", s, flatten(y_d), flatten(y_f), y.download()),
      compare("mlp_forward", "gate", s, flatten(sv_d.gate), flatten(sv_f.gate), gate.download()),
      compare("mlp_forward", "up", s, flatten(sv_d.up), flatten(sv_f.up), up.download())};

  // Backward, from the double forward's gate and up rounded to float.
  MlpSaved<float> saved_f{sv_d.gate.cast<float>(), sv_d.up.cast<float>()};
  MlpSaved<double> saved_d{saved_f.gate.cast<double>(), saved_f.up.cast<double>()};
  mhar::mlp_backward<double>(dx_d, dwg_d, dwu_d, dwd_d, dy.d, saved_d, x.d, wg.d, wu.d, wd.d);
  mhar::mlp_backward<float>(dx_f, dwg_f, dwu_f, dwd_f, dy.f, saved_f, x.f, wg.f, wu.f, wd.f);
  DeviceBuffer d_gate(flatten(saved_f.gate)), d_up(flatten(saved_f.up));
  mlp_backward(dx.data(), d_dwg.data(), d_dwu.data(), d_dwd.data(), d_dy.data(), d_gate.data(),
               d_up.data(), d_x.data(), d_wg.data(), d_wu.data(), d_wd.data(), s.P, s.d, s.f);
  rows.push_back(compare("mlp_backward", "dx", s, flatten(dx_d), flatten(dx_f), dx.download()));
  rows.push_back(
      compare("mlp_backward", "dw_gate", s, flatten(dwg_d), flatten(dwg_f), d_dwg.download()));
  rows.push_back(
      compare("mlp_backward", "dw_up", s, flatten(dwu_d), flatten(dwu_f), d_dwu.download()));
  rows.push_back(
      compare("mlp_backward", "dw_down", s, flatten(dwd_d), flatten(dwd_f), d_dwd.download()));
  return rows;
}

std::vector<CheckRow> check_embedding(const LayerShape& s, unsigned seed) {
  require_device("check_embedding");
  Rng rng(mix_seed(seed, s, 4));
  const std::vector<int> tokens = draw_tokens(rng, s.P, s.vocab);
  const Drawn E = draw(rng, s.vocab, s.d, 0.0, 0.02), dx = draw(rng, s.P, s.d);
  Drawn dE = draw(rng, s.vocab, s.d);  // += starts from random values
  DeviceBuffer d_tokens = upload_ints(tokens), d_E(flatten(E.f)), d_dx(flatten(dx.f)),
               d_dE(flatten(dE.f));

  Mat<double> x_d;
  Mat<float> x_f;
  mhar::embedding_forward<double>(x_d, tokens, E.d);
  mhar::embedding_forward<float>(x_f, tokens, E.f);
  mhar::embedding_backward<double>(dE.d, dx.d, tokens);
  mhar::embedding_backward<float>(dE.f, dx.f, tokens);

  DeviceBuffer x = poisoned(numel(s.P, s.d));
  embedding_forward(x.data(), device_ints(d_tokens), d_E.data(), s.P, s.d, s.vocab);
  embedding_backward(d_dE.data(), d_dx.data(), device_ints(d_tokens), s.P, s.d, s.vocab);
  return {compare("embedding_forward", "x", s, flatten(x_d), flatten(x_f), x.download()),
          compare("embedding_backward", "dE", s, flatten(dE.d), flatten(dE.f), d_dE.download())};
}

std::vector<CheckRow> check_cross_entropy(const LayerShape& s, unsigned seed) {
  require_device("check_cross_entropy");
  Rng rng(mix_seed(seed, s, 5));
  const std::vector<int> targets = draw_tokens(rng, s.P, s.vocab);
  const Drawn logits = draw(rng, s.P, s.vocab, 0.0, 2.0);
  DeviceBuffer d_targets = upload_ints(targets), d_logits(flatten(logits.f));

  // Forward.
  Mat<double> probs_d;
  Mat<float> probs_f;
  const double loss_d = mhar::cross_entropy_forward<double>(probs_d, logits.d, targets);
  const float loss_f = mhar::cross_entropy_forward<float>(probs_f, logits.f, targets);
  DeviceBuffer loss = poisoned(1), probs = poisoned(numel(s.P, s.vocab));
  cross_entropy_forward(loss.data(), probs.data(), d_logits.data(), device_ints(d_targets), s.P,
                        s.vocab);
  std::vector<CheckRow> rows{
      compare("cross_entropy_forward", "loss", s, {loss_d}, {loss_f}, loss.download()),
      compare("cross_entropy_forward", "probs", s, flatten(probs_d), flatten(probs_f),
              probs.download())};

  // Backward, from the double forward's probs rounded to float.
  const Drawn saved = rounded(probs_d);
  Mat<double> dlogits_d;
  Mat<float> dlogits_f;
  mhar::cross_entropy_backward<double>(dlogits_d, saved.d, targets);
  mhar::cross_entropy_backward<float>(dlogits_f, saved.f, targets);
  DeviceBuffer d_saved(flatten(saved.f)), dlogits = poisoned(numel(s.P, s.vocab));
  cross_entropy_backward(dlogits.data(), d_saved.data(), device_ints(d_targets), s.P, s.vocab);
  rows.push_back(compare("cross_entropy_backward", "dlogits", s, flatten(dlogits_d),
                         flatten(dlogits_f), dlogits.download()));
  return rows;
}

std::vector<CheckRow> check_adamw(const LayerShape& s, unsigned seed) {
  require_device("check_adamw");
  Rng rng(mix_seed(seed, s, 6));
  const Drawn param = draw(rng, s.P, s.d), m = draw(rng, s.P, s.d, 0.0, 0.1),
              grad = draw(rng, s.P, s.d);
  // v ≥ 0: squares of N(0, 0.1²), rounded to float.
  const Drawn v = rounded(rng.normal_matrix<double>(s.P, s.d, 0.0, 0.1).cwiseAbs2());
  const AdamWHyper hyper;  // β1 0.9, β2 0.95, eps 1e-8, weight decay 0.1
  const double lr = 0.03;  // large enough that a wrong update term shows above float rounding
  DeviceBuffer d_grad(flatten(grad.f));

  std::vector<CheckRow> rows;
  for (const auto& [decay, step] : {std::pair{true, 1L}, std::pair{false, 7L}}) {
    const std::string tag =
        std::string(decay ? " (decay, step " : " (no decay, step ") + std::to_string(step) + ")";
    Drawn p = param, mm = m, vv = v;
    DeviceBuffer d_p(flatten(p.f)), d_m(flatten(mm.f)), d_v(flatten(vv.f));
    mhar::adamw_step<double>(p.d, mm.d, vv.d, grad.d, step, lr, hyper, decay);
    mhar::adamw_step<float>(p.f, mm.f, vv.f, grad.f, step, lr, hyper, decay);
    adamw_step(d_p.data(), d_m.data(), d_v.data(), d_grad.data(), numel(s.P, s.d), step, lr,
               hyper.beta1, hyper.beta2, hyper.eps, hyper.weight_decay, decay);
    rows.push_back(
        compare("adamw_step", "param" + tag, s, flatten(p.d), flatten(p.f), d_p.download()));
    rows.push_back(
        compare("adamw_step", "m" + tag, s, flatten(mm.d), flatten(mm.f), d_m.download()));
    rows.push_back(
        compare("adamw_step", "v" + tag, s, flatten(vv.d), flatten(vv.f), d_v.download()));
  }
  return rows;
}

std::vector<CheckRow> check_clip(const LayerShape& s, unsigned seed) {
  require_device("check_clip");
  Rng rng(mix_seed(seed, s, 7));
  // Two gradient tensors of different sizes, summed into one accumulator.
  Drawn g1 = draw(rng, s.P, s.d), g2 = draw(rng, 1, s.vocab, 0.0, 3.0);
  const float start = static_cast<float>(rng.uniform(0.0, 10.0));  // += starts from this value
  DeviceBuffer d_g1(flatten(g1.f)), d_g2(flatten(g2.f));

  // (1) the squared norm: reference clip_grad_norm with max_norm = 0 (measure, never scale).
  std::array<Mat<double>*, 2> grads_d{&g1.d, &g2.d};
  std::array<Mat<float>*, 2> grads_f{&g1.f, &g2.f};
  const double norm_d = mhar::clip_grad_norm<double>(grads_d, 0.0);
  const double norm_f = mhar::clip_grad_norm<float>(grads_f, 0.0);
  DeviceBuffer acc(std::vector<float>{start}), sq(std::vector<float>{0.0f});
  for (DeviceBuffer* out : {&acc, &sq}) {
    grad_sq_norm(out->data(), d_g1.data(), static_cast<std::size_t>(g1.f.size()));
    grad_sq_norm(out->data(), d_g2.data(), static_cast<std::size_t>(g2.f.size()));
  }
  std::vector<CheckRow> rows{
      compare("grad_sq_norm (two tensors, +=)", "", s, {double(start) + norm_d * norm_d},
              {static_cast<float>(double(start) + norm_f * norm_f)}, acc.download())};

  // (2) clip to 0.3 of the norm (not a power of two, so the scaling rounds): the reference scales
  // in clip_grad_norm; the GPU caller takes the norm from grad_sq_norm and calls scale (the recipe
  // in cuda/optim.h).
  const double max_norm = 0.3 * norm_d;
  mhar::clip_grad_norm<double>(grads_d, max_norm);
  mhar::clip_grad_norm<float>(grads_f, max_norm);
  const double norm_gpu = std::sqrt(static_cast<double>(sq.download()[0]));
  const auto factor = static_cast<float>(max_norm / norm_gpu);
  scale(d_g1.data(), factor, static_cast<std::size_t>(g1.f.size()));
  scale(d_g2.data(), factor, static_cast<std::size_t>(g2.f.size()));
  rows.push_back(compare("scale (clip to 0.3 of the norm)", "", s,
                         joined(flatten(g1.d), flatten(g2.d)), joined(flatten(g1.f), flatten(g2.f)),
                         joined(d_g1.download(), d_g2.download())));
  return rows;
}

std::vector<CheckRow> check_layers(unsigned seed) {
  require_device("check_layers");
  std::vector<CheckRow> rows;
  for (const LayerShape& s : layer_check_shapes())
    for (auto check : {check_rmsnorm, check_rope, check_swiglu, check_linear, check_mlp,
                       check_embedding, check_cross_entropy, check_adamw, check_clip})
      for (auto& r : check(s, seed)) rows.push_back(std::move(r));
  return rows;
}

}  // namespace mhar::cuda

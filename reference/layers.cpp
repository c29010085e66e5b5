/**
 * @file layers.cpp
 * @brief The decoder's building blocks, CPU reference: each Eigen line under its formula.
 */
#include "layers.h"

#include <cmath>

namespace mhar {

// ---- RMSNorm ---------------------------------------------------------------------------------

template <typename T>
void rmsnorm_forward(Mat<T>& y, Vec<T>& rinv, const Mat<T>& x,
                     const Eigen::Ref<const RowVec<T>>& gain) {
  require(x.rows() >= 1 && x.cols() >= 1, "rmsnorm", "input must be non-empty");
  require(gain.cols() == x.cols(), "rmsnorm", "gain has ", gain.cols(), " entries, input width is ",
          x.cols());
  const T d = static_cast<T>(x.cols());
  // (1) r = 1 / sqrt( mean_c x² + eps )
  rinv = ((x.array().square().rowwise().sum() / d) + T(kNormEps)).rsqrt();
  // (2) y = diag(r) · x · diag(gain)
  y = rinv.asDiagonal() * x * gain.asDiagonal();
}

template <typename T>
void rmsnorm_backward(Mat<T>& dx, Eigen::Ref<RowVec<T>> dgain, const Mat<T>& dy, const Vec<T>& rinv,
                      const Mat<T>& x, const Eigen::Ref<const RowVec<T>>& gain) {
  require_shape(dy, x.rows(), x.cols(), "rmsnorm_backward", "dy");
  const T d = static_cast<T>(x.cols());
  // from (2): dgain += Σ_p dy ⊙ (r · x);  dxhat = dy ⊙ gain
  dgain += (dy.cwiseProduct(rinv.asDiagonal() * x)).colwise().sum();
  const Mat<T> dxhat = dy * gain.asDiagonal();
  // from (1): dx = r · dxhat − (r³ / d) · (Σ_c dxhat ⊙ x) · x
  const Vec<T> coef =
      (rinv.array().cube() * dxhat.cwiseProduct(x).rowwise().sum().array() / d).matrix();
  dx = rinv.asDiagonal() * dxhat - coef.asDiagonal() * x;
}

// ---- Linear ----------------------------------------------------------------------------------

template <typename T>
void linear_forward(Mat<T>& y, const Mat<T>& x, const Mat<T>& W) {
  require(x.cols() == W.rows(), "linear", "input width ", x.cols(), " does not match weight ",
          W.rows(), "×", W.cols());
  y.noalias() = x * W;  // y = x · W
}

template <typename T>
void linear_backward(Mat<T>& dx, Mat<T>& dW, const Mat<T>& dy, const Mat<T>& x, const Mat<T>& W) {
  require_shape(dy, x.rows(), W.cols(), "linear_backward", "dy");
  require_shape(dW, W.rows(), W.cols(), "linear_backward", "dW");
  dx.noalias() = dy * W.transpose();   // dx = dy · Wᵀ
  dW.noalias() += x.transpose() * dy;  // dW += xᵀ · dy
}

// ---- RoPE ------------------------------------------------------------------------------------

namespace {

/// The angles sign · (first + t) · θ^(−2i/hd) of positions t < T_len, as cos and sin tables.
template <typename T>
RopeTable<T> rope_angles(int T_len, int hd, double sign, int first) {
  const int half = hd / 2;
  RopeTable<T> tab{Mat<T>(T_len, half), Mat<T>(T_len, half)};
  // θ^(−2i/hd) depends on the pair i only: computed once per pair, not once per position
  std::vector<double> freq(half);
  for (int i = 0; i < half; ++i) freq[i] = std::pow(kRopeTheta, -2.0 * i / hd);
  for (int t = 0; t < T_len; ++t)
    for (int i = 0; i < half; ++i) {
      const double angle = sign * (first + t) * freq[i];
      tab.cos(t, i) = static_cast<T>(std::cos(angle));
      tab.sin(t, i) = static_cast<T>(std::sin(angle));
    }
  return tab;
}

/// Checks x for RoPE over n_heads heads and returns the head width hd.
int rope_head_width(const Eigen::Index cols, int n_heads) {
  require(n_heads >= 1, "rope", "the head count must be positive");
  require(cols % n_heads == 0, "rope", "width ", cols, " is not a multiple of ", n_heads, " heads");
  const int hd = static_cast<int>(cols) / n_heads;
  require(hd % 2 == 0, "rope", "head width ", hd, " must be even (rotate-half pairs i, i + hd/2)");
  return hd;
}

/// Rotates each pair (i, i + hd/2) of every head of row p by the angles in row
/// first_row + p mod T_len of the table.
template <typename T>
void rope_apply(Mat<T>& y, const Mat<T>& x, const RopeTable<T>& tab, int T_len, int n_heads,
                int first_row) {
  const int hd = static_cast<int>(x.cols()) / n_heads, half = hd / 2;
  y.resize(x.rows(), x.cols());
  for (Eigen::Index p = 0; p < x.rows(); ++p) {
    const auto t = first_row + p % T_len;
    for (int h = 0; h < n_heads; ++h) {
      // [y_a, y_b] = [x_a cos − x_b sin,  x_a sin + x_b cos],  a = h·hd + i,  b = a + hd/2
      const auto xa = x.row(p).segment(h * hd, half).array();
      const auto xb = x.row(p).segment(h * hd + half, half).array();
      const auto c = tab.cos.row(t).array(), s = tab.sin.row(t).array();
      y.row(p).segment(h * hd, half) = (xa * c - xb * s).matrix();
      y.row(p).segment(h * hd + half, half) = (xa * s + xb * c).matrix();
    }
  }
}

/// Rotates each pair (i, i + hd/2) of every head by sign · t · θ^(−2i/hd), where row p is at
/// position t = first + p mod T_len.
template <typename T>
void rope_rotate(Mat<T>& y, const Mat<T>& x, int T_len, int n_heads, double sign, int first = 0) {
  require(T_len >= 1, "rope", "T must be positive");
  const int hd = rope_head_width(x.cols(), n_heads);
  require(x.rows() % T_len == 0, "rope", x.rows(),
          " rows are not a whole number of sequences of T = ", T_len);
  // The rotation of pair i at position t: angle sign · t · θ^(−2i/hd), tabulated once per call.
  rope_apply(y, x, rope_angles<T>(T_len, hd, sign, first), T_len, n_heads, 0);
}

}  // namespace

template <typename T>
void rope_forward(Mat<T>& y, const Mat<T>& x, int T_len, int n_heads) {
  rope_rotate(y, x, T_len, n_heads, +1.0);
}

template <typename T>
void rope_forward_at(Mat<T>& y, const Mat<T>& x, int first, int n_heads) {
  require(first >= 0, "rope", "the first position must be 0 or more, got ", first);
  require(x.rows() >= 1, "rope", "needs at least one row");
  // one sequence of x.rows() positions, the first at position `first`
  rope_rotate(y, x, static_cast<int>(x.rows()), n_heads, +1.0, first);
}

template <typename T>
RopeTable<T> rope_table(int T_len, int hd) {
  require(T_len >= 1 && hd >= 2 && hd % 2 == 0, "rope",
          "a table needs T >= 1 and an even head "
          "width, got T = ",
          T_len, ", hd = ", hd);
  return rope_angles<T>(T_len, hd, +1.0, 0);
}

template <typename T>
void rope_forward_at(Mat<T>& y, const Mat<T>& x, int first, int n_heads,
                     const RopeTable<T>& table) {
  const int hd = rope_head_width(x.cols(), n_heads);
  require(table.cos.cols() == hd / 2, "rope", "the table is for head width ", 2 * table.cos.cols(),
          ", not ", hd);
  require(first >= 0 && first + x.rows() <= table.cos.rows(), "rope", "positions ", first, " … ",
          first + x.rows() - 1, " are not all in the table's 0 … ", table.cos.rows() - 1);
  // one sequence of x.rows() positions, the first at position `first`: rows first … of the table
  rope_apply(y, x, table, static_cast<int>(x.rows()), n_heads, first);
}

template <typename T>
void rope_backward(Mat<T>& dx, const Mat<T>& dy, int T_len, int n_heads) {
  // The rotation is orthogonal: its transpose is the rotation by −angle.
  rope_rotate(dx, dy, T_len, n_heads, -1.0);
}

// ---- Causal grouped-query attention ---------------------------------------------------------

namespace {

void check_attention(Eigen::Index qrows, Eigen::Index qcols, Eigen::Index kcols, Eigen::Index vcols,
                     Eigen::Index krows, int B, int T_len, int n_head, int n_kv_head) {
  require(B >= 1 && T_len >= 1, "attention", "B and T must be positive");
  require(n_head >= 1 && n_kv_head >= 1 && n_head % n_kv_head == 0, "attention",
          "n_head = ", n_head, " must be a positive multiple of n_kv_head = ", n_kv_head);
  require(qrows == static_cast<Eigen::Index>(B) * T_len && krows == qrows, "attention",
          "q, k, v need B·T = ", B * T_len, " rows");
  require(qcols % n_head == 0, "attention", "q width ", qcols, " is not a multiple of n_head");
  const Eigen::Index hd = qcols / n_head;
  require(kcols == n_kv_head * hd && vcols == kcols, "attention",
          "k and v must be n_kv_head·hd = ", n_kv_head * hd, " wide");
}

}  // namespace

template <typename T>
void attention_forward(Mat<T>& out, std::vector<Mat<T>>& probs, const Mat<T>& q, const Mat<T>& k,
                       const Mat<T>& v, int B, int T_len, int n_head, int n_kv_head) {
  check_attention(q.rows(), q.cols(), k.cols(), v.cols(), k.rows(), B, T_len, n_head, n_kv_head);
  const int hd = static_cast<int>(q.cols()) / n_head;
  const int G = n_head / n_kv_head;  // query heads per key/value head
  const T scale = T(1) / std::sqrt(T(hd));
  out.resize(q.rows(), q.cols());
  probs.assign(static_cast<std::size_t>(B) * n_head, Mat<T>());
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < n_head; ++h) {
      const int kv = h / G;
      const auto qh = q.block(b * T_len, h * hd, T_len, hd);
      const auto kh = k.block(b * T_len, kv * hd, T_len, hd);
      const auto vh = v.block(b * T_len, kv * hd, T_len, hd);
      // scores = q_h · k_hᵀ / √hd, causal: only s ≤ t
      Mat<T> s = (qh * kh.transpose()) * scale;
      // probs = softmax over s ≤ t (row-wise, max subtracted); zero above the diagonal
      Mat<T>& a = probs[static_cast<std::size_t>(b) * n_head + h];
      a = Mat<T>::Zero(T_len, T_len);
      for (int t = 0; t < T_len; ++t) {
        const auto row = s.row(t).head(t + 1);
        a.row(t).head(t + 1) = (row.array() - row.maxCoeff()).exp().matrix();
        a.row(t).head(t + 1) /= a.row(t).head(t + 1).sum();
      }
      // out_h = probs · v_h
      out.block(b * T_len, h * hd, T_len, hd).noalias() = a * vh;
    }
  }
}

template <typename T>
void attention_backward(Mat<T>& dq, Mat<T>& dk, Mat<T>& dv, const Mat<T>& dout,
                        const std::vector<Mat<T>>& probs, const Mat<T>& q, const Mat<T>& k,
                        const Mat<T>& v, int B, int T_len, int n_head, int n_kv_head) {
  check_attention(q.rows(), q.cols(), k.cols(), v.cols(), k.rows(), B, T_len, n_head, n_kv_head);
  require_shape(dout, q.rows(), q.cols(), "attention_backward", "dout");
  require(probs.size() == static_cast<std::size_t>(B) * n_head, "attention_backward",
          "saved probs are for another shape");
  const int hd = static_cast<int>(q.cols()) / n_head;
  const int G = n_head / n_kv_head;
  const T scale = T(1) / std::sqrt(T(hd));
  dq = Mat<T>::Zero(q.rows(), q.cols());
  dk = Mat<T>::Zero(k.rows(), k.cols());
  dv = Mat<T>::Zero(v.rows(), v.cols());
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < n_head; ++h) {
      const int kv = h / G;
      const Mat<T>& a = probs[static_cast<std::size_t>(b) * n_head + h];
      const auto qh = q.block(b * T_len, h * hd, T_len, hd);
      const auto kh = k.block(b * T_len, kv * hd, T_len, hd);
      const auto vh = v.block(b * T_len, kv * hd, T_len, hd);
      const auto douth = dout.block(b * T_len, h * hd, T_len, hd);
      // from out_h = probs · v_h:  dv_h += probsᵀ · dout_h;  dprobs = dout_h · v_hᵀ
      dv.block(b * T_len, kv * hd, T_len, hd).noalias() += a.transpose() * douth;
      const Mat<T> dprobs = douth * vh.transpose();
      // from the softmax: ds = probs ⊙ (dprobs − rowsum(dprobs ⊙ probs)); masked entries stay 0
      const Vec<T> rowdot = dprobs.cwiseProduct(a).rowwise().sum();
      const Mat<T> ds = a.cwiseProduct(dprobs - rowdot.replicate(1, T_len)) * scale;
      // from scores = q_h · k_hᵀ / √hd:  dq_h = ds · k_h;  dk_h += dsᵀ · q_h
      dq.block(b * T_len, h * hd, T_len, hd).noalias() = ds * kh;
      dk.block(b * T_len, kv * hd, T_len, hd).noalias() += ds.transpose() * qh;
    }
  }
}

// ---- SwiGLU MLP ------------------------------------------------------------------------------

template <typename T>
void mlp_forward(Mat<T>& y, MlpSaved<T>& saved, const Mat<T>& x, const Mat<T>& w_gate,
                 const Mat<T>& w_up, const Mat<T>& w_down) {
  require(w_gate.rows() == x.cols() && w_up.rows() == x.cols() && w_up.cols() == w_gate.cols() &&
              w_down.rows() == w_gate.cols() && w_down.cols() == x.cols(),
          "mlp", "weights must be d × f, d × f, f × d for d = ", x.cols());
  // (1) gate = x · W_gate;  up = x · W_up
  saved.gate.noalias() = x * w_gate;
  saved.up.noalias() = x * w_up;
  // (2) h = silu(gate) ⊙ up,  silu(a) = a · σ(a)
  const auto sig = (T(1) + (-saved.gate.array()).exp()).inverse();
  const Mat<T> h = (saved.gate.array() * sig * saved.up.array()).matrix();
  // (3) y = h · W_down
  y.noalias() = h * w_down;
}

template <typename T>
void mlp_backward(Mat<T>& dx, Mat<T>& dw_gate, Mat<T>& dw_up, Mat<T>& dw_down, const Mat<T>& dy,
                  const MlpSaved<T>& saved, const Mat<T>& x, const Mat<T>& w_gate,
                  const Mat<T>& w_up, const Mat<T>& w_down) {
  require_shape(dy, x.rows(), x.cols(), "mlp_backward", "dy");
  const Mat<T> sig = (T(1) + (-saved.gate.array()).exp()).inverse().matrix();
  const Mat<T> silu = saved.gate.cwiseProduct(sig);
  const Mat<T> h = silu.cwiseProduct(saved.up);
  // from (3): dW_down += hᵀ · dy;  dh = dy · W_downᵀ
  dw_down.noalias() += h.transpose() * dy;
  const Mat<T> dh = dy * w_down.transpose();
  // from (2): dup = dh ⊙ silu(gate);  dgate = dh ⊙ up ⊙ silu'(gate),  silu' = σ · (1 + a · (1 − σ))
  const Mat<T> dup = dh.cwiseProduct(silu);
  const Mat<T> dgate = (dh.array() * saved.up.array() * sig.array() *
                        (T(1) + saved.gate.array() * (T(1) - sig.array())))
                           .matrix();
  // from (1): dW_gate += xᵀ · dgate;  dW_up += xᵀ · dup;  dx = dgate · W_gateᵀ + dup · W_upᵀ
  dw_gate.noalias() += x.transpose() * dgate;
  dw_up.noalias() += x.transpose() * dup;
  dx.noalias() = dgate * w_gate.transpose();
  dx.noalias() += dup * w_up.transpose();
}

// ---- Embedding -------------------------------------------------------------------------------

void require_in_vocabulary(const std::vector<int>& tokens, long vocab, const char* who) {
  for (std::size_t p = 0; p < tokens.size(); ++p)
    require(tokens[p] >= 0 && tokens[p] < vocab, who, "token ", tokens[p], " at position ", p,
            " is outside the vocabulary [0, ", vocab, ")");
}

template <typename T>
void embedding_forward(Mat<T>& x, const std::vector<int>& tokens, const Mat<T>& E) {
  require(!tokens.empty(), "embedding", "needs at least one token");
  require_in_vocabulary(tokens, E.rows(), "embedding");
  x.resize(static_cast<Eigen::Index>(tokens.size()), E.cols());
  for (std::size_t p = 0; p < tokens.size(); ++p)
    x.row(static_cast<Eigen::Index>(p)) = E.row(tokens[p]);  // x[p] = E[token_p]
}

template <typename T>
void embedding_backward(Mat<T>& dE, const Mat<T>& dx, const std::vector<int>& tokens) {
  require(dx.rows() == static_cast<Eigen::Index>(tokens.size()) && dx.cols() == dE.cols(),
          "embedding_backward", "dx must be P × d");
  for (std::size_t p = 0; p < tokens.size(); ++p)
    dE.row(tokens[p]) += dx.row(static_cast<Eigen::Index>(p));  // dE[token_p] += dx[p]
}

// ---- Cross-entropy ---------------------------------------------------------------------------

template <typename T>
T cross_entropy_forward(Mat<T>& probs, const Mat<T>& logits, const std::vector<int>& targets) {
  require(logits.rows() == static_cast<Eigen::Index>(targets.size()) && logits.rows() >= 1,
          "cross_entropy", "logits have ", logits.rows(), " rows but there are ", targets.size(),
          " targets");
  // probs = softmax(logits) row-wise, with the row maximum subtracted
  const Vec<T> m = logits.rowwise().maxCoeff();
  probs = (logits - m.replicate(1, logits.cols())).array().exp().matrix();
  const Vec<T> z = probs.rowwise().sum();
  probs = z.cwiseInverse().asDiagonal() * probs;
  // loss = mean_p ( m_p + log z_p − logits[p, target_p] )
  T loss = 0;
  for (std::size_t p = 0; p < targets.size(); ++p) {
    const auto r = static_cast<Eigen::Index>(p);
    require(targets[p] >= 0 && targets[p] < logits.cols(), "cross_entropy", "target ", targets[p],
            " outside the vocabulary");
    loss += m(r) + std::log(z(r)) - logits(r, targets[p]);
  }
  return loss / static_cast<T>(targets.size());
}

template <typename T>
void cross_entropy_backward(Mat<T>& dlogits, const Mat<T>& probs, const std::vector<int>& targets) {
  // dlogits = (probs − onehot(target)) / P
  dlogits = probs;
  for (std::size_t p = 0; p < targets.size(); ++p)
    dlogits(static_cast<Eigen::Index>(p), targets[p]) -= T(1);
  dlogits /= static_cast<T>(targets.size());
}

#define MHAR_INSTANTIATE(T)                                                                        \
  template void rmsnorm_forward<T>(Mat<T>&, Vec<T>&, const Mat<T>&,                                \
                                   const Eigen::Ref<const RowVec<T>>&);                            \
  template void rmsnorm_backward<T>(Mat<T>&, Eigen::Ref<RowVec<T>>, const Mat<T>&, const Vec<T>&,  \
                                    const Mat<T>&, const Eigen::Ref<const RowVec<T>>&);            \
  template void linear_forward<T>(Mat<T>&, const Mat<T>&, const Mat<T>&);                          \
  template void linear_backward<T>(Mat<T>&, Mat<T>&, const Mat<T>&, const Mat<T>&, const Mat<T>&); \
  template void rope_forward<T>(Mat<T>&, const Mat<T>&, int, int);                                 \
  template void rope_forward_at<T>(Mat<T>&, const Mat<T>&, int, int);                              \
  template RopeTable<T> rope_table<T>(int, int);                                                   \
  template void rope_forward_at<T>(Mat<T>&, const Mat<T>&, int, int, const RopeTable<T>&);         \
  template void rope_backward<T>(Mat<T>&, const Mat<T>&, int, int);                                \
  template void attention_forward<T>(Mat<T>&, std::vector<Mat<T>>&, const Mat<T>&, const Mat<T>&,  \
                                     const Mat<T>&, int, int, int, int);                           \
  template void attention_backward<T>(Mat<T>&, Mat<T>&, Mat<T>&, const Mat<T>&,                    \
                                      const std::vector<Mat<T>>&, const Mat<T>&, const Mat<T>&,    \
                                      const Mat<T>&, int, int, int, int);                          \
  template void mlp_forward<T>(Mat<T>&, MlpSaved<T>&, const Mat<T>&, const Mat<T>&, const Mat<T>&, \
                               const Mat<T>&);                                                     \
  template void mlp_backward<T>(Mat<T>&, Mat<T>&, Mat<T>&, Mat<T>&, const Mat<T>&,                 \
                                const MlpSaved<T>&, const Mat<T>&, const Mat<T>&, const Mat<T>&,   \
                                const Mat<T>&);                                                    \
  template void embedding_forward<T>(Mat<T>&, const std::vector<int>&, const Mat<T>&);             \
  template void embedding_backward<T>(Mat<T>&, const Mat<T>&, const std::vector<int>&);            \
  template T cross_entropy_forward<T>(Mat<T>&, const Mat<T>&, const std::vector<int>&);            \
  template void cross_entropy_backward<T>(Mat<T>&, const Mat<T>&, const std::vector<int>&);
MHAR_INSTANTIATE(float)
MHAR_INSTANTIATE(double)
#undef MHAR_INSTANTIATE

}  // namespace mhar

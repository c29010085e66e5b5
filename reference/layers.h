/**
 * @file layers.h
 * @ingroup reference
 * @brief The tiny decoder's building blocks (docs/design.md §2), forward and backward, CPU reference:
 *        RMSNorm, linear, RoPE, causal grouped-query self-attention, SwiGLU MLP, embedding with
 *        the tied LM head, softmax cross-entropy.
 *
 * Conventions (docs/style.md §3): outputs first, then what is saved for the backward, then inputs,
 * then parameters, then dimensions. Backward functions write input gradients with `=` and
 * accumulate parameter gradients with `+=`. Activations are P × width with P = B·T positions,
 * sequence b occupying rows [b·T, (b+1)·T). Weights are in × out (y = x·W).
 *
 * Plain Eigen; the CUDA twins are in cuda/.
 */
#pragma once

#include <vector>

#include "tensor.h"

namespace mhar {

/// eps inside every RMSNorm of the model (docs/design.md §2).
inline constexpr double kNormEps = 1e-6;
/// RoPE base θ.
inline constexpr double kRopeTheta = 10000.0;

// ---- RMSNorm: y = x · r · gain,  r = 1 / sqrt(mean_c x² + eps) ------------------------------

/// y: P × d (=); rinv: P (=) saved; x: P × d; gain: 1 × d.
template <typename T>
void rmsnorm_forward(Mat<T>& y, Vec<T>& rinv, const Mat<T>& x,
                     const Eigen::Ref<const RowVec<T>>& gain);
/// dx: P × d (=); dgain: 1 × d (+=).
template <typename T>
void rmsnorm_backward(Mat<T>& dx, Eigen::Ref<RowVec<T>> dgain, const Mat<T>& dy, const Vec<T>& rinv,
                      const Mat<T>& x, const Eigen::Ref<const RowVec<T>>& gain);

// ---- Linear: y = x · W (no bias) ------------------------------------------------------------

/// y: P × out (=); x: P × in; W: in × out.
template <typename T>
void linear_forward(Mat<T>& y, const Mat<T>& x, const Mat<T>& W);
/// dx: P × in (=); dW: in × out (+=).
template <typename T>
void linear_backward(Mat<T>& dx, Mat<T>& dW, const Mat<T>& dy, const Mat<T>& x, const Mat<T>& W);

// ---- RoPE, "rotate-half": column i pairs with i + hd/2, angle t · θ^(−2i/hd) ----------------

/// y: P × (n_heads·hd) (=); x likewise; t = row mod T is the token's position in its sequence.
template <typename T>
void rope_forward(Mat<T>& y, const Mat<T>& x, int T_len, int n_heads);
/// y (=): x as one sequence whose row p sits at position first + p (the decode step: one row at
/// its own position). rope_forward_at(y, x, 0, n) equals rope_forward(y, x, x.rows(), n).
template <typename T>
void rope_forward_at(Mat<T>& y, const Mat<T>& x, int first, int n_heads);
/// dx (=): the rotation by the opposite angle (RoPE is orthogonal).
template <typename T>
void rope_backward(Mat<T>& dx, const Mat<T>& dy, int T_len, int n_heads);

/// RoPE's cos and sin for positions 0 … T_len − 1 of a head width hd: row t, column i hold
/// cos and sin of t · θ^(−2i/hd) (T_len × hd/2 each), the numbers rope_forward computes per call.
template <typename T>
struct RopeTable {
  Mat<T> cos, sin;
};
template <typename T>
RopeTable<T> rope_table(int T_len, int hd);
/// y (=): rope_forward_at(y, x, first, n_heads) with the angles read from a table made once
/// (the decode step's RoPE without a pow and a sincos per pair and byte). first + x.rows() must
/// not pass the table's rows.
template <typename T>
void rope_forward_at(Mat<T>& y, const Mat<T>& x, int first, int n_heads, const RopeTable<T>& table);

// ---- Causal grouped-query self-attention (after projections and RoPE) -----------------------

/**
 * out[b,t,h] = Σ_{s≤t} softmax_s( q[b,t,h] · k[b,s,h/G] / √hd ) · v[b,s,h/G],  G = n_head /
 * n_kv_head. out: P × (n_head·hd) (=); probs: B·n_head matrices T × T (=, saved, zero above the
 * diagonal); q: P × (n_head·hd); k, v: P × (n_kv_head·hd).
 */
template <typename T>
void attention_forward(Mat<T>& out, std::vector<Mat<T>>& probs, const Mat<T>& q, const Mat<T>& k,
                       const Mat<T>& v, int B, int T_len, int n_head, int n_kv_head);
/// dq, dk, dv (=) from dout; probs as saved by the forward.
template <typename T>
void attention_backward(Mat<T>& dq, Mat<T>& dk, Mat<T>& dv, const Mat<T>& dout,
                        const std::vector<Mat<T>>& probs, const Mat<T>& q, const Mat<T>& k,
                        const Mat<T>& v, int B, int T_len, int n_head, int n_kv_head);

// ---- SwiGLU MLP: y = W_down( silu(x·W_gate) ⊙ (x·W_up) ) ------------------------------------

template <typename T>
struct MlpSaved {
  Mat<T> gate;  ///< P × f: x · W_gate (before silu)
  Mat<T> up;    ///< P × f: x · W_up
};
/// y: P × d (=); x: P × d; w_gate, w_up: d × f; w_down: f × d.
template <typename T>
void mlp_forward(Mat<T>& y, MlpSaved<T>& saved, const Mat<T>& x, const Mat<T>& w_gate,
                 const Mat<T>& w_up, const Mat<T>& w_down);
/// dx (=); dw_gate, dw_up, dw_down (+=).
template <typename T>
void mlp_backward(Mat<T>& dx, Mat<T>& dw_gate, Mat<T>& dw_up, Mat<T>& dw_down, const Mat<T>& dy,
                  const MlpSaved<T>& saved, const Mat<T>& x, const Mat<T>& w_gate,
                  const Mat<T>& w_up, const Mat<T>& w_down);

// ---- Embedding and the tied LM head ---------------------------------------------------------

/// Throws ShapeError, naming `who`, the first token outside [0, vocab) and its position.
void require_in_vocabulary(const std::vector<int>& tokens, long vocab, const char* who);

/// x: P × d (=), x[p] = E[tokens[p]]; E: vocab × d. Throws on a token outside [0, vocab).
template <typename T>
void embedding_forward(Mat<T>& x, const std::vector<int>& tokens, const Mat<T>& E);
/// dE (+=): dE[tokens[p]] += dx[p].
template <typename T>
void embedding_backward(Mat<T>& dE, const Mat<T>& dx, const std::vector<int>& tokens);

// ---- Softmax cross-entropy: loss = mean_p ( logsumexp(logits_p) − logits_p[target_p] ) -------

/// Returns the loss; probs: P × vocab (=) saved softmax.
template <typename T>
T cross_entropy_forward(Mat<T>& probs, const Mat<T>& logits, const std::vector<int>& targets);
/// dlogits (=) = (probs − onehot(targets)) / P.
template <typename T>
void cross_entropy_backward(Mat<T>& dlogits, const Mat<T>& probs, const std::vector<int>& targets);

}  // namespace mhar

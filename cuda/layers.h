/**
 * @file layers.h
 * @ingroup cuda
 * @brief The decoder's row-wise and elementwise building blocks on the GPU, fp32: the CUDA
 *        twins of reference/layers.h (RMSNorm, RoPE, the SwiGLU middle, embedding,
 *        cross-entropy), same names and argument order.
 *
 * Dimension letters (docs/design.md §1–2): P positions (= B·T), T tokens per sequence, d model
 * width, f MLP hidden width, hd head width, vocab the vocabulary size.
 *
 * A plain C++ header (no CUDA types, no Eigen): g++-compiled code calls these functions with
 * DEVICE pointers (see device.h for DeviceBuffer). All tensors are contiguous fp32, row-major,
 * one row per position; tokens and targets are `int` device arrays of length P. Outputs must
 * not alias inputs. The kernels and their equations are in cuda/layers.cu; docs/kernels.md
 * ("Layer twins") gives their launch shapes.
 *
 * Deliberately left out: the matmuls (linear, the MLP's three projections, the tied LM head)
 * and attention — a later cuBLAS step. swiglu_forward / swiglu_backward are only the
 * elementwise middle of reference mlp_forward / mlp_backward (their step (2)); the GEMMs
 * around it are not here.
 *
 * Bad tokens: the reference throws on a token (or target) outside [0, vocab). Checking here
 * would cost a device-to-host copy per call, so the kernels instead write NaN where that token's
 * values would go (its row of x, its row loss, its row of dlogits): a bad token shows up as a
 * NaN loss, never as a read outside E. embedding_backward skips such a token.
 *
 * Errors: bad arguments throw std::invalid_argument before any CUDA call; a failed CUDA call
 * throws std::runtime_error with CUDA's message. Launches go to the default stream and are
 * asynchronous: a fault inside a kernel surfaces at the next synchronising call. Every
 * reduction runs in a fixed order (no atomics): two runs give the same bits.
 */
#pragma once

namespace mhar::cuda {

// ---- RMSNorm: y = x · r · gain,  r = 1 / sqrt(mean_c x² + eps),  eps = 1e-6 ------------------

/**
 * @brief RMSNorm forward (reference rmsnorm_forward).
 * @param y     P × d (=)
 * @param rinv  P (=), r per row, saved for the backward
 * @param x     P × d
 * @param gain  d
 * @param P     positions
 * @param d     width
 */
void rmsnorm_forward(float* y, float* rinv, const float* x, const float* gain, int P, int d);

/**
 * @brief RMSNorm backward (reference rmsnorm_backward).
 * @param dx     P × d (=)
 * @param dgain  d (+=), summed over positions in a fixed order
 * @param dy     P × d
 * @param rinv   P, as saved by the forward
 * @param x      P × d, as in the forward
 * @param gain   d, as in the forward
 * @param P      positions
 * @param d      width
 */
void rmsnorm_backward(float* dx, float* dgain, const float* dy, const float* rinv, const float* x,
                      const float* gain, int P, int d);

// ---- RoPE, "rotate-half": column i pairs with i + hd/2, angle t · θ^(−2i/hd), θ = 10000 ------

/**
 * @brief RoPE forward (reference rope_forward): rotates each pair (i, i + hd/2) of every head.
 * @param y        P × (n_heads·hd) (=)
 * @param x        P × (n_heads·hd); row p is the token at t = p mod T of its sequence
 * @param P        positions, a multiple of T
 * @param T        tokens per sequence
 * @param n_heads  heads per row
 * @param hd       head width, even
 */
void rope_forward(float* y, const float* x, int P, int T, int n_heads, int hd);

/**
 * @brief RoPE backward (reference rope_backward): dx is dy rotated by the opposite angle.
 * @param dx       P × (n_heads·hd) (=)
 * @param dy       P × (n_heads·hd)
 * @param P        positions, a multiple of T
 * @param T        tokens per sequence
 * @param n_heads  heads per row
 * @param hd       head width, even
 */
void rope_backward(float* dx, const float* dy, int P, int T, int n_heads, int hd);

// ---- SwiGLU middle: h = silu(gate) ⊙ up,  silu(a) = a · σ(a) -------------------------------

/**
 * @brief Step (2) of reference mlp_forward.
 * @param h     P × f (=)
 * @param gate  P × f, x · W_gate (before silu)
 * @param up    P × f, x · W_up
 * @param P     positions
 * @param f     MLP hidden width
 */
void swiglu_forward(float* h, const float* gate, const float* up, int P, int f);

/**
 * @brief Step "from (2)" of reference mlp_backward.
 * @param dgate  P × f (=), dh ⊙ up ⊙ σ(gate) · (1 + gate · (1 − σ(gate)))
 * @param dup    P × f (=), dh ⊙ silu(gate)
 * @param dh     P × f, ∂loss/∂h
 * @param gate   P × f, as in the forward
 * @param up     P × f, as in the forward
 * @param P      positions
 * @param f      MLP hidden width
 */
void swiglu_backward(float* dgate, float* dup, const float* dh, const float* gate, const float* up,
                     int P, int f);

// ---- Embedding: x[p] = E[tokens[p]] ----------------------------------------------------------

/**
 * @brief Embedding forward (reference embedding_forward).
 * @param x       P × d (=); the row of a token outside [0, vocab) is NaN
 * @param tokens  P ints
 * @param E       vocab × d
 * @param P       positions
 * @param d       width
 * @param vocab   vocabulary size
 */
void embedding_forward(float* x, const int* tokens, const float* E, int P, int d, int vocab);

/**
 * @brief Embedding backward (reference embedding_backward): dE[tokens[p]] += dx[p], positions
 *        added in increasing p (the reference's order), no atomics.
 * @param dE      vocab × d (+=)
 * @param dx      P × d
 * @param tokens  P ints
 * @param P       positions
 * @param d       width
 * @param vocab   vocabulary size
 */
void embedding_backward(float* dE, const float* dx, const int* tokens, int P, int d, int vocab);

// ---- Softmax cross-entropy: loss = mean_p ( logsumexp(logits_p) − logits_p[target_p] ) ------

/**
 * @brief Cross-entropy forward (reference cross_entropy_forward).
 * @param loss     1 float (=), the mean over rows, summed in a fixed order
 * @param probs    P × vocab (=), the row-wise softmax, saved for the backward
 * @param logits   P × vocab
 * @param targets  P ints
 * @param P        positions
 * @param vocab    vocabulary size
 */
void cross_entropy_forward(float* loss, float* probs, const float* logits, const int* targets,
                           int P, int vocab);

/**
 * @brief Cross-entropy backward (reference cross_entropy_backward).
 * @param dlogits  P × vocab (=), (probs − onehot(targets)) / P
 * @param probs    P × vocab, as saved by the forward
 * @param targets  P ints
 * @param P        positions
 * @param vocab    vocabulary size
 */
void cross_entropy_backward(float* dlogits, const float* probs, const int* targets, int P,
                            int vocab);

}  // namespace mhar::cuda

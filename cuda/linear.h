/**
 * @file linear.h
 * @ingroup cuda
 * @brief The decoder's matrix products on the GPU through cuBLAS, fp32: the CUDA twins of
 *        reference linear_forward / linear_backward and mlp_forward / mlp_backward, same names
 *        and argument order, plus the row-major GEMM they (and the tied LM head) are built on.
 *
 * Dimension letters (docs/design.md §2): P positions, d model width, f MLP hidden width; `in` and
 * `out` are a linear map's input and output widths.
 *
 * A plain C++ header (no CUDA types, no Eigen): all pointers are DEVICE pointers to contiguous
 * fp32 row-major matrices. cuBLAS is column-major; gemm() hides that (a row-major X is a
 * column-major Xᵀ, so C = A·B is computed as Cᵀ = Bᵀ·Aᵀ, nothing is copied or transposed).
 *
 * Precision and determinism: plain fp32 SGEMM (CUBLAS_DEFAULT_MATH: no TF32, no half), atomics
 * off (cuBLAS's default), one handle on the default stream. cuBLAS then gives the same bits on
 * every run on the same GPU and library version; its summation order differs from Eigen's, so
 * results differ from the float reference by rounding only.
 *
 * Errors: bad arguments throw std::invalid_argument before any CUDA call; a failed cuBLAS or CUDA
 * call throws std::runtime_error with the library's message.
 */
#pragma once

namespace mhar::cuda {

/**
 * @brief Row-major C = alpha · op(A) · op(B) + beta · C through cublasSgemm.
 * @param trans_a  op(A) = Aᵀ when true (A is then stored K × M), else A (stored M × K)
 * @param trans_b  op(B) = Bᵀ when true (B is then stored N × K), else B (stored K × N)
 * @param M        rows of C
 * @param N        columns of C
 * @param K        the shared dimension
 * @param alpha    scale of the product
 * @param A        op(A) is M × K
 * @param B        op(B) is K × N
 * @param beta     0 writes C (=, C may hold anything, NaN included), 1 accumulates (+=)
 * @param C        M × N
 */
void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
          const float* B, float beta, float* C);

/**
 * @brief gemm() on `batch` matrix triples at once (cublasSgemmStridedBatched), each matrix a
 *        block of a larger row-major array: C_i = alpha · op(A_i) · op(B_i) + beta · C_i.
 *
 * Matrix i of A starts at A + i·stride_a and its rows are lda floats apart (lda ≥ its stored
 * columns); likewise B (ldb, stride_b) and C (ldc, stride_c). Other parameters as gemm(). The
 * attention twin uses it for one head's slice of q, k, v (rows n_head·hd apart), batched over
 * the sequences.
 */
void gemm_strided_batched(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                          const float* A, int lda, long long stride_a, const float* B, int ldb,
                          long long stride_b, float beta, float* C, int ldc, long long stride_c,
                          int batch);

/**
 * @brief y = x · W (reference linear_forward).
 * @param y    P × out (=)
 * @param x    P × in
 * @param W    in × out
 * @param P    positions
 * @param in   input width
 * @param out  output width
 */
void linear_forward(float* y, const float* x, const float* W, int P, int in, int out);

/**
 * @brief Backward of y = x · W (reference linear_backward): dx = dy · Wᵀ, dW += xᵀ · dy.
 * @param dx   P × in (=)
 * @param dW   in × out (+=)
 * @param dy   P × out
 * @param x    P × in, as in the forward
 * @param W    in × out
 * @param P    positions
 * @param in   input width
 * @param out  output width
 */
void linear_backward(float* dx, float* dW, const float* dy, const float* x, const float* W, int P,
                     int in, int out);

/**
 * @brief SwiGLU MLP forward (reference mlp_forward): y = W_down( silu(x·W_gate) ⊙ (x·W_up) ).
 * @param y       P × d (=)
 * @param gate    P × f (=), x · W_gate before silu, saved for the backward (MlpSaved::gate)
 * @param up      P × f (=), x · W_up, saved for the backward (MlpSaved::up)
 * @param x       P × d
 * @param w_gate  d × f
 * @param w_up    d × f
 * @param w_down  f × d
 * @param P       positions
 * @param d       model width
 * @param f       hidden width
 */
void mlp_forward(float* y, float* gate, float* up, const float* x, const float* w_gate,
                 const float* w_up, const float* w_down, int P, int d, int f);

/**
 * @brief SwiGLU MLP backward (reference mlp_backward); the hidden h is recomputed from gate, up.
 * @param dx       P × d (=)
 * @param dw_gate  d × f (+=)
 * @param dw_up    d × f (+=)
 * @param dw_down  f × d (+=)
 * @param dy       P × d
 * @param gate     P × f, as saved by the forward
 * @param up       P × f, as saved by the forward
 * @param x        P × d, as in the forward
 * @param w_gate   d × f
 * @param w_up     d × f
 * @param w_down   f × d
 * @param P        positions
 * @param d        model width
 * @param f        hidden width
 */
void mlp_backward(float* dx, float* dw_gate, float* dw_up, float* dw_down, const float* dy,
                  const float* gate, const float* up, const float* x, const float* w_gate,
                  const float* w_up, const float* w_down, int P, int d, int f);

}  // namespace mhar::cuda

/**
 * @file linear.cu
 * @brief The decoder's matrix products through cuBLAS (fp32): the CUDA twins of reference
 *        linear_forward / linear_backward and mlp_forward / mlp_backward, step for step
 *        (functions and shapes in cuda/linear.h).
 *
 * Linear (reference linear_forward / linear_backward):
 *   y = x · W;   dx = dy · Wᵀ;   dW += xᵀ · dy
 *
 * SwiGLU MLP (reference mlp_forward / mlp_backward):
 *   (1) gate = x · W_gate;  up = x · W_up
 *   (2) h = silu(gate) ⊙ up                       (cuda/layers.cu swiglu_forward)
 *   (3) y = h · W_down
 *   from (3)  dW_down += hᵀ · dy;  dh = dy · W_downᵀ
 *   from (2)  dgate, dup                           (cuda/layers.cu swiglu_backward)
 *   from (1)  dW_gate += xᵀ · dgate;  dW_up += xᵀ · dup;  dx = dgate · W_gateᵀ + dup · W_upᵀ
 *
 * Versions (docs/style.md §6): 1 only, cuBLAS SGEMM. Deliberately left out: fusing (2) into the GEMM
 * epilogue (cuBLASLt), TF32 or half precision, and a batched W_gate/W_up product — each would
 * change the bits against the fp32 reference or only pay off at widths far above the toy's.
 */
#include <cublas_v2.h>

#include <mutex>
#include <string>

#include "cuda/launch.cuh"
#include "cuda/layers.h"
#include "cuda/linear.h"

namespace mhar::cuda {

namespace {

using detail::require;
using detail::require_pointers;
using detail::require_positive;
using detail::Scratch;

/// Throws std::runtime_error("<what>: <cuBLAS status>") unless `status` is success.
void check_cublas(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw std::runtime_error(std::string(what) + ": cuBLAS " + cublasGetStatusName(status) + " (" +
                           cublasGetStatusString(status) + ")");
}

/// The process's one cuBLAS handle, created on first use (on the default stream, default math:
/// plain fp32, no TF32). Never destroyed: the driver reclaims it at exit, and destroying it from
/// a static destructor could run after the CUDA runtime has shut down.
cublasHandle_t handle() {
  static std::once_flag once;
  static cublasHandle_t h = nullptr;
  static cublasStatus_t created = CUBLAS_STATUS_NOT_INITIALIZED;
  std::call_once(once, [] {
    created = cublasCreate(&h);
    if (created == CUBLAS_STATUS_SUCCESS) created = cublasSetMathMode(h, CUBLAS_DEFAULT_MATH);
  });
  check_cublas(created, "cublasCreate (is there a CUDA device?)");
  return h;
}

}  // namespace

void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
          const float* B, float beta, float* C) {
  const char* where = "cuda::gemm";
  require_positive(where, "M", M, "rows of C");
  require_positive(where, "N", N, "columns of C");
  require_positive(where, "K", K, "shared dimension");
  require_pointers(where, {{"A", A}, {"B", B}, {"C", C}});
  // Row-major X (r × c) is column-major Xᵀ with leading dimension c. So row-major
  // C = op(A) · op(B) is column-major Cᵀ = op(B)ᵀ · op(A)ᵀ: swap the operands, keep the flags.
  const int lda = trans_a ? M : K;  // row-major A is M × K, or K × M when transposed
  const int ldb = trans_b ? K : N;  // row-major B is K × N, or N × K when transposed
  check_cublas(cublasSgemm(handle(), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                           trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B, ldb, A, lda,
                           &beta, C, N),
               "cublasSgemm");
  detail::sync_if_debugging("cuda::gemm: cublasSgemm");
}

void gemm_strided_batched(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                          const float* A, int lda, long long stride_a, const float* B, int ldb,
                          long long stride_b, float beta, float* C, int ldc, long long stride_c,
                          int batch) {
  const char* where = "cuda::gemm_strided_batched";
  require_positive(where, "M", M, "rows of C");
  require_positive(where, "N", N, "columns of C");
  require_positive(where, "K", K, "shared dimension");
  require_positive(where, "batch", batch, "matrices");
  require_pointers(where, {{"A", A}, {"B", B}, {"C", C}});
  require(lda >= (trans_a ? M : K) && ldb >= (trans_b ? K : N) && ldc >= N, where,
          "a leading dimension is shorter than its matrix's rows");
  // As gemm(): row-major C = op(A) · op(B) is column-major Cᵀ = op(B)ᵀ · op(A)ᵀ.
  check_cublas(
      cublasSgemmStridedBatched(handle(), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B, ldb,
                                stride_b, A, lda, stride_a, &beta, C, ldc, stride_c, batch),
      "cublasSgemmStridedBatched");
  detail::sync_if_debugging("cuda::gemm_strided_batched: cublasSgemmStridedBatched");
}

void linear_forward(float* y, const float* x, const float* W, int P, int in, int out) {
  // y = x · W — reference linear_forward
  gemm(false, false, P, out, in, 1.f, x, W, 0.f, y);
}

void linear_backward(float* dx, float* dW, const float* dy, const float* x, const float* W, int P,
                     int in, int out) {
  require_pointers("cuda::linear_backward", {{"dx", dx}, {"dW", dW}});
  gemm(false, true, P, in, out, 1.f, dy, W, 0.f, dx);  // dx = dy · Wᵀ
  gemm(true, false, in, out, P, 1.f, x, dy, 1.f, dW);  // dW += xᵀ · dy
}

void mlp_forward(float* y, float* gate, float* up, const float* x, const float* w_gate,
                 const float* w_up, const float* w_down, int P, int d, int f) {
  const char* where = "cuda::mlp_forward";
  require_positive(where, "P", P, "positions");
  require_positive(where, "d", d, "model width");
  require_positive(where, "f", f, "hidden width");
  Scratch<float> h(static_cast<std::size_t>(P) * f, where);
  // (1) gate = x · W_gate;  up = x · W_up
  gemm(false, false, P, f, d, 1.f, x, w_gate, 0.f, gate);
  gemm(false, false, P, f, d, 1.f, x, w_up, 0.f, up);
  // (2) h = silu(gate) ⊙ up
  swiglu_forward(h.get(), gate, up, P, f);
  // (3) y = h · W_down
  gemm(false, false, P, d, f, 1.f, h.get(), w_down, 0.f, y);
}

void mlp_backward(float* dx, float* dw_gate, float* dw_up, float* dw_down, const float* dy,
                  const float* gate, const float* up, const float* x, const float* w_gate,
                  const float* w_up, const float* w_down, int P, int d, int f) {
  const char* where = "cuda::mlp_backward";
  require_positive(where, "P", P, "positions");
  require_positive(where, "d", d, "model width");
  require_positive(where, "f", f, "hidden width");
  require(dx != dy, where, "dx must not alias dy");
  const std::size_t n = static_cast<std::size_t>(P) * f;
  Scratch<float> h(n, where), dh(n, where), dgate(n, where), dup(n, where);
  // the forward's h = silu(gate) ⊙ up, recomputed (the reference recomputes it too)
  swiglu_forward(h.get(), gate, up, P, f);
  // from (3): dW_down += hᵀ · dy;  dh = dy · W_downᵀ
  gemm(true, false, f, d, P, 1.f, h.get(), dy, 1.f, dw_down);
  gemm(false, true, P, f, d, 1.f, dy, w_down, 0.f, dh.get());
  // from (2): dup = dh ⊙ silu(gate);  dgate = dh ⊙ up ⊙ silu'(gate)
  swiglu_backward(dgate.get(), dup.get(), dh.get(), gate, up, P, f);
  // from (1): dW_gate += xᵀ · dgate;  dW_up += xᵀ · dup;  dx = dgate · W_gateᵀ + dup · W_upᵀ
  gemm(true, false, d, f, P, 1.f, x, dgate.get(), 1.f, dw_gate);
  gemm(true, false, d, f, P, 1.f, x, dup.get(), 1.f, dw_up);
  gemm(false, true, P, d, f, 1.f, dgate.get(), w_gate, 0.f, dx);
  gemm(false, true, P, d, f, 1.f, dup.get(), w_up, 1.f, dx);
}

}  // namespace mhar::cuda

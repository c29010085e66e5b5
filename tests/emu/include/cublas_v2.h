/**
 * @file cublas_v2.h (emulator)
 * @brief A CPU stand-in for the one cuBLAS routine cuda/linear.cu calls: column-major SGEMM,
 *        C = α·op(A)·op(B) + β·C, summed in float in order of k, as a
 *        simple GPU GEMM would (tests/emu/README.md). With β = 0, C is
 *        not read, as in cuBLAS (a NaN-poisoned output stays safe).
 */
#pragma once

#include <cstddef>

enum cublasStatus_t {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_INVALID_VALUE = 7
};
enum cublasOperation_t { CUBLAS_OP_N, CUBLAS_OP_T };
enum cublasMath_t { CUBLAS_DEFAULT_MATH };
struct cublasContext;
using cublasHandle_t = cublasContext*;

inline cublasStatus_t cublasCreate(cublasHandle_t* h) {
  static int storage;
  *h = reinterpret_cast<cublasHandle_t>(&storage);
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasDestroy(cublasHandle_t) {
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasSetMathMode(cublasHandle_t, cublasMath_t) {
  return CUBLAS_STATUS_SUCCESS;
}
inline const char* cublasGetStatusName(cublasStatus_t s) {
  return s == CUBLAS_STATUS_SUCCESS ? "CUBLAS_STATUS_SUCCESS" : "CUBLAS_STATUS_INVALID_VALUE";
}
inline const char* cublasGetStatusString(cublasStatus_t s) {
  return s == CUBLAS_STATUS_SUCCESS ? "success" : "an invalid value was passed";
}

/// m × n result, inner size k; A is m × k (op N, lda ≥ m) or k × m (op T, lda ≥ k), likewise B.
inline cublasStatus_t cublasSgemm(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m,
                                  int n, int k, const float* alpha, const float* A, int lda,
                                  const float* B, int ldb, const float* beta, float* C, int ldc) {
  if (m < 0 || n < 0 || k < 0 || ldc < (m > 1 ? m : 1) ||
      lda < ((ta == CUBLAS_OP_N ? m : k) > 1 ? (ta == CUBLAS_OP_N ? m : k) : 1) ||
      ldb < ((tb == CUBLAS_OP_N ? k : n) > 1 ? (tb == CUBLAS_OP_N ? k : n) : 1))
    return CUBLAS_STATUS_INVALID_VALUE;
  const auto a = [&](int i, int l) {
    return ta == CUBLAS_OP_N ? A[i + static_cast<std::ptrdiff_t>(l) * lda]
                             : A[l + static_cast<std::ptrdiff_t>(i) * lda];
  };
  const auto b = [&](int l, int j) {
    return tb == CUBLAS_OP_N ? B[l + static_cast<std::ptrdiff_t>(j) * ldb]
                             : B[j + static_cast<std::ptrdiff_t>(l) * ldb];
  };
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) {
      float s = 0.f;
      for (int l = 0; l < k; ++l) s += a(i, l) * b(l, j);
      float& c = C[i + static_cast<std::ptrdiff_t>(j) * ldc];
      c = (*beta == 0.f ? 0.f : *beta * c) + *alpha * s;
    }
  return CUBLAS_STATUS_SUCCESS;
}

/// Batched: matrix i of A, B, C at A + i·stride_a, and so on.
inline cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t h, cublasOperation_t ta,
                                                cublasOperation_t tb, int m, int n, int k,
                                                const float* alpha, const float* A, int lda,
                                                long long stride_a, const float* B, int ldb,
                                                long long stride_b, const float* beta, float* C,
                                                int ldc, long long stride_c, int batch) {
  if (batch < 0) return CUBLAS_STATUS_INVALID_VALUE;
  for (int i = 0; i < batch; ++i) {
    const cublasStatus_t s = cublasSgemm(h, ta, tb, m, n, k, alpha, A + i * stride_a, lda,
                                         B + i * stride_b, ldb, beta, C + i * stride_c, ldc);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
  }
  return CUBLAS_STATUS_SUCCESS;
}

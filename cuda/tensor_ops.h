/**
 * @file tensor_ops.h
 * @ingroup cuda
 * @brief The few whole-tensor steps of reference/model.cpp that are Eigen expressions there
 *        (h += out, a_j · route, ν broadcast over positions, column sums, one dot product), as
 *        GPU kernels for cuda/model.cpp. fp32, deterministic.
 *
 * A plain C++ header (no CUDA types, no Eigen): all pointers are DEVICE pointers to contiguous
 * fp32 arrays. A "device scalar" is one float in device memory (a model parameter such as the
 * delta gate a_j), read by the kernel so that nothing waits for a copy to the host.
 *
 * Errors: bad arguments throw std::invalid_argument before any CUDA call; a failed CUDA call
 * throws std::runtime_error with CUDA's message. Sums run in a fixed order (no atomics).
 */
#pragma once

#include <cstddef>

namespace mhar::cuda {

/// y = x, n floats (device to device).
void copy(float* y, const float* x, std::size_t n);
/// y = 0, n floats.
void zero(float* y, std::size_t n);
/// y += x, n floats (Eigen `y += x`).
void add(float* y, const float* x, std::size_t n);
/// y += a[0] · x, n floats; `a` is a device scalar (Eigen `y += a · x`).
void add_scaled(float* y, const float* x, const float* a, std::size_t n);
/// y = a[0] · x, n floats; `a` is a device scalar (Eigen `y = a · x`).
void scaled_copy(float* y, const float* x, const float* a, std::size_t n);
/// y[p, c] += row[c] for every position p of a P × d matrix (Eigen `y.rowwise() += row`).
void add_row(float* y, const float* row, int P, int d);
/// out[c] += Σ_p x[p, c], positions in increasing order (Eigen `out += x.colwise().sum()`).
void column_sum_add(float* out, const float* x, int P, int d);
/// out[0] += Σ_k x[k] · y[k], accumulated in double in a fixed order, then rounded once
/// (Eigen `out += x.cwiseProduct(y).sum()`).
void dot_add(float* out, const float* x, const float* y, std::size_t n);

}  // namespace mhar::cuda

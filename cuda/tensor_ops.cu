/**
 * @file tensor_ops.cu
 * @brief Whole-tensor steps of the model (cuda/tensor_ops.h): one thread per element, except
 *        the two reductions — a column sum (one thread per column, positions in order) and a
 *        dot product (per-block double partials, then one block sums them in a fixed tree).
 */
#include <cstddef>

#include "cuda/launch.cuh"
#include "cuda/tensor_ops.h"

namespace mhar::cuda {

namespace {

using detail::block_sum;
using detail::ceil_div;
using detail::check;
using detail::check_launch;
using detail::grid_for;
using detail::kThreads;
using detail::require;
using detail::require_pointers;
using detail::Scratch;
using detail::thread_index;
using detail::thread_stride;

/// Most blocks of dot_partial, so that one block of dot_total sums their partials.
constexpr std::size_t kMaxPartials = 1024;
/// Rows per partial sum of column_sum_add.
constexpr std::size_t kColumnChunk = 64;

__global__ void add_elements(float* __restrict__ y, const float* __restrict__ x, std::size_t n) {
  for (std::size_t k = thread_index(); k < n; k += thread_stride()) y[k] += x[k];
}

__global__ void add_scaled_elements(float* __restrict__ y, const float* __restrict__ x,
                                    const float* __restrict__ a, std::size_t n) {
  const float s = a[0];
  for (std::size_t k = thread_index(); k < n; k += thread_stride()) y[k] += s * x[k];
}

__global__ void scaled_copy_elements(float* __restrict__ y, const float* __restrict__ x,
                                     const float* __restrict__ a, std::size_t n) {
  const float s = a[0];
  for (std::size_t k = thread_index(); k < n; k += thread_stride()) y[k] = s * x[k];
}

__global__ void add_row_elements(float* __restrict__ y, const float* __restrict__ row,
                                 std::size_t n, int d) {
  for (std::size_t k = thread_index(); k < n; k += thread_stride()) y[k] += row[k % d];
}

/// Column sum, first half: partial[k, c] = Σ_{p in chunk k} x[p, c], p increasing; one thread
/// per (chunk k, column c), so every multiprocessor has work even when d is small.
__global__ void column_sum_partial(float* __restrict__ partial, const float* __restrict__ x, int P,
                                   int d) {
  const std::size_t chunks = ceil_div(static_cast<std::size_t>(P), kColumnChunk);
  for (std::size_t idx = thread_index(); idx < chunks * d; idx += thread_stride()) {
    const std::size_t k = idx / d, c = idx % d;
    const std::size_t rows = static_cast<std::size_t>(P), end_k = (k + 1) * kColumnChunk;
    const std::size_t end = end_k < rows ? end_k : rows;
    float s = 0.f;
    for (std::size_t p = k * kColumnChunk; p < end; ++p) s += x[p * d + c];
    partial[idx] = s;
  }
}

/// Column sum, second half: out[c] += Σ_k partial[k, c], chunks in increasing order; one thread
/// per column. The split depends on P only: the same bits on every run.
__global__ void column_sum_columns(float* __restrict__ out, const float* __restrict__ partial,
                                   int chunks, int d) {
  for (std::size_t c = thread_index(); c < static_cast<std::size_t>(d); c += thread_stride()) {
    float s = 0.f;
    for (int k = 0; k < chunks; ++k) s += partial[static_cast<std::size_t>(k) * d + c];
    out[c] += s;
  }
}

/// partial[b] = Σ x·y over the elements block b visits, in double.
__global__ void dot_partial(double* __restrict__ partial, const float* __restrict__ x,
                            const float* __restrict__ y, std::size_t n) {
  double s = 0.0;
  for (std::size_t k = thread_index(); k < n; k += thread_stride())
    s += static_cast<double>(x[k]) * static_cast<double>(y[k]);
  s = block_sum(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

/// out[0] += Σ_b partial[b], one block, a fixed tree.
__global__ void dot_total(float* __restrict__ out, const double* __restrict__ partial, int blocks) {
  double s = 0.0;
  for (int b = static_cast<int>(threadIdx.x); b < blocks; b += kThreads) s += partial[b];
  s = block_sum(s);
  if (threadIdx.x == 0) out[0] = static_cast<float>(static_cast<double>(out[0]) + s);
}

void require_elements(const char* where, std::size_t n) {
  require(n >= 1, where, "n = 0: needs at least one element (n >= 1)");
}

void require_matrix(const char* where, int P, int d) {
  require(P >= 1 && d >= 1, where,
          "P = " + std::to_string(P) + ", d = " + std::to_string(d) + ": both must be >= 1");
}

}  // namespace

void copy(float* y, const float* x, std::size_t n) {
  require_elements("cuda::copy", n);
  require_pointers("cuda::copy", {{"y", y}, {"x", x}});
  check(cudaMemcpyAsync(y, x, n * sizeof(float), cudaMemcpyDeviceToDevice, 0), "cuda::copy");
}

void zero(float* y, std::size_t n) {
  require_elements("cuda::zero", n);
  require_pointers("cuda::zero", {{"y", y}});
  check(cudaMemsetAsync(y, 0, n * sizeof(float), 0), "cuda::zero");
}

void add(float* y, const float* x, std::size_t n) {
  require_elements("cuda::add", n);
  require_pointers("cuda::add", {{"y", y}, {"x", x}});
  add_elements<<<grid_for(n), kThreads>>>(y, x, n);
  check_launch("add: add_elements launch");
}

void add_scaled(float* y, const float* x, const float* a, std::size_t n) {
  require_elements("cuda::add_scaled", n);
  require_pointers("cuda::add_scaled", {{"y", y}, {"x", x}, {"a", a}});
  add_scaled_elements<<<grid_for(n), kThreads>>>(y, x, a, n);
  check_launch("add_scaled: add_scaled_elements launch");
}

void scaled_copy(float* y, const float* x, const float* a, std::size_t n) {
  require_elements("cuda::scaled_copy", n);
  require_pointers("cuda::scaled_copy", {{"y", y}, {"x", x}, {"a", a}});
  scaled_copy_elements<<<grid_for(n), kThreads>>>(y, x, a, n);
  check_launch("scaled_copy: scaled_copy_elements launch");
}

void add_row(float* y, const float* row, int P, int d) {
  require_matrix("cuda::add_row", P, d);
  require_pointers("cuda::add_row", {{"y", y}, {"row", row}});
  const std::size_t n = static_cast<std::size_t>(P) * d;
  add_row_elements<<<grid_for(n), kThreads>>>(y, row, n, d);
  check_launch("add_row: add_row_elements launch");
}

void column_sum_add(float* out, const float* x, int P, int d) {
  require_matrix("cuda::column_sum_add", P, d);
  require_pointers("cuda::column_sum_add", {{"out", out}, {"x", x}});
  const std::size_t chunks = ceil_div(static_cast<std::size_t>(P), kColumnChunk);
  Scratch<float> partial(chunks * d, "cuda::column_sum_add");
  column_sum_partial<<<grid_for(chunks * d), kThreads>>>(partial.get(), x, P, d);
  check_launch("column_sum_add: column_sum_partial launch");
  column_sum_columns<<<grid_for(static_cast<std::size_t>(d)), kThreads>>>(
      out, partial.get(), static_cast<int>(chunks), d);
  check_launch("column_sum_add: column_sum_columns launch");
}

void dot_add(float* out, const float* x, const float* y, std::size_t n) {
  const char* where = "cuda::dot_add";
  require_elements(where, n);
  require_pointers(where, {{"out", out}, {"x", x}, {"y", y}});
  // A function of n only: the same split, so the same sum order, on every run.
  const std::size_t blocks = std::min(ceil_div(n, kThreads), kMaxPartials);
  Scratch<double> partial(blocks, where);
  dot_partial<<<static_cast<unsigned>(blocks), kThreads>>>(partial.get(), x, y, n);
  check_launch("dot_add: dot_partial launch");
  dot_total<<<1, kThreads>>>(out, partial.get(), static_cast<int>(blocks));
  check_launch("dot_add: dot_total launch");
}

}  // namespace mhar::cuda

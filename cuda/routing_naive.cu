/**
 * @file routing_naive.cu
 * @brief Routing version 1 (Naive): the loops of reference/routing.cpp, one kernel per step and
 *        one thread per output element. A second oracle for the faster versions, and the one to
 *        read first: each kernel is one numbered step of docs/design.md#routing-steps.
 *
 * Rows are (i, p) pairs, row = i·P + p: source row S_i[p,:] starts at row·d, α_i[p,:] at row·H.
 * The backward keeps its intermediates (1/RMS, D, dz, uS) in scratch buffers; dq, dg are
 * summed per chunk of positions, then over the chunks in order (launch_reduce_columns).
 */
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>

#include "launch.cuh"
#include "routing_versions.h"

namespace mhar::cuda::routing_detail {

namespace {

using detail::ceil_div;
using detail::check_launch;
using detail::grid_for;
using detail::kThreads;
using detail::Scratch;
using detail::thread_index;
using detail::thread_stride;

/// Positions per partial sum of the naive dq, dg reduction.
constexpr int kNaiveChunk = 256;

/// (1) r_i = 1 / sqrt( (1/d) Σ_c S_i[p,c]² + eps ); one thread per row (i, p).
__global__ void rms_naive(float* __restrict__ rinv, const float* __restrict__ sources,
                          std::size_t rows, int d) {
  for (std::size_t row = thread_index(); row < rows; row += thread_stride()) {
    const float* S = sources + row * d;
    float sum_sq = 0.f;
    for (int c = 0; c < d; ++c) sum_sq += S[c] * S[c];
    rinv[row] = 1.0f / sqrtf(sum_sq / d + kEps);
  }
}

/// (2) z_i[h] = r_i · Σ_{c∈h} q_c g_c S_i[p,c]; one thread per (i, p, h). z goes into alpha.
__global__ void logits_naive(float* __restrict__ alpha, const float* __restrict__ rinv,
                             const float* __restrict__ sources, const float* __restrict__ q,
                             const float* __restrict__ g, std::size_t rows, int d, int H) {
  const int K = d / H;
  for (std::size_t idx = thread_index(); idx < rows * H; idx += thread_stride()) {
    const std::size_t row = idx / H;
    const int h = static_cast<int>(idx % H);
    const float* S = sources + row * d;
    float z = 0.f;
    for (int c = h * K; c < (h + 1) * K; ++c) z += q[c] * g[c] * S[c];
    alpha[idx] = rinv[row] * z;
  }
}

/// (3) α_i[h] = exp(z_i[h] − m) / Σ_j exp(z_j[h] − m), m = max_j z_j[h]; one thread per (p, h).
/// alpha holds z on entry; element (i, p, h) is at i·PH + (p·H + h).
__global__ void softmax_naive(float* __restrict__ alpha, int N, std::size_t PH) {
  for (std::size_t idx = thread_index(); idx < PH; idx += thread_stride()) {
    float m = alpha[idx];
    for (int i = 1; i < N; ++i) m = fmaxf(m, alpha[i * PH + idx]);
    float denom = 0.f;
    for (int i = 0; i < N; ++i) {
      const float e = expf(alpha[i * PH + idx] - m);
      alpha[i * PH + idx] = e;
      denom += e;
    }
    for (int i = 0; i < N; ++i) alpha[i * PH + idx] /= denom;
  }
}

/// (4) out[p,c] = Σ_i α_i[h(c)] · S_i[p,c]; one thread per (p, c).
__global__ void out_naive(float* __restrict__ out, const float* __restrict__ alpha,
                          const float* __restrict__ sources, int N, int P, int d, int H) {
  const int K = d / H;
  const std::size_t Pd = static_cast<std::size_t>(P) * d;
  for (std::size_t idx = thread_index(); idx < Pd; idx += thread_stride()) {
    const std::size_t p = idx / d;
    const int h = static_cast<int>(idx % d) / K;
    float o = 0.f;
    for (int i = 0; i < N; ++i)
      o += alpha[(static_cast<std::size_t>(i) * P + p) * H + h] * sources[i * Pd + idx];
    out[idx] = o;
  }
}

/// D[p,h] = Σ_{c∈h} dout[p,c] · out[p,c]; one thread per (p, h).
__global__ void head_dot_naive(float* __restrict__ D, const float* __restrict__ dout,
                               const float* __restrict__ out, int P, int d, int H) {
  const int K = d / H;
  for (std::size_t idx = thread_index(); idx < static_cast<std::size_t>(P) * H;
       idx += thread_stride()) {
    const std::size_t p = idx / H;
    const int h = static_cast<int>(idx % H);
    float s = 0.f;
    for (int c = h * K; c < (h + 1) * K; ++c) s += dout[p * d + c] * out[p * d + c];
    D[idx] = s;
  }
}

/// from (4): a_i[h] = Σ_{c∈h} dout ⊙ S_i;  from (3): dz_i[h] = α_i[h] · (a_i[h] − D[h]).
/// One thread per (i, p, h).
__global__ void dz_naive(float* __restrict__ dz, const float* __restrict__ alpha,
                         const float* __restrict__ D, const float* __restrict__ dout,
                         const float* __restrict__ sources, int P, std::size_t rows, int d, int H) {
  const int K = d / H;
  for (std::size_t idx = thread_index(); idx < rows * H; idx += thread_stride()) {
    const std::size_t row = idx / H;
    const std::size_t p = row % P;
    const int h = static_cast<int>(idx % H);
    float a = 0.f;
    for (int c = h * K; c < (h + 1) * K; ++c) a += dout[p * d + c] * sources[row * d + c];
    dz[idx] = alpha[idx] * (a - D[p * H + h]);
  }
}

/// from (1): uS_i = Σ_c u_i[c] · S_i[p,c], u_i[c] = dz_i[h(c)] · q_c · g_c; one thread per (i, p).
__global__ void us_naive(float* __restrict__ uS, const float* __restrict__ dz,
                         const float* __restrict__ sources, const float* __restrict__ q,
                         const float* __restrict__ g, std::size_t rows, int d, int H) {
  const int K = d / H;
  for (std::size_t row = thread_index(); row < rows; row += thread_stride()) {
    float s = 0.f;
    for (int c = 0; c < d; ++c) s += dz[row * H + c / K] * q[c] * g[c] * sources[row * d + c];
    uS[row] = s;
  }
}

/// from (4), value path, and (1)-(2), key path; one thread per (i, p, c):
/// dS_i[p,c] += α_i[h(c)]·dout[p,c] + r_i·u_i[c] − (r_i³/d)·uS_i·S_i[p,c].
__global__ void dsources_naive(float* __restrict__ dsources, const float* __restrict__ alpha,
                               const float* __restrict__ dz, const float* __restrict__ rinv,
                               const float* __restrict__ uS, const float* __restrict__ dout,
                               const float* __restrict__ sources, const float* __restrict__ q,
                               const float* __restrict__ g, int P, std::size_t rows, int d, int H) {
  const int K = d / H;
  for (std::size_t idx = thread_index(); idx < rows * d; idx += thread_stride()) {
    const std::size_t row = idx / d;
    const std::size_t p = row % P;
    const int c = static_cast<int>(idx % d);
    const std::size_t rh = row * H + c / K;
    const float r = rinv[row];
    const float u = dz[rh] * q[c] * g[c];
    dsources[idx] += alpha[rh] * dout[p * d + c] + r * u - (r * r * r / d) * uS[row] * sources[idx];
  }
}

/// dq, dg first half: partial[k, c] = Σ_i Σ_{p in chunk k} dz_i[h(c)] · r_i · S_i[p,c];
/// one thread per (chunk k, c). reduce_columns then sums the chunks in order.
__global__ void dzn_naive(float* __restrict__ partial, const float* __restrict__ dz,
                          const float* __restrict__ rinv, const float* __restrict__ sources, int N,
                          int P, int d, int H) {
  const int K = d / H;
  const std::size_t chunks = ceil_div(P, kNaiveChunk);
  for (std::size_t idx = thread_index(); idx < chunks * d; idx += thread_stride()) {
    const std::size_t k = idx / d;
    const int c = static_cast<int>(idx % d);
    const std::size_t p_end =
        (k + 1) * kNaiveChunk < static_cast<std::size_t>(P) ? (k + 1) * kNaiveChunk : P;
    float s = 0.f;
    for (int i = 0; i < N; ++i)
      for (std::size_t p = k * kNaiveChunk; p < p_end; ++p) {
        const std::size_t row = static_cast<std::size_t>(i) * P + p;
        s += dz[row * H + c / K] * rinv[row] * sources[row * d + c];
      }
    partial[idx] = s;
  }
}

}  // namespace

void forward_naive(float* out, float* alpha, const float* sources, const float* q, const float* g,
                   int N, int P, int d, int H) {
  const std::size_t rows = static_cast<std::size_t>(N) * P;
  const std::size_t PH = static_cast<std::size_t>(P) * H;
  Scratch<float> rinv(rows, "routing_forward (naive)");
  rms_naive<<<grid_for(rows), kThreads>>>(rinv.get(), sources, rows, d);
  check_launch("routing_forward (naive): rms_naive launch");
  logits_naive<<<grid_for(rows * H), kThreads>>>(alpha, rinv.get(), sources, q, g, rows, d, H);
  check_launch("routing_forward (naive): logits_naive launch");
  softmax_naive<<<grid_for(PH), kThreads>>>(alpha, N, PH);
  check_launch("routing_forward (naive): softmax_naive launch");
  out_naive<<<grid_for(static_cast<std::size_t>(P) * d), kThreads>>>(out, alpha, sources, N, P, d,
                                                                     H);
  check_launch("routing_forward (naive): out_naive launch");
}

void backward_naive(float* dsources, float* dq, float* dg, const float* dout, const float* out,
                    const float* alpha, const float* sources, const float* q, const float* g, int N,
                    int P, int d, int H) {
  const std::size_t rows = static_cast<std::size_t>(N) * P;
  const std::size_t chunks = ceil_div(P, kNaiveChunk);
  const char* where = "routing_backward (naive)";
  Scratch<float> rinv(rows, where), D(static_cast<std::size_t>(P) * H, where), dz(rows * H, where),
      uS(rows, where), partial(chunks * d, where);
  rms_naive<<<grid_for(rows), kThreads>>>(rinv.get(), sources, rows, d);
  check_launch("routing_backward (naive): rms_naive launch");
  head_dot_naive<<<grid_for(static_cast<std::size_t>(P) * H), kThreads>>>(D.get(), dout, out, P, d,
                                                                          H);
  check_launch("routing_backward (naive): head_dot_naive launch");
  dz_naive<<<grid_for(rows * H), kThreads>>>(dz.get(), alpha, D.get(), dout, sources, P, rows, d,
                                             H);
  check_launch("routing_backward (naive): dz_naive launch");
  us_naive<<<grid_for(rows), kThreads>>>(uS.get(), dz.get(), sources, q, g, rows, d, H);
  check_launch("routing_backward (naive): us_naive launch");
  dsources_naive<<<grid_for(rows * d), kThreads>>>(dsources, alpha, dz.get(), rinv.get(), uS.get(),
                                                   dout, sources, q, g, P, rows, d, H);
  check_launch("routing_backward (naive): dsources_naive launch");
  dzn_naive<<<grid_for(chunks * d), kThreads>>>(partial.get(), dz.get(), rinv.get(), sources, N, P,
                                                d, H);
  check_launch("routing_backward (naive): dzn_naive launch");
  launch_reduce_columns(dq, dg, partial.get(), static_cast<int>(chunks), q, g, d);
}

}  // namespace mhar::cuda::routing_detail

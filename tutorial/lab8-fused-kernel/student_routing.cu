/**
 * @file student_routing.cu
 * @brief Lab 8: write the fused routing forward kernel. Everything but the kernel's body is here.
 *
 * The math (docs/design.md#routing-steps), per position p, sources S_0 … S_{N−1}, H heads of
 * K = d / H contiguous columns (head h owns columns [h·K, (h+1)·K)):
 *   (1) r_i      = 1 / sqrt( (1/d) Σ_c S_i[p,c]² + eps )      over the FULL width d
 *   (2) z_i[h]   = r_i · Σ_{c∈h} q_c · g_c · S_i[p,c]
 *   (3) α_i[h]   = exp(z_i[h]) / Σ_j exp(z_j[h])              softmax over depth, per head
 *   (4) out[p,c] = Σ_i α_i[h(c)] · S_i[p,c]
 *
 * The kernel to write: one block of kThreads threads per position p. Thread t owns the columns
 * c = t + j·kThreads (j < kCols) and keeps them in registers. Walk the sources ONCE: for source i,
 * read its row, get Σ S² and the per-head sums of q·g·S in the same read (through `smem`), and
 * update an online softmax per head:
 *     m_new = max(m, z_i);  corr = exp(m − m_new);  w = exp(z_i − m_new)
 *     l     = l · corr + w;               acc[c] = acc[c] · corr + w · S_i[c]
 * At the end out[c] = acc[c] / l, and α_i[h] = exp(z_i[h] − m) / l (keep the z_i in `alpha`
 * while you go: it is yours to write, N × P × H, α_i[p,h] at (i·P + p)·H + h).
 *
 * Shared memory: `smem` holds kSmemFloats(d, H) floats: 2·d for the row's products and squares,
 * 4·H for per-head state (m, l, corr, w). Remember __syncthreads() between writing and reading it.
 * Build and grade: tutorial/lab8-fused-kernel/README.md.
 */
#include <cuda_runtime.h>

#include <cmath>
#include <stdexcept>

#include "lab8-fused-kernel/lab8.h"

namespace {

constexpr int kThreads = 256;  ///< threads per block (one block per position)
constexpr int kCols = 8;       ///< columns per thread: d ≤ kThreads · kCols = 2048
constexpr float kEps = 1e-6f;  ///< eps inside the RMS, as the project's kernels

std::size_t kSmemFloats(int d, int H) {
  return 2 * static_cast<std::size_t>(d) + 4 * H;
}

__global__ void lab8_forward_kernel(float* out, float* alpha, const float* sources, const float* q,
                                    const float* g, int N, int P, int d, int H) {
  extern __shared__ float smem[];
  // Lab 8, exercise 1: your kernel here. Position p = blockIdx.x; thread t = threadIdx.x.
  (void)smem;
  (void)out;
  (void)alpha;
  (void)sources;
  (void)q;
  (void)g;
  (void)N;
  (void)P;
  (void)d;
  (void)H;
  (void)kEps;
}

}  // namespace

bool lab8_supports(int d, int H) {
  return d <= kThreads * kCols && d % H == 0;
}

void lab8_routing_forward(float* out, float* alpha, const float* sources, const float* q,
                          const float* g, int N, int P, int d, int H) {
  if (!lab8_supports(d, H)) throw std::invalid_argument("lab 8 kernel: d > 2048 or H ∤ d");
  lab8_forward_kernel<<<P, kThreads, kSmemFloats(d, H) * sizeof(float)>>>(out, alpha, sources, q, g,
                                                                          N, P, d, H);
  if (cudaGetLastError() != cudaSuccess) throw std::runtime_error("lab 8 kernel: launch failed");
}

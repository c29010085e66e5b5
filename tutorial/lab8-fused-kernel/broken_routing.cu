/**
 * @file broken_routing.cu
 * @brief Lab 8, exercise 2: this kernel is complete, fused, online — and wrong in one place.
 *        Run it through the grader (README.md), read the hint, find the bug. Don't read it before
 *        you have written your own in student_routing.cu: it is one answer to exercise 1.
 */
#include <cuda_runtime.h>

#include <cmath>
#include <stdexcept>

#include "lab8-fused-kernel/lab8.h"

namespace {

constexpr int kThreads = 256;
constexpr int kCols = 8;
constexpr float kEps = 1e-6f;

std::size_t kSmemFloats(int d, int H) {
  return 2 * static_cast<std::size_t>(d) + 4 * H;
}

__global__ void lab8_forward_kernel(float* out, float* alpha, const float* sources, const float* q,
                                    const float* g, int N, int P, int d, int H) {
  extern __shared__ float smem[];
  float* prod = smem;       // d: q_c g_c S_i[c]
  float* sq = smem + d;     // d: S_i[c]²
  float* m = smem + 2 * d;  // H: running max
  float* l = m + H;         // H: running denominator
  float* corr = l + H;      // H: rescale of the old state
  float* w = corr + H;      // H: weight of the current source
  const int p = blockIdx.x, t = threadIdx.x, K = d / H;
  float acc[kCols] = {};
  if (t < H) {
    m[t] = -INFINITY;
    l[t] = 0.0f;
  }
  for (int i = 0; i < N; ++i) {
    const float* row = sources + (static_cast<std::size_t>(i) * P + p) * d;
    float x[kCols];
    for (int j = 0; j < kCols; ++j) {
      const int c = t + j * kThreads;
      x[j] = c < d ? row[c] : 0.0f;
      if (c < d) {
        prod[c] = q[c] * g[c] * x[j];
        sq[c] = x[j] * x[j];
      }
    }
    __syncthreads();
    if (t < H) {  // one thread per head: the sums in a fixed order
      float ss = 0.0f, kq = 0.0f;
      for (int c = 0; c < d; ++c) ss += sq[c];
      for (int c = t * K; c < (t + 1) * K; ++c) kq += prod[c];
      const float z = kq / sqrtf(ss / d + kEps);
      alpha[(static_cast<std::size_t>(i) * P + p) * H + t] = z;
      const float mn = fmaxf(m[t], z);
      corr[t] = expf(m[t] - mn);
      w[t] = expf(z - mn);
      l[t] = l[t] * corr[t] + w[t];
      m[t] = mn;
    }
    __syncthreads();
    for (int j = 0; j < kCols; ++j) {
      const int c = t + j * kThreads;
      if (c >= d) continue;
      const int h = c > 0 ? (c - 1) / K : 0;
      acc[j] = acc[j] * corr[h] + w[h] * x[j];
    }
    __syncthreads();
  }
  for (int j = 0; j < kCols; ++j) {
    const int c = t + j * kThreads;
    if (c < d) out[static_cast<std::size_t>(p) * d + c] = acc[j] / l[c / K];
  }
  if (t < H)
    for (int i = 0; i < N; ++i) {
      float& a = alpha[(static_cast<std::size_t>(i) * P + p) * H + t];
      a = expf(a - m[t]) / l[t];
    }
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

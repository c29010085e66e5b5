/**
 * @file known_bugs.cpp
 * @brief known_bugs.h: the missing rescale, computed; the race, named.
 */
#include "known_bugs.h"

#include <algorithm>

namespace mhar::verify {

std::vector<double> out_without_rescale(const Case& c) {
  const int N = c.in.N, P = c.in.P, d = c.in.d, H = c.spec.H, K = d / H;
  const std::vector<double>& alpha = c.truth.alpha;  // N × P × H
  std::vector<double> out(static_cast<std::size_t>(P) * d, 0.0);
  for (int p = 0; p < P; ++p)
    for (int h = 0; h < H; ++h) {
      const auto a = [&](int i) { return alpha[(static_cast<std::size_t>(i) * P + p) * H + h]; };
      double top = 0;  // max_j α_j: exp(m_N) up to the common factor
      for (int i = 0; i < N; ++i) top = std::max(top, a(i));
      double running = 0;  // max_{j≤i} α_j
      for (int i = 0; i < N; ++i) {
        running = std::max(running, a(i));
        if (a(i) == 0) continue;  // α underflowed: its weight cannot be recovered from α
        // the term of source i keeps the weight it had against the max of its own step
        const double w = a(i) * top / running;
        for (int col = h * K; col < (h + 1) * K; ++col)
          out[static_cast<std::size_t>(p) * d + col] +=
              w * c.in.sources[(static_cast<std::size_t>(i) * P + p) * d + col];
      }
    }
  if (c.spec.delta)
    for (std::size_t k = 0; k < out.size(); ++k) out[k] = c.in.partial[k] + c.in.gate * out[k];
  return out;
}

std::string missing_rescale_hint(const Case& c, const std::vector<double>& out_got) {
  const double tol = tolerance_for(c.dtype, c.yardstick.at("out"));
  if (relative_error(out_got, c.truth.out) <= tol ||
      !(relative_error(out_got, out_without_rescale(c)) <= tol))
    return {};
  return "out is what a running sum gives that is not rescaled when the running max moves: "
         "with m_new = max(m, z_i), the old sum needs the same factor as the denominator, "
         "acc = acc · exp(m − m_new) + exp(z_i − m_new) · S_i (and l = l · exp(m − m_new) + "
         "exp(z_i − m_new)); cases where the first source has the largest logit pass without it";
}

std::string race_hint(const std::string& differ) {
  return "two runs of the same kernel on the same case gave different bits (" + differ +
         "): a race. Look for a __syncthreads() missing between a write to shared memory and "
         "another thread's read of it: after the per-column products and squares are written "
         "and before a head sums them, and after a head updates m, l and the rescale factor "
         "and before the other threads use them (on the CPU emulator the threads run in "
         "increasing order on one launch and decreasing on the next, and shared memory starts "
         "as NaN). Fix the race first: the other hints of this case read results that change "
         "from run to run";
}

}  // namespace mhar::verify

/**
 * @file general_routing.cpp
 * @brief general_routing.h: docs/design.md#routing-steps, one position at a time, with eps, the
 *        logit scale, an optional gain and the delta output as parameters.
 */
#include "general_routing.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace mhar::verify {

RoutingInputs<float> to_float(const RoutingInputs<double>& in) {
  const auto narrow = [](const std::vector<double>& v) {
    return std::vector<float>(v.begin(), v.end());
  };
  RoutingInputs<float> f;
  f.N = in.N;
  f.P = in.P;
  f.d = in.d;
  f.sources = narrow(in.sources);
  f.q = narrow(in.q);
  f.g = narrow(in.g);
  f.dout = narrow(in.dout);
  f.partial = narrow(in.partial);
  f.gate = static_cast<float>(in.gate);
  return f;
}

template <typename T>
void check_general_args(const RoutingInputs<T>& in, const Conventions& c) {
  const auto fail = [](const std::string& m) { throw std::invalid_argument("routing: " + m); };
  if (in.N < 1 || in.P < 1 || in.d < 1) fail("N, P and d must be at least 1");
  if (c.H < 1 || in.d % c.H != 0)
    fail("H = " + std::to_string(c.H) + " must divide d = " + std::to_string(in.d));
  const std::size_t Pd = static_cast<std::size_t>(in.P) * in.d;
  if (in.sources.size() != Pd * in.N) fail("sources must hold N × P × d values");
  if (in.q.size() != static_cast<std::size_t>(in.d)) fail("q must hold d values");
  if (c.gain != (in.g.size() == static_cast<std::size_t>(in.d)))
    fail(c.gain ? "g must hold d values" : "a gain-free site takes no g");
  if (in.dout.size() != Pd) fail("dout must hold P × d values");
  if (c.delta && in.partial.size() != Pd) fail("a delta site needs partial (P × d)");
  if (!(c.eps >= 0) || !std::isfinite(c.scale)) fail("eps must be ≥ 0 and scale finite");
}

template <typename T>
RoutingOutputs<T> general_routing(const RoutingInputs<T>& in, const Conventions& c, bool backward) {
  check_general_args(in, c);
  const int N = in.N, P = in.P, d = in.d, H = c.H, K = d / H;
  const T eps = static_cast<T>(c.eps), scale = static_cast<T>(c.scale);
  const auto S = [&](int i, int p, int col) -> T {
    return in.sources[(static_cast<std::size_t>(i) * P + p) * d + col];
  };
  const auto gain = [&](int col) -> T { return c.gain ? in.g[col] : T(1); };
  const auto rounded_key = [&](T r, T s) -> T {
    return static_cast<T>(c.round_key(static_cast<float>(r * s)));
  };

  RoutingOutputs<T> o;
  o.out.assign(static_cast<std::size_t>(P) * d, T(0));
  o.alpha.assign(static_cast<std::size_t>(N) * P * H, T(0));
  std::vector<T> mix(static_cast<std::size_t>(P) * d, T(0));
  std::vector<T> rinv(static_cast<std::size_t>(N) * P);
  if (backward) {
    o.dsources.assign(in.sources.size(), T(0));
    o.dq.assign(d, T(0));
    if (c.gain) o.dg.assign(d, T(0));
  }
  std::vector<T> z(N), a(N), dz(N);
  for (int p = 0; p < P; ++p) {
    // (1) r_i = 1 / sqrt(mean_c S_i² + eps)
    for (int i = 0; i < N; ++i) {
      T ss = 0;
      for (int col = 0; col < d; ++col) ss += S(i, p, col) * S(i, p, col);
      rinv[static_cast<std::size_t>(i) * P + p] = T(1) / std::sqrt(ss / T(d) + eps);
    }
    for (int h = 0; h < H; ++h) {
      // (2) z_i[h] = scale · r_i · Σ_{c∈h} q_c g_c S_i[c]
      //     (hf-rmsnorm: z_i[h] = scale · Σ_{c∈h} q_c g_c round(r_i S_i[c]))
      for (int i = 0; i < N; ++i) {
        const T r = rinv[static_cast<std::size_t>(i) * P + p];
        T kq = 0;
        if (c.round_key) {
          for (int col = h * K; col < (h + 1) * K; ++col)
            kq += in.q[col] * gain(col) * rounded_key(r, S(i, p, col));
          z[i] = scale * kq;
          continue;
        }
        for (int col = h * K; col < (h + 1) * K; ++col) kq += in.q[col] * gain(col) * S(i, p, col);
        z[i] = scale * r * kq;
      }
      // (3) α_i[h] = exp(z_i − m) / Σ_j exp(z_j − m), m = max_j z_j
      const T m = *std::max_element(z.begin(), z.end());
      T den = 0;
      for (int i = 0; i < N; ++i) den += std::exp(z[i] - m);
      for (int i = 0; i < N; ++i)
        o.alpha[(static_cast<std::size_t>(i) * P + p) * H + h] = std::exp(z[i] - m) / den;
      // (4) mix[c] = Σ_i α_i[h] S_i[c]
      for (int col = h * K; col < (h + 1) * K; ++col) {
        T acc = 0;
        for (int i = 0; i < N; ++i)
          acc += o.alpha[(static_cast<std::size_t>(i) * P + p) * H + h] * S(i, p, col);
        mix[static_cast<std::size_t>(p) * d + col] = acc;
      }
    }
  }
  // (5) out = mix, or partial + gate · mix
  for (std::size_t k = 0; k < mix.size(); ++k)
    o.out[k] = c.delta ? in.partial[k] + in.gate * mix[k] : mix[k];
  if (!backward) return o;

  // Backward of (5): dmix = dout (or gate · dout); dpartial = dout; dgate = Σ dout ⊙ mix.
  std::vector<T> dmix(in.dout);
  if (c.delta) {
    o.dpartial = in.dout;
    T dg = 0;
    for (std::size_t k = 0; k < mix.size(); ++k) {
      dmix[k] = in.gate * in.dout[k];
      dg += in.dout[k] * mix[k];
    }
    o.dgate = dg;
  }
  std::vector<T> uS(N);  // Σ_c u_i[c] · S_i[c], for the RMS term of (1)
  for (int p = 0; p < P; ++p) {
    const T* dm = &dmix[static_cast<std::size_t>(p) * d];
    const T* mx = &mix[static_cast<std::size_t>(p) * d];
    std::fill(uS.begin(), uS.end(), T(0));
    for (int h = 0; h < H; ++h) {
      // D[h] = Σ_{c∈h} dmix ⊙ mix;  a_i[h] = Σ_{c∈h} dmix ⊙ S_i;  dz_i = α_i (a_i − D)
      T D = 0;
      for (int col = h * K; col < (h + 1) * K; ++col) D += dm[col] * mx[col];
      for (int i = 0; i < N; ++i) {
        T acc = 0;
        for (int col = h * K; col < (h + 1) * K; ++col) acc += dm[col] * S(i, p, col);
        a[i] = acc;
        dz[i] = o.alpha[(static_cast<std::size_t>(i) * P + p) * H + h] * (a[i] - D);
      }
      for (int i = 0; i < N; ++i) {
        const T al = o.alpha[(static_cast<std::size_t>(i) * P + p) * H + h];
        const T r = rinv[static_cast<std::size_t>(i) * P + p];
        const T sdz = scale * dz[i];  // ∂loss/∂(logit before the scale)
        T* dS = &o.dsources[(static_cast<std::size_t>(i) * P + p) * d];
        for (int col = h * K; col < (h + 1) * K; ++col) {
          const T s = S(i, p, col);
          const T u = sdz * in.q[col] * gain(col);  // ∂loss/∂(r_i S_i[c])
          dS[col] += al * dm[col] + r * u;          // value path (4), key path (2)
          uS[i] += u * s;
          if (c.round_key) {  // the key as (2) used it
            const T key = rounded_key(r, s);
            o.dq[col] += sdz * gain(col) * key;
            if (c.gain) o.dg[col] += sdz * in.q[col] * key;
            continue;
          }
          o.dq[col] += sdz * gain(col) * r * s;
          if (c.gain) o.dg[col] += sdz * in.q[col] * r * s;
        }
      }
    }
    // RMS path (1): dS_i −= (r_i³ / d) · (Σ_c u_i S_i) · S_i
    for (int i = 0; i < N; ++i) {
      const T r = rinv[static_cast<std::size_t>(i) * P + p];
      const T coef = r * r * r * uS[i] / T(d);
      T* dS = &o.dsources[(static_cast<std::size_t>(i) * P + p) * d];
      for (int col = 0; col < d; ++col) dS[col] -= coef * S(i, p, col);
    }
  }
  return o;
}

template void check_general_args<float>(const RoutingInputs<float>&, const Conventions&);
template void check_general_args<double>(const RoutingInputs<double>&, const Conventions&);
template RoutingOutputs<float> general_routing<float>(const RoutingInputs<float>&,
                                                      const Conventions&, bool);
template RoutingOutputs<double> general_routing<double>(const RoutingInputs<double>&,
                                                        const Conventions&, bool);

}  // namespace mhar::verify

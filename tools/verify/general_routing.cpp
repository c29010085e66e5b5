/**
 * @file general_routing.cpp
 * @brief general_routing.h: docs/design.md#routing-steps, one position at a time, with eps, the
 *        logit scale, an optional gain and the delta output as parameters.
 *
 * Reading order: one function per forward step, (1) to (4) at one position (and one head); then
 * the backward of each step, from (5) back to (1); general_routing, at the end, calls them in turn.
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

namespace {

/// One routing site: its inputs, its conventions, and the indexing every step shares.
template <typename T>
struct Site {
  const RoutingInputs<T>& in;
  const Conventions& c;
  int N, P, d, H, K;  // K = d / H columns per head
  T eps, scale;

  /// Row (i, p): where r_i[p] sits in rinv, and S_i[p, ·] starts at row(i, p) · d in sources.
  std::size_t row(int i, int p) const { return static_cast<std::size_t>(i) * P + p; }
  /// Where α_i[p, h] sits in alpha.
  std::size_t at_alpha(int i, int p, int h) const { return row(i, p) * H + h; }
  /// S_i[p, col].
  T S(int i, int p, int col) const { return in.sources[row(i, p) * d + col]; }
  /// g_col, or 1 at a gain-free site.
  T gain(int col) const { return c.gain ? in.g[col] : T(1); }
  /// The key r · s as the convention's round_key leaves it (hf-rmsnorm).
  T rounded_key(T r, T s) const { return static_cast<T>(c.round_key(static_cast<float>(r * s))); }
};

// ---- forward: steps (1)-(4) at position p, then (5) ----

/// (1) r_i = 1 / sqrt(mean_c S_i[p,c]² + eps), for every source i.
template <typename T>
void rms_inverse(const Site<T>& s, int p, std::vector<T>& rinv) {
  for (int i = 0; i < s.N; ++i) {
    T ss = 0;
    for (int col = 0; col < s.d; ++col) ss += s.S(i, p, col) * s.S(i, p, col);
    rinv[s.row(i, p)] = T(1) / std::sqrt(ss / T(s.d) + s.eps);
  }
}

/// (2) z_i[h] = scale · r_i · Σ_{c∈h} q_c g_c S_i[p,c]
///     (hf-rmsnorm: z_i[h] = scale · Σ_{c∈h} q_c g_c round(r_i S_i[p,c]))
template <typename T>
void head_logits(const Site<T>& s, int p, int h, const std::vector<T>& rinv, std::vector<T>& z) {
  for (int i = 0; i < s.N; ++i) {
    const T r = rinv[s.row(i, p)];
    T kq = 0;
    if (s.c.round_key) {
      for (int col = h * s.K; col < (h + 1) * s.K; ++col)
        kq += s.in.q[col] * s.gain(col) * s.rounded_key(r, s.S(i, p, col));
      z[i] = s.scale * kq;
      continue;
    }
    for (int col = h * s.K; col < (h + 1) * s.K; ++col)
      kq += s.in.q[col] * s.gain(col) * s.S(i, p, col);
    z[i] = s.scale * r * kq;
  }
}

/// (3) α_i[p,h] = exp(z_i − m) / Σ_j exp(z_j − m), m = max_j z_j
template <typename T>
void head_softmax(const Site<T>& s, int p, int h, const std::vector<T>& z, std::vector<T>& alpha) {
  const T m = *std::max_element(z.begin(), z.end());
  T den = 0;
  for (int i = 0; i < s.N; ++i) den += std::exp(z[i] - m);
  for (int i = 0; i < s.N; ++i) alpha[s.at_alpha(i, p, h)] = std::exp(z[i] - m) / den;
}

/// (4) mix[p,c] = Σ_i α_i[p,h] S_i[p,c], for the columns c of head h
template <typename T>
void head_mix(const Site<T>& s, int p, int h, const std::vector<T>& alpha, std::vector<T>& mix) {
  for (int col = h * s.K; col < (h + 1) * s.K; ++col) {
    T acc = 0;
    for (int i = 0; i < s.N; ++i) acc += alpha[s.at_alpha(i, p, h)] * s.S(i, p, col);
    mix[static_cast<std::size_t>(p) * s.d + col] = acc;
  }
}

// ---- backward: (5), then (4)-(1) at position p ----

/// Backward of (5): dmix = dout (or gate · dout); dpartial = dout; dgate = Σ dout ⊙ mix.
template <typename T>
std::vector<T> output_backward(const Site<T>& s, const std::vector<T>& mix, RoutingOutputs<T>& o) {
  std::vector<T> dmix(s.in.dout);
  if (s.c.delta) {
    o.dpartial = s.in.dout;
    T dg = 0;
    for (std::size_t k = 0; k < mix.size(); ++k) {
      dmix[k] = s.in.gate * s.in.dout[k];
      dg += s.in.dout[k] * mix[k];
    }
    o.dgate = dg;
  }
  return dmix;
}

/// Backward of (4) into α, and of (3): dz_i = α_i[p,h] (a_i − D), with
/// D = Σ_{c∈h} dmix ⊙ mix and a_i = Σ_{c∈h} dmix ⊙ S_i (dm, mx: dmix and mix at p).
template <typename T>
void head_softmax_backward(const Site<T>& s, int p, int h, const T* dm, const T* mx,
                           const std::vector<T>& alpha, std::vector<T>& dz) {
  T D = 0;
  for (int col = h * s.K; col < (h + 1) * s.K; ++col) D += dm[col] * mx[col];
  for (int i = 0; i < s.N; ++i) {
    T a = 0;
    for (int col = h * s.K; col < (h + 1) * s.K; ++col) a += dm[col] * s.S(i, p, col);
    dz[i] = alpha[s.at_alpha(i, p, h)] * (a - D);
  }
}

/// Backward of (4) into the values and of (2) into the keys, q and g, with
/// u_i[c] = scale · dz_i · q_c g_c; adds Σ_{c∈h} u_i[c] S_i[p,c] to uS[i] for (1).
template <typename T>
void head_key_value_backward(const Site<T>& s, int p, int h, const T* dm, const std::vector<T>& dz,
                             const std::vector<T>& rinv, std::vector<T>& uS, RoutingOutputs<T>& o) {
  for (int i = 0; i < s.N; ++i) {
    const T al = o.alpha[s.at_alpha(i, p, h)];
    const T r = rinv[s.row(i, p)];
    const T sdz = s.scale * dz[i];  // ∂loss/∂(logit before the scale)
    T* dS = &o.dsources[s.row(i, p) * s.d];
    for (int col = h * s.K; col < (h + 1) * s.K; ++col) {
      const T x = s.S(i, p, col);
      const T u = sdz * s.in.q[col] * s.gain(col);  // ∂loss/∂(r_i S_i[c])
      dS[col] += al * dm[col] + r * u;              // value path (4), key path (2)
      uS[i] += u * x;
      if (s.c.round_key) {  // the key as (2) used it
        const T key = s.rounded_key(r, x);
        o.dq[col] += sdz * s.gain(col) * key;
        if (s.c.gain) o.dg[col] += sdz * s.in.q[col] * key;
        continue;
      }
      o.dq[col] += sdz * s.gain(col) * r * x;
      if (s.c.gain) o.dg[col] += sdz * s.in.q[col] * r * x;
    }
  }
}

/// Backward of (1), the RMS path: dS_i −= (r_i³ / d) · (Σ_c u_i S_i) · S_i
template <typename T>
void rms_backward(const Site<T>& s, int p, const std::vector<T>& rinv, const std::vector<T>& uS,
                  RoutingOutputs<T>& o) {
  for (int i = 0; i < s.N; ++i) {
    const T r = rinv[s.row(i, p)];
    const T coef = r * r * r * uS[i] / T(s.d);
    T* dS = &o.dsources[s.row(i, p) * s.d];
    for (int col = 0; col < s.d; ++col) dS[col] -= coef * s.S(i, p, col);
  }
}

/// The gradients of Σ dout ⊙ out: the steps walked backwards, one position at a time.
template <typename T>
void routing_backward(const Site<T>& s, const std::vector<T>& mix, const std::vector<T>& rinv,
                      RoutingOutputs<T>& o) {
  o.dsources.assign(s.in.sources.size(), T(0));
  o.dq.assign(s.d, T(0));
  if (s.c.gain) o.dg.assign(s.d, T(0));
  const std::vector<T> dmix = output_backward(s, mix, o);  // (5)
  std::vector<T> dz(s.N);
  std::vector<T> uS(s.N);  // Σ_c u_i[c] · S_i[c], for the RMS term of (1)
  for (int p = 0; p < s.P; ++p) {
    const T* dm = &dmix[static_cast<std::size_t>(p) * s.d];
    const T* mx = &mix[static_cast<std::size_t>(p) * s.d];
    std::fill(uS.begin(), uS.end(), T(0));
    for (int h = 0; h < s.H; ++h) {
      head_softmax_backward(s, p, h, dm, mx, o.alpha, dz);    // (4) into α, (3)
      head_key_value_backward(s, p, h, dm, dz, rinv, uS, o);  // (4) into S, (2)
    }
    rms_backward(s, p, rinv, uS, o);  // (1)
  }
}

}  // namespace

template <typename T>
RoutingOutputs<T> general_routing(const RoutingInputs<T>& in, const Conventions& c, bool backward) {
  check_general_args(in, c);
  const Site<T> s{.in = in,
                  .c = c,
                  .N = in.N,
                  .P = in.P,
                  .d = in.d,
                  .H = c.H,
                  .K = in.d / c.H,
                  .eps = static_cast<T>(c.eps),
                  .scale = static_cast<T>(c.scale)};
  RoutingOutputs<T> o;
  o.out.assign(static_cast<std::size_t>(s.P) * s.d, T(0));
  o.alpha.assign(static_cast<std::size_t>(s.N) * s.P * s.H, T(0));
  std::vector<T> mix(static_cast<std::size_t>(s.P) * s.d, T(0));
  std::vector<T> rinv(static_cast<std::size_t>(s.N) * s.P);
  std::vector<T> z(s.N);
  for (int p = 0; p < s.P; ++p) {
    rms_inverse(s, p, rinv);  // (1)
    for (int h = 0; h < s.H; ++h) {
      head_logits(s, p, h, rinv, z);      // (2)
      head_softmax(s, p, h, z, o.alpha);  // (3)
      head_mix(s, p, h, o.alpha, mix);    // (4)
    }
  }
  // (5) out = mix, or partial + gate · mix
  for (std::size_t k = 0; k < mix.size(); ++k)
    o.out[k] = c.delta ? in.partial[k] + in.gate * mix[k] : mix[k];
  if (backward) routing_backward(s, mix, rinv, o);
  return o;
}

template void check_general_args<float>(const RoutingInputs<float>&, const Conventions&);
template void check_general_args<double>(const RoutingInputs<double>&, const Conventions&);
template RoutingOutputs<float> general_routing<float>(const RoutingInputs<float>&,
                                                      const Conventions&, bool);
template RoutingOutputs<double> general_routing<double>(const RoutingInputs<double>&,
                                                        const Conventions&, bool);

}  // namespace mhar::verify

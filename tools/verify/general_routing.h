/**
 * @file general_routing.h
 * @ingroup tools
 * @brief One routing site under every convention the verify kit covers (docs/verify.md): H heads,
 *        any eps, a logit scale, a key gain present or absent, and the output either the mix or
 *        `partial + gate · mix` (delta routing). Forward and backward, plain loops.
 *
 * docs/design.md §1 (the routing steps) with two additions, per position p:
 *   (1) r_i      = 1 / sqrt( (1/d) Σ_c S_i[p,c]² + eps )          RMS over the full width d
 *   (2) z_i[h]   = scale · Σ_{c∈h} q_c · g_c · r_i · S_i[p,c]      g_c = 1 when there is no gain
 *   (3) α_i[h]   = softmax over i of z_i[h]
 *   (4) mix[p,c] = Σ_i α_i[h(c)] · S_i[p,c]
 *   (5) out      = mix, or partial + gate · mix (delta)
 * Head h owns the contiguous columns [h·K, (h+1)·K), K = d / H.
 *
 * Templated on the arithmetic type: double gives the verify kit's truth, float the yardstick (the
 * same loops with float accumulation).
 *
 * Why this is not reference/routing.h: the reference computes one convention, the model's (eps
 * 1e-6, scale 1, a gain, no delta output), while the verify kit grades kernels written for
 * other conventions too, so eps, the scale, the gain and the delta output are parameters here.
 * It also stays free of Eigen and of the reference library: the kit (mhar_verify) reads and
 * grades result files from any kernel, and the emulator and the CUDA tests link it alone.
 * tests/verify/test_general_routing.cpp holds this file to the reference where the conventions
 * coincide, and its backward to central differences everywhere.
 */
#pragma once

#include <vector>

namespace mhar::verify {

/// The conventions of one routing site.
struct Conventions {
  int H = 1;           ///< heads; must divide d
  double eps = 1e-6;   ///< inside the RMS of a key
  double scale = 1.0;  ///< multiplies every logit
  bool gain = true;    ///< a key gain g (else g = 1 and there is no dg)
  bool delta = false;  ///< out = partial + gate · mix (else out = mix)
  /// A rounding convention (docs/verify.md, "Named rounding conventions"): when set, the
  /// normalised key r_i·S_i[p,c] is passed through it before the gain, in (2) and in dq and dg,
  /// as Hugging Face's RMSNorm rounds it to the storage dtype (hf-rmsnorm). Its derivative is
  /// taken as 1, as autograd does through a cast. nullptr: the exact intermediates.
  float (*round_key)(float) = nullptr;
};

/// The inputs, flat and row-major: sources N × P × d, q and g d (g empty without a gain),
/// dout P × d, and for delta partial P × d and the scalar gate.
template <typename T>
struct RoutingInputs {
  int N = 0, P = 0, d = 0;
  std::vector<T> sources, q, g, dout, partial;
  T gate = 0;
};

/// What the site computes: out P × d, alpha N × P × H (α_i[p,h] at (i·P + p)·H + h), and the
/// gradients of loss = Σ dout ⊙ out: dsources, dq, dg (gain), dpartial, dgate (delta).
template <typename T>
struct RoutingOutputs {
  std::vector<T> out, alpha, dsources, dq, dg, dpartial;
  T dgate = 0;
};

/// The same inputs rounded to float (what the float twin, the yardstick, computes from).
RoutingInputs<float> to_float(const RoutingInputs<double>& in);

/// Throws std::invalid_argument naming what is wrong unless `in` and `c` make a routing site.
template <typename T>
void check_general_args(const RoutingInputs<T>& in, const Conventions& c);

/// Forward, and the backward of Σ dout ⊙ out when `backward`.
template <typename T>
RoutingOutputs<T> general_routing(const RoutingInputs<T>& in, const Conventions& c,
                                  bool backward = true);

}  // namespace mhar::verify

/**
 * @file verify_adapter.cpp
 * @brief verify_adapter.h: the kernels of cuda/routing.h through the verify protocol.
 */
#include "verify_adapter.h"

#include <cmath>
#include <filesystem>

#include "cases.h"
#include "cuda/device.h"
#include "file_util.h"
#include "routing.h"
#include "safetensors.h"
#include "verify.h"

namespace mhar::cuda::test {

namespace {

std::vector<float> to_float(const std::vector<double>& v) {
  return {v.begin(), v.end()};
}

bool power_of_two(double s) {
  int e = 0;
  return s > 0 && std::frexp(s, &e) == 0.5;
}

/// Why candidate k cannot serve case c exactly, or "" when it can.
std::string refusal(const verify::Case& c, const KernelCandidate& k) {
  const verify::CaseSpec& s = c.spec;
  if (s.eps != kRoutingEps)
    return "eps = " + std::to_string(s.eps) + " is not the kernels' constant 1e-6";
  if (!power_of_two(s.scale))
    return "scale " + std::to_string(s.scale) + " is not a power of two (s·q would round)";
  if (k.supports && !k.supports(s.d, s.H))
    return k.name + " does not support d = " + std::to_string(s.d) + ", H = " + std::to_string(s.H);
  return {};
}

}  // namespace

KernelCandidate project_kernels(RoutingVersion v) {
  KernelCandidate k;
  k.name = version_name(v);
  k.forward = [v](float* out, float* alpha, const float* S, const float* q, const float* g, int N,
                  int P, int d, int H) { routing_forward(out, alpha, S, q, g, N, P, d, H, v); };
  k.backward = [v](float* dS, float* dq, float* dg, const float* dout, const float* out,
                   const float* alpha, const float* S, const float* q, const float* g, int N, int P,
                   int d, int H) {
    routing_backward(dS, dq, dg, dout, out, alpha, S, q, g, N, P, d, H, v);
  };
  k.supports = [v](int d, int H) { return version_supports(v, d, H); };
  return k;
}

AdapterRun run_kernel_candidate(const std::string& cases, const std::string& results,
                                const KernelCandidate& k) {
  namespace fs = std::filesystem;
  fs::create_directories(results);
  AdapterRun run;
  for (const verify::ManifestEntry& e : verify::load_manifest(cases).cases) {
    const verify::Case c = verify::load_case((fs::path(cases) / e.file).string());
    const fs::path marker = fs::path(results) / verify::decline_marker_name(e.file);
    if (const std::string why = refusal(c, k); !why.empty()) {
      run.not_served.emplace_back(e.file, why);
      io::write_text_file_atomic(marker.string(), why + "\n");  // verify: "declined"
      continue;
    }
    fs::remove(marker);
    const int N = c.in.N, P = c.in.P, d = c.in.d, H = c.spec.H;
    const float s = static_cast<float>(c.spec.scale);
    std::vector<float> q = to_float(c.in.q);
    for (float& x : q) x *= s;  // exact: s is a power of two
    const std::vector<float> g = c.spec.gain ? to_float(c.in.g) : std::vector<float>(d, 1.0f);
    const std::vector<float> dout = to_float(c.in.dout);

    DeviceBuffer dS(to_float(c.in.sources)), dq_(q), dg_(g);
    DeviceBuffer mix(static_cast<std::size_t>(P) * d), alpha(static_cast<std::size_t>(N) * P * H);
    mix.fill_bytes(0xFF);  // poison: an unwritten output reads NaN
    alpha.fill_bytes(0xFF);
    k.forward(mix.data(), alpha.data(), dS.data(), dq_.data(), dg_.data(), N, P, d, H);
    const std::vector<float> m = mix.download();
    io::SafeTensors st;
    st.metadata["inputs"] = "float32";  // fp32 kernels: bf16/f16 inputs arrive upcast (exact)
    const int64_t n = N, p = P, w = d, h = H;

    std::vector<float> out = m;
    if (c.spec.delta)
      for (std::size_t j = 0; j < m.size(); ++j)
        out[j] = static_cast<float>(c.in.partial[j]) + static_cast<float>(c.in.gate) * m[j];
    st.tensors.emplace_back("out", io::Tensor::from_f32({p, w}, out.data()));
    const std::vector<float> a = alpha.download();
    st.tensors.emplace_back("alpha", io::Tensor::from_f32({n, p, h}, a.data()));
    if (!k.backward) {  // forward-only
      io::save_safetensors((fs::path(results) / e.file).string(), st);
      ++run.served;
      continue;
    }
    std::vector<float> dmix = dout, dpartial;
    float dgate = 0;
    if (c.spec.delta) {
      const float gate = static_cast<float>(c.in.gate);
      double acc = 0;
      for (std::size_t j = 0; j < m.size(); ++j) {
        dmix[j] = gate * dout[j];
        acc += static_cast<double>(dout[j]) * m[j];
      }
      dgate = static_cast<float>(acc);
      dpartial = dout;
    }
    DeviceBuffer ddm(dmix), dsrc(c.in.sources.size()), ddq(d), ddg(d);
    dsrc.fill_bytes(0);  // the backward accumulates (+=)
    ddq.fill_bytes(0);
    ddg.fill_bytes(0);
    k.backward(dsrc.data(), ddq.data(), ddg.data(), ddm.data(), mix.data(), alpha.data(), dS.data(),
               dq_.data(), dg_.data(), N, P, d, H);
    std::vector<float> dq = ddq.download();
    for (float& x : dq) x *= s;  // ∂/∂q = s · ∂/∂(s·q), exact

    const std::vector<float> ds = dsrc.download();
    st.tensors.emplace_back("dsources", io::Tensor::from_f32({n, p, w}, ds.data()));
    st.tensors.emplace_back("dq", io::Tensor::from_f32({w}, dq.data()));
    if (c.spec.gain) {
      const std::vector<float> dg = ddg.download();
      st.tensors.emplace_back("dg", io::Tensor::from_f32({w}, dg.data()));
    }
    if (c.spec.delta) {
      st.tensors.emplace_back("dpartial", io::Tensor::from_f32({p, w}, dpartial.data()));
      st.tensors.emplace_back("dgate", io::Tensor::from_f32({}, &dgate));
    }
    io::save_safetensors((fs::path(results) / e.file).string(), st);
    ++run.served;
  }
  return run;
}

}  // namespace mhar::cuda::test

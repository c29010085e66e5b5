/**
 * @file model.cpp
 * @brief The tiny decoder in five residual modes on the GPU: forward and backward, step for
 *        step the twin of reference/model.cpp (read the two side by side).
 *
 * Forward, for sub-layers j = 0 … 2L−1 (l = j/2 is the layer):
 *   (1) input_j  formed by the mode (reference/model.h's table)
 *   (2) normed_j = RMSNorm_j(input_j)
 *   (3) out_j    = attention(normed_j) for even j, MLP(normed_j) for odd j
 * then (4) final = the mode's final read, (5) logits = RMSNorm_final(final) · Eᵀ,
 * (6) loss = cross-entropy. The backward walks (6) → (1), sub-layers in reverse.
 *
 * What differs from the reference, and why:
 *   - Tensors live in a few big device buffers (DeviceParams, DeviceCache) instead of one Mat
 *     each; prims = [E, out_0 …] is one N × P × d array, so routing in attnres and mhar reads
 *     its sources in place (cuda/routing.h's layout) instead of through a span of matrices.
 *   - In attnres, mhar and block, input_j *is* the routing output of site j: the cache keeps
 *     one buffer where the reference keeps a copy (c.inputs[j] = route_site(j)).
 *   - In residual mode the stream is stored as the inputs themselves:
 *     input_{j+1} = input_j + out_j, the final read = input_{2L−1} + out_{2L−1}.
 * Host code (g++): every GPU step is a call into a cuda/ header; nothing here touches CUDA
 * directly.
 */
#include "cuda/model.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda/attention.h"
#include "cuda/layers.h"
#include "cuda/linear.h"
#include "cuda/optim.h"
#include "cuda/tensor_ops.h"

namespace mhar::cuda {

namespace {

std::size_t sz(long long a, long long b = 1, long long c = 1) {
  return static_cast<std::size_t>(a) * static_cast<std::size_t>(b) * static_cast<std::size_t>(c);
}

bool stream_mode(Mode m) {
  return m == Mode::Residual || m == Mode::Delta;
}

/// attnres and mhar route over the primitives themselves; block and delta over sums of them.
bool routes_over_prims(Mode m) {
  return m == Mode::AttnRes || m == Mode::Mhar;
}

std::string mib(std::size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}

}  // namespace

// ---- Parameters -------------------------------------------------------------------------------

DeviceParams::DeviceParams(const Config& cfg) : cfg_(cfg) {
  const Params<float> shapes = zero_params<float>(cfg);
  std::size_t total = 0;
  shapes.for_each([&](const std::string&, const Mat<float>& m, bool) {
    total += static_cast<std::size_t>(m.size());
  });
  try {
    storage_ = DeviceBuffer(total);
  } catch (const std::runtime_error& e) {
    throw std::runtime_error("the model's " + std::to_string(total) + " parameters (" +
                             mib(total * sizeof(float)) + ") do not fit on the GPU: " + e.what());
  }
  // Every tensor's place in the allocation, and the named pointers (embed, layers[l].wq, …),
  // from the one list of tensors (for_each_tensor): the host shapes and this object in step.
  layers.resize(shapes.layers.size());
  std::size_t offset = 0;
  for_each_tensor(
      [&](const std::string& name, bool decay, const Mat<float>& m, float*& ptr) {
        ptr = storage_.data() + offset;
        tensors.push_back(
            {name, ptr, static_cast<int>(m.rows()), static_cast<int>(m.cols()), decay});
        offset += static_cast<std::size_t>(m.size());
      },
      shapes, *this);
  norm_sq = DeviceBuffer(1);
  set_zero();
}

DeviceParams::DeviceParams(const Config& cfg, const Params<float>& host) : DeviceParams(cfg) {
  upload(host);
}

void DeviceParams::set_zero() {
  if (storage_.size() > 0) zero(storage_.data(), storage_.size());
}

void DeviceParams::upload(const Params<float>& host) {
  std::vector<float> flat;
  flat.reserve(storage_.size());
  std::size_t k = 0;
  host.for_each([&](const std::string& name, const Mat<float>& m, bool) {
    if (k >= tensors.size() || tensors[k].name != name || tensors[k].rows != m.rows() ||
        tensors[k].cols != m.cols())
      throw std::invalid_argument("DeviceParams::upload: tensor '" + name + "' (" +
                                  std::to_string(m.rows()) + " × " + std::to_string(m.cols()) +
                                  ") does not match the model on the GPU");
    flat.insert(flat.end(), m.data(), m.data() + m.size());  // Mat is row-major
    ++k;
  });
  if (k != tensors.size())
    throw std::invalid_argument("DeviceParams::upload: the host parameters have " +
                                std::to_string(k) + " tensors, the GPU model " +
                                std::to_string(tensors.size()));
  storage_.upload(flat);
}

Params<float> DeviceParams::download() const {
  const std::vector<float> flat = storage_.download();
  Params<float> host = zero_params<float>(cfg_);
  std::size_t offset = 0;
  host.for_each([&](const std::string&, Mat<float>& m, bool) {
    std::copy_n(flat.begin() + static_cast<std::ptrdiff_t>(offset), m.size(), m.data());
    offset += static_cast<std::size_t>(m.size());
  });
  return host;
}

// ---- Cache ------------------------------------------------------------------------------------

namespace {

/**
 * The one list of a DeviceCache's buffers for (cfg, B), in allocation order. Calls
 * visit(&DeviceCache::member, floats) for a single buffer, and visit(&DeviceCache::list, floats)
 * once per element of a per-layer or per-site list. bytes_needed sums it, the constructor
 * allocates from it, and bytes() and poison() walk the buffers it names: none can drift from
 * another.
 */
template <typename Visit>
void cache_plan(const Config& cfg, int B, Visit&& visit) {
  using C = DeviceCache;
  const int P = B * cfg.T, d = cfg.d, L = cfg.L, hd = cfg.head_dim(), H = cfg.route_heads();
  const int qw = cfg.n_head * hd, kw = cfg.n_kv_head * hd;
  const int n_prims = 2 * L + 1;
  visit(&C::tokens, sz(P));
  visit(&C::targets, sz(P));
  visit(&C::prims, sz(n_prims, P, d));
  if (stream_mode(cfg.mode))
    for (int j = 0; j < 2 * L; ++j) visit(&C::stream_inputs, sz(P, d));
  visit(&C::norm_rinv, sz(2 * L, P));
  visit(&C::normed, sz(2 * L, P, d));
  for (int l = 0; l < L; ++l) {
    visit(&C::q, sz(P, qw));
    visit(&C::k, sz(P, kw));
    visit(&C::v, sz(P, kw));
    visit(&C::attn, sz(P, qw));
    visit(&C::probs, sz(B, cfg.n_head, sz(cfg.T, cfg.T)));
    visit(&C::gate, sz(P, cfg.ffn));
    visit(&C::up, sz(P, cfg.ffn));
  }
  std::size_t widest = 0;
  for (int s = 0; s < cfg.n_sites(); ++s) {
    const std::size_t N = site_groups(cfg, s).size();
    visit(&C::site_sources, routes_over_prims(cfg.mode) ? 0 : sz(N, P, d));
    visit(&C::site_out, sz(P, d));
    visit(&C::alpha, sz(N, P, H));
    widest = std::max(widest, N);
  }
  if (cfg.mode == Mode::Delta) visit(&C::stream, sz(P, d));
  if (stream_mode(cfg.mode)) visit(&C::final_in_own, sz(P, d));
  visit(&C::final_rinv, sz(P));
  visit(&C::final_normed, sz(P, d));
  visit(&C::logits, sz(P, cfg.vocab));
  visit(&C::probs_out, sz(P, cfg.vocab));
  visit(&C::loss, 1);
  visit(&C::dprims, sz(n_prims, P, d));
  for (auto row : {&C::dh, &C::dout, &C::dnormed, &C::dinput, &C::dtmp}) visit(row, sz(P, d));
  for (auto row : {&C::dattn, &C::dq, &C::dq_pre}) visit(row, sz(P, qw));
  for (auto row : {&C::dk, &C::dv, &C::dk_pre}) visit(row, sz(P, kw));
  if (!routes_over_prims(cfg.mode) && cfg.routed()) visit(&C::dsources, sz(widest, P, d));
  visit(&C::dlogits, sz(P, cfg.vocab));
}

/// A single buffer of the plan, or one element of a list.
using One = DeviceBuffer DeviceCache::*;
using List = std::vector<DeviceBuffer> DeviceCache::*;

/// Calls f on every buffer the cache's plan names (each list's elements once).
template <typename F>
void for_each_buffer(DeviceCache& c, F&& f) {
  std::vector<List> seen;
  cache_plan(c.cfg, c.B, [&](auto member, std::size_t) {
    if constexpr (std::is_same_v<decltype(member), One>) {
      f(c.*member);
    } else {
      if (std::find(seen.begin(), seen.end(), member) != seen.end()) return;
      seen.push_back(member);
      for (DeviceBuffer& b : c.*member) f(b);
    }
  });
}

}  // namespace

std::size_t DeviceCache::bytes_needed(const Config& cfg, int B) {
  std::size_t floats = 0;
  cache_plan(cfg, B, [&](auto, std::size_t n) { floats += n; });
  return floats * sizeof(float);
}

DeviceCache::DeviceCache(const Config& cfg, int B_) {
  cfg.validate();
  if (B_ < 1) throw std::invalid_argument("DeviceCache: batch B must be positive");
  const std::size_t need = bytes_needed(cfg, B_);
  std::size_t free_bytes = 0, total_bytes = 0;
  memory_info(&free_bytes, &total_bytes);
  const std::string what = "the GPU training step for batch " + std::to_string(B_) + " × T " +
                           std::to_string(cfg.T) + " (d " + std::to_string(cfg.d) + ", L " +
                           std::to_string(cfg.L) + ", " + mode_name(cfg.mode) + ") needs " +
                           mib(need) + " of activations";
  if (need > free_bytes)
    throw std::runtime_error(what + ", but only " + mib(free_bytes) + " of the GPU's " +
                             mib(total_bytes) + " is free; use a smaller --batch or T");
  try {
    B = B_;
    P = B * cfg.T;
    this->cfg = cfg;
    cache_plan(cfg, B, [&](auto member, std::size_t n) {
      if constexpr (std::is_same_v<decltype(member), One>)
        this->*member = DeviceBuffer(n);
      else
        (this->*member).emplace_back(n);
    });
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(what + " (" + mib(free_bytes) + " free of " + mib(total_bytes) +
                             "), and an allocation failed: " + e.what() +
                             "; use a smaller --batch or T");
  }
}

std::string DeviceCache::shape_mismatch(const Config& other) const {
  std::string diff;
  auto field = [&](const char* name, const std::string& mine, const std::string& theirs) {
    if (mine == theirs) return;
    diff += (diff.empty() ? "" : ", ") + std::string(name) + " " + mine + " (cache) vs " + theirs;
  };
  auto number = [&](const char* name, int mine, int theirs) {
    field(name, std::to_string(mine), std::to_string(theirs));
  };
  number("vocab", cfg.vocab, other.vocab);
  number("d", cfg.d, other.d);
  number("L", cfg.L, other.L);
  number("n_head", cfg.n_head, other.n_head);
  number("n_kv_head", cfg.n_kv_head, other.n_kv_head);
  number("ffn", cfg.ffn, other.ffn);
  number("T", cfg.T, other.T);
  field("mode", mode_name(cfg.mode), mode_name(other.mode));
  number("routing heads", cfg.route_heads(), other.route_heads());
  number("n_blocks", cfg.n_blocks, other.n_blocks);
  return diff;
}

std::size_t DeviceCache::bytes() const {
  std::size_t n = 0;
  for_each_buffer(const_cast<DeviceCache&>(*this), [&](DeviceBuffer& b) { n += b.size(); });
  return n * sizeof(float);
}

void DeviceCache::poison() {
  for_each_buffer(*this, [](DeviceBuffer& b) { b.fill_bytes(0xFF); });
  has_loss = false;
}

std::vector<float> DeviceCache::download_alpha(int site) const {
  if (site < 0 || site >= static_cast<int>(alpha.size()))
    throw std::invalid_argument("DeviceCache::download_alpha: site " + std::to_string(site) +
                                " outside [0, " + std::to_string(alpha.size()) + ")");
  return alpha[static_cast<std::size_t>(site)].download();
}

// ---- Forward ----------------------------------------------------------------------------------

namespace {

/// Device view of one forward: the pointers the steps need, named as in reference/model.cpp.
struct Views {
  const Config& cfg;
  const DeviceParams& p;
  DeviceCache& c;
  int P, d, hd, qw, kw, H, n_sub;

  float* prim(int k) const { return c.prims.data() + sz(k, P, d); }
  float* dprim(int k) const { return c.dprims.data() + sz(k, P, d); }
  float* normed(int j) const { return c.normed.data() + sz(j, P, d); }
  float* rinv(int j) const { return c.norm_rinv.data() + sz(j, P); }
  /// input_j: its own buffer in the stream modes, else site j's routing output.
  float* input(int j) const {
    return stream_mode(cfg.mode) ? c.stream_inputs[static_cast<std::size_t>(j)].data()
                                 : c.site_out[static_cast<std::size_t>(j)].data();
  }
  /// The input of the final norm.
  float* final_in() const {
    return stream_mode(cfg.mode) ? c.final_in_own.data()
                                 : c.site_out[static_cast<std::size_t>(n_sub)].data();
  }
  const float* q_row(int s) const { return p.route_q + sz(s, d); }
  const float* g_row(int s) const { return p.route_g + sz(s, d); }
};

Views views(const Config& cfg, const DeviceParams& p, DeviceCache& c) {
  const int hd = cfg.head_dim();
  return Views{
      cfg, p, c, c.P, cfg.d, hd, cfg.n_head * hd, cfg.n_kv_head * hd, cfg.route_heads(), 2 * cfg.L};
}

/// Site s's sources (block and delta): each group's sum of primitives (or ν), written into
/// c.site_sources[s] — reference gather_sources.
void gather_sources(const Views& w, int s, const std::vector<SourceGroup>& groups) {
  float* dst = w.c.site_sources[static_cast<std::size_t>(s)].data();
  const std::size_t n = sz(w.P, w.d);
  for (std::size_t i = 0; i < groups.size(); ++i) {
    float* m = dst + i * n;
    zero(m, n);
    for (int k : groups[i].prims) {
      if (k == kNullSource)
        add_row(m, w.p.delta_null, w.P, w.d);  // ν broadcast over positions
      else
        add(m, w.prim(k), n);
    }
  }
}

/// Routing site s's forward; returns its output (reference route_site).
float* route_site(const Views& w, int s) {
  const auto groups = site_groups(w.cfg, s);
  const int N = static_cast<int>(groups.size());
  float* out = w.c.site_out[static_cast<std::size_t>(s)].data();
  float* alpha = w.c.alpha[static_cast<std::size_t>(s)].data();
  if (routes_over_prims(w.cfg.mode)) {
    // route over [E, out_0 … out_{s−1}]: the first s + 1 primitives, no copy
    routing_forward(out, alpha, w.prim(0), w.q_row(s), w.g_row(s), N, w.P, w.d, w.H, w.c.routing);
  } else {
    gather_sources(w, s, groups);
    routing_forward(out, alpha, w.c.site_sources[static_cast<std::size_t>(s)].data(), w.q_row(s),
                    w.g_row(s), N, w.P, w.d, w.H, w.c.routing);
  }
  return out;
}

void check_batch(const Config& cfg, const std::vector<int>& tokens, int B, const char* what) {
  if (B < 1) throw std::invalid_argument("cuda::model_forward: batch B must be positive");
  if (tokens.size() != sz(B, cfg.T))
    throw std::invalid_argument("cuda::model_forward: " + std::string(what) + " has " +
                                std::to_string(tokens.size()) +
                                " entries, expected B·T = " + std::to_string(B * cfg.T));
  for (std::size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= cfg.vocab)
      throw std::invalid_argument("cuda::model_forward: " + std::string(what) + " " +
                                  std::to_string(tokens[i]) + " at position " + std::to_string(i) +
                                  " is outside the vocabulary [0, " + std::to_string(cfg.vocab) +
                                  ")");
}

}  // namespace

float model_forward(const Config& cfg, const DeviceParams& p, const std::vector<int>& tokens,
                    const std::vector<int>& targets, int B, DeviceCache& cache) {
  cfg.validate();
  check_batch(cfg, tokens, B, "tokens");
  check_batch(cfg, targets, B, "targets");
  if (static_cast<int>(p.layers.size()) != cfg.L || (cfg.routed() && !p.route_q))
    throw std::invalid_argument("cuda::model_forward: the parameters do not match the config");
  if (cache.B != 0) {
    const std::string diff = cache.shape_mismatch(cfg);
    if (!diff.empty())
      throw std::invalid_argument("cuda::model_forward: the cache was made for another model (" +
                                  diff + "); make a DeviceCache for this config");
  }
  if (cache.B != B) {
    const RoutingVersion routing = cache.routing;
    cache = DeviceCache(cfg, B);
    cache.routing = routing;
  }
  DeviceCache& c = cache;
  c.has_loss = false;
  upload_ints(c.tokens, tokens);
  upload_ints(c.targets, targets);
  const Views w = views(cfg, p, c);
  const int P = w.P, d = w.d, n_sub = w.n_sub;
  const std::size_t n = sz(P, d);

  embedding_forward(w.prim(0), device_ints(c.tokens), p.embed, P, d, cfg.vocab);  // E[tokens]
  if (cfg.mode == Mode::Residual) copy(w.input(0), w.prim(0), n);                 // h_0 = E
  if (cfg.mode == Mode::Delta) copy(c.stream.data(), w.prim(0), n);

  for (int j = 0; j < n_sub; ++j) {
    const int l = j / 2;
    const DeviceLayer& y = p.layers[static_cast<std::size_t>(l)];
    // (1) input_j
    switch (cfg.mode) {
      case Mode::Residual:
        break;  // input_j = h_j, written when out_{j−1} was added (below)
      case Mode::Delta: {
        const float* r = route_site(w, j);
        copy(w.input(j), c.stream.data(), n);  // input_j = h_j + a_j · route_j
        add_scaled(w.input(j), r, p.delta_gate + j, n);
        break;
      }
      default:
        route_site(w, j);  // input_j = route_j (the same buffer)
        break;
    }
    // (2) normed_j = RMSNorm_j(input_j)
    rmsnorm_forward(w.normed(j), w.rinv(j), w.input(j), j % 2 == 0 ? y.attn_norm : y.mlp_norm, P,
                    d);
    // (3) out_j
    float* out = w.prim(j + 1);
    if (j % 2 == 0) {
      // attention: q, k with RoPE, v; causal GQA; output projection
      float* q_pre = c.dq_pre.data();  // forward scratch: the backward rewrites it anyway
      float* k_pre = c.dk_pre.data();
      linear_forward(q_pre, w.normed(j), y.wq, P, d, w.qw);
      linear_forward(k_pre, w.normed(j), y.wk, P, d, w.kw);
      linear_forward(c.v[l].data(), w.normed(j), y.wv, P, d, w.kw);
      rope_forward(c.q[l].data(), q_pre, P, cfg.T, cfg.n_head, w.hd);
      rope_forward(c.k[l].data(), k_pre, P, cfg.T, cfg.n_kv_head, w.hd);
      attention_forward(c.attn[l].data(), c.probs[l].data(), c.q[l].data(), c.k[l].data(),
                        c.v[l].data(), B, cfg.T, cfg.n_head, cfg.n_kv_head, w.hd);
      linear_forward(out, c.attn[l].data(), y.wo, P, w.qw, d);
    } else {
      mlp_forward(out, c.gate[l].data(), c.up[l].data(), w.normed(j), y.w_gate, y.w_up, y.w_down, P,
                  d, cfg.ffn);
    }
    // h_{j+1} = h_j + out_j
    if (cfg.mode == Mode::Residual) {
      float* next = j + 1 < n_sub ? w.input(j + 1) : w.final_in();
      copy(next, w.input(j), n);
      add(next, out, n);
    } else if (cfg.mode == Mode::Delta) {
      add(c.stream.data(), out, n);
    }
  }
  // (4) the final read
  if (cfg.mode == Mode::Delta)
    copy(w.final_in(), c.stream.data(), n);
  else if (!stream_mode(cfg.mode))
    route_site(w, n_sub);  // final_in = the last site's output (the same buffer)
  // (5) final norm; logits = RMSNorm_final(final) · Eᵀ (tied head)
  rmsnorm_forward(c.final_normed.data(), c.final_rinv.data(), w.final_in(), p.final_norm, P, d);
  gemm(false, true, P, cfg.vocab, d, 1.f, c.final_normed.data(), p.embed, 0.f, c.logits.data());
  // (6) loss
  cross_entropy_forward(c.loss.data(), c.probs_out.data(), c.logits.data(), device_ints(c.targets),
                        P, cfg.vocab);
  c.has_loss = true;
  return c.loss.download()[0];
}

// ---- Backward ---------------------------------------------------------------------------------

namespace {

/// The backward of routing site s, given ∂loss/∂(its output) (reference route_site_backward).
void route_site_backward(const Views& w, DeviceParams& grads, int s, const float* dsite) {
  const auto groups = site_groups(w.cfg, s);
  const int N = static_cast<int>(groups.size());
  const float* out = w.c.site_out[static_cast<std::size_t>(s)].data();
  const float* alpha = w.c.alpha[static_cast<std::size_t>(s)].data();
  float* dq = grads.route_q + sz(s, w.d);
  float* dg = grads.route_g + sz(s, w.d);
  if (routes_over_prims(w.cfg.mode)) {
    routing_backward(w.dprim(0), dq, dg, dsite, out, alpha, w.prim(0), w.q_row(s), w.g_row(s), N,
                     w.P, w.d, w.H, w.c.routing);
    return;
  }
  const std::size_t n = sz(w.P, w.d);
  float* dsrc = w.c.dsources.data();
  zero(dsrc, sz(N) * n);
  routing_backward(dsrc, dq, dg, dsite, out, alpha,
                   w.c.site_sources[static_cast<std::size_t>(s)].data(), w.q_row(s), w.g_row(s), N,
                   w.P, w.d, w.H, w.c.routing);
  // scatter_source_grads: each source's gradient to the primitives it sums (ν: over positions)
  for (std::size_t i = 0; i < groups.size(); ++i)
    for (int k : groups[i].prims) {
      if (k == kNullSource)
        column_sum_add(grads.delta_null, dsrc + i * n, w.P, w.d);
      else
        add(w.dprim(k), dsrc + i * n, n);
    }
}

}  // namespace

void model_backward(DeviceParams& grads, const Config& cfg, const DeviceParams& p, DeviceCache& c) {
  if (!c.has_loss)
    throw std::invalid_argument(
        "cuda::model_backward: the cache holds no loss: run model_forward with it first");
  if (grads.size() != p.size())
    throw std::invalid_argument("cuda::model_backward: grads are for another model");
  if (const std::string diff = c.shape_mismatch(cfg); !diff.empty())
    throw std::invalid_argument("cuda::model_backward: the cache was made for another model (" +
                                diff + ")");
  const Views w = views(cfg, p, c);
  const int P = w.P, d = w.d, n_sub = w.n_sub;
  const std::size_t n = sz(P, d);
  grads.set_zero();

  // from (6): dlogits = (softmax − onehot) / P
  cross_entropy_backward(c.dlogits.data(), c.probs_out.data(), device_ints(c.targets), P,
                         cfg.vocab);
  // from (5): logits = final_normed · Eᵀ → dE += dlogitsᵀ · final_normed; dfinal_normed = dlogits ·
  // E
  gemm(true, false, cfg.vocab, d, P, 1.f, c.dlogits.data(), c.final_normed.data(), 1.f,
       grads.embed);
  float* dfinal_normed = c.dnormed.data();
  float* dfinal = c.dinput.data();
  gemm(false, false, P, d, cfg.vocab, 1.f, c.dlogits.data(), p.embed, 0.f, dfinal_normed);
  rmsnorm_backward(dfinal, grads.final_norm, dfinal_normed, c.final_rinv.data(), w.final_in(),
                   p.final_norm, P, d);

  zero(c.dprims.data(), c.dprims.size());
  // from (4): the final read
  if (stream_mode(cfg.mode))
    copy(c.dh.data(), dfinal, n);  // dh = dfinal
  else
    route_site_backward(w, grads, n_sub, dfinal);

  for (int j = n_sub - 1; j >= 0; --j) {
    const int l = j / 2;
    const DeviceLayer& y = p.layers[static_cast<std::size_t>(l)];
    const DeviceLayer& gy = grads.layers[static_cast<std::size_t>(l)];
    // ∂loss/∂out_j: every later site that read it, plus the stream h_{j+1} = h_j + out_j
    float* dout = c.dout.data();
    copy(dout, w.dprim(j + 1), n);
    if (stream_mode(cfg.mode)) add(dout, c.dh.data(), n);

    // from (3): back through the sub-layer to dnormed_j
    float* dnormed = c.dnormed.data();
    if (j % 2 == 0) {
      linear_backward(c.dattn.data(), gy.wo, dout, c.attn[l].data(), y.wo, P, w.qw, d);
      attention_backward(c.dq.data(), c.dk.data(), c.dv.data(), c.dattn.data(), c.probs[l].data(),
                         c.q[l].data(), c.k[l].data(), c.v[l].data(), c.B, cfg.T, cfg.n_head,
                         cfg.n_kv_head, w.hd);
      rope_backward(c.dq_pre.data(), c.dq.data(), P, cfg.T, cfg.n_head, w.hd);
      rope_backward(c.dk_pre.data(), c.dk.data(), P, cfg.T, cfg.n_kv_head, w.hd);
      linear_backward(dnormed, gy.wq, c.dq_pre.data(), w.normed(j), y.wq, P, d, w.qw);
      linear_backward(c.dtmp.data(), gy.wk, c.dk_pre.data(), w.normed(j), y.wk, P, d, w.kw);
      add(dnormed, c.dtmp.data(), n);
      linear_backward(c.dtmp.data(), gy.wv, c.dv.data(), w.normed(j), y.wv, P, d, w.kw);
      add(dnormed, c.dtmp.data(), n);
    } else {
      mlp_backward(dnormed, gy.w_gate, gy.w_up, gy.w_down, dout, c.gate[l].data(), c.up[l].data(),
                   w.normed(j), y.w_gate, y.w_up, y.w_down, P, d, cfg.ffn);
    }
    // from (2): RMSNorm_j
    float* dinput = c.dinput.data();
    rmsnorm_backward(dinput, j % 2 == 0 ? gy.attn_norm : gy.mlp_norm, dnormed, w.rinv(j),
                     w.input(j), j % 2 == 0 ? y.attn_norm : y.mlp_norm, P, d);
    // from (1): input_j
    switch (cfg.mode) {
      case Mode::Residual:
        add(c.dh.data(), dinput, n);  // input_j = h_j
        break;
      case Mode::Delta: {
        // input_j = h_j + a_j · route_j:  dh += dinput;  da_j += ⟨dinput, route_j⟩;
        // droute = a_j · dinput
        add(c.dh.data(), dinput, n);
        dot_add(grads.delta_gate + j, dinput, c.site_out[static_cast<std::size_t>(j)].data(), n);
        scaled_copy(c.dtmp.data(), dinput, p.delta_gate + j, n);
        route_site_backward(w, grads, j, c.dtmp.data());
        break;
      }
      default:
        route_site_backward(w, grads, j, dinput);
        break;
    }
  }
  // E was read as primitive 0 and as h_0
  float* demb = w.dprim(0);
  if (stream_mode(cfg.mode)) add(demb, c.dh.data(), n);
  embedding_backward(grads.embed, demb, device_ints(c.tokens), P, d, cfg.vocab);
}

// ---- Optimiser --------------------------------------------------------------------------------

double clip_grad_norm(DeviceParams& grads, double max_norm) {
  float* sq = grads.norm_sq.data();
  zero(sq, 1);
  grad_sq_norm(sq, grads.data(), grads.size());
  const double norm = std::sqrt(static_cast<double>(grads.norm_sq.download()[0]));
  if (max_norm > 0 && norm > max_norm)
    scale(grads.data(), static_cast<float>(max_norm / norm), grads.size());
  return norm;
}

void adamw_step(DeviceParams& p, DeviceParams& m, DeviceParams& v, const DeviceParams& grads,
                long step, double lr, const AdamWHyper& hyper) {
  if (m.size() != p.size() || v.size() != p.size() || grads.size() != p.size())
    throw std::invalid_argument("cuda::adamw_step: moments or gradients are for another model");
  for (std::size_t k = 0; k < p.tensors.size(); ++k) {
    const DeviceTensor& t = p.tensors[k];
    adamw_step(t.data, m.tensors[k].data, v.tensors[k].data, grads.tensors[k].data, t.size(), step,
               lr, hyper.beta1, hyper.beta2, hyper.eps, hyper.weight_decay, t.decay);
  }
}

}  // namespace mhar::cuda

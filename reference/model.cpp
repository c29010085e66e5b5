/**
 * @file model.cpp
 * @brief The tiny decoder in five residual modes: forward and backward, CPU reference.
 *
 * Forward, for sub-layers j = 0 … 2L−1 (l = j/2 is the layer):
 *   (1) input_j  formed by the mode (model.h's table)
 *   (2) normed_j = RMSNorm_j(input_j)
 *   (3) out_j    = attention(normed_j) for even j, MLP(normed_j) for odd j
 * then (4) final = the mode's final read, (5) logits = RMSNorm_final(final) · Eᵀ,
 * (6) loss = cross-entropy. The backward walks (6) → (1), sub-layers in reverse.
 *
 * "Primitives" are E and the sub-layer outputs: prims = [E, out_0, …, out_{2L−1}]. Every routing
 * source is a sum of primitives (or the null source ν), so a source's gradient flows back to each
 * primitive it sums.
 *
 * The routing sites run through the cache's Routing (routing_choice.h): the reference's
 * routing.cpp at every site unless the caller chose a faster version (cpu/routing_versions.h).
 */
#include "model.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <sstream>

namespace mhar {

// ---- Modes and configuration ------------------------------------------------------------------

std::string mode_name(Mode m) {
  switch (m) {
    case Mode::Residual:
      return "residual";
    case Mode::AttnRes:
      return "attnres";
    case Mode::Mhar:
      return "mhar";
    case Mode::Block:
      return "block";
    case Mode::Delta:
      return "delta";
  }
  return "?";
}

std::vector<std::string> mode_names() {
  std::vector<std::string> names;
  for (Mode m : kModes) names.push_back(mode_name(m));
  return names;
}

Mode parse_mode(const std::string& name) {
  std::string allowed;
  for (Mode m : kModes) {
    if (mode_name(m) == name) return m;
    allowed += (allowed.empty() ? "" : ", ") + mode_name(m);
  }
  throw ShapeError("unknown residual mode '" + name + "' (allowed: " + allowed + ")");
}

namespace {
/// "1, 2, 4, 8" for d = 8: the divisors below √d and their partners (√d steps, not d: a
/// d of 2³¹ − 4 is answered at once).
std::string divisors_of(int d) {
  std::vector<int> low, high;
  for (int k = 1; static_cast<long>(k) * k <= d; ++k)
    if (d % k == 0) {
      low.push_back(k);
      if (k != d / k) high.push_back(d / k);
    }
  low.insert(low.end(), high.rbegin(), high.rend());
  std::ostringstream os;
  for (std::size_t i = 0; i < low.size(); ++i) os << (i ? ", " : "") << low[i];
  return os.str();
}
}  // namespace

int Config::route_heads() const {
  if (mode == Mode::AttnRes) return 1;
  return H > 0 ? H : n_kv_head;
}

int Config::n_sites() const {
  switch (mode) {
    case Mode::Residual:
      return 0;
    case Mode::Delta:
      return 2 * L;
    default:
      return 2 * L + 1;
  }
}

int Config::layers_per_block() const {
  return (L + n_blocks - 1) / n_blocks;
}

void Config::validate() const {
  const char* w = "config";
  require(vocab >= 2, w, "vocab must be at least 2, got ", vocab);
  require(d >= 1, w, "d must be positive, got ", d);
  require(L >= 1, w, "L must be positive, got ", L);
  require(T >= 1, w, "T (sequence length) must be positive, got ", T);
  require(ffn >= 1, w, "ffn must be positive, got ", ffn);
  require(n_head >= 1 && n_kv_head >= 1, w, "n_head and n_kv_head must be positive, got ", n_head,
          " and ", n_kv_head);
  require(n_head % n_kv_head == 0, w, "n_head = ", n_head,
          " must be a multiple of n_kv_head = ", n_kv_head);
  require(d % n_head == 0, w, "n_head = ", n_head, " must divide d = ", d);
  require(head_dim() % 2 == 0, w, "head width d / n_head = ", head_dim(),
          " must be even (RoPE rotates column pairs)");
  require(H >= 0, w, "routing heads H must be positive (or 0 for the default), got ", H);
  if (routed() && d % route_heads() != 0)  // the list of divisors only when it is printed
    require(false, w, "routing heads H = ", route_heads(), " must divide d = ", d,
            " (allowed: ", divisors_of(d), ")");
  if (mode == Mode::Block || mode == Mode::Delta)
    require(n_blocks >= 1 && n_blocks <= L, w, "n_blocks must be in [1, L = ", L, "], got ",
            n_blocks);
}

// ---- Parameters -----------------------------------------------------------------------------

std::pair<int, int> param_shape(const Config& cfg, const std::string& name) {
  const int d = cfg.d, hd = cfg.head_dim();
  const std::string field = name.substr(name.rfind('.') + 1);  // "layers.3.wq" → "wq"
  if (field == "embed") return {cfg.vocab, d};
  if (field == "wq") return {d, cfg.n_head * hd};
  if (field == "wk" || field == "wv") return {d, cfg.n_kv_head * hd};
  if (field == "wo") return {cfg.n_head * hd, d};
  if (field == "w_gate" || field == "w_up") return {d, cfg.ffn};
  if (field == "w_down") return {cfg.ffn, d};
  if (field.ends_with("norm") || name == "delta.null") return {1, d};  // gains, ν
  if (name == "route.q" || name == "route.g") return {cfg.n_sites(), d};
  if (name == "delta.gate") return {1, 2 * cfg.L};
  throw std::invalid_argument("param_shape: no tensor named '" + name + "'");
}

namespace {

/// The tensors the config's mode has, not yet sized: the layers' tensors are empty, and route.*
/// and delta.* hold one element where the mode has them (for_each_tensor visits those once they
/// are non-empty).
template <typename T>
Params<T> unsized_params(const Config& cfg) {
  Params<T> p;
  p.layers.resize(static_cast<std::size_t>(cfg.L));
  if (cfg.routed()) p.route_q = p.route_g = Mat<T>(1, 1);
  if (cfg.mode == Mode::Delta) p.delta_null = p.delta_gate = Mat<T>(1, 1);
  return p;
}

}  // namespace

void for_each_shape(const Config& cfg,
                    const std::function<void(const std::string&, int, int, bool)>& f) {
  unsized_params<float>(cfg).for_each([&](const std::string& name, const Mat<float>&, bool decay) {
    const auto [rows, cols] = param_shape(cfg, name);
    f(name, rows, cols, decay);
  });
}

template <typename T>
Params<T> zero_params(const Config& cfg) {
  cfg.validate();
  Params<T> p = unsized_params<T>(cfg);
  p.for_each([&](const std::string& name, Mat<T>& m, bool) {
    const auto [rows, cols] = param_shape(cfg, name);
    m = Mat<T>::Zero(rows, cols);
  });
  return p;
}

template <typename T>
Params<T> init_params(const Config& cfg, Rng& rng) {
  Params<T> p = zero_params<T>(cfg);
  p.for_each([&](const std::string& name, Mat<T>& m, bool decay) {
    if (decay) {
      m = rng.normal_matrix<T>(m.rows(), m.cols(), 0.0, 0.02);  // matrices: N(0, 0.02²)
    } else if (name.ends_with("norm") || name == "route.g") {
      m.setOnes();  // gains: one
    }               // route.q, delta.null, delta.gate: zero
  });
  return p;
}

template <typename To, typename From>
Params<To> cast_params(const Params<From>& p) {
  Params<To> out;
  out.layers.resize(p.layers.size());
  for_each_tensor([](const std::string&, bool, const Mat<From>& from,
                     Mat<To>& to) { to = from.template cast<To>(); },
                  p, out);
  return out;
}

template <typename T>
long count_params(const Params<T>& p) {
  long n = 0;
  p.for_each([&](const std::string&, const Mat<T>& m, bool) { n += static_cast<long>(m.size()); });
  return n;
}

template <typename T>
double clip_grad_norm(Params<T>& grads, double max_norm) {
  std::vector<Mat<T>*> all;
  grads.for_each([&](const std::string&, Mat<T>& g, bool) { all.push_back(&g); });
  return clip_grad_norm<T>(std::span<Mat<T>* const>(all), max_norm);
}

template <typename T>
void adamw_step(Params<T>& p, Params<T>& m, Params<T>& v, const Params<T>& grads, long step,
                double lr, const AdamWHyper& hyper) {
  const std::size_t L = p.layers.size();
  if (m.layers.size() != L || v.layers.size() != L || grads.layers.size() != L)
    throw std::invalid_argument("adamw_step: moments or gradients are for another model");
  for_each_tensor(
      [&](const std::string& name, bool decay, Mat<T>& w, Mat<T>& mw, Mat<T>& vw,
          const Mat<T>& gw) {
        if (mw.rows() != w.rows() || mw.cols() != w.cols() || vw.rows() != w.rows() ||
            vw.cols() != w.cols() || gw.rows() != w.rows() || gw.cols() != w.cols())
          throw std::invalid_argument("adamw_step: " + name +
                                      ": moments or gradient of another shape");
        adamw_step(w, mw, vw, gw, step, lr, hyper, decay);
      },
      p, m, v, grads);
}

// ---- Which sources each routing site reads --------------------------------------------------

// Primitive index of the null source ν (delta mode): model.h's kNullSource.
namespace {
constexpr int kNull = kNullSource;

std::string prim_name(int k) {
  if (k == kNull) return "null";
  if (k == 0) return "emb";
  const int j = k - 1;
  return (j % 2 == 0 ? "attn" : "mlp") + std::to_string(j / 2);
}
}  // namespace

/*
 * The sources of routing site j as groups of primitives (0 = E, k + 1 = out_k, kNull = ν):
 *   attnres, mhar: {0}, {1}, …, {j}
 *   block:  {0}, one group per completed block, the current block's partial sum (if non-empty)
 *   delta:  {ν} then as block
 * Site 2L is the final read.
 */
std::vector<SourceGroup> site_groups(const Config& cfg, int j) {
  std::vector<SourceGroup> groups;
  if (cfg.mode == Mode::AttnRes || cfg.mode == Mode::Mhar) {
    for (int i = 0; i <= j; ++i) groups.push_back({prim_name(i), {i}});
    return groups;
  }
  const int n_sub = 2 * cfg.L;
  const int per = 2 * cfg.layers_per_block();  // sub-layers per block
  const int n_complete = (j == n_sub) ? (n_sub + per - 1) / per : j / per;
  if (cfg.mode == Mode::Delta) groups.push_back({"null", {kNull}});
  groups.push_back({"emb", {0}});  // b_0 = E
  for (int n = 0; n < n_complete; ++n) {
    SourceGroup g{"block" + std::to_string(n + 1), {}};
    for (int k = n * per; k < std::min((n + 1) * per, n_sub); ++k) g.prims.push_back(k + 1);
    groups.push_back(g);
  }
  if (j < n_sub && j > n_complete * per) {  // the partial sum of the current block
    SourceGroup g{"partial", {}};
    for (int k = n_complete * per; k < j; ++k) g.prims.push_back(k + 1);
    groups.push_back(g);
  }
  return groups;
}

namespace {

/// Materialises site j's sources from the primitives (block and delta modes).
template <typename T>
std::vector<Mat<T>> gather_sources(const std::vector<SourceGroup>& groups,
                                   const std::vector<Mat<T>>& prims, const Params<T>& p) {
  const auto P = prims[0].rows();
  std::vector<Mat<T>> s;
  for (const auto& g : groups) {
    Mat<T> m = Mat<T>::Zero(P, prims[0].cols());
    for (int k : g.prims) {
      if (k == kNull)
        m.rowwise() += RowVec<T>(p.delta_null.row(0));  // ν broadcast over positions
      else
        m += prims[k];
    }
    s.push_back(std::move(m));
  }
  return s;
}

/// Sends each source's gradient back to the primitives it sums (ν: summed over positions).
template <typename T>
void scatter_source_grads(std::vector<Mat<T>>& dprims, Params<T>& grads,
                          const std::vector<SourceGroup>& groups,
                          const std::vector<Mat<T>>& dsources) {
  for (std::size_t i = 0; i < groups.size(); ++i)
    for (int k : groups[i].prims) {
      if (k == kNull)
        grads.delta_null += dsources[i].colwise().sum();
      else
        dprims[k] += dsources[i];
    }
}

bool stream_mode(Mode m) {
  return m == Mode::Residual || m == Mode::Delta;
}

template <typename T>
void check_tokens(const Config& cfg, const std::vector<int>& tokens, int B, const char* what) {
  require(B >= 1, "model", "batch B must be positive, got ", B);
  require(tokens.size() == static_cast<std::size_t>(B) * cfg.T, "model", what, " has ",
          tokens.size(), " entries, expected B·T = ", B * cfg.T);
}

/// Steps (1)–(5) up to the final norm's output, filling the cache. With kv_only, it stops once
/// the last layer's keys and values are in c.k and c.v (model_keys_values).
template <typename T>
void forward_hidden(const Config& cfg, const Params<T>& p, const std::vector<int>& tokens, int B,
                    Cache<T>& c, bool kv_only = false) {
  cfg.validate();
  check_tokens<T>(cfg, tokens, B, "tokens");
  require(static_cast<int>(p.layers.size()) == cfg.L && p.embed.rows() == cfg.vocab &&
              p.embed.cols() == cfg.d && p.route_q.rows() == (cfg.routed() ? cfg.n_sites() : 0),
          "model", "parameters do not match the config (", mode_name(cfg.mode), ", L = ", cfg.L,
          ", d = ", cfg.d, ")");
  const int L = cfg.L, n_sub = 2 * L, H = cfg.route_heads();
  const Routing<T>* const chosen = c.routing;  // kept: the cache is otherwise made anew
  c = Cache<T>();
  c.routing = chosen;
  const Routing<T>& routing = chosen ? *chosen : reference_routing<T>();
  c.B = B;
  c.tokens = tokens;
  c.prims.reserve(n_sub + 1);
  c.prims.emplace_back();
  embedding_forward(c.prims[0], tokens, p.embed);  // prims[0] = E[tokens]
  Mat<T> h = c.prims[0];                           // the standard stream (residual, delta)
  c.inputs.resize(n_sub);
  c.norm_rinv.resize(n_sub);
  c.normed.resize(n_sub);
  c.q.resize(L), c.k.resize(L), c.v.resize(L), c.attn.resize(L), c.probs.resize(L), c.mlp.resize(L);
  c.site_sources.resize(cfg.n_sites());
  c.site_out.resize(cfg.n_sites());
  c.route.resize(cfg.n_sites());

  // AttnRes and MHAR: site s reads primitives 0 … s. A routing with a stack form (the fast
  // CPU versions, cpu/routing_stack.h) runs the whole stack's forward at once: each primitive's
  // logits at every later site are computed when it is written, and a site routes over
  // [E, out_0 … out_{s−1}] without a copy. The reference has none: it routes site by site.
  std::unique_ptr<StackForward<T>> stack;
  if (cfg.mode == Mode::AttnRes || cfg.mode == Mode::Mhar)
    stack = routing.stack_forward(p.route_q, p.route_g, H, std::span<RoutingSaved<T>>(c.route));
  if (stack) stack->add_source(0, c.prims[0]);

  // Site by site: route site s over its gathered sources into c.site_out[s].
  auto route_site = [&](int s) -> const Mat<T>& {
    c.site_sources[s] = gather_sources(site_groups(cfg, s), c.prims, p);
    routing.forward(c.site_out[s], c.route[s], c.site_sources[s], p.route_q.row(s),
                    p.route_g.row(s), H);
    return c.site_out[s];
  };

  for (int j = 0; j < n_sub; ++j) {
    const int l = j / 2;
    const LayerParams<T>& y = p.layers[l];
    // (1) input_j
    switch (cfg.mode) {
      case Mode::Residual:
        c.inputs[j] = std::move(h);  // h_j, kept for the backward; h_{j+1} is a new matrix
        break;
      case Mode::Delta:
        c.inputs[j] = h + p.delta_gate(0, j) * route_site(j);
        break;
      default:  // block, attnres, mhar; a stack's site writes input_j (one matrix, not a copy)
        if (stack)
          stack->site(j, c.inputs[j]);
        else
          c.inputs[j] = route_site(j);
        break;
    }
    // (2) normed_j = RMSNorm_j(input_j)
    rmsnorm_forward<T>(c.normed[j], c.norm_rinv[j], c.inputs[j],
                       (j % 2 == 0 ? y.attn_norm : y.mlp_norm).row(0));
    // (3) out_j
    Mat<T> out;
    if (j % 2 == 0) {
      // attention: k (with RoPE) and v, then q (with RoPE); causal GQA; output projection.
      // k and v come first because they are all a decoder's prefill keeps of the last layer.
      Mat<T> q, k;
      linear_forward(k, c.normed[j], y.wk);
      linear_forward(c.v[l], c.normed[j], y.wv);
      rope_forward(c.k[l], k, cfg.T, cfg.n_kv_head);
      if (kv_only && l == L - 1) return;  // model_keys_values: the prefill has what it needs
      linear_forward(q, c.normed[j], y.wq);
      rope_forward(c.q[l], q, cfg.T, cfg.n_head);
      attention_forward(c.attn[l], c.probs[l], c.q[l], c.k[l], c.v[l], B, cfg.T, cfg.n_head,
                        cfg.n_kv_head);
      linear_forward(out, c.attn[l], y.wo);
    } else {
      mlp_forward(out, c.mlp[l], c.normed[j], y.w_gate, y.w_up, y.w_down);
    }
    if (cfg.mode == Mode::Residual)
      h = c.inputs[j] + out;  // h_{j+1} = h_j + out_j (h_j was moved into inputs[j])
    else if (cfg.mode == Mode::Delta)
      h += out;
    c.prims.push_back(std::move(out));
    if (stack) stack->add_source(j + 1, c.prims.back());
  }
  // (4) the final read
  if (stack)
    stack->site(n_sub, c.final_in);
  else if (stream_mode(cfg.mode))
    c.final_in = std::move(h);
  else
    c.final_in = route_site(n_sub);
  // (5) final norm
  rmsnorm_forward<T>(c.final_normed, c.final_rinv, c.final_in, p.final_norm.row(0));
}

}  // namespace

// ---- Forward ----------------------------------------------------------------------------------

template <typename T>
T model_forward(const Config& cfg, const Params<T>& p, const std::vector<int>& tokens,
                const std::vector<int>& targets, int B, Cache<T>* cache) {
  Cache<T> local;
  Cache<T>& c = cache ? *cache : local;
  check_tokens<T>(cfg, targets, B, "targets");
  forward_hidden(cfg, p, tokens, B, c);
  c.targets = targets;
  // (5) logits = RMSNorm_final(final) · Eᵀ  (tied head);  (6) loss
  const Mat<T> logits = c.final_normed * p.embed.transpose();
  c.loss = cross_entropy_forward(c.probs_out, logits, targets);
  return c.loss;
}

template <typename T>
Mat<T> model_logits(const Config& cfg, const Params<T>& p, const std::vector<int>& tokens, int B,
                    Cache<T>* cache) {
  Cache<T> local;
  Cache<T>& c = cache ? *cache : local;
  forward_hidden(cfg, p, tokens, B, c);
  return c.final_normed * p.embed.transpose();
}

template <typename T>
void model_keys_values(const Config& cfg, const Params<T>& p, const std::vector<int>& tokens,
                       Cache<T>& cache) {
  forward_hidden(cfg, p, tokens, 1, cache, /*kv_only=*/true);
}

// ---- Backward ---------------------------------------------------------------------------------

template <typename T>
void model_backward(Params<T>& grads, const Config& cfg, const Params<T>& p, const Cache<T>& c) {
  require(!c.targets.empty() && c.probs_out.rows() > 0, "model_backward",
          "the cache holds no loss: run model_forward with a cache first");
  const int L = cfg.L, n_sub = 2 * L, H = cfg.route_heads();
  const auto P = c.prims[0].rows();
  const Routing<T>& routing = c.routing ? *c.routing : reference_routing<T>();
  grads = zero_params<T>(cfg);

  // from (6): dlogits = (softmax − onehot) / P
  Mat<T> dlogits;
  cross_entropy_backward(dlogits, c.probs_out, c.targets);
  // from (5): logits = final_normed · Eᵀ → dE += dlogitsᵀ · final_normed; dfinal_normed = dlogits ·
  // E
  grads.embed.noalias() += dlogits.transpose() * c.final_normed;
  const Mat<T> dfinal_normed = dlogits * p.embed;
  Mat<T> dfinal;
  rmsnorm_backward<T>(dfinal, grads.final_norm.row(0), dfinal_normed, c.final_rinv, c.final_in,
                      p.final_norm.row(0));

  // AttnRes and MHAR: site s reads primitives 0 … s. A routing with a stack form runs the
  // whole stack's backward source by source: each site's dout is kept, and ∂loss/∂out_j is
  // computed when sub-layer j's backward needs it, from every site that read out_j. Otherwise
  // (the reference, block, delta) each site's source gradients are added into dprims as the
  // sites come; residual has no sites.
  std::unique_ptr<StackBackward<T>> stack;
  if (cfg.mode == Mode::AttnRes || cfg.mode == Mode::Mhar)
    stack = routing.stack_backward(std::span<const Mat<T>>(c.prims), H);
  const bool by_source = stack != nullptr;
  std::vector<Mat<T>> dsites;  // by source: ∂loss/∂(site s's output), kept for the stack
  std::vector<Mat<T>> dprims;
  if (by_source)
    dsites.resize(cfg.n_sites());
  else if (cfg.mode != Mode::Residual)
    dprims.assign(n_sub + 1, Mat<T>::Zero(P, cfg.d));
  Mat<T> dh;  // ∂loss/∂h_{j+1} for the stream modes (from ∂loss/∂final below)

  // ∂loss/∂prim_k, once every site that read it is done: what the sites gave (the stack sums
  // it now; site by site, it was added up in dprims[k], not read again) plus the stream's share.
  auto prim_gradient = [&](int k) {
    Mat<T> g;
    if (by_source)
      stack->source_gradient(k, g);
    else if (!dprims.empty())
      g = std::move(dprims[k]);
    if (stream_mode(cfg.mode)) {
      if (g.size() == 0)
        g = dh;
      else
        g += dh;
    }
    return g;
  };

  // The backward of one routing site s, given ∂loss/∂(its output).
  auto route_site_backward = [&](int s, Mat<T> dsite) {
    if (by_source) {
      // attnres, mhar: site s's output is input_s (the final read's, final_in), which the
      // RMSNorm's backward has just read
      const Mat<T>& out = s < n_sub ? c.inputs[s] : c.final_in;
      dsites[s] = std::move(dsite);
      stack->add_site(s, dsites[s], out, c.route[s], p.route_q.row(s), p.route_g.row(s));
    } else {
      const auto groups = site_groups(cfg, s);
      std::vector<Mat<T>> dsrc(groups.size(), Mat<T>::Zero(P, cfg.d));
      routing.backward(dsrc, grads.route_q.row(s), grads.route_g.row(s), dsite, c.site_out[s],
                       c.route[s], c.site_sources[s], p.route_q.row(s), p.route_g.row(s), H);
      scatter_source_grads(dprims, grads, groups, dsrc);
    }
  };

  // from (4): the final read
  if (stream_mode(cfg.mode))
    dh = std::move(dfinal);
  else
    route_site_backward(n_sub, std::move(dfinal));

  for (int j = n_sub - 1; j >= 0; --j) {
    const int l = j / 2;
    const LayerParams<T>& y = p.layers[l];
    LayerParams<T>& gy = grads.layers[l];
    // ∂loss/∂out_j: every later site that read it, plus the stream h_{j+1} = h_j + out_j
    const Mat<T> dout = prim_gradient(j + 1);

    // from (3): back through the sub-layer to dnormed_j
    Mat<T> dnormed;
    if (j % 2 == 0) {
      Mat<T> dattn, dq, dk, dv, dq_pre, dk_pre, tmp;
      linear_backward(dattn, gy.wo, dout, c.attn[l], y.wo);
      attention_backward(dq, dk, dv, dattn, c.probs[l], c.q[l], c.k[l], c.v[l], c.B, cfg.T,
                         cfg.n_head, cfg.n_kv_head);
      rope_backward(dq_pre, dq, cfg.T, cfg.n_head);
      rope_backward(dk_pre, dk, cfg.T, cfg.n_kv_head);
      linear_backward(dnormed, gy.wq, dq_pre, c.normed[j], y.wq);
      linear_backward(tmp, gy.wk, dk_pre, c.normed[j], y.wk);
      dnormed += tmp;
      linear_backward(tmp, gy.wv, dv, c.normed[j], y.wv);
      dnormed += tmp;
    } else {
      mlp_backward(dnormed, gy.w_gate, gy.w_up, gy.w_down, dout, c.mlp[l], c.normed[j], y.w_gate,
                   y.w_up, y.w_down);
    }
    // from (2): RMSNorm_j
    Mat<T> dinput;
    rmsnorm_backward<T>(dinput, (j % 2 == 0 ? gy.attn_norm : gy.mlp_norm).row(0), dnormed,
                        c.norm_rinv[j], c.inputs[j],
                        (j % 2 == 0 ? y.attn_norm : y.mlp_norm).row(0));
    // from (1): input_j
    switch (cfg.mode) {
      case Mode::Residual:
        dh += dinput;
        break;  // input_j = h_j
      case Mode::Delta: {
        // input_j = h_j + a_j · route_j:  dh += dinput;  da_j += ⟨dinput, route_j⟩;  droute = a_j ·
        // dinput
        dh += dinput;
        grads.delta_gate(0, j) += dinput.cwiseProduct(c.site_out[j]).sum();
        route_site_backward(j, p.delta_gate(0, j) * dinput);
        break;
      }
      default:
        route_site_backward(j, std::move(dinput));
        break;
    }
  }
  // E was read as primitive 0 and as h_0
  const Mat<T> demb = prim_gradient(0);
  if (by_source) stack->parameter_gradients(grads.route_q, grads.route_g);
  embedding_backward(grads.embed, demb, c.tokens);
}

// ---- Names, conversion ------------------------------------------------------------------------

std::vector<std::string> site_names(const Config& cfg) {
  std::vector<std::string> names;
  for (int s = 0; s < cfg.n_sites(); ++s)
    names.push_back(s == 2 * cfg.L ? "final" : prim_name(s + 1));
  return names;
}

std::vector<std::string> site_source_names(const Config& cfg, int site) {
  require(site >= 0 && site < cfg.n_sites(), "site_source_names", "site ", site, " outside [0, ",
          cfg.n_sites(), ")");
  std::vector<std::string> names;
  for (const auto& g : site_groups(cfg, site)) names.push_back(g.name);
  return names;
}

template <typename T>
Params<T> convert_residual_to_delta(Config& delta_cfg, const Config& residual_cfg,
                                    const Params<T>& residual, int H, int n_blocks) {
  require(residual_cfg.mode == Mode::Residual, "convert",
          "the source model must be 'residual', got '", mode_name(residual_cfg.mode), "'");
  delta_cfg = residual_cfg;
  delta_cfg.mode = Mode::Delta;
  delta_cfg.H = H;
  delta_cfg.n_blocks = n_blocks;
  delta_cfg.validate();
  Params<T> p = residual;
  p.route_q = Mat<T>::Zero(delta_cfg.n_sites(), delta_cfg.d);  // q = 0
  p.route_g = Mat<T>::Ones(delta_cfg.n_sites(), delta_cfg.d);  // g = 1
  p.delta_null = Mat<T>::Zero(1, delta_cfg.d);                 // ν = 0
  p.delta_gate = Mat<T>::Zero(1, 2 * delta_cfg.L);             // a_j = 0: identity at conversion
  return p;
}

#define MHAR_INSTANTIATE(T)                                                                       \
  template Params<T> zero_params<T>(const Config&);                                               \
  template Params<T> init_params<T>(const Config&, Rng&);                                         \
  template long count_params<T>(const Params<T>&);                                                \
  template double clip_grad_norm<T>(Params<T>&, double);                                          \
  template void adamw_step<T>(Params<T>&, Params<T>&, Params<T>&, const Params<T>&, long, double, \
                              const AdamWHyper&);                                                 \
  template T model_forward<T>(const Config&, const Params<T>&, const std::vector<int>&,           \
                              const std::vector<int>&, int, Cache<T>*);                           \
  template Mat<T> model_logits<T>(const Config&, const Params<T>&, const std::vector<int>&, int,  \
                                  Cache<T>*);                                                     \
  template void model_keys_values<T>(const Config&, const Params<T>&, const std::vector<int>&,    \
                                     Cache<T>&);                                                  \
  template void model_backward<T>(Params<T>&, const Config&, const Params<T>&, const Cache<T>&);  \
  template Params<T> convert_residual_to_delta<T>(Config&, const Config&, const Params<T>&, int,  \
                                                  int);
MHAR_INSTANTIATE(float)
MHAR_INSTANTIATE(double)
#undef MHAR_INSTANTIATE
template Params<float> cast_params<float, double>(const Params<double>&);
template Params<double> cast_params<double, float>(const Params<float>&);
template Params<float> cast_params<float, float>(const Params<float>&);
template Params<double> cast_params<double, double>(const Params<double>&);

}  // namespace mhar

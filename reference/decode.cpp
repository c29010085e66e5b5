/**
 * @file decode.cpp
 * @brief Decoding with a cache, CPU reference: model_forward's steps (1)–(5) for one position.
 *
 * decode_step follows model.cpp's forward_hidden line by line, with P = 1 row (the new position
 * t). Two things differ, both in attention:
 *   - RoPE rotates the single row by its own position t (rope_forward_at, with the angles from
 *     the state's table, made once), not by row mod T;
 *   - the row's k and v are written into the state at row t, and its q attends over rows 0 … t
 *     of the state: the causal row t of attention_forward, scores = q_h · k_hᵀ / √hd, softmax,
 *     times v_h.
 * Everything else (embedding, routing at every site, RMSNorm, W_o, MLP, final read, LM head) is
 * the same per-position function as in the batched forward, applied to one row (routing by the
 * state's Routing, site by site: a stack form would save nothing for one row); routing reads only
 * this position's own sources, so nothing of it is kept between steps.
 */
#include "decode.h"

#include <cmath>

namespace mhar {

long decode_state_scalars(const Config& cfg) {
  return 2L * cfg.L * cfg.T * cfg.n_kv_head * cfg.head_dim();
}

template <typename T>
DecodeState<T> decode_start(const Config& cfg) {
  cfg.validate();
  DecodeState<T> s;
  const int kv = cfg.n_kv_head * cfg.head_dim();
  s.k.assign(cfg.L, Mat<T>::Zero(cfg.T, kv));
  s.v.assign(cfg.L, Mat<T>::Zero(cfg.T, kv));
  s.rope = rope_table<T>(cfg.T, cfg.head_dim());
  return s;
}

namespace {

/// Whether `state` was made by decode_start for this config: L layers of T × (n_kv_head · hd)
/// keys and values, and a RoPE table for T positions of width hd.
template <typename T>
bool made_for(const DecodeState<T>& state, const Config& cfg) {
  const int kv = cfg.n_kv_head * cfg.head_dim();
  if (static_cast<int>(state.k.size()) != cfg.L || static_cast<int>(state.v.size()) != cfg.L)
    return false;
  for (int l = 0; l < cfg.L; ++l)
    if (state.k[l].rows() != cfg.T || state.k[l].cols() != kv || state.v[l].rows() != cfg.T ||
        state.v[l].cols() != kv)
      return false;
  return state.rope.cos.rows() == cfg.T && state.rope.cos.cols() == cfg.head_dim() / 2;
}

}  // namespace

template <typename T>
RowVec<T> decode_prefill(const Config& cfg, const Params<T>& p, DecodeState<T>& state,
                         const std::vector<int>& tokens) {
  const int n = static_cast<int>(tokens.size());
  require(n >= 1 && n <= cfg.T, "decode_prefill", "the prompt must hold 1 … T = ", cfg.T,
          " bytes, got ", n);
  // before the state is touched, so that a bad prompt leaves it as it was
  require_in_vocabulary(tokens, cfg.vocab, "decode_prefill");
  // A state already made for this config keeps its storage and RoPE table (sample restarts its
  // window this way every T/2 bytes); rows n … T − 1 are left as they are, never read before a
  // step writes them.
  if (!made_for(state, cfg)) {
    const Routing<T>* const routing = state.routing;  // the caller's choice, kept
    state = decode_start<T>(cfg);
    state.routing = routing;
  }
  // Positions 0 … n − 2: the batched forward over them as one sequence, only as far as the last
  // layer's keys and values (model_keys_values). Nothing after those is needed of these
  // positions: later positions read their keys and values, never their outputs.
  if (n > 1) {
    Config c = cfg;
    c.T = n - 1;
    Cache<T> cache;
    cache.routing = state.routing;
    model_keys_values<T>(c, p, std::vector<int>(tokens.begin(), tokens.end() - 1), cache);
    for (int l = 0; l < cfg.L; ++l) {
      state.k[l].topRows(n - 1) = cache.k[l];  // after RoPE
      state.v[l].topRows(n - 1) = cache.v[l];
    }
  }
  state.n = n - 1;
  // Position n − 1, the last byte: a step, which gives the logits of the next byte.
  return decode_step<T>(cfg, p, state, tokens.back());
}

namespace {

bool stream_mode(Mode m) {
  return m == Mode::Residual || m == Mode::Delta;
}

/// Site s's sources at this position, each the sum of its group's primitives (block, delta).
template <typename T>
std::vector<Mat<T>> gather_row_sources(const Config& cfg, int s, const std::vector<Mat<T>>& prims,
                                       const Params<T>& p) {
  std::vector<Mat<T>> sources;
  for (const SourceGroup& g : site_groups(cfg, s)) {
    Mat<T> m = Mat<T>::Zero(1, cfg.d);
    for (int k : g.prims) m += (k == kNullSource ? p.delta_null : prims[k]);
    sources.push_back(std::move(m));
  }
  return sources;
}

/// Row t of causal grouped-query attention: q (1 × n_head·hd) against rows 0 … t of the cache,
/// into out (1 × n_head·hd, =); a: scratch for one head's scores.
template <typename T>
void attend_row(Mat<T>& out, RowVec<T>& a, const Mat<T>& q, const Mat<T>& k, const Mat<T>& v, int t,
                int n_head, int n_kv_head) {
  const int hd = static_cast<int>(q.cols()) / n_head;
  const int G = n_head / n_kv_head;  // query heads per key/value head
  const T scale = T(1) / std::sqrt(T(hd));
  out.resize(1, q.cols());
  for (int h = 0; h < n_head; ++h) {
    const int kv = h / G;
    const auto qh = q.block(0, h * hd, 1, hd);
    const auto kh = k.block(0, kv * hd, t + 1, hd);  // positions 0 … t
    const auto vh = v.block(0, kv * hd, t + 1, hd);
    // scores_s = q_h · k_h[s] / √hd for s ≤ t; softmax over s (max subtracted)
    a.noalias() = (qh * kh.transpose()) * scale;
    a = (a.array() - a.maxCoeff()).exp().matrix();
    a /= a.sum();
    // out_h = Σ_s a_s · v_h[s]
    out.block(0, h * hd, 1, hd).noalias() = a * vh;
  }
}

}  // namespace

template <typename T>
RowVec<T> decode_step(const Config& cfg, const Params<T>& p, DecodeState<T>& state, int token) {
  const int t = state.n;  // this byte's position
  require(t >= 0 && t < cfg.T, "decode_step", "the state already holds T = ", cfg.T,
          " positions: the window is full (start again from the bytes to keep, decode_prefill)");
  require(made_for(state, cfg), "decode_step",
          "the state was made for another config (use decode_start(cfg))");
  require(static_cast<int>(p.layers.size()) == cfg.L && p.embed.rows() == cfg.vocab &&
              p.embed.cols() == cfg.d && p.route_q.rows() == (cfg.routed() ? cfg.n_sites() : 0),
          "decode_step", "parameters do not match the config (", mode_name(cfg.mode),
          ", L = ", cfg.L, ", d = ", cfg.d, ")");
  const int n_sub = 2 * cfg.L, H = cfg.route_heads();
  // The step's working rows live in state.scratch only to be reused (see DecodeState::Scratch);
  // nothing in them is read before this step writes it.
  auto& s = state.scratch;

  // This position's primitives [E, out_0 … out_{2L−1}], 1 × d each.
  std::vector<Mat<T>>& prims = s.prims;
  prims.resize(n_sub + 1);
  embedding_forward(prims[0], {token}, p.embed);  // E[token]
  Mat<T>& h = s.h;                                // the stream (residual, delta)
  h = prims[0];

  // Routing site j over this position's own sources: no other position is read.
  const Routing<T>& routing = state.routing ? *state.routing : reference_routing<T>();
  auto route_site = [&](int j) -> const Mat<T>& {
    if (cfg.mode == Mode::AttnRes || cfg.mode == Mode::Mhar)
      routing.forward(s.routed, s.routing, std::span<const Mat<T>>(prims.data(), j + 1),
                      p.route_q.row(j), p.route_g.row(j), H);  // [E, out_0 … out_{j−1}]
    else {
      const std::vector<Mat<T>> sources = gather_row_sources(cfg, j, prims, p);  // grouped
      routing.forward(s.routed, s.routing, sources, p.route_q.row(j), p.route_g.row(j), H);
    }
    return s.routed;
  };

  for (int j = 0; j < n_sub; ++j) {
    const int l = j / 2;
    const LayerParams<T>& y = p.layers[l];
    // (1) input_j, formed by the mode
    Mat<T>& input = s.input;
    switch (cfg.mode) {
      case Mode::Residual:
        input = h;
        break;
      case Mode::Delta:
        input = h + p.delta_gate(0, j) * route_site(j);
        break;
      default:
        input = route_site(j);
        break;
    }
    // (2) normed_j = RMSNorm_j(input_j)
    rmsnorm_forward<T>(s.normed, s.rinv, input, (j % 2 == 0 ? y.attn_norm : y.mlp_norm).row(0));
    // (3) out_j, written as primitive j + 1
    Mat<T>& out = prims[j + 1];
    if (j % 2 == 0) {
      // attention: this row's q, k (RoPE at position t) and v; k, v join the cache at row t
      linear_forward(s.q, s.normed, y.wq);
      linear_forward(s.k, s.normed, y.wk);
      linear_forward(s.v, s.normed, y.wv);
      rope_forward_at(s.q_rot, s.q, t, cfg.n_head, state.rope);
      rope_forward_at(s.k_rot, s.k, t, cfg.n_kv_head, state.rope);
      state.k[l].row(t) = s.k_rot.row(0);
      state.v[l].row(t) = s.v.row(0);
      attend_row(s.attn, s.scores, s.q_rot, state.k[l], state.v[l], t, cfg.n_head, cfg.n_kv_head);
      linear_forward(out, s.attn, y.wo);
    } else {
      mlp_forward(out, s.mlp, s.normed, y.w_gate, y.w_up, y.w_down);
    }
    if (stream_mode(cfg.mode)) h += out;  // h_{j+1} = h_j + out_j
  }
  // (4) the final read; (5) final norm and the tied LM head
  const Mat<T>& final_in = stream_mode(cfg.mode) ? h : route_site(n_sub);
  rmsnorm_forward<T>(s.final_normed, s.rinv, final_in, p.final_norm.row(0));
  state.n = t + 1;
  return s.final_normed * p.embed.transpose();
}

#define MHAR_INSTANTIATE(T)                                                              \
  template DecodeState<T> decode_start<T>(const Config&);                                \
  template RowVec<T> decode_prefill<T>(const Config&, const Params<T>&, DecodeState<T>&, \
                                       const std::vector<int>&);                         \
  template RowVec<T> decode_step<T>(const Config&, const Params<T>&, DecodeState<T>&, int);
MHAR_INSTANTIATE(float)
MHAR_INSTANTIATE(double)
#undef MHAR_INSTANTIATE

}  // namespace mhar

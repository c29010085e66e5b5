/**
 * @file model.h
 * @ingroup reference
 * @brief The tiny Qwen3-style decoder (docs/design.md §2) in all five residual modes, CPU
 * reference: configuration, parameters, forward (loss), backward (every parameter gradient).
 *
 * Byte-level vocabulary (256). Pre-norm blocks: RMSNorm → causal grouped-query attention with
 * RoPE, and RMSNorm → SwiGLU MLP. Tied embedding / LM head. Sub-layer j is attention for j = 2l
 * and MLP for j = 2l + 1; out_j = f_j(RMSNorm_j(input_j)). Only how input_j (and the final read)
 * is formed depends on the mode:
 *
 *   residual  input_j = E + Σ_{k<j} out_k                       final: the same stream
 *   attnres   input_j = route_1 ([E, out_0 … out_{j−1}])         final: route over all 2L+1
 *   mhar      input_j = route_H ([E, out_0 … out_{j−1}])         final: likewise, H heads
 *   block     input_j = route_H ([b_0 = E, completed blocks, partial sum of this block])
 *   delta     input_j = h_j + a_j · route_H ([ν, b_0, completed blocks, partial])   final: h
 */
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "layers.h"
#include "optim.h"
#include "routing_choice.h"
#include "tensor.h"

namespace mhar {

enum class Mode { Residual, AttnRes, Mhar, Block, Delta };
/// Every mode, in the order the docs and --help list them.
inline constexpr Mode kModes[] = {Mode::Residual, Mode::AttnRes, Mode::Mhar, Mode::Block,
                                  Mode::Delta};

/// "residual", "attnres", "mhar", "block", "delta".
std::string mode_name(Mode m);
/// mode_name of every mode in kModes.
std::vector<std::string> mode_names();
/// Parses a mode name; throws ShapeError listing the allowed names.
Mode parse_mode(const std::string& name);

struct Config {
  int vocab = 256;    ///< bytes
  int d = 128;        ///< model width
  int L = 4;          ///< transformer blocks (2L sub-layers)
  int n_head = 4;     ///< query heads (hd = d / n_head)
  int n_kv_head = 2;  ///< key/value heads (grouped-query attention)
  int ffn = 352;      ///< SwiGLU hidden width
  int T = 128;        ///< tokens per sequence
  Mode mode = Mode::Mhar;
  int H = 0;         ///< routing heads; 0 = default (n_kv_head; attnres always uses 1)
  int n_blocks = 2;  ///< blocks for `block` and `delta`

  /// Throws ShapeError with a message naming the field and what is allowed.
  void validate() const;
  int head_dim() const { return d / n_head; }
  /// Routing heads actually used: 1 for attnres, H (or n_kv_head when H = 0) otherwise.
  int route_heads() const;
  /// Routing sites: 0 (residual), 2L + 1 (attnres, mhar, block), 2L (delta: the final read is h).
  int n_sites() const;
  /// Layers per block, ceil(L / n_blocks).
  int layers_per_block() const;
  bool routed() const { return mode != Mode::Residual; }
};

template <typename T>
struct LayerParams {
  Mat<T> attn_norm;  ///< 1 × d
  Mat<T> wq;         ///< d × (n_head·hd)
  Mat<T> wk;         ///< d × (n_kv_head·hd)
  Mat<T> wv;         ///< d × (n_kv_head·hd)
  Mat<T> wo;         ///< (n_head·hd) × d
  Mat<T> mlp_norm;   ///< 1 × d
  Mat<T> w_gate;     ///< d × ffn
  Mat<T> w_up;       ///< d × ffn
  Mat<T> w_down;     ///< ffn × d
};

/// Every parameter tensor of the model. Names (for checkpoints and gradient files) are given by
/// for_each: "embed", "layers.<l>.<name>", "final_norm", "route.q", "route.g", "delta.null",
/// "delta.gate".
template <typename T>
struct Params {
  Mat<T> embed;  ///< vocab × d, tied with the LM head
  std::vector<LayerParams<T>> layers;
  Mat<T> final_norm;  ///< 1 × d
  Mat<T> route_q;     ///< n_sites × d pseudo-queries (routed modes; init 0)
  Mat<T> route_g;     ///< n_sites × d key gains (routed modes; init 1)
  Mat<T> delta_null;  ///< 1 × d null source ν (delta; init 0)
  Mat<T> delta_gate;  ///< 1 × 2L gates a_j (delta; init 0)

  /// Calls f(name, tensor, decay) for each tensor the mode uses, in a fixed order; decay says
  /// whether AdamW's weight decay applies (matrices yes; gains, routing, gates no).
  template <typename F>
  void for_each(F&& f);
  template <typename F>
  void for_each(F&& f) const;
};

/// Parameters with the docs/design.md §2 initialisation: N(0, 0.02²) matrices, ones for gains,
/// zeros for routing queries, ones for key gains, zero null source and gates.
template <typename T>
Params<T> init_params(const Config& cfg, Rng& rng);
/// rows × cols of the tensor called `name` (a for_each name: "layers.3.wq", "route.q") in config
/// cfg: the one place parameter shapes are written down. Throws std::invalid_argument for an
/// unknown name.
std::pair<int, int> param_shape(const Config& cfg, const std::string& name);
/// Calls f(name, rows, cols, decay) for every tensor of config cfg, in for_each order, without
/// allocating them (memory estimates before a model is built).
void for_each_shape(const Config& cfg,
                    const std::function<void(const std::string&, int, int, bool)>& f);
/// Parameters of the config's shapes, all zero (gradient buffers, optimiser moments).
template <typename T>
Params<T> zero_params(const Config& cfg);
/// Parameters converted to another scalar type.
template <typename To, typename From>
Params<To> cast_params(const Params<From>& p);
/// Number of scalars.
template <typename T>
long count_params(const Params<T>& p);

/// Global-norm clipping of every gradient tensor (clip_grad_norm of optim.h over all of them);
/// returns the norm before clipping.
template <typename T>
double clip_grad_norm(Params<T>& grads, double max_norm);
/// One AdamW step (optim.h) on every tensor, with weight decay where for_each says so (matrices).
/// m, v and grads must have p's shapes; throws std::invalid_argument otherwise.
template <typename T>
void adamw_step(Params<T>& p, Params<T>& m, Params<T>& v, const Params<T>& grads, long step,
                double lr, const AdamWHyper& hyper);

/// Everything the forward keeps for the backward (and for heatmaps and diagnostics).
template <typename T>
struct Cache {
  /// How the routing sites run, chosen before the forward and kept by it: null is the reference
  /// (routing.h at every site); cpu/routing_versions.h has the fast versions.
  const Routing<T>* routing = nullptr;
  int B = 0;
  std::vector<int> tokens, targets;
  std::vector<Mat<T>> prims;          ///< [E, out_0 … out_{2L−1}]: 2L + 1 of P × d
  std::vector<Mat<T>> inputs;         ///< input_j, 2L of P × d
  std::vector<Vec<T>> norm_rinv;      ///< RMSNorm_j's 1/RMS
  std::vector<Mat<T>> normed;         ///< RMSNorm_j(input_j)
  std::vector<Mat<T>> q, k, v, attn;  ///< per layer: after RoPE, and attention output (pre-W_o)
  std::vector<std::vector<Mat<T>>> probs;         ///< per layer: attention probabilities
  std::vector<MlpSaved<T>> mlp;                   ///< per layer
  std::vector<std::vector<Mat<T>>> site_sources;  ///< site by site: the sources each site read
  std::vector<Mat<T>> site_out;        ///< site by site: each site's routing output (a stack
                                       ///< routes straight into inputs[j] and final_in)
  std::vector<RoutingSaved<T>> route;  ///< routed modes: α and r per site
  Mat<T> final_in;                     ///< input of the final norm
  Vec<T> final_rinv;
  Mat<T> final_normed;
  Mat<T> probs_out;  ///< softmax of the logits, P × vocab
  T loss = 0;
};

/**
 * @brief Forward pass on B sequences: tokens and targets are B·T bytes each (sequence-major).
 * Returns the mean cross-entropy; fills `cache` when it is not null. The sites route by
 * cache->routing (kept), or by the reference when cache or its routing is null.
 */
template <typename T>
T model_forward(const Config& cfg, const Params<T>& p, const std::vector<int>& tokens,
                const std::vector<int>& targets, int B, Cache<T>* cache);

/// Logits (P × vocab) of the forward, without a loss (for sampling and evaluation).
template <typename T>
Mat<T> model_logits(const Config& cfg, const Params<T>& p, const std::vector<int>& tokens, int B,
                    Cache<T>* cache = nullptr);

/**
 * @brief The forward of one sequence (tokens: cfg.T bytes) only as far as every layer's keys and
 * values, for a decoder's prefill (decode.h): cache.k and cache.v (after RoPE) are those of
 * model_logits, and the rest of the last layer, the final read and the head are not computed.
 */
template <typename T>
void model_keys_values(const Config& cfg, const Params<T>& p, const std::vector<int>& tokens,
                       Cache<T>& cache);

/// Backward pass: grads (=) receives ∂loss/∂θ for every parameter, from the forward's cache.
template <typename T>
void model_backward(Params<T>& grads, const Config& cfg, const Params<T>& p, const Cache<T>& cache);

/// The primitive index site_groups uses for the null source ν (delta mode).
inline constexpr int kNullSource = -1;

/// One routing source of a site, as the primitives it sums (0 = E, k + 1 = out_k, kNullSource = ν).
struct SourceGroup {
  std::string name;        ///< "emb", "attn0", "mlp0", "block1", "partial", "null"
  std::vector<int> prims;  ///< the primitives this source sums
};

/**
 * @brief The sources routing site `site` reads (site 2L is the final read), in order:
 *   attnres, mhar: {E}, {out_0}, …, {out_{site−1}};
 *   block: {E}, one group per completed block, the current block's partial sum (if non-empty);
 *   delta: {ν}, then as block.
 */
std::vector<SourceGroup> site_groups(const Config& cfg, int site);

/// Describes source i of routing site s ("emb", "attn0", "mlp0", "block1", "partial", "null", …).
std::vector<std::string> site_source_names(const Config& cfg, int site);
/// Names the routing sites ("attn0", "mlp0", …, "final").
std::vector<std::string> site_names(const Config& cfg);

/**
 * @brief A `delta` model that computes exactly the logits of a trained `residual` model: the
 * same weights, routing q = 0, g = 1, null source ν = 0 and every gate a_j = 0.
 */
template <typename T>
Params<T> convert_residual_to_delta(Config& delta_cfg, const Config& residual_cfg,
                                    const Params<T>& residual, int H, int n_blocks);

// ---- template members ------------------------------------------------------------------------

/**
 * The one list of parameter tensors: their names, their order and which take weight decay.
 * Calls f(name, decay, a.FIELD, rest.FIELD...) for every tensor that `a` holds; each of
 * `rest` is a structure with the same field names (Params of another scalar type, the GPU's
 * DeviceParams) and as many layers as `a`. Params::for_each, cast_params and the GPU model's
 * pointer table all walk this list, so a new tensor is added here once.
 */
template <typename F, typename A, typename... Rest>
void for_each_tensor(F&& f, A& a, Rest&... rest) {
  f(std::string("embed"), true, a.embed, rest.embed...);
  for (std::size_t l = 0; l < a.layers.size(); ++l) {
    const std::string pre = "layers." + std::to_string(l) + ".";
    f(pre + "attn_norm", false, a.layers[l].attn_norm, rest.layers[l].attn_norm...);
    f(pre + "wq", true, a.layers[l].wq, rest.layers[l].wq...);
    f(pre + "wk", true, a.layers[l].wk, rest.layers[l].wk...);
    f(pre + "wv", true, a.layers[l].wv, rest.layers[l].wv...);
    f(pre + "wo", true, a.layers[l].wo, rest.layers[l].wo...);
    f(pre + "mlp_norm", false, a.layers[l].mlp_norm, rest.layers[l].mlp_norm...);
    f(pre + "w_gate", true, a.layers[l].w_gate, rest.layers[l].w_gate...);
    f(pre + "w_up", true, a.layers[l].w_up, rest.layers[l].w_up...);
    f(pre + "w_down", true, a.layers[l].w_down, rest.layers[l].w_down...);
  }
  f(std::string("final_norm"), false, a.final_norm, rest.final_norm...);
  if (a.route_q.size() > 0) {  // routed modes only
    f(std::string("route.q"), false, a.route_q, rest.route_q...);
    f(std::string("route.g"), false, a.route_g, rest.route_g...);
  }
  if (a.delta_gate.size() > 0) {  // delta only
    f(std::string("delta.null"), false, a.delta_null, rest.delta_null...);
    f(std::string("delta.gate"), false, a.delta_gate, rest.delta_gate...);
  }
}

template <typename T>
template <typename F>
void Params<T>::for_each(F&& f) {
  for_each_tensor([&](const std::string& name, bool decay, Mat<T>& m) { f(name, m, decay); },
                  *this);
}

template <typename T>
template <typename F>
void Params<T>::for_each(F&& f) const {
  for_each_tensor([&](const std::string& name, bool decay, const Mat<T>& m) { f(name, m, decay); },
                  *this);
}

}  // namespace mhar

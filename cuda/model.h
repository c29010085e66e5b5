/**
 * @file model.h
 * @ingroup cuda
 * @brief The tiny decoder in all five residual modes on the GPU: the CUDA twin of
 *        reference/model.h — parameters in device memory, forward (loss), backward (every
 *        parameter gradient), clipping and AdamW, so that a whole training step stays on the GPU.
 *
 * The same Config, the same parameter names and order (Params::for_each), the same steps as
 * reference/model.cpp, each calling the CUDA twin of the reference function it mirrors:
 * cuda/layers.h (RMSNorm, RoPE, SwiGLU middle, embedding, cross-entropy), cuda/attention.h,
 * cuda/linear.h (cuBLAS products), cuda/routing.h (depth routing), cuda/optim.h (AdamW,
 * clipping), cuda/tensor_ops.h (the Eigen one-liners of model.cpp).
 *
 * Host code (g++), like the tests and mhar-toy: this header uses reference types (Config,
 * Params<float>) for uploads and downloads, and device pointers inside.
 *
 * Memory: DeviceParams holds every tensor in one allocation (so clipping is one reduction);
 * DeviceCache holds every activation the backward needs for a batch of B sequences, allocated
 * once and reused while B stays the same. An allocation that does not fit throws
 * std::runtime_error naming the bytes needed, the bytes free and what to shrink.
 */
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "cuda/device.h"
#include "cuda/routing.h"
#include "reference/model.h"
#include "reference/optim.h"

namespace mhar::cuda {

/// Device pointers to one transformer block's tensors (reference LayerParams).
struct DeviceLayer {
  float* attn_norm = nullptr;
  float* wq = nullptr;
  float* wk = nullptr;
  float* wv = nullptr;
  float* wo = nullptr;
  float* mlp_norm = nullptr;
  float* w_gate = nullptr;
  float* w_up = nullptr;
  float* w_down = nullptr;
};

/// One tensor of DeviceParams: its name (reference Params::for_each), place and shape.
struct DeviceTensor {
  std::string name;
  float* data = nullptr;
  int rows = 0, cols = 0;
  bool decay = false;  ///< AdamW weight decay applies
  std::size_t size() const { return static_cast<std::size_t>(rows) * cols; }
};

/**
 * @brief Every parameter tensor of a model (reference Params<float>) in one device allocation,
 *        tensors in Params::for_each order. Move-only.
 */
class DeviceParams {
 public:
  DeviceParams() = default;
  /// The config's shapes, every element zero.
  explicit DeviceParams(const Config& cfg);
  /// A device copy of host parameters (their shapes must be the config's).
  DeviceParams(const Config& cfg, const Params<float>& host);

  /// Copies host → device; throws std::invalid_argument when a shape differs.
  void upload(const Params<float>& host);
  /// Copies device → host.
  Params<float> download() const;
  /// Every tensor back to back, copied to the host (Params::for_each order).
  std::vector<float> download_flat() const { return storage_.download(); }
  /// Sets every element to zero.
  void set_zero();

  /// Total scalars.
  std::size_t size() const { return storage_.size(); }
  /// The whole allocation (all tensors back to back).
  float* data() { return storage_.data(); }
  const float* data() const { return storage_.data(); }

  float* embed = nullptr;  ///< vocab × d
  std::vector<DeviceLayer> layers;
  float* final_norm = nullptr;        ///< d
  float* route_q = nullptr;           ///< n_sites × d (routed modes), else null
  float* route_g = nullptr;           ///< n_sites × d (routed modes), else null
  float* delta_null = nullptr;        ///< d (delta), else null
  float* delta_gate = nullptr;        ///< 2L (delta), else null
  std::vector<DeviceTensor> tensors;  ///< every tensor, in Params::for_each order
  DeviceBuffer norm_sq;  ///< 1 float: clip_grad_norm's accumulator (no allocation per step)

 private:
  Config cfg_;
  DeviceBuffer storage_;
};

/**
 * @brief Everything the GPU forward keeps for the backward (reference Cache<float>), plus the
 *        backward's own work buffers, for batches of B sequences.
 *
 * Layout of the big arrays: prims is [E, out_0 … out_{2L−1}], (2L + 1) × P × d back to back, so
 * that routing site s of attnres and mhar reads its sources, the first s + 1 primitives, with
 * no copy (cuda/routing.h's N × P × d layout).
 */
class DeviceCache {
 public:
  DeviceCache() = default;
  /// Allocates for B sequences of cfg.T tokens (throws with the sizes when it does not fit).
  DeviceCache(const Config& cfg, int B);

  int B = 0;  ///< sequences (0: nothing allocated yet)
  int P = 0;  ///< positions, B · T
  /// The model shape every buffer below was sized for: model_forward and model_backward refuse
  /// a cache whose shape differs from their config's (it would read and write out of bounds).
  Config cfg;
  /// Routing kernel version of every site (Warp only where version_supports(Warp, d, H)).
  RoutingVersion routing = RoutingVersion::Fused;
  DeviceBuffer tokens, targets;             ///< P ints each (upload_ints layout)
  DeviceBuffer prims;                       ///< (2L + 1) × P × d
  std::vector<DeviceBuffer> stream_inputs;  ///< residual, delta: input_j, 2L of P × d
  DeviceBuffer norm_rinv;                   ///< 2L × P
  DeviceBuffer normed;                      ///< 2L × P × d
  std::vector<DeviceBuffer> q, k, v, attn;  ///< per layer, after RoPE; attention output
  std::vector<DeviceBuffer> probs;          ///< per layer, B · n_head × T × T
  std::vector<DeviceBuffer> gate, up;       ///< per layer, P × ffn (MlpSaved)
  std::vector<DeviceBuffer> site_sources;   ///< block, delta: site s's N_s × P × d sources
  std::vector<DeviceBuffer> site_out;       ///< routed modes: site s's output, P × d
  std::vector<DeviceBuffer> alpha;          ///< routed modes: site s's α, N_s × P × H
  DeviceBuffer stream;                      ///< delta: the standard stream h
  DeviceBuffer final_in_own;                ///< residual, delta: the final read
  DeviceBuffer final_rinv, final_normed;    ///< P; P × d
  DeviceBuffer logits, probs_out;           ///< P × vocab each
  DeviceBuffer loss;                        ///< 1 float
  // backward work buffers
  DeviceBuffer dprims;                           ///< (2L + 1) × P × d
  DeviceBuffer dh, dout, dnormed, dinput, dtmp;  ///< P × d each
  DeviceBuffer dattn, dq, dq_pre;                ///< P × (n_head · hd) each
  DeviceBuffer dk, dv, dk_pre;                   ///< P × (n_kv_head · hd) each
  DeviceBuffer dsources;                         ///< block, delta: the widest site's N × P × d
  DeviceBuffer dlogits;                          ///< P × vocab
  bool has_loss = false;                         ///< a model_forward with targets filled this cache

  /// Bytes this cache holds on the device.
  std::size_t bytes() const;
  /// Bytes a cache for (cfg, B) needs, without allocating.
  static std::size_t bytes_needed(const Config& cfg, int B);
  /// "" when this cache was sized for `other`'s shape (vocab, d, L, n_head, n_kv_head, ffn, T,
  /// mode, routing heads, n_blocks); otherwise each field that differs, "d 32 (cache) vs 64, …".
  std::string shape_mismatch(const Config& other) const;

  /// Fills every buffer with NaN bytes (0xFF), so that a step reading what no earlier step
  /// wrote shows up as a NaN loss or gradient (the checks call it before a forward).
  void poison();

  /// Site s's α (N_s × P × H, cuda/routing.h layout), copied to the host.
  std::vector<float> download_alpha(int site) const;
};

/**
 * @brief GPU forward on B sequences (reference model_forward): tokens and targets are B·T bytes
 *        each, on the host; they are uploaded into the cache. Returns the mean cross-entropy.
 *
 * Reallocates `cache` when it is empty or was made for another B (keeping its routing version);
 * throws std::invalid_argument when it was made for another model shape (shape_mismatch).
 * Synchronises (the loss comes back).
 */
float model_forward(const Config& cfg, const DeviceParams& p, const std::vector<int>& tokens,
                    const std::vector<int>& targets, int B, DeviceCache& cache);

/**
 * @brief GPU backward (reference model_backward): grads (=) receives ∂loss/∂θ for every
 *        parameter, from the forward's cache. Asynchronous: nothing waits for the GPU. Throws
 *        std::invalid_argument when the cache holds no loss or was made for another shape.
 */
void model_backward(DeviceParams& grads, const Config& cfg, const DeviceParams& p,
                    DeviceCache& cache);

/**
 * @brief Global-norm clipping over every gradient (reference clip_grad_norm): returns the norm
 *        before clipping; scales every gradient by max_norm / norm when norm > max_norm > 0.
 */
double clip_grad_norm(DeviceParams& grads, double max_norm);

/**
 * @brief One AdamW step on every tensor (reference adamw_step, per tensor with its own decay
 *        flag): p, m, v updated in place from grads.
 */
void adamw_step(DeviceParams& p, DeviceParams& m, DeviceParams& v, const DeviceParams& grads,
                long step, double lr, const AdamWHyper& hyper);

}  // namespace mhar::cuda

/**
 * @file decode.h
 * @ingroup reference
 * @brief Decoding with a cache: the model's forward one position at a time, in all five residual
 *        modes, CPU reference (docs/decode.md).
 *
 * model_forward computes every position of a window at once. To generate text byte by byte it
 * would recompute the whole window for each new byte. Here the forward is split by position:
 *
 *   decode_prefill  runs the ordinary batched forward over a prompt, as far as the last layer's
 *                   keys and values, keeps them per layer (after RoPE), and steps the last byte;
 *   decode_step     takes one new byte at position t = state.n and computes only that position:
 *                   its embedding E, then for j = 0 … 2L−1 routing site j over this position's
 *                   own sources [E, out_0 … out_{j−1}] (grouped by the mode), RMSNorm, and for
 *                   attention q, k, v of this position, with k, v appended to the cache and q
 *                   attending over cached positions 0 … t; for the MLP the SwiGLU of this row;
 *                   then the final read and the tied LM head. It returns the byte's logits.
 *
 * **What the state holds, per mode.** Routing is per position: site j of position t mixes only
 * position t's own earlier sub-layer outputs (at most 2L + 1 vectors of width d, scratch of one
 * step), never another position's. So routing, in every mode, adds **nothing** to the state
 * across positions; only attention looks back in time. The state is the same in all five modes
 * (residual, attnres, mhar, block, delta):
 *
 *   k[l], v[l]   for each layer l: T × (n_kv_head · hd), rows 0 … n−1 filled (k after RoPE)
 *
 * that is 2 · L · T · n_kv_head · hd scalars (decode_state_scalars). Default model (L 4, d 128,
 * 4 query / 2 key-value heads, hd 32, T 128): 2·4·128·2·32 = 65,536 floats = 256 KiB. The
 * paper's 100M shape (L 12, d 512, 8 query / 4 key-value heads, hd 64, T 2048): 2·12·2048·4·64 =
 * 12,582,912 floats = 48 MiB. A step's scratch (the 2L + 1 sources of its position, one
 * attention row per head) holds nothing from one step to the next; it is kept in the state
 * (DecodeState::Scratch) only to be reused without allocating.
 *
 * The step's logits equal those of model_logits on the same prefix (tests/test_decode.cpp: to
 * 1e-12 in double, every mode, every position). RoPE positions are those of the state: the
 * prefill's first byte is position 0, as in model_logits on the prefix.
 */
#pragma once

#include <vector>

#include "model.h"

namespace mhar {

/// What decoding keeps across positions: each layer's keys and values (after RoPE).
template <typename T>
struct DecodeState {
  /// How the routing sites run (model.h's Cache::routing): null is the reference. Set it after
  /// decode_start; decode_prefill and decode_step keep it.
  const Routing<T>* routing = nullptr;
  int n = 0;                 ///< positions held; the next byte goes to position n (< T)
  std::vector<Mat<T>> k, v;  ///< per layer: T × (n_kv_head·hd); rows [0, n) are filled
  /// RoPE's cos and sin for positions 0 … T − 1, made by decode_start (once a prefill), so a
  /// step needs no pow or sincos. A constant of the config (T × hd/2 twice), not a memory of
  /// past positions, so it is not counted in decode_state_scalars.
  RopeTable<T> rope;

  /// One step's working rows, kept between steps only so that a step does not allocate them
  /// again (Eigen reuses a matrix of the right size): their values mean nothing once a step has
  /// returned, and they are not counted in decode_state_scalars. The names are decode_step's.
  struct Scratch {
    std::vector<Mat<T>> prims;  ///< [E, out_0 … out_{2L−1}] of this position, 1 × d each
    Mat<T> h, input, normed, q, k, v, q_rot, k_rot, attn, routed, final_normed;
    Vec<T> rinv;
    RowVec<T> scores;
    RoutingSaved<T> routing;
    MlpSaved<T> mlp;
  } scratch;
};

/// Scalars the state holds when full: 2 · L · T · n_kv_head · hd (the same in every mode).
long decode_state_scalars(const Config& cfg);

/// An empty state (n = 0) with room for T positions, and its RoPE table.
template <typename T>
DecodeState<T> decode_start(const Config& cfg);

/**
 * @brief Fills `state` (=) from a prompt of 1 … T bytes and returns the logits (1 × vocab) of the
 * byte after it. Bytes 0 … n − 2 go through one batched forward (model_keys_values: model_logits's
 * forward as far as the last layer's keys and values, all a later position reads of them); the
 * last byte is a decode_step. A state already made for this config keeps its storage and RoPE
 * table (its old rows past the prompt are never read); any other is made again (decode_start).
 * Throws ShapeError on an empty prompt, one longer than T, or a byte outside the vocabulary.
 */
template <typename T>
RowVec<T> decode_prefill(const Config& cfg, const Params<T>& p, DecodeState<T>& state,
                         const std::vector<int>& tokens);

/**
 * @brief One new byte at position state.n: appends its keys and values to the state and returns
 * its logits (1 × vocab), computing only this position. Throws ShapeError when the state already
 * holds T positions (the window is full: prefill the bytes to keep, decode_prefill) or on a byte
 * outside the vocabulary.
 */
template <typename T>
RowVec<T> decode_step(const Config& cfg, const Params<T>& p, DecodeState<T>& state, int token);

}  // namespace mhar

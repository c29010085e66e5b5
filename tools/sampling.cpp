/**
 * @file sampling.cpp
 * @brief draw_byte: the next byte, greedy or among the top k at a temperature.
 */
#include "sampling.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <stdexcept>

namespace mhar::toy {

namespace {

/// A key that sorts like (logit, −byte): the float's bits made to order as unsigned integers
/// (negative floats flipped whole, positive ones with the sign bit set), then the byte, lower
/// bytes first on equal logits. Distinct for distinct bytes, so every ranking is total. −0 and +0
/// are equal logits, so −0 is taken as +0 first.
std::uint64_t rank_key(float logit, int byte) {
  const auto u = std::bit_cast<std::uint32_t>(logit == 0.0f ? 0.0f : logit);
  const std::uint32_t ordered = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (static_cast<std::uint64_t>(ordered) << 32) | static_cast<std::uint32_t>(255 - byte);
}

int key_byte(std::uint64_t key) {
  return 255 - static_cast<int>(key & 0xffffffffu);
}

}  // namespace

int draw_byte(const RowVec<float>& logits, int top_k, double temperature, std::mt19937_64& gen) {
  const int V = static_cast<int>(logits.cols());
  require(V >= 1 && V <= 256, "draw_byte", V, " logits, expected 1 … 256 (bytes)");
  if (!logits.allFinite())
    throw std::runtime_error(
        "sample: the model's logits are not finite (its weights overflow on this context)");
  if (temperature == 0) {
    int best = 0;
    logits.maxCoeff(&best);  // the first of equal maxima
    return best;
  }
  std::array<std::uint64_t, 256> keys;
  for (int i = 0; i < V; ++i) keys[i] = rank_key(logits(i), i);
  const int k = (top_k == 0 || top_k > V) ? V : top_k;
  // the k highest keys, then those k in descending order
  std::nth_element(keys.begin(), keys.begin() + (k - 1), keys.begin() + V, std::greater<>());
  std::sort(keys.begin(), keys.begin() + k, std::greater<>());
  std::array<double, 256> w;
  const float best = logits(key_byte(keys[0]));
  for (int i = 0; i < k; ++i) w[i] = std::exp((logits(key_byte(keys[i])) - best) / temperature);
  return key_byte(keys[std::discrete_distribution<int>(w.begin(), w.begin() + k)(gen)]);
}

}  // namespace mhar::toy

/**
 * @file sampling.h
 * @brief The next byte from a model's logits: greedy, or drawn among the k most likely at a
 *        temperature (`mhar-toy sample`).
 */
#pragma once

#include <random>

#include "tensor.h"

namespace mhar::toy {

/**
 * @brief The byte `mhar-toy sample` emits after `logits` (1 × vocab, vocab ≤ 256, all finite).
 *
 * temperature = 0: the most likely byte (the lowest one on a tie). Otherwise the k most likely
 * bytes (k = top_k, or all when top_k is 0 or above vocab), ranked by logit with the lower byte
 * first on a tie, get weights exp((logit − best logit) / temperature) in that rank order, and
 * std::discrete_distribution draws one from `gen`.
 *
 * The ranking is the same as sorting all the bytes by logit and keeping the first k, so a seed
 * draws what it drew before this function (which sorted with std::partial_sort, 7 µs a byte);
 * it selects the k first (std::nth_element), then sorts only them, on 64-bit keys that order
 * like (logit, −byte). Integer keys, not a comparator on the logits: with a comparator the same
 * selection and sort took as long as the partial_sort did (perf, 10,000 bytes). Throws ShapeError
 * for none or more than 256 logits, std::runtime_error when one is not finite.
 */
int draw_byte(const RowVec<float>& logits, int top_k, double temperature, std::mt19937_64& gen);

}  // namespace mhar::toy

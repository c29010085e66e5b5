/**
 * @file test_sampling.cpp
 * @brief draw_byte (tools/sampling.h) against the plain rule written here: sort every byte by
 *        logit (lower byte first on a tie), keep the first k, weight them, draw with the same
 *        generator. Ties, every k, greedy, and refusals.
 */
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "sampling.h"

using namespace mhar;
using namespace mhar::toy;

namespace {

/// The rule of sampling.h, the slow and obvious way.
int plain_draw(const RowVec<float>& logits, int top_k, double temperature, std::mt19937_64& gen) {
  const int V = static_cast<int>(logits.cols());
  std::vector<int> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return logits(a) > logits(b); });  // ties: lower byte first
  if (temperature == 0) return order[0];
  const int k = (top_k == 0 || top_k > V) ? V : top_k;
  std::vector<double> w(k);
  for (int i = 0; i < k; ++i) w[i] = std::exp((logits(order[i]) - logits(order[0])) / temperature);
  return order[std::discrete_distribution<int>(w.begin(), w.end())(gen)];
}

}  // namespace

TEST_CASE("draw_byte draws what sorting every byte and keeping the top k draws", "[sampling]") {
  std::mt19937_64 make(2026);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  long draws = 0, tied = 0;
  for (int trial = 0; trial < 300; ++trial) {
    RowVec<float> logits(256);
    // every third trial rounds the logits to whole numbers: many ties, some across the k-th rank
    for (int i = 0; i < 256; ++i)
      logits(i) = trial % 3 == 0 ? std::round(normal(make)) : normal(make);
    if (trial % 3 == 0) ++tied;
    for (int k : {0, 1, 2, 7, 40, 255, 256, 300}) {
      for (double temperature : {0.0, 0.3, 0.8, 2.0}) {
        CAPTURE(trial, k, temperature);
        std::mt19937_64 a(trial * 31 + k), b(trial * 31 + k);
        for (int rep = 0; rep < 3; ++rep) {
          REQUIRE(draw_byte(logits, k, temperature, a) == plain_draw(logits, k, temperature, b));
          ++draws;
        }
        CHECK(a() == b());  // the same random numbers consumed
      }
    }
  }
  CHECK(draws == 300L * 8 * 4 * 3);
  CHECK(tied == 100);
}

TEST_CASE("draw_byte: top k = 1 and temperature 0 take the best byte, the lowest on a tie",
          "[sampling]") {
  RowVec<float> logits = RowVec<float>::Constant(256, -1.0f);
  logits(200) = 4.0f;
  logits(17) = 4.0f;
  logits(90) = 3.9f;
  std::mt19937_64 gen(1);
  CHECK(draw_byte(logits, 0, 0.0, gen) == 17);
  CHECK(draw_byte(logits, 1, 0.8, gen) == 17);
  for (int rep = 0; rep < 50; ++rep) {  // k = 3: only the three best bytes, all of them in time
    const int b = draw_byte(logits, 3, 5.0, gen);
    CHECK((b == 17 || b == 200 || b == 90));
  }
  const RowVec<float> short_vocab = RowVec<float>::LinSpaced(10, 0.0f, 1.0f);
  CHECK(draw_byte(short_vocab, 0, 0.0, gen) == 9);
  CHECK(draw_byte(short_vocab, 40, 0.1, gen) < 10);
}

TEST_CASE("draw_byte: non-finite logits and wrong sizes get a clear error",
          "[sampling][bad-input]") {
  std::mt19937_64 gen(1);
  RowVec<float> logits = RowVec<float>::Zero(256);
  logits(5) = std::numeric_limits<float>::quiet_NaN();
  CHECK_THROWS_WITH(draw_byte(logits, 40, 0.8, gen), Catch::Contains("not finite"));
  logits(5) = std::numeric_limits<float>::infinity();
  CHECK_THROWS_WITH(draw_byte(logits, 0, 0.0, gen), Catch::Contains("not finite"));
  CHECK_THROWS_WITH(draw_byte(RowVec<float>::Zero(257), 40, 0.8, gen), Catch::Contains("257"));
  CHECK_THROWS_WITH(draw_byte(RowVec<float>(0), 40, 0.8, gen), Catch::Contains("0 logits"));
}

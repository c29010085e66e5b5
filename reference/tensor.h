/**
 * @file tensor.h
 * @ingroup reference
 * @brief The few types every reference function shares: row-major Eigen matrices, a seeded
 *        random generator, and the argument checks that turn bad shapes into clear exceptions.
 *
 * Dimension letters (docs/design.md §1), used in every shape comment of this project:
 *   P positions (= B·T), d model width, N sources at a routing site, H routing heads,
 *   K = d / H head width, L transformer blocks, B batch, T tokens per sequence.
 *
 * Plain Eigen, no SIMD tricks; everything is templated on the scalar type T so that the same
 * code trains in float and is gradient-checked in double.
 */
#pragma once

#include <Eigen/Dense>
#include <cstdint>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>

namespace mhar {

/// A row-major matrix: one row per position (P × d), or a weight (in × out).
template <typename T>
using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
/// A column vector (per-position values such as 1/RMS).
template <typename T>
using Vec = Eigen::Matrix<T, Eigen::Dynamic, 1>;
/// A row vector (per-column parameters such as a gain or a pseudo-query).
template <typename T>
using RowVec = Eigen::Matrix<T, 1, Eigen::Dynamic>;

/// Bad arguments (shapes, sizes, modes): the message says what is wrong and what is allowed.
class ShapeError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

namespace detail {
inline void concat(std::ostringstream&) {}
template <typename A, typename... Rest>
void concat(std::ostringstream& os, const A& a, const Rest&... rest) {
  os << a;
  concat(os, rest...);
}
}  // namespace detail

/// Throws ShapeError("<where>: <message...>") unless `ok`.
template <typename... Msg>
void require(bool ok, const char* where, const Msg&... msg) {
  if (ok) return;
  std::ostringstream os;
  os << where << ": ";
  detail::concat(os, msg...);
  throw ShapeError(os.str());
}

/// Throws unless m is rows × cols; names the argument in the message.
template <typename Derived>
void require_shape(const Eigen::MatrixBase<Derived>& m, Eigen::Index rows, Eigen::Index cols,
                   const char* where, const char* name) {
  require(m.rows() == rows && m.cols() == cols, where, name, " must be ", rows, "×", cols, ", got ",
          m.rows(), "×", m.cols());
}

/// Deterministic random numbers (Eigen's Random() uses std::rand; we never do).
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : engine_(seed) {}
  double normal(double mean = 0.0, double stddev = 1.0) {
    return std::normal_distribution<double>(mean, stddev)(engine_);
  }
  double uniform(double lo = 0.0, double hi = 1.0) {
    return std::uniform_real_distribution<double>(lo, hi)(engine_);
  }
  std::uint64_t below(std::uint64_t n) {
    return std::uniform_int_distribution<std::uint64_t>(0, n - 1)(engine_);
  }
  std::mt19937_64& engine() { return engine_; }

  /// rows × cols with entries N(mean, stddev²).
  template <typename T>
  Mat<T> normal_matrix(Eigen::Index rows, Eigen::Index cols, double mean = 0.0,
                       double stddev = 1.0) {
    Mat<T> m(rows, cols);
    for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = static_cast<T>(normal(mean, stddev));
    return m;
  }

 private:
  std::mt19937_64 engine_;
};

}  // namespace mhar

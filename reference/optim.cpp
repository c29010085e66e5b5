/**
 * @file optim.cpp
 * @brief AdamW and gradient clipping, CPU reference (formulas in optim.h).
 */
#include "optim.h"

#include <cmath>

namespace mhar {

template <typename T>
void adamw_step(Mat<T>& param, Mat<T>& m, Mat<T>& v, const Mat<T>& grad, long step, double lr,
                const AdamWHyper& hyper, bool decay) {
  require(step >= 1, "adamw", "step counts from 1, got ", step);
  require_shape(grad, param.rows(), param.cols(), "adamw", "grad");
  require_shape(m, param.rows(), param.cols(), "adamw", "m");
  require_shape(v, param.rows(), param.cols(), "adamw", "v");
  const T b1 = static_cast<T>(hyper.beta1), b2 = static_cast<T>(hyper.beta2);
  // θ ← θ − lr · wd · θ
  if (decay) param *= static_cast<T>(1.0 - lr * hyper.weight_decay);
  // m ← β1 m + (1 − β1) γ;  v ← β2 v + (1 − β2) γ²
  m = b1 * m + (T(1) - b1) * grad;
  v = b2 * v + (T(1) - b2) * grad.cwiseProduct(grad);
  // θ ← θ − lr · m̂ / (sqrt(v̂) + eps)
  const T c1 = static_cast<T>(1.0 - std::pow(hyper.beta1, static_cast<double>(step)));
  const T c2 = static_cast<T>(1.0 - std::pow(hyper.beta2, static_cast<double>(step)));
  param.array() -=
      static_cast<T>(lr) * (m.array() / c1) / ((v.array() / c2).sqrt() + static_cast<T>(hyper.eps));
}

template <typename T>
double clip_grad_norm(std::span<Mat<T>* const> grads, double max_norm) {
  double sq = 0;
  for (const Mat<T>* g : grads) sq += static_cast<double>(g->squaredNorm());
  const double norm = std::sqrt(sq);
  if (max_norm > 0 && norm > max_norm) {
    const T s = static_cast<T>(max_norm / norm);
    for (Mat<T>* g : grads) *g *= s;
  }
  return norm;
}

template void adamw_step<float>(Mat<float>&, Mat<float>&, Mat<float>&, const Mat<float>&, long,
                                double, const AdamWHyper&, bool);
template void adamw_step<double>(Mat<double>&, Mat<double>&, Mat<double>&, const Mat<double>&, long,
                                 double, const AdamWHyper&, bool);
template double clip_grad_norm<float>(std::span<Mat<float>* const>, double);
template double clip_grad_norm<double>(std::span<Mat<double>* const>, double);

}  // namespace mhar

// Configure-time measurement (cmake/ChooseCpuArch.cmake): the single-thread Eigen SGEMM rate at
// the model's shapes, built once per candidate -march level and run on the build machine, so that
// the build picks the level that is faster on this CPU, not the one that is merely wider.
// Prints one number: the best GFLOP/s over the shapes' geometric mean, after a warm-up.
#include <Eigen/Dense>

#include <chrono>
#include <cmath>
#include <cstdio>

namespace {

// Best rate of C = A · B (m × k by k × n) over repeats that fill about `budget_s` seconds.
double gflops(int m, int k, int n, double budget_s) {
  Eigen::MatrixXf a = Eigen::MatrixXf::Constant(m, k, 0.5f);
  Eigen::MatrixXf b = Eigen::MatrixXf::Constant(k, n, 0.25f);
  for (int i = 0; i < a.size(); ++i) a.data()[i] += 1e-3f * static_cast<float>(i % 97);
  Eigen::MatrixXf c(m, n);
  c.noalias() = a * b;  // warm-up: pages, caches, clocks
  double best = 0;
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    const auto t0 = std::chrono::steady_clock::now();
    c.noalias() = a * b;
    const auto t1 = std::chrono::steady_clock::now();
    const double s = std::chrono::duration<double>(t1 - t0).count();
    if (s > 0) best = std::max(best, 2.0 * m * k * n / s / 1e9);
    if (std::chrono::duration<double>(t1 - start).count() > budget_s) break;
  }
  volatile float sink = c(m - 1, n - 1);
  (void)sink;
  return best;
}

}  // namespace

int main() {
  // The default tiny model's products (B·T = 2048 rows, d 128, ffn 352) and the paper's 100M
  // shape's (B·T = 512 rows, d 512, ffn 1408).
  const double r1 = gflops(2048, 128, 352, 0.08);
  const double r2 = gflops(2048, 352, 128, 0.08);
  const double r3 = gflops(512, 512, 1408, 0.08);
  std::printf("%.1f\n", std::cbrt(r1 * r2 * r3));
  return 0;
}

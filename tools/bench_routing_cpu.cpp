/**
 * @file bench_routing_cpu.cpp
 * @brief The CPU routing benchmark (see bench_routing_cpu.h).
 */
#include "bench_routing_cpu.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>

#include "routing.h"
#include "routing_fast.h"
#include "routing_stack.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace mhar::toy {

namespace {

/// The fastest of `repeats` timed calls of each f, after one warm-up call each, in rounds
/// (f0, f1, …, f0, f1, …) so a change in the machine's load reaches all of them alike. On a
/// shared machine other processes only ever add time (this one's L3 cache is shared with other
/// machines' cores), so the fastest call is the closest to what the code itself costs.
std::vector<double> best_ms(const std::vector<std::function<void()>>& fs, int repeats) {
  for (const auto& f : fs) f();  // warm-up: page faults, caches
  std::vector<double> best(fs.size(), 1e300);
  for (int r = 0; r < repeats; ++r)
    for (std::size_t k = 0; k < fs.size(); ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      fs[k]();
      best[k] = std::min(
          best[k],
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
  return best;
}

/// dst = src, split into one contiguous piece per thread (memcpy within each).
void copy_loop(float* dst, const float* src, long n) {
#pragma omp parallel
  {
#ifdef _OPENMP
    const long t = omp_get_thread_num(), nt = omp_get_num_threads();
#else
    const long t = 0, nt = 1;
#endif
    const long lo = n * t / nt, hi = n * (t + 1) / nt;
    std::memcpy(dst + lo, src + lo, sizeof(float) * static_cast<std::size_t>(hi - lo));
  }
}

/// XOR of the n 64-bit words at src, one contiguous piece per thread: a read of every byte and
/// no write (integer XOR may be reordered, so the loop is vectorised).
std::uint64_t read_loop(const std::uint64_t* src, long n) {
  std::uint64_t total = 0;
#pragma omp parallel reduction(^ : total)
  {
#ifdef _OPENMP
    const long t = omp_get_thread_num(), nt = omp_get_num_threads();
#else
    const long t = 0, nt = 1;
#endif
    std::uint64_t acc = 0;
    for (long i = n * t / nt, hi = n * (t + 1) / nt; i < hi; ++i) acc ^= src[i];
    total ^= acc;
  }
  return total;
}

/// Throws ShapeError unless the shape is one routing can run and repeats ≥ 1.
void check_bench_args(int N, int P, int d, int H, int repeats) {
  require(N >= 1 && P >= 1 && d >= 1 && H >= 1 && d % H == 0, "bench routing",
          "need N, P, d, H >= 1 with H dividing d, got N = ", N, ", P = ", P, ", d = ", d,
          ", H = ", H);
  require(repeats >= 1, "bench routing", "repeats must be at least 1");
}

/// One op of a table: its name, version, the bytes it moves, and the call to time.
struct TimedOp {
  std::string op, version;
  double bytes;
  std::function<void()> run;
};

/// For each thread count: the copy loop `copy` (moving copy_bytes) and every op timed in rounds
/// (best_ms); one row each, every op's GB/s also as a percentage of the copy loop's.
std::vector<CpuRoutingRow> time_against_copy(const std::vector<int>& threads, int repeats,
                                             const std::function<void()>& copy, double copy_bytes,
                                             const std::vector<TimedOp>& ops) {
  std::vector<std::function<void()>> fs = {copy};
  for (const TimedOp& o : ops) fs.push_back(o.run);
  std::vector<CpuRoutingRow> rows;
  for (const int t : threads) {
#ifdef _OPENMP
    omp_set_num_threads(t);
#endif
    const std::vector<double> ms = best_ms(fs, repeats);
    const double copy_gbps = copy_bytes / (ms[0] * 1e6);
    rows.push_back({"copy", "-", t, ms[0], copy_bytes, copy_gbps, 100.0});
    for (std::size_t k = 0; k < ops.size(); ++k) {
      const double gbps = ops[k].bytes / (ms[k + 1] * 1e6);
      rows.push_back(
          {ops[k].op, ops[k].version, t, ms[k + 1], ops[k].bytes, gbps, 100.0 * gbps / copy_gbps});
    }
  }
  return rows;
}

}  // namespace

double cpu_routing_forward_bytes(int N, int P, int d, int H) {
  return 4.0 * (double(N) * P * d + double(P) * d + double(N) * P * H);
}
double cpu_routing_backward_bytes(int N, int P, int d, int H) {
  return 4.0 * (3.0 * N * P * d + 2.0 * P * d + double(N) * P * H);
}

double cpu_stack_forward_bytes(int n, int P, int d, int H) {
  double bytes = 0;
  for (int s = 0; s < n; ++s) bytes += cpu_routing_forward_bytes(s + 1, P, d, H);
  return bytes;
}
double cpu_stack_backward_bytes(int n, int P, int d, int H) {
  const double pairs = 0.5 * n * (n + 1.0);  // Σ_s (s + 1)
  return 4.0 * (pairs * (double(P) * d + double(P) * H) + 4.0 * n * double(P) * d);
}

double cpu_step_routing_bytes(int L, int P, int d, int H) {
  return cpu_stack_forward_bytes(2 * L + 1, P, d, H) + cpu_stack_backward_bytes(2 * L + 1, P, d, H);
}

double cpu_step_routing_written_bytes(int L, int P, int d) {
  return 4.0 * 2.0 * (2.0 * L + 1.0) * double(P) * d;
}

double cpu_copy_gbps(long floats, int repeats) {
  std::vector<float> src(static_cast<std::size_t>(floats), 1.0f), dst(src.size());
  const double ms = best_ms({[&] { copy_loop(dst.data(), src.data(), floats); }}, repeats)[0];
  return 8.0 * static_cast<double>(floats) / (ms * 1e6);
}

double cpu_read_gbps(long bytes, int repeats) {
  const long n = bytes / 8;
  std::vector<std::uint64_t> src(static_cast<std::size_t>(n));
  for (long i = 0; i < n; ++i) src[i] = static_cast<std::uint64_t>(i) * 0x9E3779B97F4A7C15ULL;
  volatile std::uint64_t sink = 0;  // the XOR is used, so the reads stay
  const double ms = best_ms({[&] { sink = sink ^ read_loop(src.data(), n); }}, repeats)[0];
  return 8.0 * static_cast<double>(n) / (ms * 1e6);
}

std::vector<CpuRoutingRow> bench_routing_cpu(int N, int P, int d, int H, int repeats,
                                             const std::vector<int>& threads) {
  check_bench_args(N, P, d, H, repeats);
  Rng rng(1);
  std::vector<Mat<float>> sources, dsources;
  for (int i = 0; i < N; ++i) {
    sources.push_back(rng.normal_matrix<float>(P, d));
    dsources.push_back(Mat<float>::Zero(P, d));
  }
  const RowVec<float> q = rng.normal_matrix<float>(1, d, 0, 0.1);
  const RowVec<float> g = rng.normal_matrix<float>(1, d, 1, 0.1);
  const Mat<float> dout = rng.normal_matrix<float>(P, d);
  RowVec<float> dq = RowVec<float>::Zero(d), dg = RowVec<float>::Zero(d);
  Mat<float> out;
  RoutingSaved<float> saved;
  const long n = long(N) * P * d;
  std::vector<float> src(static_cast<std::size_t>(n), 1.0f), dst(static_cast<std::size_t>(n));
  const std::span<const Mat<float>> S(sources);

  const double fwd_bytes = cpu_routing_forward_bytes(N, P, d, H);
  const double bwd_bytes = cpu_routing_backward_bytes(N, P, d, H);
  return time_against_copy(
      threads, repeats, [&] { copy_loop(dst.data(), src.data(), n); }, 8.0 * double(n),
      {{"forward", "F1 ref", fwd_bytes, [&] { routing_forward<float>(out, saved, S, q, g, H); }},
       {"forward", "F2 fast", fwd_bytes,
        [&] { routing_forward_fast<float>(out, saved, S, q, g, H); }},
       {"backward", "B1 ref", bwd_bytes,
        [&] { routing_backward<float>(dsources, dq, dg, dout, out, saved, S, q, g, H); }},
       {"backward", "B2 fast", bwd_bytes,
        [&] { routing_backward_fast<float>(dsources, dq, dg, dout, out, saved, S, q, g, H); }}});
}

std::vector<CpuRoutingRow> bench_routing_stack_cpu(int n, int P, int d, int H, int repeats,
                                                   const std::vector<int>& threads) {
  check_bench_args(n, P, d, H, repeats);
  Rng rng(2);
  std::vector<Mat<float>> sources, dsources(n, Mat<float>::Zero(P, d)), douts, outs(n);
  for (int i = 0; i < n; ++i) {
    sources.push_back(rng.normal_matrix<float>(P, d));
    douts.push_back(rng.normal_matrix<float>(P, d));
  }
  const Mat<float> q = rng.normal_matrix<float>(n, d, 0, 0.1);
  const Mat<float> g = rng.normal_matrix<float>(n, d, 1, 0.1);
  Mat<float> dq = Mat<float>::Zero(n, d), dg = Mat<float>::Zero(n, d);
  std::vector<RoutingSaved<float>> saved(n);
  const long floats = long(n) * P * d;
  std::vector<float> src(static_cast<std::size_t>(floats), 1.0f),
      dst(static_cast<std::size_t>(floats));
  auto forward = [&] {
    for (int s = 0; s < n; ++s)
      routing_forward_fast<float>(outs[s], saved[s],
                                  std::span<const Mat<float>>(sources.data(), s + 1), q.row(s),
                                  g.row(s), H);
  };
  // F3 as the model runs it: a source added (its logits at every later site), then the
  // site that reads it last.
  auto forward_f3 = [&] {
    RoutingStackForward<float> stack(q, g, H, saved);
    for (int s = 0; s < n; ++s) {
      stack.add_source(s, sources[s]);
      stack.site(s, outs[s]);
    }
  };
  // B2 site by site (as the model ran it before B3): zeroed source gradients, then the sites last
  // to first.
  auto backward_b2 = [&] {
    for (auto& m : dsources) m.setZero();
    for (int s = n - 1; s >= 0; --s)
      routing_backward_fast<float>(
          std::span<Mat<float>>(dsources.data(), s + 1), dq.row(s), dg.row(s), douts[s], outs[s],
          saved[s], std::span<const Mat<float>>(sources.data(), s + 1), q.row(s), g.row(s), H);
  };
  // B3 as the model runs it: a site added, then the source only it and later sites read.
  auto backward_b3 = [&] {
    RoutingStackBackward<float> stack(sources, H);
    stack.add_site(n - 1, douts[n - 1], outs[n - 1], saved[n - 1], q.row(n - 1), g.row(n - 1));
    for (int s = n - 1; s >= 1; --s) {
      stack.source_gradient(s, dsources[s]);
      stack.add_site(s - 1, douts[s - 1], outs[s - 1], saved[s - 1], q.row(s - 1), g.row(s - 1));
    }
    stack.source_gradient(0, dsources[0]);
    stack.parameter_gradients(dq, dg);
  };
  forward();  // the saved state both backwards read

  const double fwd_bytes = cpu_stack_forward_bytes(n, P, d, H);
  const double bwd_bytes = cpu_stack_backward_bytes(n, P, d, H);
  return time_against_copy(threads, repeats, [&] { copy_loop(dst.data(), src.data(), floats); },
                           8.0 * double(floats),
                           {{"stack-fwd", "F2 fast", fwd_bytes, forward},
                            {"stack-fwd", "F3 stack", fwd_bytes, forward_f3},
                            {"stack-bwd", "B2 fast", bwd_bytes, backward_b2},
                            {"stack-bwd", "B3 stack", bwd_bytes, backward_b3}});
}

}  // namespace mhar::toy

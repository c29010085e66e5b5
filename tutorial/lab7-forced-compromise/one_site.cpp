/**
 * @file one_site.cpp
 * @brief Lab 7, part A: the forced compromise at one routing site, on synthetic sources.
 *
 * Sources S_0 … S_{N−1} (each P × d) each carry a direction of their own plus noise, the way
 * real sub-layer outputs carry signatures. The d columns are cut into G contiguous groups and
 * group k should read source σ(k) (σ: a random assignment), so the target is
 *
 *     target[p, c] = S_{σ(group(c))}[p, c].
 *
 * We fit only the site's query q and key gain g, by AdamW on the mean squared error between
 * routing_H(S; q, g) and the target, for several H. One head (H = 1) has one softmax for all
 * columns: it must pick one mixture for every group and stalls at a compromise. H = G heads that
 * line up with the groups can each pick their own source, and the loss goes towards zero; heads
 * that straddle group boundaries land in between.
 *
 * Built on the reference: mhar::routing_forward, mhar::routing_backward and mhar::adamw_step.
 * Prints the final loss per H and each head's mean α over positions as a shaded table, writes
 * alpha_H<H>.csv (head, source, mean α), and draws every H's heads as one heatmap panel each in
 * alpha.png and alpha.svg (where the build has figures).
 *
 *   build/tutorial/lab7_one_site [--d 48] [--groups 4] [--sources 6] [--steps 1500] [--seed 1]
 *                                [--heads 1,2,4,3,6,12] [--out DIR]
 */
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "figures.h"
#include "optim.h"
#include "routing.h"

using mhar::Mat;
using mhar::RowVec;

namespace {

struct Options {
  int d = 48, groups = 4, sources = 6, positions = 256, steps = 1500;
  unsigned long seed = 1;
  double lr = 0.05, noise = 0.3;
  std::vector<int> heads = {1, 2, 4, 3, 6, 12};
  std::string out = ".";
};

/// The synthetic site: sources, the target, and which source each group should read.
struct Site {
  std::vector<Mat<double>> sources;  // N × (P × d)
  Mat<double> target;                // P × d
  std::vector<int> sigma;            // G: the source group k should read
};

Site make_site(const Options& o) {
  mhar::Rng rng(o.seed);
  Site s;
  // S_n[p, :] = a_{n,p} · v_n + noise: a direction v_n of its own (norm √d), an amplitude per
  // position, and N(0, noise²) per element.
  for (int n = 0; n < o.sources; ++n) {
    RowVec<double> v(o.d);
    for (int c = 0; c < o.d; ++c) v(c) = rng.normal();
    v *= std::sqrt(static_cast<double>(o.d)) / v.norm();
    Mat<double> S(o.positions, o.d);
    for (int p = 0; p < o.positions; ++p) {
      const double a = 1.0 + 0.2 * rng.normal();
      for (int c = 0; c < o.d; ++c) S(p, c) = a * v(c) + o.noise * rng.normal();
    }
    s.sources.push_back(std::move(S));
  }
  const int W = o.d / o.groups;
  s.target = Mat<double>(o.positions, o.d);
  for (int k = 0; k < o.groups; ++k) {
    s.sigma.push_back(static_cast<int>(rng.below(static_cast<std::uint64_t>(o.sources))));
    s.target.middleCols(k * W, W) = s.sources[s.sigma[k]].middleCols(k * W, W);
  }
  return s;
}

struct Fit {
  double loss = 0;
  std::vector<std::vector<double>> alpha;  // H × N: mean α over positions
};

/// Fits q and g for H heads; returns the final loss and each head's mean α.
Fit fit(const Site& s, int H, const Options& o) {
  const std::span<const Mat<double>> S(s.sources);
  const auto N = static_cast<int>(S.size());
  const double P = static_cast<double>(o.positions), d = o.d;
  Mat<double> q = Mat<double>::Zero(1, o.d), g = Mat<double>::Ones(1, o.d);  // the model's init
  Mat<double> mq = q, vq = q, mg = q, vg = q;  // AdamW moments (zeros)
  std::vector<Mat<double>> dS(N, Mat<double>::Zero(o.positions, o.d));  // unused here
  mhar::AdamWHyper hy;
  hy.weight_decay = 0;
  Mat<double> out;
  mhar::RoutingSaved<double> saved;
  Fit f;
  for (int step = 1; step <= o.steps + 1; ++step) {
    mhar::routing_forward<double>(out, saved, S, q.row(0), g.row(0), H);
    // loss = mean_{p,c} (out − target)²;  ∂loss/∂out = 2 (out − target) / (P · d)
    const Mat<double> err = out - s.target;
    f.loss = err.squaredNorm() / (P * d);
    if (step > o.steps) break;  // the last pass only measures
    const Mat<double> dout = err * (2.0 / (P * d));
    Mat<double> dq = Mat<double>::Zero(1, o.d), dg = Mat<double>::Zero(1, o.d);
    mhar::routing_backward<double>(std::span<Mat<double>>(dS), dq.row(0), dg.row(0), dout, out,
                                   saved, S, q.row(0), g.row(0), H);
    mhar::adamw_step(q, mq, vq, dq, step, o.lr, hy, false);
    mhar::adamw_step(g, mg, vg, dg, step, o.lr, hy, false);
  }
  f.alpha.assign(H, std::vector<double>(N, 0.0));
  for (int h = 0; h < H; ++h)
    for (int n = 0; n < N; ++n) f.alpha[h][n] = saved.alpha[n].col(h).mean();
  return f;
}

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> v;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) v.push_back(std::stoi(item));
  return v;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf("usage: lab7_one_site [--d 48] [--groups 4] [--sources 6] [--positions 256]\n"
                  "       [--steps 1500] [--lr 0.05] [--noise 0.3] [--seed 1]\n"
                  "       [--heads 1,2,4,3,6,12] [--out DIR]\n");
      std::exit(0);
    }
    if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
    const std::string v = argv[++i];
    if (a == "--d") o.d = std::stoi(v);
    else if (a == "--groups") o.groups = std::stoi(v);
    else if (a == "--sources") o.sources = std::stoi(v);
    else if (a == "--positions") o.positions = std::stoi(v);
    else if (a == "--steps") o.steps = std::stoi(v);
    else if (a == "--lr") o.lr = std::stod(v);
    else if (a == "--noise") o.noise = std::stod(v);
    else if (a == "--seed") o.seed = std::stoul(v);
    else if (a == "--heads") o.heads = parse_list(v);
    else if (a == "--out") o.out = v;
    else throw std::invalid_argument("unknown flag " + a);
  }
  if (o.d < 1 || o.groups < 1 || o.d % o.groups != 0)
    throw std::invalid_argument("--groups must divide --d");
  if (o.sources < 2 || o.positions < 1 || o.steps < 1)
    throw std::invalid_argument("--sources must be >= 2, --positions and --steps >= 1");
  for (int H : o.heads)
    if (H < 1 || o.d % H != 0)
      throw std::invalid_argument("every H in --heads must divide d = " + std::to_string(o.d));
  return o;
}

/// One character per α: ' ' (0) … '#' (1).
char shade(double a) {
  static const char ramp[] = " .:-=+*%@#";
  const int i = static_cast<int>(std::lround(std::clamp(a, 0.0, 1.0) * 9));
  return ramp[i];
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    const Site s = make_site(o);
    const int W = o.d / o.groups;
    std::printf("one routing site: N = %d sources, d = %d, P = %d positions; %d groups of %d "
                "columns, group k reads source sigma(k) =",
                o.sources, o.d, o.positions, o.groups, W);
    for (int k : s.sigma) std::printf(" %d", k);
    std::printf("\nfitting q and g by AdamW (lr %g, %d steps) on the MSE to that target\n\n",
                o.lr, o.steps);
    // The best a single shared mixture could do is bounded below by this fit's H = 1 result;
    // the trivial mixture (uniform α, q = 0) is the starting point.
    std::printf("%4s  %-34s  %12s\n", "H", "heads vs groups", "final MSE");
    std::vector<Fit> fits;
    for (int H : o.heads) {
      const Fit f = fit(s, H, o);
      const int K = o.d / H;
      const bool aligned = (K % W == 0) || (W % K == 0);
      const char* how = H == 1               ? "one head: one mixture for all"
                        : !aligned           ? "heads straddle group boundaries"
                        : H < o.groups       ? "aligned, fewer heads than groups"
                                             : "aligned, every group has its head";
      std::printf("%4d  %-34s  %12.3e\n", H, how, f.loss);
      fits.push_back(f);
      const std::string path = o.out + "/alpha_H" + std::to_string(H) + ".csv";
      std::ofstream csv(path);
      csv << "head,source,alpha\n";
      for (int h = 0; h < H; ++h)
        for (int n = 0; n < o.sources; ++n) csv << h << "," << n << "," << f.alpha[h][n] << "\n";
      if (!csv) throw std::runtime_error("cannot write " + path);
    }
    std::printf("\nmean alpha of each head over the sources (' ' = 0 ... '#' = 1), with the "
                "columns each head owns:\n");
    for (std::size_t i = 0; i < o.heads.size(); ++i) {
      const int H = o.heads[i], K = o.d / H;
      std::printf("H = %d\n", H);
      for (int h = 0; h < H; ++h) {
        std::printf("  head %2d (cols %2d-%2d) |", h, h * K, (h + 1) * K - 1);
        for (double a : fits[i].alpha[h]) std::printf("%c", shade(a));
        std::printf("|  argmax source %d\n",
                    static_cast<int>(std::max_element(fits[i].alpha[h].begin(),
                                                      fits[i].alpha[h].end()) -
                                     fits[i].alpha[h].begin()));
      }
    }
    if (mhar::io::kFiguresBuilt) {
      std::vector<mhar::io::Heatmap> panels;
      for (std::size_t i = 0; i < o.heads.size(); ++i) {
        mhar::io::Heatmap p;
        const int H = o.heads[i];
        char title[96];
        std::snprintf(title, sizeof title, "H = %d, MSE %.2g", H, fits[i].loss);
        p.title = title;
        p.row_axis = "head";
        p.col_axis = "source";
        for (int h = 0; h < H; ++h) p.row_labels.push_back(std::to_string(h));
        for (int n = 0; n < o.sources; ++n) p.col_labels.push_back("S" + std::to_string(n));
        for (int h = 0; h < H; ++h)
          for (int n = 0; n < o.sources; ++n) p.values.push_back(fits[i].alpha[h][n]);
        p.annotate = H <= 6;
        panels.push_back(std::move(p));
      }
      std::string wants = "mean α of each head; groups want";
      for (int k : s.sigma) wants += " S" + std::to_string(k);
      mhar::io::write_heatmaps(o.out + "/alpha", {mhar::io::Format::png, mhar::io::Format::svg},
                               panels, wants);
      std::printf("\nwrote alpha.png, alpha.svg and alpha_H<H>.csv in %s\n", o.out.c_str());
    } else {
      std::printf("\nwrote alpha_H<H>.csv in %s (figures are off in this build)\n",
                  o.out.c_str());
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lab7_one_site: %s\n", e.what());
    return 2;
  }
}

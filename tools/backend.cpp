/**
 * @file backend.cpp
 * @brief The CPU and GPU backends of backend.h.
 *
 * The CPU backend runs the step data-parallel: the batch is cut into k shards of whole rows, k
 * fixed when the backend is made (train's --threads N, or with --threads 0 one per CPU this
 * process may use: ThreadGovernor::shards; at most one a row), and the OpenMP threads there are
 * at the step run the shards, each thread the whole forward and backward of one shard at a time
 * (one parallel region per pass). Inside a shard every product and every routing site runs on
 * its thread alone: OpenMP does not nest the model's own parallel loops, and Eigen does not split
 * a product inside a parallel region (with one thread, the region has one thread and so have
 * they). The alternative, parallel inside each product and each site, is hundreds of short
 * regions per step: at the tiny shape two threads gained 0.98–1.13× there, and a descheduled
 * thread stalls every one of their barriers. The loss and the gradients are the row-weighted
 * means of the shards' (each shard's loss is the mean over its rows), summed in shard order. So
 * a shard's numbers do not depend on which thread ran it, or on how many ran: a step gives the
 * same bits with any thread count (tests/tools/test_backend.cpp), and a run with --threads 0 the
 * same bits whatever thread counts the load made the governor choose (thread_governor.h).
 * Validation (loss) runs on the same shards, for the same reason. With one shard (a batch of one
 * row, or one CPU) the step runs parallel inside its products and sites instead, and its last
 * bits may follow the thread count.
 */
#include "backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

#ifdef MHAR_WITH_CUDA
#include "cuda/device.h"
#include "cuda/model.h"
#endif
#include "thread_governor.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace mhar::toy {

namespace {

int max_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

/// Every tensor of `p`, in for_each order.
std::vector<Mat<float>*> tensors(Params<float>& p) {
  std::vector<Mat<float>*> out;
  p.for_each([&](const std::string&, Mat<float>& m, bool) { out.push_back(&m); });
  return out;
}

/// Rows [first, first + rows) of the batch, with their own cache and gradients.
struct Shard {
  int first = 0, rows = 0;
  Batch batch;
  Cache<float> cache;
  Params<float> grads;
  float loss = 0;
};

/// The CPU model, on the host tensors themselves, its routing sites run by `routing`.
class CpuBackend : public Backend {
 public:
  CpuBackend(const Config& cfg, int batch, Params<float>& p, Params<float>& m, Params<float>& v,
             CpuRouting routing, int shards)
      : cfg_(cfg),
        batch_(batch),
        shards_wanted_(std::clamp(shards, 1, std::max(batch, 1))),
        p_(p),
        m_(m),
        v_(v),
        routing_(routing) {
    cache_.routing = &cpu_routing<float>(routing);
    eval_cache_.routing = cache_.routing;
  }
  float forward(const Batch& b) override;
  void backward() override;
  double clip(double max_norm) override { return clip_grad_norm(grads_, max_norm); }
  void adamw(long step, double lr, const AdamWHyper& hyper) override {
    adamw_step(p_, m_, v_, grads_, step, lr, hyper);
  }
  float loss(const Batch& b) override { return run_forward(b, eval_shards_, eval_cache_); }
  void sync() override {}
  std::string describe() const override {
    const int threads = shards_wanted_ < 2 ? max_threads() : team();
    return fmt::format("CPU ({} thread{}, {} routing)", threads, threads == 1 ? "" : "s",
                       cpu_routing_name(routing_));
  }

 private:
  void cut(const Batch& b, std::vector<Shard>& shards) const;
  float run_forward(const Batch& b, std::vector<Shard>& shards, Cache<float>& whole);
  void reduce_grads();
  /// The threads that run the k shards: never more than k, one shard at a time each.
  int team() const { return std::min(max_threads(), shards_wanted_); }

  const Config& cfg_;
  int batch_;
  int shards_wanted_;  // k: the shards of every step, whatever the thread count
  Params<float>&p_, &m_, &v_;
  CpuRouting routing_;
  Params<float> grads_;
  // The step's and validation's (the step's kept for its backward): k shards, or with k = 1 the
  // whole batch in one cache
  std::vector<Shard> shards_, eval_shards_;
  Cache<float> cache_, eval_cache_;
};

/// Shard s of k takes rows [B·s/k, B·(s+1)/k): sizes differ by one row at most.
void CpuBackend::cut(const Batch& b, std::vector<Shard>& shards) const {
  const int k = shards_wanted_;
  shards.resize(static_cast<std::size_t>(k));
  const std::size_t T = static_cast<std::size_t>(cfg_.T);
  for (int s = 0; s < k; ++s) {
    Shard& sh = shards[static_cast<std::size_t>(s)];
    sh.first = batch_ * s / k;
    sh.rows = batch_ * (s + 1) / k - sh.first;
    const auto lo = static_cast<std::ptrdiff_t>(sh.first * T);
    const auto hi = lo + static_cast<std::ptrdiff_t>(sh.rows * T);
    sh.batch.tokens.assign(b.tokens.begin() + lo, b.tokens.begin() + hi);
    sh.batch.targets.assign(b.targets.begin() + lo, b.targets.begin() + hi);
    sh.cache.routing = cache_.routing;
  }
}

/// The forward over `shards` (k ≥ 2), the threads taking one shard at a time; or, with k = 1,
/// over the whole batch in `whole`. Returns the mean loss over the batch's rows.
float CpuBackend::run_forward(const Batch& b, std::vector<Shard>& shards, Cache<float>& whole) {
  if (shards_wanted_ < 2) {
    return model_forward<float>(cfg_, p_, b.tokens, b.targets, batch_, &whole);
  }
  cut(b, shards);
  const int k = shards_wanted_;
#pragma omp parallel for num_threads(team()) schedule(static, 1)
  for (int s = 0; s < k; ++s) {
    Shard& sh = shards[static_cast<std::size_t>(s)];
    sh.loss = model_forward<float>(cfg_, p_, sh.batch.tokens, sh.batch.targets, sh.rows, &sh.cache);
  }
  double loss = 0;  // the mean over all rows: each shard's mean, weighted by its rows
  for (const Shard& sh : shards) loss += static_cast<double>(sh.loss) * sh.rows / batch_;
  return static_cast<float>(loss);
}

float CpuBackend::forward(const Batch& b) {
  return run_forward(b, shards_, cache_);
}

void CpuBackend::backward() {
  if (shards_.empty()) {
    model_backward(grads_, cfg_, p_, cache_);
    return;
  }
  const int k = static_cast<int>(shards_.size());
#pragma omp parallel for num_threads(team()) schedule(static, 1)
  for (int s = 0; s < k; ++s) {
    Shard& sh = shards_[static_cast<std::size_t>(s)];
    model_backward(sh.grads, cfg_, p_, sh.cache);
  }
  reduce_grads();
}

/// grads = Σ_s (rows_s / B) · grads_s, in shard order for every element; tensors split over the
/// threads.
void CpuBackend::reduce_grads() {
  if (grads_.layers.size() != static_cast<std::size_t>(cfg_.L)) grads_ = zero_params<float>(cfg_);
  const std::vector<Mat<float>*> out = tensors(grads_);
  std::vector<std::vector<Mat<float>*>> in;
  for (Shard& sh : shards_) in.push_back(tensors(sh.grads));
  const int n = static_cast<int>(out.size());
#pragma omp parallel for num_threads(team()) schedule(dynamic, 1)
  for (int t = 0; t < n; ++t) {
    Mat<float>& g = *out[static_cast<std::size_t>(t)];
    for (std::size_t s = 0; s < shards_.size(); ++s) {
      const float w = static_cast<float>(shards_[s].rows) / static_cast<float>(batch_);
      if (s == 0)
        g.noalias() = w * *in[s][static_cast<std::size_t>(t)];
      else
        g.noalias() += w * *in[s][static_cast<std::size_t>(t)];
    }
  }
}

#ifdef MHAR_WITH_CUDA
/// The CUDA twin (cuda/model.h): parameters, moments, gradients and activations stay on the GPU;
/// only the loss, the gradient norm and, for checkpoints and heatmaps, the tensors come back.
class CudaBackend : public Backend {
 public:
  CudaBackend(const Config& cfg, int batch, Params<float>& p, Params<float>& m, Params<float>& v)
      : cfg_(cfg),
        batch_(batch),
        host_p_(p),
        host_m_(m),
        host_v_(v),
        p_(cfg, p),
        m_(cfg, m),
        v_(cfg, v),
        g_(cfg),
        cache_(cfg, batch) {}
  float forward(const Batch& b) override {
    return mhar::cuda::model_forward(cfg_, p_, b.tokens, b.targets, batch_, cache_);
  }
  void backward() override { mhar::cuda::model_backward(g_, cfg_, p_, cache_); }
  double clip(double max_norm) override { return mhar::cuda::clip_grad_norm(g_, max_norm); }
  void adamw(long step, double lr, const AdamWHyper& hyper) override {
    mhar::cuda::adamw_step(p_, m_, v_, g_, step, lr, hyper);
  }
  float loss(const Batch& b) override { return forward(b); }
  void sync() override {
    host_p_ = p_.download();
    host_m_ = m_.download();
    host_v_ = v_.download();
  }
  std::string describe() const override { return "GPU " + mhar::cuda::device_name(0); }

 private:
  const Config& cfg_;
  int batch_;
  Params<float>&host_p_, &host_m_, &host_v_;
  mhar::cuda::DeviceParams p_, m_, v_, g_;
  mhar::cuda::DeviceCache cache_;
};
#endif

}  // namespace

std::unique_ptr<Backend> make_backend([[maybe_unused]] const std::string& device, const Config& cfg,
                                      int batch, Params<float>& p, Params<float>& m,
                                      Params<float>& v, CpuRouting routing, int shards) {
#ifdef MHAR_WITH_CUDA
  if (device == "cuda") return std::make_unique<CudaBackend>(cfg, batch, p, m, v);
#endif
  return std::make_unique<CpuBackend>(cfg, batch, p, m, v, routing,
                                      shards > 0 ? shards : usable_cpus());
}

}  // namespace mhar::toy

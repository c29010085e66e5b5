/**
 * @file backend.h
 * @ingroup tools
 * @brief What a training step needs from the device it runs on: train's step and `bench step`
 *        both run it through a Backend, so the bench times the step that training takes.
 */
#pragma once

#include <memory>
#include <string>

#include "data.h"
#include "model.h"
#include "optim.h"
#include "routing_versions.h"

namespace mhar::toy {

/// Both backends run the same steps in the same order; only where the tensors live differs.
class Backend {
 public:
  virtual ~Backend() = default;
  /// Forward on a batch, keeping what the backward needs; returns the mean loss.
  virtual float forward(const Batch& b) = 0;
  /// Gradients of the last forward.
  virtual void backward() = 0;
  /// Global-norm clipping of the gradients; returns the norm before clipping.
  virtual double clip(double max_norm) = 0;
  /// One AdamW step on every tensor.
  virtual void adamw(long step, double lr, const AdamWHyper& hyper) = 0;
  /// Loss of a batch (validation).
  virtual float loss(const Batch& b) = 0;
  /// Brings the host's parameters and moments up to date (before a checkpoint or a heatmap).
  virtual void sync() = 0;
  /// "CPU (2 threads, fast routing)", "GPU NVIDIA H100 …".
  virtual std::string describe() const = 0;
};

/// The backend of `device` ("cpu", or "cuda" in a build with CUDA) for batches of `batch` rows,
/// working on p, m and v (the CPU one in place; the GPU one on copies, written back by sync()).
/// On the CPU, the sites are routed by `routing`, and a step cuts the batch into `shards` shards
/// (at most one a row; 0: one per CPU this process may use, usable_cpus()) that the OpenMP
/// threads run side by side: its bits depend on the shards, never on the thread count (see
/// backend.cpp).
std::unique_ptr<Backend> make_backend(const std::string& device, const Config& cfg, int batch,
                                      Params<float>& p, Params<float>& m, Params<float>& v,
                                      CpuRouting routing, int shards = 0);

}  // namespace mhar::toy

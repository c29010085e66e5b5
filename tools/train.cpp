/**
 * @file train.cpp
 * @brief The training loop (see train.h). Everything a step does depends only on the parameters,
 *        the optimiser state and the step number, so a resumed run repeats the uninterrupted one.
 */
#include "train.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <numbers>
#include <string>
#include <system_error>
#include <utility>

#include "backend.h"
#include "checkpoint.h"
#include "data.h"
#include "device_select.h"
#include "errors.h"
#include "file_util.h"
#include "gpu_selfcheck.h"
#include "heatmap.h"
#include "json_types.h"
#include "memory.h"
#include "optim.h"
#include "routing_versions.h"
#include "run_dir.h"
#include "strict_json.h"
#include "thread_governor.h"

namespace mhar::toy {

namespace fs = std::filesystem;

// ---- Options ----------------------------------------------------------------------------------

nlohmann::json train_options_to_json(const TrainOptions& o) {
  return {{"model", config_to_json(o.cfg)}, {"train", o}};
}

TrainOptions train_options_from_json(const nlohmann::json& j, const std::string& where) {
  const std::string w = where + ": bad run config";
  if (!j.is_object() || !j.contains("model") || !j.contains("train") || !j["train"].is_object())
    throw UsageError(w + ": it needs the objects 'model' and 'train'");
  TrainOptions o;
  o.cfg = config_from_json(j["model"], where);
  const nlohmann::json& t = j["train"];
  constexpr int64_t kInt = std::numeric_limits<int>::max();
  try {
    const auto count = [&](const char* key, int64_t lo) {
      return static_cast<int>(io::get_int(t, key, lo, kInt, w));
    };
    o.data = io::get_string(t, "data", w);
    o.device = io::get_string(t, "device", w);
    if (t.contains("figure_formats")) o.figure_formats = io::get_string(t, "figure_formats", w);
    if (t.contains("routing")) o.routing = io::get_string(t, "routing", w);  // before: the fast one
    o.steps = count("steps", 1), o.batch = count("batch", 1), o.warmup = count("warmup", 0);
    o.eval_every = count("eval_every", 1), o.eval_batches = count("eval_batches", 1);
    o.ckpt_every = count("ckpt_every", 1), o.heatmap_every = count("heatmap_every", 0);
    o.log_every = count("log_every", 1), o.threads = count("threads", 0);
    o.lr = io::get_number(t, "lr", w), o.min_lr_ratio = io::get_number(t, "min_lr_ratio", w);
    o.weight_decay = io::get_number(t, "weight_decay", w), o.clip = io::get_number(t, "clip", w);
    o.val_fraction = io::get_number(t, "val_fraction", w);
    if (t.contains("seed") && t["seed"].is_number_unsigned())
      o.seed = t["seed"].get<std::uint64_t>();  // the whole range of --seed
    else
      o.seed = static_cast<std::uint64_t>(
          io::get_int(t, "seed", 0, std::numeric_limits<int64_t>::max(), w));  // says why not
  } catch (const io::StrictJsonError& e) {
    throw UsageError(e.what());
  }
  return o;
}

std::vector<MetricsRow> read_metrics(const fs::path& path, bool* torn) {
  std::vector<MetricsRow> rows;
  if (torn) *torn = false;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    try {
      rows.push_back(nlohmann::json::parse(line).get<MetricsRow>());
    } catch (const nlohmann::json::exception&) {
      if (torn) *torn = true;
      break;
    }
  }
  return rows;
}

void validate(const TrainOptions& o) {
  try {
    o.cfg.validate();
  } catch (const ShapeError& e) {
    throw UsageError(e.what());
  }
  auto positive = [](long v, const char* flag) {
    if (v <= 0) throw UsageError(fmt::format("{} must be positive, got {}", flag, v));
  };
  positive(o.steps, "--steps");
  positive(o.batch, "--batch");
  positive(o.eval_every, "--eval-every");
  positive(o.eval_batches, "--eval-batches");
  positive(o.ckpt_every, "--ckpt-every");
  positive(o.log_every, "--log-every");
  if (o.heatmap_every < 0)
    throw UsageError("--heatmap-every must be 0 (only at the end) or positive");
  try {
    io::parse_formats(o.figure_formats);
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("--format: ") + e.what());
  }
  if (o.warmup < 0) throw UsageError("--warmup must be 0 or positive");
  if (o.threads < 0 || o.threads > kMaxThreads)
    throw UsageError(fmt::format("--threads must be 0 (one per idle core) to {}, got {}",
                                 kMaxThreads, o.threads));
  try {
    parse_cpu_routing(o.routing);
  } catch (const ShapeError& e) {
    throw UsageError(std::string("--routing: ") + e.what());
  }
  if (!(o.lr > 0 && std::isfinite(o.lr)))
    throw UsageError(fmt::format("--lr must be positive, got {}", o.lr));
  if (!(o.min_lr_ratio >= 0 && o.min_lr_ratio <= 1))
    throw UsageError("--min-lr-ratio must be in [0, 1]");
  if (!(o.weight_decay >= 0)) throw UsageError("--weight-decay must be 0 or positive");
  if (!(o.clip >= 0)) throw UsageError("--clip must be 0 (off) or positive");
}

double learning_rate(const TrainOptions& o, long step) {
  if (o.warmup > 0 && step <= o.warmup) return o.lr * static_cast<double>(step) / o.warmup;
  const double span = std::max(1, o.steps - o.warmup);
  const double progress = std::min(1.0, static_cast<double>(step - o.warmup) / span);
  const double cosine = 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  return o.lr * (o.min_lr_ratio + (1.0 - o.min_lr_ratio) * cosine);
}

// ---- The loop ---------------------------------------------------------------------------------

namespace {

/// The signal that asked the loop to stop after its step (SIGINT: Ctrl-C; SIGTERM: `kill`, a job
/// scheduler's time limit, `docker stop`; SIGHUP: the terminal closed, as an ssh connection that
/// drops or a terminal window shut), 0 for none.
std::atomic<int> g_stop_signal{0};
extern "C" void on_stop_signal(int sig) {
  g_stop_signal = sig;
}

/// " (SIGTERM)" or " (SIGHUP)" for the interrupted message; nothing for Ctrl-C.
std::string signal_said(int sig) {
  return sig == SIGTERM ? " (SIGTERM)" : sig == SIGHUP ? " (SIGHUP)" : "";
}

/// Prints to stderr, where a failed write is not an error: a progress line that cannot be shown
/// (the terminal closed under SIGHUP, stderr on a full disk) must not stop a run whose metrics
/// and checkpoints go to their own files (fmt::print throws when the write fails).
template <typename... Args>
void tell(fmt::format_string<Args...> f, Args&&... args) {
  try {
    fmt::print(stderr, f, std::forward<Args>(args)...);
  } catch (const std::system_error&) {
  }
}

/// Mean validation loss over the same eval_batches windows at every evaluation.
double validation_loss(const TrainOptions& o, Backend& backend, const Corpus& corpus) {
  double total = 0;
  for (int k = 0; k < o.eval_batches; ++k) {
    const Batch b = random_batch(corpus.val, o.batch, o.cfg.T, o.seed, k, /*stream=*/1);
    total += backend.loss(b);
  }
  return total / o.eval_batches;
}

/// A step's forward measures the weights before its update, so the weights after step s are
/// confirmed before their checkpoint replaces the last good one: `val` when the validation ran
/// at s, else the loss of one validation batch. Throws DivergedError when it is not finite.
void confirm_weights(const TrainOptions& o, Backend& backend, const Corpus& corpus, long s,
                     double val, bool evaluated, const std::function<std::string()>& kept) {
  const double loss =
      evaluated ? val
                : backend.loss(random_batch(corpus.val, o.batch, o.cfg.T, o.seed, 0, /*stream=*/1));
  if (!std::isfinite(loss))
    throw DivergedError(fmt::format(
        "the weights after step {} give a validation loss of {}; stopping without saving them: "
        "{}. Try a smaller --lr or a tighter --clip.",
        s, shown(loss), kept()));
}

/// The step of a metrics row (JSON or CSV): 0 for the CSV header, -1 for a torn or damaged row.
long metrics_row_step(const std::string& line) {
  if (line.starts_with("{")) {
    try {
      return nlohmann::json::parse(line).at("step").get<long>();
    } catch (const std::exception&) {
      return -1;  // a torn last line
    }
  }
  if (line.starts_with("step")) return 0;
  // A row torn by a kill or a full disk has fewer fields: its "1" may be the start of step 12.
  if (std::count(line.begin(), line.end(), ',') != 6) return -1;
  char* end = nullptr;
  const long step = std::strtol(line.c_str(), &end, 10);
  return end != line.c_str() && *end == ',' ? step : -1;
}

struct Metrics {
  fs::path dir;
  std::ofstream jsonl, csv;
  void open(const fs::path& run_dir, long keep_through_step) {
    dir = run_dir;
    // On resume, drop rows past the checkpoint's step: they are recomputed exactly.
    for (const char* name : {"metrics.jsonl", "metrics.csv"}) {
      const fs::path path = dir / name;
      std::string content;
      std::ifstream in(path);
      for (std::string line; std::getline(in, line);) {
        const long step = line.empty() ? -1 : metrics_row_step(line);
        if (step >= 0 && step <= keep_through_step) content += line + "\n";
      }
      if (std::string(name) == "metrics.csv" && content.empty())
        content = "step,train_loss,val_loss,lr,grad_norm,tokens_per_s,elapsed_s\n";
      io::write_text_file_atomic(path.string(), content);
    }
    jsonl.open(dir / "metrics.jsonl", std::ios::app);
    csv.open(dir / "metrics.csv", std::ios::app);
    if (!jsonl || !csv) throw std::runtime_error("cannot append to the metrics in " + dir.string());
  }
  void write(long step, double loss, double val, double lr, double gnorm, double tps, double el) {
    MetricsRow row;
    row.step = step;
    row.train_loss = loss;
    row.lr = lr;
    row.grad_norm = gnorm;
    row.tokens_per_s = tps;
    row.elapsed_s = el;
    if (!std::isnan(val)) row.val_loss = val;
    const nlohmann::json j = row;
    jsonl << j.dump() << "\n" << std::flush;
    check(jsonl, "metrics.jsonl");
    csv << fmt::format("{},{:.6f},{},{:.6g},{:.6g},{:.1f},{:.2f}\n", step, loss,
                       std::isnan(val) ? std::string() : fmt::format("{:.6f}", val), lr, gnorm, tps,
                       el)
        << std::flush;
    check(csv, "metrics.csv");
  }
  /// A failed append names its file (a full disk; the torn row is dropped on --resume).
  void check(const std::ofstream& f, const char* name) const {
    if (!f)
      throw std::runtime_error((dir / name).string() + ": writing it failed (disk full?); " +
                               "--resume continues from the last checkpoint");
  }
};

void save_state(const fs::path& dir, const TrainOptions& o, const Params<float>& p,
                const Params<float>& m, const Params<float>& v, long step) {
  // The pair is committed together: after a kill, both files hold one step (run_dir.h).
  commit_state(dir, o.cfg, p, m, v, step, {{"seed", std::to_string(o.seed)}});
}

void heatmaps(const fs::path& dir, const TrainOptions& o, const Params<float>& p,
              const Corpus& corpus, long step) {
  if (!o.cfg.routed()) return;
  const Batch b = random_batch(corpus.val, o.batch, o.cfg.T, o.seed, 0, /*stream=*/2);
  const RoutingMap map = routing_map(o.cfg, p, b, o.batch);
  write_routing_map(
      (dir / "heatmaps" / fmt::format("step_{:06}", step)).string(), map,
      fmt::format("{} H={}, step {}", mode_name(o.cfg.mode), o.cfg.route_heads(), step),
      io::parse_formats(o.figure_formats));
}

/// The line that opens a run: model, schedule, device, data.
void print_run_header(const TrainOptions& o, const Params<float>& p, const Backend& backend,
                      const Corpus& corpus, const fs::path& dir) {
  if (o.quiet) return;
  fmt::print(stderr,
             "mhar-toy train: {}{}, d={} L={} heads={}/{} ffn={} T={}, {} parameters; "
             "{} steps of {} × {} bytes on the {}; data {} ({} train / {} val bytes) → {}\n",
             mode_name(o.cfg.mode),
             o.cfg.routed() ? fmt::format(" (H={})", o.cfg.route_heads()) : std::string(), o.cfg.d,
             o.cfg.L, o.cfg.n_head, o.cfg.n_kv_head, o.cfg.ffn, o.cfg.T, count_params(p), o.steps,
             o.batch, o.cfg.T, backend.describe(), o.data, corpus.train.size(), corpus.val.size(),
             dir.string());
  if (!io::kFiguresBuilt && o.cfg.routed())
    fmt::print(stderr, "mhar-toy train: {}; the heatmaps are alpha.csv and alpha.json only\n",
               kFiguresOff);
}

/// What one optimiser step measured.
struct StepResult {
  float loss = 0;
  double grad_norm = 0, lr = 0;
};

/// Step s: forward, backward, clipping, AdamW. Throws DivergedError on a non-finite loss or
/// gradient norm, saying what is kept (`kept`).
StepResult train_step(const TrainOptions& o, Backend& backend, const Batch& b, long s,
                      const std::function<std::string()>& kept) {
  StepResult r;
  r.loss = backend.forward(b);
  if (!std::isfinite(r.loss))
    throw DivergedError(fmt::format(
        "the training loss became {} at step {}; stopping: {}. Try a smaller --lr or a tighter "
        "--clip.",
        shown(r.loss), s, kept()));
  backend.backward();
  r.grad_norm = backend.clip(o.clip);
  if (!std::isfinite(r.grad_norm))
    throw DivergedError(fmt::format("the gradient norm became {} at step {}; stopping: {}.",
                                    shown(r.grad_norm), s, kept()));
  r.lr = learning_rate(o, s);
  AdamWHyper hy;
  hy.weight_decay = o.weight_decay;
  backend.adamw(s, r.lr, hy);
  return r;
}

/// The progress line: a bar redrawn in place on a terminal, else a line every --log-every steps
/// and at every validation.
struct Progress {
  bool tty = false, quiet = false;
  void print(const TrainOptions& o, long s, const StepResult& r, double val, double last_val,
             double tokens_per_s, double eta_s) const {
    if (tty) {
      const int width = 24, filled = static_cast<int>(width * s / o.steps);
      tell("\r[{}{}] step {}/{}  loss {:.4f}  val {}  {:.0f} tok/s  ETA {}   ",
           std::string(filled, '#'), std::string(width - filled, '.'), s, o.steps, r.loss,
           std::isnan(last_val) ? std::string("-") : fmt::format("{:.4f}", last_val), tokens_per_s,
           fmt_duration(eta_s));
      if (s == o.steps) tell("\n");
    } else if (!quiet && (s % o.log_every == 0 || s == o.steps || !std::isnan(val))) {
      tell("step {:>6}/{}  loss {:.4f}{}  lr {:.2e}  {:.0f} tok/s  ETA {}\n", s, o.steps, r.loss,
           std::isnan(val) ? std::string() : fmt::format("  val {:.4f}", val), r.lr, tokens_per_s,
           fmt_duration(eta_s));
    }
  }
};

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

/// Trains on `device` ("cpu" or "cuda", pick_checked_device) from start_step to o.steps.
int run_loop(const TrainOptions& o, const std::string& device, const fs::path& dir,
             Params<float>& p, Params<float>& m, Params<float>& v, long start_step) {
  const Corpus corpus = load_corpus(o.data, o.val_fraction, o.cfg.T);
  ThreadGovernor threads(o.threads);  // --threads 0: as many as there are idle cores
  const std::unique_ptr<Backend> backend =
      make_backend(device, o.cfg, o.batch, p, m, v, parse_cpu_routing(o.routing), threads.shards());
  Metrics metrics;
  metrics.open(dir, start_step);
  print_run_header(o, p, *backend, corpus, dir);
  const Progress progress{isatty(STDERR_FILENO) && !o.quiet, o.quiet};

  g_stop_signal = 0;
  auto old_int = std::signal(SIGINT, on_stop_signal);
  auto old_term = std::signal(SIGTERM, on_stop_signal);
  auto old_hup = std::signal(SIGHUP, on_stop_signal);
  // stderr into a pipe whose reader has gone (`train 2>&1 | tee log`, tee stopped by the same
  // Ctrl-C): the write fails (`tell` goes on) instead of SIGPIPE killing the run unsaved.
  auto old_pipe = std::signal(SIGPIPE, SIG_IGN);
  const auto t0 = std::chrono::steady_clock::now();
  double last_val = std::nan("");
  long step = start_step;
  long last_saved = start_step;  // a resumed run starts from its checkpoint; a fresh one has none
  const std::function<std::string()> kept = [&] {
    return last_saved > 0 ? fmt::format("the last good checkpoint (step {}) is kept in {}",
                                        last_saved, dir.string())
                          : std::string("no checkpoint had been written yet");
  };
  int code = kOk;
  float last_loss = std::nanf("");

  if (start_step == 0 && o.heatmap_every > 0) heatmaps(dir, o, p, corpus, 0);
  while (step < o.steps) {
    const long s = step + 1;
    threads.before_step();
    const auto ts = std::chrono::steady_clock::now();
    const StepResult r =
        train_step(o, *backend, random_batch(corpus.train, o.batch, o.cfg.T, o.seed, s), s, kept);
    last_loss = r.loss;
    step = s;
    const double tps = o.batch * o.cfg.T / seconds_since(ts);
    const double elapsed = seconds_since(t0);
    double val = std::nan("");
    const bool evaluated = s % o.eval_every == 0 || s == o.steps;
    if (evaluated) last_val = val = validation_loss(o, *backend, corpus);
    metrics.write(s, r.loss, val, r.lr, r.grad_norm, tps, elapsed);
    progress.print(
        o, s, r, val, last_val, tps,
        elapsed / static_cast<double>(s - start_step) * static_cast<double>(o.steps - s));
    const bool save_due = s % o.ckpt_every == 0 || s == o.steps;
    if (save_due) confirm_weights(o, *backend, corpus, s, val, evaluated, kept);
    const bool heatmap_now = o.heatmap_every > 0 && s % o.heatmap_every == 0;
    if (heatmap_now) {
      backend->sync();  // p, m, v on the host are current
      heatmaps(dir, o, p, corpus, s);
    }
    // Read once, after the heatmap: a Ctrl-C that comes while it is written still saves this step
    // (it used to be read before, and such a Ctrl-C said "saved" without saving).
    const int stop_signal = g_stop_signal;
    const bool interrupted = stop_signal != 0;
    if (save_due || interrupted) {
      if (!save_due) confirm_weights(o, *backend, corpus, s, val, evaluated, kept);
      if (!heatmap_now) backend->sync();
      save_state(dir, o, p, m, v, s);
      last_saved = s;
    }
    if (interrupted) {
      tell(
          "\ninterrupted{}: checkpoint of step {} saved in {}; continue with "
          "`mhar-toy train --resume {}`\n",
          signal_said(stop_signal), s, dir.string(), dir.string());
      code = kInterrupted;
      break;
    }
  }
  std::signal(SIGINT, old_int);
  std::signal(SIGTERM, old_term);
  std::signal(SIGHUP, old_hup);
  std::signal(SIGPIPE, old_pipe);
  if (code == kOk) {
    if (o.heatmap_every == 0 || o.steps % o.heatmap_every != 0)
      heatmaps(dir, o, p, corpus, o.steps);
    if (!o.quiet)
      tell("done: {} steps, final train loss {:.4f}, val loss {:.4f}; run in {}\n", o.steps,
           last_loss, last_val, dir.string());
  }
  return code;
}

void check_writable_dir(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    throw UsageError("cannot create the output directory '" + dir.string() + "': " + ec.message());
  const fs::path probe = dir / ".mhar-write-test";
  std::ofstream f(probe);
  if (!f) throw UsageError("the output directory '" + dir.string() + "' is not writable");
  f.close();
  fs::remove(probe, ec);
}

}  // namespace

std::string fmt_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const long t = std::lround(s);
  if (t >= 3600) return fmt::format("{}h{:02}m", t / 3600, (t % 3600) / 60);
  if (t >= 60) return fmt::format("{}m{:02}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

namespace {

/// Step 0 of a run: the initial parameters of its seed, zero moments.
int run_from_scratch(const TrainOptions& o, const std::string& device, const fs::path& dir) {
  Rng rng(o.seed);
  Params<float> p = init_params<float>(o.cfg, rng);
  Params<float> m = zero_params<float>(o.cfg), v = zero_params<float>(o.cfg);
  return run_loop(o, device, dir, p, m, v, 0);
}

void refuse_existing_run(const TrainOptions& o) {
  const fs::path dir(o.out);
  if (fs::exists(dir / kCheckpointFile) || fs::exists(dir / "config.json"))
    throw UsageError("'" + o.out + "' already holds a run; continue it with --resume " + o.out +
                     " or choose another --out (nothing is overwritten)");
}

/// The run's config.json, strictly read (strict_json.h).
TrainOptions read_run_config(const fs::path& cfg_path) {
  try {
    return train_options_from_json(io::read_json_file_strict(cfg_path.string()), cfg_path.string());
  } catch (const io::InputError& e) {
    throw UsageError(e.what());
  }
}

/// The checkpoint and optimizer state of a run, checked against its config.json and each other.
Checkpoint load_run_state(const TrainOptions& o, const fs::path& dir, Params<float>& m,
                          Params<float>& v) {
  Checkpoint ck = load_checkpoint((dir / kCheckpointFile).string());
  if (config_to_json(ck.cfg) != config_to_json(o.cfg))
    throw UsageError(o.out + ": checkpoint.safetensors holds a different model than config.json");
  const auto seed = ck.metadata.find("seed");
  if (seed != ck.metadata.end() && seed->second != std::to_string(o.seed))
    throw UsageError(
        fmt::format("{}: checkpoint.safetensors was trained with seed {}, "
                    "config.json says seed {}",
                    o.out, io::printable_excerpt(seed->second), o.seed));
  m = zero_params<float>(o.cfg), v = zero_params<float>(o.cfg);
  const long ostep = load_optimizer((dir / kOptimizerFile).string(), m, v);
  if (ostep != ck.step)
    throw UsageError(
        fmt::format("{}: the optimizer state is from step {}, the checkpoint from "
                    "step {}",
                    o.out, ostep, ck.step));
  return ck;
}

}  // namespace

int train(const TrainOptions& o) {
  validate(o);
  const fs::path dir(o.out);
  refuse_existing_run(o);
  pick_device(o.device);
  require_memory(o.cfg, o.batch, sizeof(float), Workload::Training, "train");
  load_corpus(o.data, o.val_fraction, o.cfg.T);  // fail before creating anything
  check_writable_dir(dir);
  const DirLock lock(dir, "train");
  refuse_existing_run(o);  // a second train may have written it between the check and the lock
  remove_stale_temporaries(dir);
  const std::string device = pick_checked_device(o.device, GpuWork{.models = {o.cfg}}, o.quiet);
  io::write_text_file_atomic((dir / "config.json").string(),
                             train_options_to_json(o).dump(2) + "\n");
  return run_from_scratch(o, device, dir);
}

int resume(const std::string& dir_s, int steps, bool quiet) {
  const fs::path dir(dir_s);
  const fs::path cfg_path = dir / "config.json";
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw UsageError("--resume " + dir_s + ": no such directory (not a run directory)");
  if (!fs::exists(cfg_path, ec))
    throw UsageError("--resume " + dir_s +
                     ": no config.json there (not a run directory; start "
                     "one there with `mhar-toy train -o " +
                     dir_s + "`)");
  const DirLock lock(dir, "train --resume");
  remove_stale_temporaries(dir);
  recover_state(dir);
  TrainOptions o = read_run_config(cfg_path);
  o.out = dir_s;
  o.quiet = quiet;
  if (steps > 0) o.steps = steps;  // a longer run: the cosine schedule is stretched from here on
  try {  // before config.json is rewritten: a refused resume changes nothing
    validate(o);
  } catch (const UsageError& e) {
    throw UsageError(cfg_path.string() + ": " + e.what());
  }
  require_memory(o.cfg, o.batch, sizeof(float), Workload::Training, "train --resume");
  const auto write_steps = [&] {  // only once the run goes on: a resume that trains nothing
    if (steps > 0)                // changes nothing (--steps 1 at step 2 wrote "steps": 1)
      io::write_text_file_atomic(cfg_path.string(), train_options_to_json(o).dump(2) + "\n");
  };
  if (!fs::exists(dir / kCheckpointFile, ec)) {
    // Stopped before its first checkpoint: step 0 is the seed's, so start there.
    const std::string device = pick_checked_device(o.device, GpuWork{.models = {o.cfg}}, quiet);
    if (!quiet) fmt::print(stderr, "resuming {} from step 0 (it had no checkpoint yet)\n", dir_s);
    write_steps();
    return run_from_scratch(o, device, dir);
  }
  Params<float> m, v;
  Checkpoint ck = load_run_state(o, dir, m, v);
  if (ck.step >= o.steps) {
    if (steps > 0)
      fmt::print(stderr, "{} is already at step {}: --steps {} trains nothing (nothing changed)\n",
                 dir_s, ck.step, steps);
    else
      fmt::print(stderr, "{} already finished its {} steps (pass --steps N to train longer)\n",
                 dir_s, o.steps);
    return kOk;
  }
  write_steps();
  const std::string device = pick_checked_device(o.device, GpuWork{.models = {o.cfg}}, quiet);
  if (!quiet) fmt::print(stderr, "resuming {} from step {}\n", dir_s, ck.step);
  return run_loop(o, device, dir, ck.params, m, v, ck.step);
}

}  // namespace mhar::toy

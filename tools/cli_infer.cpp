/**
 * @file cli_infer.cpp
 * @brief The subcommands that read a trained model: `sample`, `eval`, `heatmap`.
 */
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <exception>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <numbers>
#include <random>
#include <vector>

#include "checkpoint.h"
#include "cli_common.h"
#include "data.h"
#include "decode.h"
#include "errors.h"
#include "heatmap.h"
#include "memory.h"
#include "routing_versions.h"
#include "sampling.h"

namespace mhar::toy {

namespace {

/// Next-byte logits of the model for `context` (at most T bytes; RoPE positions from 0), by the
/// whole batched forward over the context.
RowVec<float> next_logits(const Checkpoint& ck, const std::vector<int>& context) {
  Config c = ck.cfg;
  c.T = static_cast<int>(context.size());
  Cache<float> cache;
  cache.routing = &fast_routing<float>();
  const Mat<float> logits = model_logits<float>(c, ck.params, context, 1, &cache);
  return logits.row(logits.rows() - 1);
}

/// Bytes a slid window keeps: the last T/2 (at least 1).
int window_keep(int T) {
  return std::max(1, T / 2);
}

struct SampleOptions {
  int length = 300, top_k = 40;
  double temperature = 0.8;
  std::uint64_t seed = 1;
  bool cache = true;
};

struct SampleResult {
  std::string generated;   ///< the new bytes only
  long slides = 0;         ///< times the window was restarted from its last T/2 bytes
  double seconds = 0;      ///< generation time (prefills, steps and sampling; not the load)
  double cpu_seconds = 0;  ///< CPU time of the same, all threads (less noisy on a shared machine)
};

/**
 * Generates o.length bytes after `window` (1 … T bytes). The context of each byte is the window:
 * the bytes since it started. When a new byte would make it T + 1 bytes, the window restarts from
 * its last T/2 bytes (RoPE positions from 0 again). With the cache the window is prefilled once
 * (decode_prefill) and then grows by one decode_step a byte; without it, the whole window is
 * recomputed for every byte (model_logits). The same windows either way, so the same logits up to
 * float rounding, and a greedy sample gives the same text.
 */
SampleResult generate(const Checkpoint& ck, std::vector<int> window, const SampleOptions& o) {
  const Config& cfg = ck.cfg;
  const auto t0 = std::chrono::steady_clock::now();
  const std::clock_t c0 = std::clock();
  SampleResult r;
  std::mt19937_64 gen(o.seed);
  DecodeState<float> state;
  state.routing = &fast_routing<float>();
  RowVec<float> logits;
  auto from_scratch = [&] {  // the logits after the whole window
    if (o.cache) {
      logits = decode_prefill<float>(cfg, ck.params, state, window);
    } else {
      logits = next_logits(ck, window);
    }
  };
  from_scratch();
  for (int n = 0; n < o.length; ++n) {
    const int next = draw_byte(logits, o.top_k, o.temperature, gen);
    r.generated.push_back(static_cast<char>(next));
    if (n + 1 == o.length) break;  // no logits needed after the last byte
    window.push_back(next);
    if (window.size() > static_cast<std::size_t>(cfg.T)) {
      // slide: restart the window from its last T/2 bytes
      window.erase(window.begin(), window.end() - window_keep(cfg.T));
      ++r.slides;
      from_scratch();
    } else if (o.cache) {
      logits = decode_step<float>(cfg, ck.params, state, next);
    } else {
      logits = next_logits(ck, window);
    }
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.cpu_seconds = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
  return r;
}

}  // namespace

// ---- sample -----------------------------------------------------------------------------------

namespace {

/// The options of `sample`.
struct SampleArgs {
  std::string ckpt, prompt = "ROMEO:";
  SampleOptions s;
  bool no_cache = false, json = false;
  int threads = 1;  // a decode step is too small to share between threads
};

/// The first window: the prompt's bytes (an empty prompt: a newline), cut to its last T bytes.
struct PromptWindow {
  std::vector<int> bytes;
  bool cut = false;  // the prompt was longer than T
};
PromptWindow prompt_window(const std::string& prompt, int T) {
  PromptWindow w;
  w.bytes.assign(prompt.begin(), prompt.end());
  for (auto& b : w.bytes) b &= 0xff;
  if (w.bytes.empty()) w.bytes.push_back('\n');
  w.cut = w.bytes.size() > static_cast<std::size_t>(T);
  if (w.cut) w.bytes.erase(w.bytes.begin(), w.bytes.end() - T);
  return w;
}

/// A rate: bytes per second, the time floored at 1 ns.
double bytes_per_s(std::size_t bytes, double seconds) {
  return static_cast<double>(bytes) / std::max(seconds, 1e-9);
}

/// `sample --json`: the text, the rates, and how the window was used.
nlohmann::json sample_json(const SampleArgs& o, const PromptWindow& w, const SampleResult& r,
                           bool cache, int T) {
  return {{"text", o.prompt + r.generated},
          {"generated_bytes", r.generated.size()},
          {"seconds", r.seconds},
          {"bytes_per_s", bytes_per_s(r.generated.size(), r.seconds)},
          {"cpu_seconds", r.cpu_seconds},
          {"bytes_per_cpu_s", bytes_per_s(r.generated.size(), r.cpu_seconds)},
          {"cache", cache},
          {"T", T},
          {"window_slides", r.slides},
          {"threads", omp_get_max_threads()},
          {"prompt_bytes", o.prompt.size()},
          {"prompt_bytes_read", w.bytes.size()},
          {"prompt_cut", w.cut}};
}

/// The prompt and its continuation on stdout, then the rate on stderr.
void print_sample(const std::string& prompt, const SampleResult& r, bool cache, int T) {
  const std::string how = cache ? "cache: prefill, then one step a byte"
                                : "no cache: the whole window recomputed every byte";
  fmt::print("{}{}\n", prompt, r.generated);
  std::fflush(stdout);
  fmt::print(stderr,
             "sample: {} bytes in {:.3f} s, {:.0f} bytes/s ({}; {} window slides to "
             "the last {} of T = {} bytes)\n",
             r.generated.size(), r.seconds, bytes_per_s(r.generated.size(), r.seconds), how,
             r.slides, window_keep(T), T);
}

/// Runs `sample`.
int run_sample(const SampleArgs& o) {
  if (o.threads > 0) omp_set_num_threads(o.threads);
  const Checkpoint ck = load_checkpoint(o.ckpt);
  const int T = ck.cfg.T;
  const PromptWindow w = prompt_window(o.prompt, T);
  if (w.cut && !o.json)
    fmt::print(stderr,
               "sample: the prompt is {} bytes, longer than the window T = {}: only "
               "its last {} bytes are read\n",
               o.prompt.size(), T, T);
  SampleOptions so = o.s;
  so.cache = !o.no_cache;
  const SampleResult r = generate(ck, w.bytes, so);
  if (o.json) {
    // bytes that are not UTF-8 become U+FFFD in JSON (the text output keeps them raw)
    fmt::print("{}\n", sample_json(o, w, r, so.cache, T)
                           .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  } else {
    print_sample(o.prompt, r, so.cache, T);
  }
  return kOk;
}

// ---- eval -------------------------------------------------------------------------------------

/// Sets and returns the threads eval runs: `threads` (--threads; 0: OpenMP's count, every core),
/// fewer where that many batches at once would not fit in memory (each thread keeps one batch's
/// activations). Set as OpenMP's count too, so that with one thread the products inside a forward
/// see one thread and run serially, as they do inside a team of several.
int eval_team(const Config& cfg, int batch, int threads) {
  int team = threads > 0 ? threads : omp_get_max_threads();
  while (team > 1 &&
         memory_needed(cfg, batch * team, sizeof(float), Workload::Forward) > memory_available())
    --team;
  omp_set_num_threads(team);
  return team;
}

/// The mean loss over the first `windows` windows of `bytes`, `batch` at a time. Each batch's
/// forward runs whole on one thread, the threads taking the next batch as they come free; the
/// batches' losses are then summed in order. So the loss is the same bits on any number of
/// threads, and a thread whose core is busy slows eval by its share only: no thread waits for it
/// at a barrier inside a forward (docs/cli.md, `eval`, has the times). An exception inside the
/// team (std::bad_alloc) is rethrown after it, not left to end the process.
double mean_loss(const Checkpoint& ck, const std::vector<std::uint8_t>& bytes, long windows,
                 int batch, int team) {
  const long n = (windows + batch - 1) / batch;
  std::vector<double> sums(static_cast<std::size_t>(n));
  std::exception_ptr failed;
#pragma omp parallel num_threads(team)
  {
    Cache<float> cache;
    cache.routing = &fast_routing<float>();
#pragma omp for schedule(dynamic, 1)
    for (long k = 0; k < n; ++k) {
      try {
        const long w = k * batch;
        const int B = static_cast<int>(std::min<long>(batch, windows - w));
        const Batch b = sequential_batch(bytes, w, B, ck.cfg.T);
        sums[static_cast<std::size_t>(k)] =
            B * static_cast<double>(
                    model_forward<float>(ck.cfg, ck.params, b.tokens, b.targets, B, &cache));
      } catch (...) {
#pragma omp critical(eval_failed)
        if (!failed) failed = std::current_exception();
      }
    }
  }
  if (failed) std::rethrow_exception(failed);
  double total = 0;
  for (const double v : sums) total += v;
  return total / static_cast<double>(windows);
}

}  // namespace

Subcommand register_sample(CLI::App& app) {
  auto o = std::make_shared<SampleArgs>();
  auto* cmd = app.add_subcommand("sample", "Generate text from a trained model");
  cmd->footer(
      "Window rule (both paths): the context of each byte is a window of at most T bytes, RoPE\n"
      "positions from 0. A prompt longer than T is cut to its last T bytes (said on stderr, or\n"
      "prompt_cut in --json); an empty prompt starts after a newline byte. When a new byte would\n"
      "make the window T + 1 bytes, it restarts from its last T/2 bytes: one batched prefill of\n"
      "T/2 bytes every T/2 bytes, about one position of work a byte, and a byte never sees fewer\n"
      "than T/2 bytes once the window is full. (Sliding by one byte would recompute the whole\n"
      "window every byte: the kept keys and values depend on the bytes dropped.) With the decode\n"
      "cache (default), a byte that does not slide the window is one step over the cached keys\n"
      "and values; --no-cache recomputes the whole window for every byte, over the same windows,\n"
      "so a greedy sample gives the same text. Runs on the CPU reference. The last line on\n"
      "stderr gives bytes/s (--json: in the object).");
  cmd->add_option("ckpt", o->ckpt, "checkpoint file or run directory")->required();
  cmd->add_option("--prompt,-p", o->prompt, "text to continue (empty: start after a newline)");
  cmd->add_option("--length,-n", o->s.length, "bytes to generate")->check(positive());
  cmd->add_option("--temperature,-t", o->s.temperature, "softmax temperature (0 = greedy)")
      ->check(non_negative());
  cmd->add_option("--top-k,-k", o->s.top_k, "sample among the k most likely bytes (0 = all)")
      ->check(in_range(0, 256, "INT"));
  cmd->add_option("--seed", o->s.seed, "sampling seed");
  cmd->add_flag("--no-cache", o->no_cache,
                "recompute the whole window for every byte (no decode cache)");
  cmd->add_flag("--json", o->json,
                "print one JSON object (text, bytes/s, window slides) instead of text");
  cmd->add_option("--threads", o->threads, "CPU threads (0 = all cores)")->check(thread_count());
  return {cmd, [o]() -> int { return run_sample(*o); }};
}

// ---- eval -------------------------------------------------------------------------------------

Subcommand register_eval(CLI::App& app) {
  struct Opts {
    std::string ckpt, data = kDefaultCorpus, split = "val";
    double val_fraction = 0.1;
    int batch = 16;
    long max_windows = 0;
    int threads = 0;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("eval", "Loss and bits per byte of a model on a text file");
  cmd->add_option("ckpt", o->ckpt, "checkpoint file or run directory")->required();
  cmd->add_option("--data", o->data, "text file to evaluate on");
  cmd->add_option("--split", o->split,
                  "val: the held-out tail (as in training); all: the whole file")
      ->check(one_of({"val", "all"}));
  cmd->add_option("--val-fraction", o->val_fraction, "size of the held-out tail")
      ->check(in_range(0, 1, "FLOAT"));
  cmd->add_option("--batch,-B", o->batch, "sequences per forward pass")->check(positive());
  cmd->add_option("--max-windows", o->max_windows, "evaluate at most this many windows (0 = all)")
      ->check(non_negative());
  cmd->add_flag("--json", o->json, "print one JSON object instead of text");
  cmd->add_option("--threads", o->threads, "CPU threads, a batch each (0 = all cores)")
      ->check(thread_count());
  return {
      cmd, [o]() -> int {
        const Checkpoint ck = load_checkpoint(o->ckpt);
        require_memory(ck.cfg, o->batch, sizeof(float), Workload::Forward, "eval");
        const int T = ck.cfg.T;
        std::vector<std::uint8_t> bytes;
        if (o->split == "val")
          bytes = load_corpus(o->data, o->val_fraction, T).val;
        else
          bytes = read_file_bytes(o->data);
        long windows = window_count(bytes, T);
        if (windows == 0)
          throw UsageError(fmt::format(
              "data file '{}' is shorter than one sequence of T + 1 = {} bytes", o->data, T + 1));
        if (o->max_windows > 0) windows = std::min(windows, o->max_windows);
        const int team = eval_team(ck.cfg, o->batch, o->threads);
        const double loss = mean_loss(ck, bytes, windows, o->batch, team);
        if (!std::isfinite(loss))
          throw UsageError(fmt::format(
              "{}: the loss on {} is {}: the checkpoint's weights overflow in float (finite, but "
              "too large to evaluate); no loss is reported",
              o->ckpt, o->data, shown(loss)));
        const double bpb = loss / std::numbers::ln2;
        if (o->json)
          fmt::print(
              "{{\"loss\": {:.8f}, \"bits_per_byte\": {:.8f}, \"bytes\": {}, \"mode\": \"{}\", "
              "\"step\": {}}}\n",
              loss, bpb, windows * T, mode_name(ck.cfg.mode), ck.step);
        else
          fmt::print(
              "{} ({} step {}) on {} [{}]: loss {:.6f} nats/byte, {:.6f} bits/byte over {} bytes\n",
              o->ckpt, mode_name(ck.cfg.mode), ck.step, o->data, o->split, loss, bpb, windows * T);
        return kOk;
      }};
}

// ---- heatmap ----------------------------------------------------------------------------------

Subcommand register_heatmap(CLI::App& app) {
  struct Opts {
    std::string ckpt, data = kDefaultCorpus, out;
    int batch = 16;
    double val_fraction = 0.1;
    std::uint64_t seed = 1;
    std::string formats = "png,svg";
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand(
      "heatmap",
      "Where each routing head looks: mean α per [site × source], and head disagreement");
  cmd->add_option("ckpt", o->ckpt, "checkpoint file or run directory")->required();
  cmd->add_option("--data", o->data, "text to route (its held-out tail is used)");
  cmd->add_option("--out,-o", o->out, "output directory (default <run>/heatmaps/step_<step>)");
  cmd->add_option("--batch,-B", o->batch, "random windows averaged over")->check(positive());
  cmd->add_option("--val-fraction", o->val_fraction, "size of the held-out tail")
      ->check(in_range(0, 1, "FLOAT"));
  cmd->add_option("--seed", o->seed, "seed of the windows");
  cmd->add_option("--format", o->formats, "figure formats, comma-separated: png, svg, pdf");
  return {cmd, [o]() -> int {
            const std::vector<io::Format> formats = parse_format_flag(o->formats);
            const Checkpoint ck = load_checkpoint(o->ckpt);
            if (!ck.cfg.routed())
              throw UsageError(o->ckpt +
                               " is a 'residual' model: it has no routing to draw "
                               "(train attnres, mhar, block or delta)");
            require_memory(ck.cfg, o->batch, sizeof(float), Workload::Forward, "heatmap");
            const Corpus corpus = load_corpus(o->data, o->val_fraction, ck.cfg.T);
            const Batch b = random_batch(corpus.val, o->batch, ck.cfg.T, o->seed, 0, 2);
            std::string out = o->out;
            if (out.empty()) {
              const auto path = std::filesystem::path(resolve_checkpoint_path(o->ckpt));
              out = (path.parent_path() / "heatmaps" / fmt::format("step_{:06}", ck.step)).string();
            }
            const RoutingMap map = routing_map(ck.cfg, ck.params, b, o->batch);
            write_routing_map(out, map,
                              fmt::format("{} H={}, step {}", mode_name(ck.cfg.mode),
                                          ck.cfg.route_heads(), ck.step),
                              formats);
            if (io::kFiguresBuilt)
              fmt::print("wrote {0}/alpha.csv, alpha.json, heatmap.{1} and disagreement.{1}\n", out,
                         formats.size() == 1 ? io::format_list(formats)
                                             : "{" + io::format_list(formats) + "}");
            else
              fmt::print("wrote {}/alpha.csv and alpha.json ({})\n", out, kFiguresOff);
            for (std::size_t s = 0; s < map.sites.size(); ++s)
              fmt::print("  site {:<6} head disagreement {:.4f} bits\n", map.sites[s],
                         map.disagreement[s]);
            return kOk;
          }};
}

}  // namespace mhar::toy

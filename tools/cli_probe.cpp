/**
 * @file cli_probe.cpp
 * @brief `mhar-toy probe`: the forced-compromise probe of a trained model's routing queries
 *        (probe.h), as a per-site table or one JSON object.
 */
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "checkpoint.h"
#include "cli_common.h"
#include "data.h"
#include "errors.h"
#include "memory.h"
#include "probe.h"

namespace mhar::toy {

namespace {

/// The --data a run was trained on (its config.json), when `ckpt` is a run directory.
std::string run_data(const std::string& ckpt) {
  const auto cfg = std::filesystem::path(ckpt) / "config.json";
  std::ifstream in(cfg);
  if (!in) return {};
  try {
    return nlohmann::json::parse(in).at("train").at("data").get<std::string>();
  } catch (const std::exception&) {
    return {};
  }
}

nlohmann::json site_json(const SiteProbe& s, bool with_n) {
  nlohmann::json j;
  if (with_n) j = {{"site", s.site}, {"n_sources", s.n_sources}};
  j["kl_trained"] = s.kl_trained;
  j["kl_null"] = s.kl_null;
  if (with_n) j["kl_null_sd"] = s.kl_null_sd;
  j["excess"] = s.excess;
  j["collinearity"] = s.collinearity;
  return j;
}

/// The options of `probe`.
struct ProbeArgs {
  std::string ckpt, data = kDefaultCorpus;
  int windows = 16;
  double val_fraction = 0.1;
  std::uint64_t batch_seed = 0;
  ProbeOptions probe;
  bool json = false;
};

/// `probe --json`: every site, their mean, the config and step, and the heads' disagreement.
nlohmann::json probe_json(const Checkpoint& ck, const ProbeResult& r) {
  nlohmann::json j;
  j["sites"] = nlohmann::json::array();
  for (const auto& s : r.sites) j["sites"].push_back(site_json(s, true));
  j["mean"] = site_json(r.mean, false);
  j["config"] = config_to_json(ck.cfg);
  j["step"] = ck.step;
  if (r.H > 1) {
    nlohmann::json hd;
    for (const auto& s : r.sites) hd[s.site] = s.head_disagreement;
    j["head_disagreement"] = hd;
  }
  return j;
}

/// The per-site table, its mean row, and the paper's numbers to compare with.
void print_probe_table(const ProbeArgs& o, const Checkpoint& ck, const ProbeResult& r,
                       const std::string& path) {
  fmt::print(
      "probe of {} ({} H={}, d={}, step {}): {} slices, {} null draws, {} "
      "windows of {} bytes from {}\n",
      o.ckpt, mode_name(ck.cfg.mode), r.H, ck.cfg.d, ck.step, o.probe.slices, o.probe.null_draws,
      o.windows, ck.cfg.T, path);
  const bool heads = r.H > 1;
  fmt::print("{:<8} {:>3} {:>10} {:>10} {:>9} {:>10} {:>8}{}\n", "site", "N", "KL trained",
             "KL null", "null sd", "excess", "|cos|", heads ? "  heads disagree (bits)" : "");
  for (const auto& s : r.sites)
    fmt::print("{:<8} {:>3} {:>10.4f} {:>10.4f} {:>9.4f} {:>10.4f} {:>8.3f}{}\n", s.site,
               s.n_sources, s.kl_trained, s.kl_null, s.kl_null_sd, s.excess, s.collinearity,
               heads ? fmt::format("  {:>10.4f}", s.head_disagreement) : "");
  fmt::print("{:<8} {:>3} {:>10.4f} {:>10.4f} {:>9} {:>10.4f} {:>8.3f}{}\n", "mean", "",
             r.mean.kl_trained, r.mean.kl_null, "", r.mean.excess, r.mean.collinearity,
             heads ? fmt::format("  {:>10.4f}", r.mean.head_disagreement) : "");
  if (heads)
    fmt::print(
        "(H = {}: the KL columns probe the concatenated query, i.e. what one "
        "head would have to compromise; the last column is the heads' own "
        "disagreement)\n",
        r.H);
  fmt::print(
      "paper (attnres, learned excess): 0.235 at d 512, 0.281 at d 768, 0.512 "
      "at d 1024, 0.606 at d 1280; null 0.03-0.10\n");
}

/// Runs `probe`; `data_given`: --data was on the command line (else the run's own data is used).
int run_probe(const ProbeArgs& o, bool data_given) {
  const Checkpoint ck = load_checkpoint(o.ckpt);
  if (!ck.cfg.routed())
    throw UsageError(o.ckpt +
                     " is a 'residual' model: it has no routing query to probe "
                     "(train attnres, mhar, block or delta)");
  require_memory(ck.cfg, o.windows, sizeof(double), Workload::Gradient, "probe");
  std::string path = o.data;
  if (!data_given)
    if (const std::string d = run_data(o.ckpt); !d.empty()) path = d;
  const Corpus corpus = load_corpus(path, o.val_fraction, ck.cfg.T);
  const Batch b = random_batch(corpus.val, o.windows, ck.cfg.T, o.batch_seed, 0, 4);
  const ProbeResult r = probe_model(ck.cfg, ck.params, b, o.windows, o.probe);
  if (o.json)
    fmt::print("{}\n", probe_json(ck, r).dump(2));
  else
    print_probe_table(o, ck, r, path);
  return kOk;
}

}  // namespace

Subcommand register_probe(CLI::App& app) {
  auto o = std::make_shared<ProbeArgs>();
  auto* cmd = app.add_subcommand(
      "probe",
      "The forced-compromise probe: how much slices of each trained routing query disagree "
      "about depth (KL to the shared softmax), against random queries of the same norm");
  cmd->add_option("ckpt", o->ckpt, "checkpoint file or run directory")->required();
  auto* data = cmd->add_option("--data", o->data,
                               "text to probe on, its held-out tail (default: the run's own "
                               "--data, else data/tinyshakespeare.txt)");
  cmd->add_option("--windows", o->windows, "held-out windows of T bytes to probe on")
      ->capture_default_str()
      ->check(positive());
  cmd->add_option("--batch-seed", o->batch_seed, "seed of the windows")->capture_default_str();
  cmd->add_option("--val-fraction", o->val_fraction, "size of the held-out tail")
      ->capture_default_str()
      ->check(in_range(0, 1, "FLOAT"));
  cmd->add_option("--slices", o->probe.slices, "contiguous slices of q (must divide d)")
      ->capture_default_str()
      ->check(positive());
  cmd->add_option("--null-draws", o->probe.null_draws, "random queries for the null")
      ->capture_default_str()
      ->check(positive());
  cmd->add_option("--null-seed", o->probe.null_seed, "seed of the null queries")
      ->capture_default_str();
  cmd->add_flag("--json", o->json, "print one JSON object instead of the table");
  return {cmd, [o, data]() -> int { return run_probe(*o, data->count() > 0); }};
}

}  // namespace mhar::toy

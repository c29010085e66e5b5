/**
 * @file test_cli.cpp
 * @brief mhar-toy end to end: a short run whose loss falls, resume equals uninterrupted, convert
 *        keeps the loss, the grad file matches finite differences, Ctrl-C and NaN handling, the
 *        figure formats (and a build without figures), and each bad input's message and exit
 *        code.
 */
#include <fmt/format.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <thread>
#include <tuple>
#include <vector>

#include "bench_routing_cpu.h"
#include "checkpoint.h"
#include "cli_train.h"
#include "figures.h"
#include "memory.h"
#include "safetensors.h"

namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {

struct Result {
  int code = -1;
  std::string out;  ///< stdout and stderr together
};

/// Runs `mhar-toy <args>` through the shell (after `env`, "VAR=value ..." or ""); returns its
/// exit code and output.
Result toy(const std::string& args, const std::string& env = "") {
  static int n = 0;
  const fs::path log = fs::temp_directory_path() / ("mhar-cli-" + std::to_string(getpid()) + "-" +
                                                    std::to_string(n++) + ".log");
  const std::string cmd = env + std::string(MHAR_TOY) + " " + args + " > " + log.string() + " 2>&1";
  const int status = std::system(cmd.c_str());
  Result r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream in(log);
  std::stringstream ss;
  ss << in.rdbuf();
  r.out = ss.str();
  fs::remove(log);
  return r;
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// A fresh directory for one test case.
fs::path scratch(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("mhar-cli-" + std::to_string(getpid())) / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

/// A tiny model that trains in a fraction of a second per step.
const std::string kTiny =
    std::string(" --data ") + MHAR_DATA +
    " --d 32 --layers 2 --n-head 2 --n-kv-head 1 --ffn 48 --seq-len 32 --batch 4"
    " --eval-every 10 --eval-batches 2 --ckpt-every 10 --threads 1 -q";
/// kTiny on the CPU reference, whatever this machine has.
const std::string kTinyCpu = kTiny + " --device cpu";

std::vector<nlohmann::json> metrics(const fs::path& run) {
  std::vector<nlohmann::json> rows;
  std::ifstream in(run / "metrics.jsonl");
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

double eval_loss(const fs::path& run) {
  const Result r = toy("eval " + run.string() + " --json --max-windows 40 --data " + MHAR_DATA);
  REQUIRE(r.code == 0);
  return nlohmann::json::parse(r.out).at("loss").get<double>();
}

/// Runs each (arguments, expected message) pair: each must exit 2 with that message, and no raw
/// C++ exception text may reach the user.
template <typename Cases>
void expect_refused(const Cases& cases) {
  for (const auto& c : cases) {
    CAPTURE(c.args);
    const Result r = toy(c.args);
    CAPTURE(r.out);
    CHECK(r.code == 2);
    CHECK_THAT(r.out, Contains(c.message));
    CHECK_THAT(r.out, !Contains("bad_alloc") && !Contains("basic_filebuf") &&
                          !Contains("Run with --help"));  // a library's words, not ours
  }
}

}  // namespace

TEST_CASE("a short training run lowers the loss and writes a complete run directory", "[cli]") {
  const fs::path d = scratch("train");
  const Result r = toy("train" + kTinyCpu + " --heads 4 --steps 60 --heatmap-every 30 --out " +
                       (d / "run").string());
  INFO(r.out);
  REQUIRE(r.code == 0);
  const auto m = metrics(d / "run");
  REQUIRE(m.size() == 60);
  double first = 0, last = 0;
  for (int i = 0; i < 5; ++i) first += m[i].at("train_loss").get<double>() / 5;
  for (int i = 55; i < 60; ++i) last += m[i].at("train_loss").get<double>() / 5;
  INFO("mean train loss of the first 5 steps " << first << ", of the last 5 " << last);
  CHECK(last < first - 0.3);
  CHECK(m.back().contains("val_loss"));
  for (const char* f :
       {"config.json", "metrics.csv", "checkpoint.safetensors", "optimizer.safetensors"})
    CHECK(fs::exists(d / "run" / f));
  for (const char* s : {"step_000000", "step_000030", "step_000060"}) {
    CAPTURE(s);
    for (const char* f : {"alpha.csv", "alpha.json"})
      CHECK(fs::exists(d / "run" / "heatmaps" / s / f));
    // The default formats, png and svg, where this build draws figures.
    for (const char* f : {"heatmap.png", "heatmap.svg", "disagreement.png", "disagreement.svg"})
      CHECK(fs::exists(d / "run" / "heatmaps" / s / f) == mhar::io::kFiguresBuilt);
    CHECK_FALSE(fs::exists(d / "run" / "heatmaps" / s / "heatmap.pdf"));
  }
  // alpha.json: H = 4 heads, rows of each site sum to one over the sources it reads
  std::ifstream in(d / "run" / "heatmaps" / "step_000060" / "alpha.json");
  const auto j = nlohmann::json::parse(in);
  CHECK(j.at("H") == 4);
  for (const auto& head : j.at("alpha"))
    for (const auto& row : head) {
      double sum = 0;
      for (const auto& a : row)
        if (!a.is_null()) sum += a.get<double>();
      CHECK(std::abs(sum - 1.0) < 1e-4);
    }
  // the same seed again gives the same losses (a new directory is chosen, nothing overwritten)
  const Result again =
      toy("train" + kTinyCpu + " --heads 4 --steps 60 --out " + (d / "run").string());
  CHECK(again.code == 2);
  CHECK_THAT(again.out, Contains("already holds a run"));
}

TEST_CASE("resume produces exactly the losses of the uninterrupted run", "[cli][resume]") {
  const fs::path d = scratch("resume");
  const std::string mode = GENERATE(std::string("mhar --heads 2"), std::string("block --heads 2"));
  CAPTURE(mode);
  REQUIRE(toy("train" + kTinyCpu + " --mode " + mode + " --steps 30 --out " + (d / "full").string())
              .code == 0);
  REQUIRE(toy("train" + kTinyCpu + " --mode " + mode + " --steps 30 --out " + (d / "part").string())
              .code == 0);
  // Cut the second run back to its step-10 checkpoint: train 10 steps fresh, then resume.
  REQUIRE(toy("train" + kTinyCpu + " --mode " + mode + " --steps 10 --out " + (d / "cut").string())
              .code == 0);
  const Result r = toy("train --resume " + (d / "cut").string() + " --steps 30 -q");
  INFO(r.out);
  REQUIRE(r.code == 0);
  const auto full = metrics(d / "full"), cut = metrics(d / "cut");
  REQUIRE(full.size() == 30);
  REQUIRE(cut.size() == 30);
  for (std::size_t i = 0; i < full.size(); ++i) {
    CAPTURE(i);
    CHECK(full[i].at("train_loss").get<double>() == cut[i].at("train_loss").get<double>());
  }
  CHECK(full.back().at("val_loss").get<double>() == cut.back().at("val_loss").get<double>());
}

TEST_CASE("convert keeps the loss of the residual model, then training continues",
          "[cli][convert]") {
  const fs::path d = scratch("convert");
  REQUIRE(
      toy("train" + kTinyCpu + " --mode residual --steps 20 --out " + (d / "res").string()).code ==
      0);
  const Result c = toy("convert " + (d / "res").string() + " --out " + (d / "delta").string() +
                       " --heads 2 --steps 30");
  INFO(c.out);
  REQUIRE(c.code == 0);
  const double before = eval_loss(d / "res"), after = eval_loss(d / "delta");
  INFO("residual " << before << ", converted delta " << after);
  CHECK(before == after);
  REQUIRE(toy("train --resume " + (d / "delta").string() + " -q").code == 0);
  CHECK(eval_loss(d / "delta") < after);
  const auto ck = mhar::toy::load_checkpoint((d / "delta").string());
  CHECK(ck.cfg.mode == mhar::Mode::Delta);
  CHECK(ck.params.delta_gate.cwiseAbs().maxCoeff() > 0.0f);  // the gates opened
  // convert refuses a routed model
  const Result bad = toy("convert " + (d / "delta").string() + " --out " + (d / "x").string());
  CHECK(bad.code == 2);
  CHECK_THAT(bad.out, Contains("convert takes a 'residual' one"));
}

TEST_CASE("the grad file matches central differences of its own loss", "[cli][grad]") {
  const fs::path d = scratch("grad");
  const std::string file = (d / "g.safetensors").string();
  const Result r = toy(std::string("grad --data ") + MHAR_DATA +
                       " --mode mhar --heads 2 --d 16 --layers 2 --n-head 2 --n-kv-head 1 --ffn 24"
                       " --seq-len 8 --batch 2 --out " +
                       file);
  INFO(r.out);
  REQUIRE(r.code == 0);
  const auto st = mhar::io::load_safetensors(file);
  const auto cfg =
      mhar::toy::config_from_json(nlohmann::json::parse(st.metadata.at("config")), file);
  const auto tok64 = st.find("tokens")->to_i64(), tgt64 = st.find("targets")->to_i64();
  const std::vector<int> tokens(tok64.begin(), tok64.end()), targets(tgt64.begin(), tgt64.end());
  mhar::Params<double> p = mhar::zero_params<double>(cfg);
  p.for_each([&](const std::string& name, mhar::Mat<double>& m, bool) {
    const auto v = st.find("param." + name)->to_f64();
    std::copy(v.begin(), v.end(), m.data());
  });
  const double loss = mhar::model_forward<double>(cfg, p, tokens, targets, 2, nullptr);
  CHECK(loss == st.find("loss")->to_f64()[0]);
  int checked = 0;
  double worst = 0;
  p.for_each([&](const std::string& name, mhar::Mat<double>& m, bool) {
    const auto g = st.find("grad." + name)->to_f64();
    for (long k = 0; k < m.size(); k += std::max<long>(1, m.size() / 5)) {
      const double saved = m.data()[k], h = 1e-5;
      m.data()[k] = saved + h;
      const double fp = mhar::model_forward<double>(cfg, p, tokens, targets, 2, nullptr);
      m.data()[k] = saved - h;
      const double fm = mhar::model_forward<double>(cfg, p, tokens, targets, 2, nullptr);
      m.data()[k] = saved;
      const double num = (fp - fm) / (2 * h);
      const double err = std::abs(num - g[k]);
      worst = std::max(worst, err);
      // FD rounding noise ~ 16 ε |loss| / h ≈ 2e-9 (see tests/gradcheck.h)
      CHECK(err <= 1e-6 * std::abs(num) + 1e-8);
      ++checked;
    }
  });
  std::printf("gradcheck grad-file (mhar H=2): %d elements, worst absolute error %.3e\n", checked,
              worst);
  CHECK(checked > 50);
}

TEST_CASE("a NaN loss stops training with exit 3 and keeps the last good checkpoint",
          "[cli][bad-input]") {
  const fs::path d = scratch("nan");
  const fs::path run = d / "run";
  // two good steps, a checkpoint at each; then the learning rate of config.json made 1e30, so
  // that step 3's update overflows the weights (its own forward, before the update, is finite)
  REQUIRE(toy("train" + kTinyCpu + " --steps 2 --ckpt-every 1 --out " + run.string()).code == 0);
  nlohmann::json cfg;
  std::ifstream(run / "config.json") >> cfg;
  cfg["train"]["lr"] = 1e30;
  cfg["train"]["warmup"] = 0;
  cfg["train"]["clip"] = 0.0;
  std::ofstream(run / "config.json") << cfg.dump(2);
  const Result r = toy("train --resume " + run.string() + " --steps 20");
  INFO(r.out);
  CHECK(r.code == 3);
  // NaN as "NaN": fmt alone writes this one "-nan", which read as a negative number
  CHECK_THAT(r.out, Contains("diverged: the weights after step 3 give a validation loss of NaN;"));
  CHECK_THAT(r.out, Contains("the last good checkpoint (step 2) is kept"));
  // kept means usable: step 2's checkpoint, whose loss is finite
  CHECK(mhar::toy::load_checkpoint(run.string()).step == 2);
  CHECK(std::isfinite(eval_loss(run)));

  // the same in the last step, where no later forward would notice: no checkpoint, no "done"
  const Result last = toy("train" + kTinyCpu + " --steps 1 --warmup 0 --lr 1e30 --clip 0 --out " +
                          (d / "last").string());
  INFO(last.out);
  CHECK(last.code == 3);
  CHECK_THAT(last.out, Contains("validation loss of NaN; stopping without saving them: no "
                                "checkpoint had been written yet"));
  CHECK_THAT(last.out, !Contains("done"));
  CHECK(!fs::exists(d / "last" / "checkpoint.safetensors"));
}

TEST_CASE("resume with --steps at or below the run's step trains nothing and changes nothing",
          "[cli][resume]") {
  const fs::path run = scratch("resume-fewer") / "run";
  REQUIRE(toy("train" + kTinyCpu + " --steps 3 --ckpt-every 1 --out " + run.string()).code == 0);
  const std::string before = read_text(run / "config.json");
  const Result r = toy("train --resume " + run.string() + " --steps 1");
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Contains("is already at step 3: --steps 1 trains nothing (nothing changed)"));
  CHECK(read_text(run / "config.json") == before);  // it used to say "steps": 1 there
}

TEST_CASE("Ctrl-C, SIGTERM or SIGHUP saves a checkpoint, exits 130, and the run resumes",
          "[cli][sigint]") {
  // SIGTERM: `kill`, a job scheduler's time limit; SIGHUP: the terminal closed. Each killed the
  // run at once, losing the steps since its last checkpoint. With SIGHUP stderr is gone first, as
  // a closed terminal's is (here a pipe with no reader, and a progress line every step), and a
  // line that cannot be written must not stop the run either (the write raised SIGPIPE, or threw).
  const int sig = GENERATE(SIGINT, SIGTERM, SIGHUP);
  const fs::path d = scratch(sig == SIGINT ? "sigint" : sig == SIGTERM ? "sigterm" : "sighup");
  const std::string out = (d / "run").string();
  const fs::path log = d / "train.log";
  int gone[2] = {-1, -1};  // SIGHUP: stderr is this pipe, whose reader closes before the signal
  REQUIRE((sig != SIGHUP || pipe(gone) == 0));
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    const int fd = sig == SIGHUP ? gone[1] : open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || dup2(fd, STDERR_FILENO) < 0) _exit(127);
    if (sig == SIGHUP) close(gone[0]);
    const std::string data = MHAR_DATA;
    std::vector<const char*> argv = {
        MHAR_TOY,    "train",     "--data",  data.c_str(),  "--d",     "32",     "--layers",
        "2",         "--n-head",  "2",       "--n-kv-head", "1",       "--ffn",  "48",
        "--seq-len", "32",        "--batch", "4",           "--steps", "100000", "--ckpt-every",
        "1000",      "--threads", "1",       "--log-every", "1",       "--out",  out.c_str()};
    if (sig != SIGHUP) argv.push_back("-q");
    argv.push_back(nullptr);
    execv(MHAR_TOY, const_cast<char* const*>(argv.data()));
    _exit(127);
  }
  if (sig == SIGHUP) close(gone[1]);
  // Wait (without a timed assertion) until a few steps are logged, then interrupt.
  for (int i = 0; i < 600 && metrics(out).size() < 3; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  if (sig == SIGHUP) {
    close(gone[0]);
    const std::size_t n = metrics(out).size();  // a progress line into the closed pipe first
    for (int i = 0; i < 600 && metrics(out).size() < n + 2; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  kill(pid, sig);
  int status = 0;
  waitpid(pid, &status, 0);
  CAPTURE(sig == SIGHUP ? std::string("(stderr was a closed pipe)") : read_text(log));
  CAPTURE(WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 130);
  const auto ck = mhar::toy::load_checkpoint(out);
  if (sig != SIGHUP)
    CHECK_THAT(read_text(log), Contains(fmt::format("interrupted{}: checkpoint of step {} saved",
                                                    sig == SIGTERM ? " (SIGTERM)" : "", ck.step)));
  CHECK(ck.step >= 3);
  CHECK(static_cast<long>(metrics(out).size()) == ck.step);
  const Result r = toy("train --resume " + out + " --steps " + std::to_string(ck.step + 3) + " -q");
  CHECK(r.code == 0);
  CHECK(static_cast<long>(metrics(out).size()) == ck.step + 3);
}

TEST_CASE("bad input gets a clear message and exit code 2", "[cli][bad-input]") {
  const fs::path d = scratch("bad");
  const std::string run = (d / "run").string();
  struct Case {
    std::string args, message;
  };
  std::ofstream(d / "short.txt") << "too short";
  REQUIRE(toy("train" + kTinyCpu + " --steps 10 --out " + (d / "ok").string()).code == 0);
  // a truncated checkpoint, a corrupt one, and a checkpoint of another shape in a run directory
  fs::copy(d / "ok", d / "trunc", fs::copy_options::recursive);
  fs::resize_file(d / "trunc" / "checkpoint.safetensors",
                  fs::file_size(d / "trunc" / "checkpoint.safetensors") / 2);
  fs::copy(d / "ok", d / "corrupt", fs::copy_options::recursive);
  std::ofstream(d / "corrupt" / "checkpoint.safetensors", std::ios::binary)
      << "\xff\xff\xff\xff garbage";
  REQUIRE(toy("train" + kTinyCpu + " --d 16 --steps 10 --out " + (d / "small").string()).code == 0);
  fs::copy(d / "ok", d / "mixed", fs::copy_options::recursive);
  fs::copy_file(d / "small" / "checkpoint.safetensors", d / "mixed" / "checkpoint.safetensors",
                fs::copy_options::overwrite_existing);
  std::ofstream(d / "afile") << "x";
  // a run whose config.json holds a value that train refuses
  fs::copy(d / "ok", d / "badcfg", fs::copy_options::recursive);
  nlohmann::json cfg;
  std::ifstream(d / "badcfg" / "config.json") >> cfg;
  cfg["train"]["threads"] = 5000;
  std::ofstream(d / "badcfg" / "config.json") << cfg.dump(2);
  const std::string badcfg_text = read_text(d / "badcfg" / "config.json");

  const Case cases[] = {
      {"train" + kTinyCpu + " --heads 3 --out " + run, "routing heads H = 3 must divide d = 32"},
      {"train" + kTinyCpu + " --mode mha --out " + run,
       "--mode: must be residual, attnres, mhar, block or delta, got 'mha'"},
      {"train" + kTinyCpu + " --steps 0 --out " + run, "--steps: must be positive, got 0"},
      {"train" + kTinyCpu + " --batch -2 --out " + run, "--batch: must be positive, got -2"},
      {"train" + kTinyCpu + " --d 0 --out " + run, "--d: must be positive, got 0"},
      {"train" + kTinyCpu + " --n-head 3 --out " + run, "n_head = 3 must divide d = 32"},
      {"train" + kTinyCpu + " --lr -1 --out " + run, "--lr: must be positive, got -1"},
      {"train" + kTinyCpu + " --device tpu --out " + run, "--device: must be auto, cpu or cuda, got 'tpu'"},
      {"train" + kTinyCpu + " --data " + (d / "missing.txt").string() + " --out " + run,
       "cannot open"},
      {"train" + kTinyCpu + " --data " + (d / "short.txt").string() + " --out " + run,
       "too short for sequences"},
      {"train" + kTinyCpu + " --out " + (d / "afile" / "sub").string(),
       "cannot create the output directory"},
      // CLI11's own words never reach the user ("--steps: 1 required INT:POSITIVE missing",
      // "ckpt is required", "A subcommand is required", "Run with --help for more information.")
      {"train --steps",
       "mhar-toy: error: mhar-toy train: --steps needs a value (every flag: "
       "mhar-toy train --help)"},
      {"train --heads -3",
       "mhar-toy: error: mhar-toy train: --heads: must be 0 or positive, got -3 (every flag: "
       "mhar-toy train --help)"},
      {"eval", "mhar-toy eval: missing the ckpt argument: checkpoint file or run directory"},
      {"cases", "mhar-toy cases: missing --out, which this command needs: directory to write"},
      {"bench walk", "mhar-toy bench: what: must be step or routing, got 'walk'"},
      {"", "mhar-toy: error: a command is required: train, sample, eval,"},
      {"trian --steps 3", "mhar-toy: error: 'trian' is not a command; the commands: train,"},
      {"train --bogus-flag", "bogus"},
      // named with the subcommand, in the order typed (CLI11's own text: "residual --modes")
      {"bench step --modes residual",
       "mhar-toy: error: mhar-toy bench: unexpected arguments --modes residual (every flag: "
       "mhar-toy bench --help)"},
      {"train --bogus 1 two", "mhar-toy train: unexpected arguments --bogus 1 two"},
      {"eval a b", "mhar-toy eval: unexpected argument b (every flag: mhar-toy eval --help)"},
      {"eval " + (d / "trunc").string(), "truncated"},
      {"eval " + (d / "corrupt").string(), "cannot load checkpoint"},
      {"eval " + (d / "nowhere").string(), "cannot load checkpoint"},
      {"train --resume " + (d / "mixed").string(), "holds a different model than config.json"},
      {"train --resume " + (d / "nowhere").string(), "not a run directory"},
      // named with its file, and config.json not rewritten for --steps (it was, then refused)
      {"train --resume " + (d / "badcfg").string() + " --steps 20",
       (d / "badcfg" / "config.json").string() +
           ": --threads must be 0 (one per idle core) to 1024, got 5000"},
      {"sample " + (d / "ok").string() + " --top-k 300", "--top-k: must be from 0 to 256, got 300"},
      {"train" + kTinyCpu + " --val-fraction 2 --out " + run,
       "--val-fraction: must be from 0 to 1, got 2"},
      {"train" + kTinyCpu + " --steps 2.5 --out " + run,
       "--steps: '2.5' is not a whole number in range"},
      {"train" + kTinyCpu + " --lr 1e999 --out " + run,
       "--lr: '1e999' is beyond the range of a double"},
      {"sample " + (d / "ok").string() + " --threads -1",
       "--threads: must be from 0 to 1024, got -1"},
      // a team of 20,000 OpenMP threads took minutes and gigabytes to start
      {"train" + kTinyCpu + " --threads 20000 --out " + run,
       "--threads: must be from 0 to 1024, got 20000"},
      {"bench step --threads 5000", "--threads: must be from 0 to 1024, got 5000"},
      // it forked until the process limit, for minutes
      {"bench step --busy 100000", "--busy: must be from 0 to 1024, got 100000"},
      {"heatmap " + (d / "ok").string() + " --batch 0", "--batch: must be positive, got 0"},
      {"plot " + (d / "nowhere").string(), "is '"},
      {"train" + kTinyCpu + " --format png,jpg --out " + run, "unknown figure format 'jpg'"},
      {"heatmap " + (d / "ok").string() + " --format svg,svg", "'svg' is named twice"},
      {"plot " + (d / "ok").string() + " --format gif", "unknown figure format 'gif'"},
      {"grad --heads 5 --d 32", "must divide d = 32"},
      {"probe " + (d / "ok").string() + " --slices 3", "--slices = 3 must divide the width d = 32"},
      {"bench routing --device cpu -N 3 -P 8 --width 10 --route-heads 4",
       "--route-heads must divide --width"},
      {"bench routing --device cpu -N 3", "give all of --sources, --positions"},
      // sizes that cannot fit: refused before anything is allocated (the first allocated until
      // the kernel killed it, the second failed after allocating for minutes)
      {"bench routing --device cpu -N 100000 -P 100000 --width 4096 --route-heads 4",
       "bench routing at N = 100000, P = 100000, width 4096 needs about"},
      {"bench step --device cpu --batch 100000000",
       "GiB for 3 models at once of d = 128, L = 4, ffn = 352, T = 128, B = 100000000"},
  };
  expect_refused(cases);
  CHECK_FALSE(fs::exists(run));  // nothing was created by the refused runs
  CHECK(read_text(d / "badcfg" / "config.json") == badcfg_text);
}

TEST_CASE("bench step: its modes' steps must fit together, not only each alone",
          "[cli][bad-input]") {
  // a batch at which one mode's step needs about half the memory this machine has left: each
  // mode alone would fit, the three that bench step builds before it times them do not
  const double have = mhar::toy::memory_available();
  REQUIRE(have > 0);
  const double per_sequence =
      mhar::toy::memory_needed(mhar::Config(), 1000, sizeof(float),
                               mhar::toy::Workload::Training) /
      1000;
  const long batch = static_cast<long>(0.5 * have / per_sequence);
  const Result r = toy("bench step --device cpu --repeats 1 --batch " + std::to_string(batch));
  INFO(r.out);
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Contains("bench step needs about"));
  CHECK_THAT(r.out, Contains(fmt::format("for 3 models at once of d = 128, L = 4, ffn = 352, "
                                         "T = 128, B = {}",
                                         batch)));
}

TEST_CASE("output that cannot be written is an error, not a silent success", "[cli][bad-input]") {
  // standard output on a full disk: /dev/full fails every write with ENOSPC. A short output sat
  // in stdio's buffer until exit, where its loss went unchecked (exit 0); a long one failed
  // inside fmt::print, whose own words reached the user ("cannot write to file").
  REQUIRE(fs::exists("/dev/full"));
  const fs::path run = scratch("stdout-full") / "run";
  REQUIRE(toy("train" + kTinyCpu + " --steps 1 --out " + run.string()).code == 0);
  const fs::path log = run.parent_path() / "stderr.txt";
  for (const std::string& args : std::vector<std::string>{
           "eval " + run.string() + " --max-windows 4 --data " + MHAR_DATA,
           "sample " + run.string() + " -n 20", "sample " + run.string() + " -n 20000", "--help"}) {
    CAPTURE(args);
    const int status = std::system(
        (std::string(MHAR_TOY) + " " + args + " > /dev/full 2> " + log.string()).c_str());
    CHECK((WIFEXITED(status) ? WEXITSTATUS(status) : -1) == 1);
    const std::string err = read_text(log);
    CHECK_THAT(err, Contains("mhar-toy: error: writing the output (standard output) failed"));
    CHECK_THAT(err, !Contains("cannot write to file"));
  }
}

TEST_CASE("docs/cli.md quotes a usage error as mhar-toy prints it", "[cli][bad-input]") {
  const Result r = toy("train --steps");
  CHECK(r.code == 2);
  const std::string line = r.out.substr(0, r.out.find('\n'));
  REQUIRE_FALSE(line.empty());
  std::ifstream in(MHAR_CLI_DOC);
  std::stringstream doc;
  doc << in.rdbuf();
  CHECK_THAT(doc.str(), Contains("\n" + line + "\n"));
}

namespace {

/// Rewrites a checkpoint file through `edit` (metadata or tensor data), as a damaged or forged
/// file would arrive.
template <typename F>
void edit_checkpoint(const fs::path& from, const fs::path& to, F&& edit) {
  mhar::io::SafeTensors st = mhar::io::load_safetensors(from.string());
  edit(st);
  mhar::io::save_safetensors(to.string(), st);
}

/// Sets one config field in a checkpoint's metadata.
void forge_config(mhar::io::SafeTensors& st, const std::string& key, long long value) {
  nlohmann::json c = nlohmann::json::parse(st.metadata.at("config"));
  c[key] = value;
  st.metadata["config"] = c.dump();
}

/// Replaces element `i` of tensor `name` (stored as F32) by `value`.
void poison_tensor(mhar::io::SafeTensors& st, const std::string& name, std::size_t i, float value) {
  for (auto& [n, t] : st.tensors)
    if (n == name) {
      std::vector<float> v = t.to_f32();
      v.at(i) = value;
      t = mhar::io::Tensor::from_f32(t.shape, v.data());
      return;
    }
  FAIL("no tensor " << name);
}

}  // namespace

TEST_CASE("inputs that once crashed get a clear message and exit 2, and create nothing",
          "[cli][bad-input]") {
  const fs::path d = scratch("crash");
  REQUIRE(toy("train" + kTinyCpu + " --steps 2 --out " + (d / "ok").string()).code == 0);
  const fs::path ck = d / "ok" / "checkpoint.safetensors";
  edit_checkpoint(ck, d / "big-d.safetensors",
                  [](auto& st) { forge_config(st, "d", 1000000000); });
  edit_checkpoint(ck, d / "big-ffn.safetensors",
                  [](auto& st) { forge_config(st, "ffn", 1000000000); });
  edit_checkpoint(ck, d / "big-t.safetensors",
                  [](auto& st) { forge_config(st, "T", 1000000000); });
  edit_checkpoint(ck, d / "nan.safetensors",
                  [](auto& st) { poison_tensor(st, "layers.1.wq", 5, std::nanf("")); });
  edit_checkpoint(ck, d / "inf.safetensors", [](auto& st) {
    poison_tensor(st, "route.q", 0, std::numeric_limits<float>::infinity());
  });
  const std::string data = std::string(" --data ") + MHAR_DATA;
  struct Case {
    std::string args, message;
  };
  const Case cases[] = {
      {"eval " + (d / "big-d.safetensors").string() + data,
       "the config says vocab × d = 256×1000000000, but tensor 'embed' is 256×32"},
      {"eval " + (d / "big-ffn.safetensors").string() + data, "the file's tensors hold"},
      {"sample " + (d / "big-t.safetensors").string() + " -n 4", "needs about"},
      {"eval " + (d / "nan.safetensors").string() + data,
       "tensor 'layers.1.wq' holds a non-finite value (NaN) at element 5"},
      {"eval " + (d / "inf.safetensors").string() + data,
       "tensor 'route.q' holds a non-finite value (inf)"},
      {"train" + kTinyCpu + " --d 1000000 --out " + (d / "huge").string(), "this machine has"},
      {"grad --d 1000000 --n-head 4" + data, "grad needs about"},
      {"eval " + (d / "ok").string() + " --batch 100000000" + data, "eval needs about"},
      {"train" + kTinyCpu + " --data " + d.string() + " --out " + (d / "dir").string(),
       "is a directory, not a file"},
      {"eval " + (d / "ok").string() + " --data " + d.string(), "is a directory, not a file"},
  };
  expect_refused(cases);
  CHECK_FALSE(fs::exists(d / "huge"));
  CHECK_FALSE(fs::exists(d / "dir"));
}

TEST_CASE("the default corpus is found from any folder, beside the executable",
          "[cli][data]") {
  const fs::path d = scratch("elsewhere");
  // No --data: data/tinyshakespeare.txt is not in this folder, so mhar-toy finds the build tree's.
  const std::string cmd = "cd " + d.string() + " && " + MHAR_TOY +
                          " train --d 32 --layers 2 --n-head 2 --n-kv-head 1 --ffn 48 --seq-len 32"
                          " --batch 4 --steps 2 --eval-every 2 --eval-batches 1 --threads 1 -q"
                          " --device cpu --out run > log.txt 2>&1";
  const int status = std::system(cmd.c_str());
  std::ifstream in(d / "log.txt");
  std::stringstream log;
  log << in.rdbuf();
  CAPTURE(log.str());
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(fs::exists(d / "run" / "checkpoint.safetensors"));
}

TEST_CASE("the memory estimate counts exactly the parameters the model allocates",
          "[cli][memory]") {
  for (const char* mode : {"residual", "attnres", "mhar", "block", "delta"}) {
    for (int L : {2, 3}) {
      mhar::Config c;
      c.mode = mhar::parse_mode(mode);
      c.d = 48, c.L = L, c.n_head = 4, c.n_kv_head = 2, c.ffn = 40, c.T = 8, c.H = 4;
      c.n_blocks = 2;
      CAPTURE(mode, L);
      CHECK(mhar::toy::param_count(c) ==
            static_cast<double>(mhar::count_params(mhar::zero_params<float>(c))));
    }
  }
}

namespace {

/// The sweep grid of the tests: two tiny runs, one residual and one attnres.
const std::string kSweepGrid =
    std::string(" --modes residual,attnres --widths 32 --seeds 1 --jobs 1 --layers 2 --n-head 2"
                " --n-kv-head 1 --seq-len 32 --batch 4 --eval-every 50 --eval-batches 2"
                " --ckpt-every 5 --steps 80 --data ") +
    MHAR_DATA;

}  // namespace

TEST_CASE("sweep: a bad grid is refused before any run starts", "[cli][sweep]") {
  const fs::path d = scratch("sweep-bad");
  const std::string out = " --out " + (d / "s").string();
  const std::pair<std::string, std::string> cases[] = {
      {"sweep --modes mhar --widths 32,48 --heads 5" + out, "H = 5 must divide d = 32"},
      {"sweep --modes residual,mha --widths 32" + out, "unknown residual mode 'mha'"},
      {"sweep --widths 32,abc" + out, "--widths: 'abc' is not an integer"},
      {"sweep --modes attnres --widths 30" + out, "n_head = 4 must divide d = 30"},
      {"sweep --modes attnres --widths 32 --stpes 5" + out,
       "sweep: unexpected arguments --stpes 5, taken neither by the sweep nor by train"},
      {"sweep --modes attnres --widths 32 --steps 0" + out,
       "a flag passed to train is not valid: --steps: must be positive, got 0"},
      {"sweep --modes attnres --widths 32 --steps" + out,
       "a flag passed to train is not valid: --steps needs a value"},
      {"sweep --modes attnres --widths 32 --d 16" + out, "--d is set by the sweep"},
      {"sweep --modes attnres --widths 32", "--out DIR is required"},
  };
  for (const auto& [args, message] : cases) {
    CAPTURE(args);
    const Result r = toy(args);
    CAPTURE(r.out);
    CHECK(r.code == 2);
    CHECK_THAT(r.out, Contains(message));
  }
  CHECK_FALSE(fs::exists(d / "s"));
}

TEST_CASE("sweep: --cuda-sync, --recheck-gpu and --skip-gpu-check reach every run's train",
          "[cli][sweep]") {
  const fs::path d = scratch("sweep-flags");
  const Result r = toy("sweep --modes residual --widths 32 --seeds 1 --jobs 1 --layers 1"
                       " --n-head 2 --n-kv-head 1 --seq-len 16 --batch 2 --steps 2 --eval-every 2"
                       " --eval-batches 1 --device cpu --cuda-sync --recheck-gpu --skip-gpu-check"
                       " --data " + std::string(MHAR_DATA) + " --out " + (d / "s").string());
  CAPTURE(r.out);
  REQUIRE(r.code == 0);
  const std::string log = read_text(d / "s" / "logs" / "residual-d32-seed1.log");
  const std::string first = log.substr(0, log.find('\n'));
  CAPTURE(first);
  CHECK_THAT(first, Contains(" train ") && Contains(" --cuda-sync --recheck-gpu --skip-gpu-check"));
}

TEST_CASE("sweep: killed midway and rerun, it resumes and gives the uninterrupted summary",
          "[cli][sweep]") {
  // SIGTERM or SIGHUP (the terminal closed) killed the sweep, and with it its runs, losing their
  // steps since their checkpoints
  const int sig = GENERATE(SIGINT, SIGTERM, SIGHUP);
  const fs::path d =
      scratch(sig == SIGINT ? "sweep" : sig == SIGTERM ? "sweep-term" : "sweep-hup");
  const Result whole = toy("sweep" + kSweepGrid + " --out " + (d / "whole").string());
  REQUIRE(whole.code == 0);
  CHECK_THAT(whole.out, Contains("[2/2] attnres-d32-seed1: val"));

  const fs::path cut = d / "cut";
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    const std::string cmd = std::string(MHAR_TOY) + " sweep" + kSweepGrid + " --out " +
                            cut.string() + " > " + (d / "cut.log").string() + " 2>&1";
    execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  // Interrupt once the second run has a checkpoint and is still training (no timed assertion).
  const fs::path second = cut / "attnres-d32-seed1";
  // (Up to 10 minutes: a loaded CI machine can be slow; the loop ends as soon as it is there.)
  for (int i = 0; i < 12000 && metrics(second).size() < 12; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  kill(pid, sig);
  int status = 0;
  waitpid(pid, &status, 0);
  REQUIRE(WIFEXITED(status));
  CAPTURE(read_text(d / "cut.log"));
  CHECK(WEXITSTATUS(status) == 130);
  CHECK_THAT(read_text(d / "cut.log"), Contains("stopped attnres-d32-seed1: checkpoint saved"));

  const Result again = toy("sweep" + kSweepGrid + " --out " + cut.string());
  CAPTURE(again.out);
  REQUIRE(again.code == 0);
  CHECK_THAT(again.out, Contains("skip    residual-d32-seed1: finished (step 80)"));
  CHECK_THAT(again.out, Contains("resume  attnres-d32-seed1: from step"));
  CHECK(read_text(cut / "summary.csv") == read_text(d / "whole" / "summary.csv"));
  CHECK(read_text(cut / "attnres-d32-seed1" / "checkpoint.safetensors") ==
        read_text(d / "whole" / "attnres-d32-seed1" / "checkpoint.safetensors"));

  // The summary's numbers are the runs' own metrics.
  const auto rows = metrics(d / "whole" / "attnres-d32-seed1");
  const std::string csv = read_text(d / "whole" / "summary.csv");
  CHECK_THAT(csv, Contains(fmt::format("attnres,32,1,1,{:.6f},", rows.back().at("val_loss").get<double>())));
  const Result summary = toy("sweep --summary " + (d / "whole").string());
  CHECK(summary.code == 0);
  CHECK(read_text(d / "whole" / "summary.csv") == csv);
  for (const char* f : {"val-vs-width.png", "val-vs-width.svg", "excess-vs-width.png"})
    CHECK(fs::exists(d / "whole" / f) == mhar::io::kFiguresBuilt);
}

TEST_CASE("sweep: a run's command line, TrainOptions::to_args, parses back to its options",
          "[cli][sweep]") {
  using namespace mhar::toy;
  TrainOptions o;  // every field away from its default, a double that is no short decimal
  o.cfg.mode = mhar::Mode::Block, o.cfg.d = 48, o.cfg.L = 3, o.cfg.n_head = 3, o.cfg.n_kv_head = 1;
  o.cfg.ffn = 136, o.cfg.T = 24, o.cfg.H = 6, o.cfg.n_blocks = 3;
  o.data = "some dir/text.txt", o.out = "runs/a b", o.device = "cpu", o.steps = 7, o.batch = 3;
  o.lr = 1.0 / 3.0, o.min_lr_ratio = 0.07, o.warmup = 2, o.weight_decay = 0.01, o.clip = 0.5;
  o.seed = std::numeric_limits<std::uint64_t>::max(), o.val_fraction = 0.2, o.eval_every = 3;
  o.eval_batches = 5, o.ckpt_every = 4, o.heatmap_every = 0, o.figure_formats = "svg";
  o.log_every = 2, o.threads = 3, o.routing = "reference", o.quiet = true;
  std::vector<std::string> args = o.to_args();
  CAPTURE(args);
  TrainOptions back;
  std::string mode;
  CLI::App parser;
  add_train_options(parser, back, mode);
  std::reverse(args.begin(), args.end());
  parser.parse(args);
  back.cfg.mode = mhar::parse_mode(mode);
  CHECK(train_options_to_json(back) == train_options_to_json(o));
  CHECK(back.out == o.out);
  CHECK(back.quiet);
}

TEST_CASE("sample: the same greedy text with and without the decode cache, past window slides",
          "[cli][sample]") {
  const fs::path d = scratch("sample");
  const std::string run = (d / "run").string();
  REQUIRE(toy("train" + kTinyCpu + " --heads 4 --steps 20 --out " + run).code == 0);
  auto sample = [&](const std::string& extra) {
    const Result r = toy("sample " + run + " --temperature 0 --json" + extra);
    INFO(r.out);
    REQUIRE(r.code == 0);
    return nlohmann::json::parse(r.out);
  };
  // T = 32: the window restarts from its last 16 bytes every 16 bytes once it is full
  for (const std::string& prompt :
       std::vector<std::string>{"ROMEO:", "", std::string(50, 'a') + " JULIET:"}) {
    CAPTURE(prompt);
    const std::string args = " --length 120 --prompt '" + prompt + "'";
    const auto cached = sample(args), recomputed = sample(args + " --no-cache");
    CHECK(cached.at("cache") == true);
    CHECK(recomputed.at("cache") == false);
    CHECK(cached.at("generated_bytes") == 120);
    CHECK(cached.at("window_slides").get<int>() >= 5);
    CHECK(cached.at("window_slides") == recomputed.at("window_slides"));
    CHECK(cached.at("text") == recomputed.at("text"));
    CHECK(cached.at("bytes_per_s").get<double>() > 0);
    CHECK(cached.at("prompt_cut") == (prompt.size() > 32));
    CHECK(cached.at("prompt_bytes_read") ==
          (prompt.empty() ? 1 : std::min<int>(prompt.size(), 32)));
  }
  // in text mode: the text on stdout, the cut and the speed said on stderr
  const Result r = toy("sample " + run + " -n 40 --prompt '" + std::string(40, 'b') + "'");
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Contains("the prompt is 40 bytes, longer than the window T = 32: only its "
                             "last 32 bytes are read"));
  CHECK_THAT(r.out, Contains("bytes/s (cache: prefill, then one step a byte; 3 window slides to "
                             "the last 16 of T = 32 bytes)"));
}

TEST_CASE("eval, heatmap, probe and grad: the same numbers to the last bit on 1, 2 and 3 threads",
          "[cli][eval]") {
  // The default model's shape: its products are large enough for a forward shared between
  // threads to sum in another order (with a forward per thread, 1 and 2 threads gave losses
  // apart in the 7th digit); T = 128, so 48 windows are 3 batches of 16.
  const fs::path d = scratch("eval-threads");
  const std::string run = (d / "run").string(), data = std::string(" --data ") + MHAR_DATA;
  const Result trained = toy("train --heads 4 --steps 2 --eval-every 2 --threads 1 -q --out " +
                             run + data);
  REQUIRE(trained.code == 0);
  auto loss = [&](const std::string& extra, const std::string& env) {
    const Result r = toy("eval " + run + " --max-windows 48 --json" + data + extra, env);
    INFO(r.out);
    REQUIRE(r.code == 0);
    return nlohmann::json::parse(r.out).at("loss").get<double>();
  };
  const double one = loss(" --threads 1", "");
  CHECK(std::isfinite(one));
  for (const int t : {2, 3}) {
    CAPTURE(t);
    CHECK(loss(" --threads " + std::to_string(t), "") == one);
    CHECK(loss("", "OMP_NUM_THREADS=" + std::to_string(t) + " ") == one);  // the default, 0
  }
  // heatmap's α means and head disagreement, written to 17 digits in alpha.json
  auto map = [&](int t) {
    const fs::path out = d / ("map" + std::to_string(t));
    const Result r = toy("heatmap " + run + " --format svg --out " + out.string() + data,
                         "OMP_NUM_THREADS=" + std::to_string(t) + " ");
    INFO(r.out);
    REQUIRE(r.code == 0);
    return read_text(out / "alpha.json");
  };
  const std::string map1 = map(1);
  CHECK_THAT(map1, Contains("disagreement"));
  CHECK(map(2) == map1);
  CHECK(map(3) == map1);
  // probe's KL divergences, from a forward in double, printed to 17 digits
  auto probe = [&](int t) {
    const Result r =
        toy("probe " + run + " --json" + data, "OMP_NUM_THREADS=" + std::to_string(t) + " ");
    INFO(r.out);
    REQUIRE(r.code == 0);
    return r.out;
  };
  const std::string probe1 = probe(1);
  CHECK_THAT(probe1, Contains("kl_null"));
  CHECK(probe(2) == probe1);
  CHECK(probe(3) == probe1);
  // grad's file, a step of a fresh default model, in both precisions
  for (const std::string precision : {"f64", "f32"}) {
    CAPTURE(precision);
    auto grad = [&](int t) {
      const fs::path out = d / ("grad-" + precision + std::to_string(t) + ".safetensors");
      const Result r = toy("grad --precision " + precision + " -o " + out.string() + data,
                           "OMP_NUM_THREADS=" + std::to_string(t) + " ");
      INFO(r.out);
      REQUIRE(r.code == 0);
      return read_text(out);
    };
    const std::string grad1 = grad(1);
    CHECK(grad1.size() > 1000000);
    CHECK(grad(2) == grad1);
    CHECK(grad(3) == grad1);
  }
}

TEST_CASE("bench step --device cpu times each mode and what routing at copy speed would add",
          "[cli][bench]") {
  // The bytes: forward 4·(N·P·d + P·d + N·P·H) at sites N = 1 … n = 2L + 1, and the stack
  // backward (version 3) 4·(ΣN·(P·d + P·H) + 4·n·P·d). L = 1, P = 8, d = 4, H = 2, so ΣN = 6
  // over 3 sites: forward 4·(6·32 + 3·32 + 6·16) = 1536, backward 4·(6·(32 + 16) + 12·32) = 2688.
  CHECK(mhar::toy::cpu_stack_forward_bytes(3, 8, 4, 2) == 1536.0);
  CHECK(mhar::toy::cpu_stack_backward_bytes(3, 8, 4, 2) == 2688.0);
  CHECK(mhar::toy::cpu_step_routing_bytes(1, 8, 4, 2) == 1536.0 + 2688.0);
  // written: each of the 3 sites' outputs and each of the 3 sources' gradients, 4·2·3·8·4 = 768
  CHECK(mhar::toy::cpu_step_routing_written_bytes(1, 8, 4) == 768.0);
  const Result r =
      toy("bench step --device cpu --d 16 -L 1 --n-head 2 --n-kv-head 1 --ffn 16 -T 8 -B 2 "
          "-H 2 --repeats 1 --threads 1");
  INFO(r.out);
  REQUIRE(r.code == 0);
  for (const std::string mode : {"residual", "attnres", "mhar"})
    CHECK_THAT(r.out, Contains("\n" + mode + " "));
  // L = 1, P = 16, d = 16, H = 2: 4·(6·256 + 3·256 + 6·32) + 4·(6·(256 + 32) + 12·256) bytes
  CHECK_THAT(r.out, Contains(fmt::format("mhar's routing moves {:.1f} MB a step",
                                         mhar::toy::cpu_step_routing_bytes(1, 16, 16, 2) / 1e6)));
  CHECK_THAT(r.out, Contains("a 64 MiB copy ran at"));
  const double moved = mhar::toy::cpu_step_routing_bytes(1, 16, 16, 2);
  const double written = mhar::toy::cpu_step_routing_written_bytes(1, 16, 16);
  CHECK_THAT(r.out, Contains(fmt::format("\nrouting at read speed: of those, {:.1f} MB are read "
                                         "and {:.1f} MB written; a 64 MiB read ran at ",
                                         (moved - written) / 1e6, written / 1e6)));
  // Each routed mode's ratio round by round, on a line no reader of the rows mistakes for one.
  for (const std::string mode : {"attnres", "mhar"})
    CHECK_THAT(r.out, Contains("\nround by round, " + mode + " ÷ residual: median "));
}

TEST_CASE(
    "bench routing --device cpu times copy and the routing versions on 1 and 2 threads, one site "
    "and the whole stack, with --busy's load if asked",
    "[cli][bench]") {
  // A small shape and one repeat: this checks the table, never the speed. --busy was honoured
  // by bench step on the CPU only, and ignored silently here.
  const Result r =
      toy("bench routing --device cpu -N 3 -P 40 --width 16 --route-heads 4 --repeats 1 "
          "--threads 2 --busy 1");
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Contains("CPU routing under load: 1 other process spinning (--busy)"));
  CHECK_THAT(r.out, Contains("N=3 P=40 d=16 H=4"));
  CHECK_THAT(r.out, Contains("% copy"));
  // One row per (op, version, threads): "op version… threads ms MB GB/s %".
  std::map<std::string, int> rows;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream w(line);
    std::string op, v1, v2, t;
    w >> op >> v1;
    if (op != "copy" && op != "forward" && op != "backward" && op != "stack-fwd" &&
        op != "stack-bwd")
      continue;
    if (v1 != "-") w >> v2;
    w >> t;
    ++rows[op + " " + v1 + (v2.empty() ? "" : " " + v2) + " @" + t];
  }
  CHECK_THAT(r.out, Contains("all 3 sites of the stack"));
  for (const std::string t : {"1", "2"}) {
    CHECK(rows["copy - @" + t] == 2);  // one for the site's table, one for the stack's
    for (const std::string v : {"F1 ref", "F2 fast"}) CHECK(rows["forward " + v + " @" + t] == 1);
    for (const std::string v : {"B1 ref", "B2 fast"}) CHECK(rows["backward " + v + " @" + t] == 1);
    CHECK(rows["stack-fwd F2 fast @" + t] == 1);
    CHECK(rows["stack-fwd F3 stack @" + t] == 1);
    CHECK(rows["stack-bwd B2 fast @" + t] == 1);
    CHECK(rows["stack-bwd B3 stack @" + t] == 1);
  }
}

TEST_CASE(
    "figures: --format chooses the files of train, heatmap and plot, and without figures "
    "mhar-toy says so and still writes CSV and JSON",
    "[cli][figures]") {
  const fs::path d = scratch("formats");
  std::string loud = kTinyCpu;  // not quiet: the note that figures are off must show
  loud.erase(loud.find(" -q"), 3);
  const Result r =
      toy("train" + loud + " --heads 2 --steps 10 --heatmap-every 5 --format pdf --out " +
          (d / "run").string());
  INFO(r.out);
  REQUIRE(r.code == 0);
  const bool figs = mhar::io::kFiguresBuilt;
  auto has = [](const fs::path& p) { return fs::exists(p); };
  for (const char* s : {"step_000000", "step_000005", "step_000010"}) {
    const fs::path h = d / "run" / "heatmaps" / s;
    CAPTURE(s);
    CHECK(has(h / "alpha.csv"));
    CHECK(has(h / "alpha.json"));
    CHECK(has(h / "heatmap.pdf") == figs);
    CHECK(has(h / "disagreement.pdf") == figs);
    CHECK_FALSE(has(h / "heatmap.png"));
    CHECK_FALSE(has(h / "heatmap.svg"));
  }
  std::ifstream cfg(d / "run" / "config.json");
  CHECK(nlohmann::json::parse(cfg).at("train").at("figure_formats") == "pdf");
  // Without figures, train says so once, whatever the number of heatmaps.
  std::size_t notes = 0;
  for (auto p = r.out.find("figures are off"); p != std::string::npos;
       p = r.out.find("figures are off", p + 1))
    ++notes;
  CHECK(notes == (figs ? 0u : 1u));

  // --resume keeps the run's formats.
  REQUIRE(toy("train --resume " + (d / "run").string() + " --steps 15 -q").code == 0);
  CHECK(has(d / "run" / "heatmaps" / "step_000015" / "alpha.csv"));
  CHECK(has(d / "run" / "heatmaps" / "step_000015" / "heatmap.pdf") == figs);

  const Result h = toy("heatmap " + (d / "run").string() + " --format svg,pdf -B 2 --data " +
                       MHAR_DATA + " -o " + (d / "heat").string());
  INFO(h.out);
  CHECK(h.code == 0);
  CHECK(has(d / "heat" / "alpha.csv"));
  for (const char* f : {"heatmap.svg", "heatmap.pdf", "disagreement.svg", "disagreement.pdf"})
    CHECK(has(d / "heat" / f) == figs);
  CHECK_FALSE(has(d / "heat" / "heatmap.png"));
  CHECK((h.out.find("figures are off") != std::string::npos) == !figs);

  const Result p =
      toy("plot " + (d / "run").string() + " --format pdf,png -o " + (d / "loss").string());
  INFO(p.out);
  if (figs) {
    CHECK(p.code == 0);
    CHECK_THAT(p.out,
               Contains("wrote " + (d / "loss.pdf").string() + ", " + (d / "loss.png").string()));
    CHECK(has(d / "loss.pdf"));
    CHECK(has(d / "loss.png"));
    CHECK_FALSE(has(d / "loss.svg"));
    // -o with a figure's extension names the same files (it wrote curve.png.png)
    const Result ext = toy("plot " + (d / "run").string() + " --format png,svg -o " +
                           (d / "curve.png").string());
    INFO(ext.out);
    CHECK(ext.code == 0);
    CHECK(has(d / "curve.png"));
    CHECK(has(d / "curve.svg"));
    CHECK_FALSE(has(d / "curve.png.png"));
  } else {
    CHECK(p.code == 4);  // unavailable in this build
    CHECK_THAT(p.out, Contains("figures are off"));
    CHECK_FALSE(has(d / "loss.pdf"));
  }
}

/// Runs `train --device cuda` on kTiny: exit 4 means this machine has no GPU (or no CUDA build).
Result train_on_gpu(const fs::path& out, const std::string& extra) {
  return toy("train" + kTiny + " --device cuda" + extra + " --out " + out.string());
}

TEST_CASE("train on device cuda without a GPU exits 4, says why and creates nothing",
          "[cli][bad-input]") {
  const fs::path d = scratch("nogpu");
  const Result r = train_on_gpu(d / "run", " --steps 2");
  INFO(r.out);
  if (r.code == 0) {
    WARN(
        "MHAR_SKIP: this machine has a GPU; the GPU run is tested by 'train on device cuda matches "
        "the CPU'");
    return;
  }
  CHECK(r.code == 4);
  const bool says_why = r.out.find("no CUDA device") != std::string::npos ||
                        r.out.find("built without CUDA") != std::string::npos;
  CHECK(says_why);
  CHECK_THAT(r.out, Contains("--device cpu"));
  CHECK_FALSE(fs::exists(d / "run"));
}

TEST_CASE("train on device cuda matches the CPU: losses to float rounding, same run files",
          "[cli][gpu]") {
  const fs::path d = scratch("gpu");
  const std::string mode = GENERATE(std::string("mhar --heads 4"), std::string("delta --heads 2"),
                                    std::string("residual"));
  CAPTURE(mode);
  const Result g = train_on_gpu(d / "gpu", " --mode " + mode + " --steps 20 --heatmap-every 10");
  INFO(g.out);
  if (g.code == 4) {
    WARN("MHAR_SKIP: no GPU here (" << g.out << ")");
    return;
  }
  REQUIRE(g.code == 0);
  REQUIRE(toy("train" + kTinyCpu + " --mode " + mode + " --steps 20 --heatmap-every 10 --out " +
              (d / "cpu").string())
              .code == 0);
  const auto gm = metrics(d / "gpu"), cm = metrics(d / "cpu");
  REQUIRE(gm.size() == 20);
  REQUIRE(cm.size() == 20);
  // Step 1 sees identical parameters: the losses differ by float rounding only. Later steps
  // follow AdamW, which amplifies rounding where a gradient is near zero, so they are compared
  // loosely: a wrong kernel is off by far more than 1 %.
  CHECK(std::abs(gm[0].at("train_loss").get<double>() - cm[0].at("train_loss").get<double>()) <
        1e-4);
  for (std::size_t i = 0; i < gm.size(); ++i) {
    CAPTURE(i);
    const double a = gm[i].at("train_loss").get<double>(), b = cm[i].at("train_loss").get<double>();
    CHECK(std::abs(a - b) < 1e-2 * b);
  }
  for (const char* f :
       {"config.json", "metrics.csv", "checkpoint.safetensors", "optimizer.safetensors"})
    CHECK(fs::exists(d / "gpu" / f));
  if (mode != "residual") {
    CHECK(fs::exists(d / "gpu" / "heatmaps" / "step_000020" / "alpha.json"));
    CHECK(fs::exists(d / "gpu" / "heatmaps" / "step_000020" / "heatmap.png") ==
          mhar::io::kFiguresBuilt);
  }
  // resume on the GPU repeats the uninterrupted GPU run bit for bit (deterministic kernels)
  REQUIRE(train_on_gpu(d / "cut", " --mode " + mode + " --steps 10").code == 0);
  REQUIRE(toy("train --resume " + (d / "cut").string() + " --steps 20 -q").code == 0);
  const auto cut = metrics(d / "cut");
  REQUIRE(cut.size() == 20);
  for (std::size_t i = 0; i < cut.size(); ++i) {
    CAPTURE(i);
    CHECK(cut[i].at("train_loss").get<double>() == gm[i].at("train_loss").get<double>());
  }
}

namespace {

/// kTiny without -q: the run's header and the GPU self-check's lines are printed.
const std::string kTinyLoud = kTiny.substr(0, kTiny.rfind(" -q"));

/// The environment that gives mhar-toy `cache` as its cache folder.
std::string cache_env(const fs::path& cache) {
  return "XDG_CACHE_HOME=" + cache.string() + " ";
}

}  // namespace

// On a machine without a GPU (here: any machine without one, and the emulator told to present
// none), --device auto trains on the CPU exactly as before: no self-check, no line about it, no
// cache folder.
TEST_CASE("without a GPU, train neither runs nor mentions the GPU self-check", "[cli][gpu]") {
  const fs::path d = scratch("no-selfcheck");
  const Result r = toy("train" + kTinyLoud + " --steps 1 --out " + (d / "run").string(),
                       cache_env(d / "cache") + "MHAR_EMU_DEVICES=0 ");
  INFO(r.out);
  if (r.out.find("GPU NVIDIA") != std::string::npos) {
    WARN("MHAR_SKIP: this machine has a GPU; the self-check is tested on the emulator");
    return;
  }
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Contains("on the CPU ("));
  CHECK_THAT(r.out, !Contains("self-check") && !Contains("GPU"));
  CHECK_FALSE(fs::exists(d / "cache"));
}

namespace {

/// docs/gpu-results.md quotes a report's first lines from the emulator: `md`, a report made on
/// the emulator, must have them (all but the title, which carries the date of that run).
void check_quoted_header(const std::string& md) {
  const std::string doc =
      read_text(fs::path(MHAR_DATA).parent_path().parent_path() / "docs" / "gpu-results.md");
  const std::size_t at = doc.find("```text", doc.find("The report's first lines"));
  REQUIRE(at != std::string::npos);
  std::istringstream quoted(doc.substr(at + 8, doc.find("```", at + 8) - at - 8));
  std::string line;
  std::getline(quoted, line);
  CHECK_THAT(line, Contains("### mhar CPU emulator, sm_90 — "));
  while (std::getline(quoted, line)) {
    CAPTURE(line);
    CHECK_THAT(md, Contains(line));
  }
}

}  // namespace

// On the emulator in CI; on a GPU, the report a user would send (docs/gpu-results.md).
TEST_CASE("check --report writes the card, the build, every comparison and the time taken",
          "[cli][gpu]") {
  const fs::path d = scratch("report");
  const Result r = toy("check --benches none --report " + (d / "gpu.md").string());
  INFO(r.out);
  if (r.code == 4) {
    WARN("MHAR_SKIP: no GPU here (" << r.out << ")");
    return;
  }
  REQUIRE(r.code == 0);
  std::smatch m;
  REQUIRE(std::regex_search(r.out, m, std::regex("(\\d+) comparisons: all pass")));
  const std::string n = m[1];
  const std::string md = read_text(d / "gpu.md");
  CHECK_THAT(md, Contains("**check: " + n + " comparisons, all pass.**") &&
                     Contains("every comparison (" + n + " rows)"));
  std::istringstream lines(md);
  int pass_rows = 0;
  for (std::string line; std::getline(lines, line);)
    pass_rows += line.ends_with(" | pass |") ? 1 : 0;
  CHECK(std::to_string(pass_rows) == n);
  CHECK_THAT(md, Contains("| build flags | Release") && Contains("| time taken | ") &&
                     Contains("| command | `mhar-toy check --seed 1 --report "));
  CHECK_THAT(md, !Contains("| commit | unknown |") && !Contains("| commit |  |"));
  if (md.find("mhar CPU emulator") != std::string::npos) check_quoted_header(md);
}

#ifdef MHAR_CLI_EMULATOR
namespace {

/// `train --device <device>` of one step on the emulator, with `cache` as the cache folder.
Result train_checked(const fs::path& out, const fs::path& cache, const std::string& device,
                     const std::string& env = "", const std::string& extra = "") {
  return toy("train" + kTinyLoud + " --steps 1 --device " + device + extra + " --out " +
                 out.string(),
             cache_env(cache) + env);
}

/// The cache file's entries.
nlohmann::json cached(const fs::path& cache) {
  std::ifstream in(cache / "mhar" / "gpu-check.json");
  return nlohmann::json::parse(in).at("passed");
}

}  // namespace

// Emulator only: the emulator presents a device ("mhar CPU emulator", sm_90, driver 13000 unless
// MHAR_EMU_DRIVER_VERSION says otherwise), so the whole path of a first GPU run is taken.
TEST_CASE("the GPU self-check runs before the first GPU run, is cached, and reruns for a new key",
          "[cli][gpu]") {
  const fs::path d = scratch("selfcheck"), cache = d / "cache";
  const std::string ran = "comparisons pass in";
  const Result first = train_checked(d / "a", cache, "cuda");
  INFO(first.out);
  REQUIRE(first.code == 0);
  CHECK_THAT(first.out, Contains("GPU self-check on mhar CPU emulator (sm_90, driver CUDA 13.0"));
  for (const char* stage : {"routing fused", "layer twins", "cuBLAS linear and MLP",
                            "attention (cuBLAS)", "training step mhar H=1"})
    CHECK_THAT(first.out, Contains(std::string("GPU self-check: ") + stage));
  CHECK_THAT(first.out, Contains(ran) && Contains("verdict cached in " + cache.string()));
  CHECK_THAT(first.out, Contains("on the GPU mhar CPU emulator"));
  nlohmann::json entries = cached(cache);
  REQUIRE(entries.size() == 1);
  CHECK(entries[0].at("device") == "mhar CPU emulator");
  CHECK(entries[0].at("compute_capability") == "9.0");
  CHECK(entries[0].at("driver") == 13000);
  CHECK(entries[0].at("comparisons").get<int>() > 50);
  CHECK_THAT(entries[0].at("flags").get<std::string>(), Contains("CUDA emulator"));

  const Result second = train_checked(d / "b", cache, "auto");
  INFO(second.out);
  CHECK(second.code == 0);
  CHECK_THAT(second.out, Contains("GPU self-check: passed on") && !Contains(ran));

  const Result driver = train_checked(d / "c", cache, "auto", "MHAR_EMU_DRIVER_VERSION=13010 ");
  INFO(driver.out);
  CHECK(driver.code == 0);
  CHECK_THAT(driver.out, Contains("driver CUDA 13.1") && Contains(ran));
  CHECK(cached(cache).size() == 2);

  // Another build: the entries now name a commit this binary was not built from.
  entries = cached(cache);
  for (auto& e : entries) e["commit"] = "0000000older";
  std::ofstream(cache / "mhar" / "gpu-check.json") << nlohmann::json{{"format", 1},
                                                                     {"passed", entries}};
  const Result build = train_checked(d / "e", cache, "auto");
  INFO(build.out);
  CHECK(build.code == 0);
  CHECK_THAT(build.out, Contains(ran));

  const Result forced = train_checked(d / "f", cache, "auto", "", " --recheck-gpu");
  CHECK_THAT(forced.out, Contains(ran));
  const Result skipped = train_checked(d / "g", d / "other", "cuda", "", " --skip-gpu-check");
  CHECK(skipped.code == 0);
  CHECK_THAT(skipped.out, Contains("GPU self-check skipped (--skip-gpu-check)"));
  CHECK_FALSE(fs::exists(d / "other"));
}

namespace {

/// `train` under `env`, where the self-check fails, with --device auto and then cuda: auto
/// trains its step on the CPU (exit 0), cuda exits 1 before writing the run; no pass is cached.
/// Returns what each printed.
std::pair<std::string, std::string> failing_check(const fs::path& d, const std::string& env) {
  const Result a = train_checked(d / "auto", d / "cache", "auto", env);
  INFO(a.out);
  CHECK(a.code == 0);
  CHECK_THAT(a.out, Contains("Continuing on the CPU (--device auto)") && Contains("on the CPU ("));
  CHECK(metrics(d / "auto").size() == 1);
  const Result c = train_checked(d / "cuda", d / "cache", "cuda", env);
  INFO(c.out);
  CHECK(c.code == 1);
  CHECK_THAT(c.out, Contains("Not using this GPU, as --device cuda asks for it"));
  CHECK_FALSE(fs::exists(d / "cuda" / "config.json"));
  CHECK_FALSE(fs::exists(d / "cache" / "mhar" / "gpu-check.json"));
  return {a.out, c.out};
}

}  // namespace

// Emulator only: MHAR_EMU_WRONG_KERNEL makes every launch of one kernel come out ~1e-3 wrong.
TEST_CASE("a wrong kernel fails the self-check: auto trains on the CPU, cuda exits 1, by name",
          "[cli][gpu]") {
  const fs::path d = scratch("selfcheck-wrong");
  const auto [on_auto, on_cuda] = failing_check(d, "MHAR_EMU_WRONG_KERNEL=rmsnorm_forward_rows ");
  for (const std::string& out : {on_auto, on_cuda}) {
    INFO(out);
    CHECK_THAT(out, Contains("GPU self-check FAILED on mhar CPU emulator (sm_90): rmsnorm_forward"
                             " y (v1, P=16 T=8 d=32") &&
                        Contains("disagrees with the CPU reference: relative error 9.77e-04, "
                                 "tolerance") &&
                        Contains("report: " + (d / "cache/mhar/gpu-check-report.md").string()));
  }
  const std::string report = read_text(d / "cache/mhar/gpu-check-report.md");
  CHECK_THAT(report, Contains("comparisons FAIL.** First: rmsnorm_forward y (v1, P=16 T=8") &&
                         Contains("| rmsnorm_forward y | v1 |") && Contains("**FAIL**"));
  check_quoted_header(report);
}

// Emulator only: MHAR_EMU_FAULT_LAUNCH makes the third launch (inside the self-check) fault.
TEST_CASE("a kernel fault during the self-check is reported as a failure, not a crash",
          "[cli][gpu]") {
  const fs::path d = scratch("selfcheck-fault");
  const auto [on_auto, on_cuda] = failing_check(d, "MHAR_EMU_FAULT_LAUNCH=3 ");
  for (const std::string& out : {on_auto, on_cuda}) {
    INFO(out);
    CHECK_THAT(out, Contains("GPU self-check FAILED on mhar CPU emulator (sm_90): a CUDA error "
                             "while checking routing fused") &&
                        Contains("launch: cudaErrorLaunchFailure") &&
                        Contains("raised while this kernel ran"));
  }
}

// Emulator only: MHAR_EMU_FAULT_LAUNCH makes one launch fault, as a kernel's bad access would.
TEST_CASE("a kernel fault is named under MHAR_CUDA_SYNC=1 or --cuda-sync, blamed later without",
          "[cli][gpu]") {
  const fs::path d = scratch("fault");
  // The launches are counted from the training's first, so the self-check is left out.
  const std::string args = "train" + kTiny + " --device cuda --skip-gpu-check --steps 2 --out ";
  const std::string fault = "MHAR_EMU_FAULT_LAUNCH=40 ";  // launch 40 is rope_table
  const Result plain = toy(args + (d / "a").string(), fault);
  INFO(plain.out);
  CHECK(plain.code == 1);
  CHECK_THAT(plain.out, Contains("rope: rope_rotate_pairs launch: cudaErrorLaunchFailure"));
  CHECK_THAT(plain.out, Contains("rerun with MHAR_CUDA_SYNC=1 (or --cuda-sync)"));
  for (const auto& [how, env, flag] :
       {std::tuple{"environment", fault + "MHAR_CUDA_SYNC=1 ", ""},
        std::tuple{"flag", fault, " --cuda-sync"}}) {
    CAPTURE(how);
    const Result named = toy(args + (d / how).string() + flag, env);
    INFO(named.out);
    CHECK(named.code == 1);
    CHECK_THAT(named.out, Contains("rope: rope_table launch: cudaErrorLaunchFailure") &&
                              Contains("raised while this kernel ran"));
  }
}
#endif

TEST_CASE("every subcommand: exit 2 on a missing file, a corrupt file and an unwritable output",
          "[cli][exit-codes]") {
  const fs::path d = scratch("exit-codes");
  const std::string data = std::string(" --data ") + MHAR_DATA;
  const std::string tiny = kTinyCpu + " --steps 2 --heatmap-every 0 --format svg";
  REQUIRE(toy("train" + tiny + " -o " + (d / "run").string()).code == 0);
  REQUIRE(toy("train" + tiny + " --mode residual -o " + (d / "res").string()).code == 0);
  const std::string missing = (d / "nowhere.safetensors").string();
  const std::string garbage = (d / "garbage.safetensors").string();
  std::ofstream(garbage) << std::string("\x10\0\0\0\0\0\0\0not json at all!", 24);
  fs::create_directories(d / "badrun");
  std::ofstream(d / "badrun" / "config.json") << "{\"model\": 1";
  fs::create_directories(d / "badmetrics");
  std::ofstream(d / "badmetrics" / "metrics.jsonl") << "{\"step\": 1, \"train_loss\": tru\n";
  fs::create_directories(d / "badcases");
  std::ofstream(d / "badcases" / "manifest.json") << "{\"format\":";
  // A folder this process cannot write: mode 0555, or, for root (whom modes do not stop), /sys.
  fs::path ro = d / "ro";
  fs::create_directories(ro);
  fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
  if (std::ofstream(ro / "probe")) ro = "/sys";
  const bool ro_ok = !std::ofstream(ro / "probe-mhar");
  const std::string run = (d / "run").string(), out = (ro / "out").string();
  struct Case {
    std::string what, args;
  };
  std::vector<Case> cases = {
      {"train, missing --data",
       "train" + tiny + " --data " + missing + " -o " + (d / "x").string()},
      {"train, corrupt config.json", "train --resume " + (d / "badrun").string()},
      {"sample, missing", "sample " + missing},
      {"sample, corrupt", "sample " + garbage},
      {"eval, missing", "eval " + missing + data},
      {"eval, corrupt", "eval " + garbage + data},
      {"grad, missing", "grad --ckpt " + missing + data},
      {"grad, corrupt", "grad --ckpt " + garbage + data},
      {"heatmap, missing", "heatmap " + missing + data},
      {"heatmap, corrupt", "heatmap " + garbage + data},
      {"convert, missing", "convert " + missing + " -o " + (d / "c1").string()},
      {"convert, corrupt", "convert " + garbage + " -o " + (d / "c2").string()},
      {"plot, missing", "plot " + missing},
      {"plot, corrupt", "plot " + (d / "badmetrics").string() + " -o " + (d / "p").string()},
      {"stream, missing", "stream " + missing + data},
      {"stream, corrupt", "stream " + garbage + data},
      {"probe, missing", "probe " + missing + data},
      {"probe, corrupt", "probe " + garbage + data},
      {"sweep, missing", "sweep --summary " + missing},
      {"sweep, corrupt", "sweep --summary " + d.string()},  // badrun/config.json
      {"verify, missing", "verify --cases " + missing + " --results " + missing},
      {"verify, corrupt", "verify --cases " + (d / "badcases").string() + " --results " + run}};
  if (ro_ok) {
    cases.insert(cases.end(),
                 {{"train, unwritable", "train" + tiny + " -o " + out},
                  {"grad, unwritable", "grad --ckpt " + run + data + " -o " + out},
                  {"heatmap, unwritable", "heatmap " + run + data + " --format svg -o " + out},
                  {"convert, unwritable", "convert " + (d / "res").string() + " -o " + out},
                  {"plot, unwritable", "plot " + run + " --format svg -o " + out},
                  {"stream, unwritable", "stream " + run + data + " --csv " + out},
                  {"sweep, unwritable", "sweep --widths 16 --seeds 1 --modes residual -o " + out},
                  {"cases, unwritable", "cases --set quick --dtype f32 --out " + out}});
  } else {
    WARN(
        "no unwritable folder here (root, and /sys is writable): the unwritable-output cases "
        "are left out, the others run");
  }
  // check and bench read and write no file.
  for (const Case& c : cases) {
    CAPTURE(c.what, c.args);
    const Result r = toy(c.args);
    CAPTURE(r.out);
    CHECK(r.code == 2);
    CHECK_THAT(r.out, !Contains("json.exception") && !Contains("filesystem error"));
  }
  fs::permissions(d / "ro", fs::perms::owner_all);
}

/**
 * @file test_cli.cpp
 * @brief mhar-toy end to end: a short run whose loss falls, resume equals uninterrupted, convert
 *        keeps the loss, the grad file matches finite differences, Ctrl-C and NaN handling, the
 *        figure formats (and a build without figures), and each bad input's message and exit
 *        code.
 */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "checkpoint.h"
#include "figures.h"
#include "safetensors.h"

namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {

struct Result {
  int code = -1;
  std::string out;  ///< stdout and stderr together
};

/// Runs `mhar-toy <args>` through the shell; returns its exit code and output.
Result toy(const std::string& args) {
  static int n = 0;
  const fs::path log = fs::temp_directory_path() / ("mhar-cli-" + std::to_string(getpid()) + "-" +
                                                    std::to_string(n++) + ".log");
  const std::string cmd = std::string(MHAR_TOY) + " " + args + " > " + log.string() + " 2>&1";
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
  const Result r =
      toy("train" + kTinyCpu + " --steps 20 --warmup 0 --lr 1e30 --clip 0 --ckpt-every 1 --out " +
          (d / "run").string());
  INFO(r.out);
  CHECK(r.code == 3);
  CHECK_THAT(r.out, Contains("the training loss became"));
  CHECK_THAT(r.out, Contains("last good checkpoint"));
  const auto ck = mhar::toy::load_checkpoint((d / "run").string());  // still loads
  CHECK(ck.step >= 1);
  CHECK(ck.params.embed.allFinite());
}

TEST_CASE("Ctrl-C saves a checkpoint, exits 130, and the run resumes", "[cli][sigint]") {
  const fs::path d = scratch("sigint");
  const std::string out = (d / "run").string();
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    const std::string data = MHAR_DATA;
    execl(MHAR_TOY, MHAR_TOY, "train", "--data", data.c_str(), "--d", "32", "--layers", "2",
          "--n-head", "2", "--n-kv-head", "1", "--ffn", "48", "--seq-len", "32", "--batch", "4",
          "--steps", "100000", "--ckpt-every", "1000", "--threads", "1", "-q", "--out", out.c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  // Wait (without a timed assertion) until a few steps are logged, then interrupt.
  for (int i = 0; i < 600 && metrics(out).size() < 3; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  kill(pid, SIGINT);
  int status = 0;
  waitpid(pid, &status, 0);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 130);
  const auto ck = mhar::toy::load_checkpoint(out);
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

  const Case cases[] = {
      {"train" + kTinyCpu + " --heads 3 --out " + run, "routing heads H = 3 must divide d = 32"},
      {"train" + kTinyCpu + " --mode mha --out " + run, "unknown residual mode 'mha'"},
      {"train" + kTinyCpu + " --steps 0 --out " + run, "--steps must be positive"},
      {"train" + kTinyCpu + " --batch -2 --out " + run, "--batch must be positive"},
      {"train" + kTinyCpu + " --d 0 --out " + run, "d must be positive"},
      {"train" + kTinyCpu + " --n-head 3 --out " + run, "n_head = 3 must divide d = 32"},
      {"train" + kTinyCpu + " --lr -1 --out " + run, "--lr must be positive"},
      {"train" + kTinyCpu + " --device tpu --out " + run, "--device must be auto, cpu or cuda"},
      {"train" + kTinyCpu + " --data " + (d / "missing.txt").string() + " --out " + run,
       "cannot open"},
      {"train" + kTinyCpu + " --data " + (d / "short.txt").string() + " --out " + run,
       "too short for sequences"},
      {"train" + kTinyCpu + " --out " + (d / "afile" / "sub").string(),
       "cannot create the output directory"},
      {"train --steps", "--steps"},
      {"train --bogus-flag", "bogus"},
      {"eval " + (d / "trunc").string(), "truncated"},
      {"eval " + (d / "corrupt").string(), "cannot load checkpoint"},
      {"eval " + (d / "nowhere").string(), "cannot load checkpoint"},
      {"train --resume " + (d / "mixed").string(), "holds a different model than config.json"},
      {"train --resume " + (d / "nowhere").string(), "not a run directory"},
      {"sample " + (d / "ok").string() + " --top-k 300", "--top-k must be in [0, 256]"},
      {"heatmap " + (d / "ok").string() + " --batch 0", "--batch must be positive"},
      {"plot " + (d / "nowhere").string(), "is '"},
      {"train" + kTinyCpu + " --format png,jpg --out " + run, "unknown figure format 'jpg'"},
      {"heatmap " + (d / "ok").string() + " --format svg,svg", "'svg' is named twice"},
      {"plot " + (d / "ok").string() + " --format gif", "unknown figure format 'gif'"},
      {"grad --heads 5 --d 32", "must divide d = 32"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.args);
    const Result r = toy(c.args);
    CAPTURE(r.out);
    CHECK(r.code == 2);
    CHECK_THAT(r.out, Contains(c.message));
  }
  CHECK_FALSE(fs::exists(run));  // nothing was created by the refused runs
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

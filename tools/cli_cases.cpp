/**
 * @file cli_cases.cpp
 * @brief `mhar-toy cases`: writes the verify kit's conformance cases (tools/verify/cases.h) and
 *        their manifest, for any implementation to run (docs/verify.md).
 */
#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <system_error>

#include "cases.h"
#include "cli_common.h"
#include "errors.h"

namespace mhar::toy {

Subcommand register_cases(CLI::App& app) {
  struct Opts {
    std::string out, set = "quick", dtype = "f32,bf16";
    std::uint64_t seed = 0;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand(
      "cases",
      "Write the verify kit's conformance cases (inputs, double-precision truth, yardsticks) for "
      "any routing implementation, one safetensors file each plus manifest.json");
  cmd->add_option("--out", o->out, "directory to write (created if needed)")->required();
  cmd->add_option("--set", o->set,
                  "quick (every convention, seconds), full (quick and more), "
                  "paper (the paper's shapes)")
      ->capture_default_str();
  cmd->add_option("--dtype", o->dtype,
                  "storage dtype of the inputs: f32, bf16, f16, all, or a comma list")
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "seed of the inputs")->capture_default_str();
  return {cmd, [o]() -> int {
            using namespace mhar::verify;
            std::vector<DType> dtypes;
            if (o->dtype == "all") {
              dtypes = {DType::F32, DType::BF16, DType::F16};
            } else {
              std::size_t at = 0;
              while (at <= o->dtype.size()) {
                const std::size_t comma = std::min(o->dtype.find(',', at), o->dtype.size());
                try {
                  dtypes.push_back(parse_dtype(o->dtype.substr(at, comma - at)));
                } catch (const std::invalid_argument& e) {
                  throw UsageError(std::string("--dtype: ") + e.what() + " or all");
                }
                at = comma + 1;
              }
            }
            try {
              (void)case_set(o->set);
            } catch (const std::invalid_argument& e) {
              throw UsageError(std::string("--set: ") + e.what());
            }
            if (std::filesystem::exists(o->out) && !std::filesystem::is_directory(o->out))
              throw UsageError("--out " + o->out + " exists and is not a directory");
            const auto t0 = std::chrono::steady_clock::now();
            Manifest m;
            try {
              m = write_cases(o->out, o->set, dtypes, o->seed);
            } catch (const std::filesystem::filesystem_error& e) {
              // a folder the user named that cannot be written: exit 2 (mhar_toy.cpp)
              throw std::system_error(e.code(), "cannot write " + o->out);
            }
            const double secs =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            fmt::print(
                "wrote {} cases (set {}, seed {}) to {} in {:.2f} s; the protocol: "
                "docs/verify.md\n",
                m.cases.size(), m.set, m.seed, o->out, secs);
            for (const auto& e : m.cases) fmt::print("  {:<32} {}\n", e.file, e.why);
            return kOk;
          }};
}

}  // namespace mhar::toy

/**
 * @file cli_verify.cpp
 * @brief `mhar-toy verify`: grades a candidate's results against the conformance cases
 *        (tools/verify/verify.h): a table, or JSON; exit 0 only when every output passes.
 */
#include <fmt/format.h>

#include <memory>

#include "cli_common.h"
#include "errors.h"
#include "verify.h"

namespace mhar::toy {

Subcommand register_verify(CLI::App& app) {
  struct Opts {
    mhar::verify::VerifyOptions v;
    std::string serves = "all", convention = "exact";
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand(
      "verify",
      "Grade any routing implementation's results against the conformance cases of `cases` "
      "(worst error against k x yardstick + floor, per case and tensor)");
  cmd->add_option("--cases", o->v.cases, "directory written by `mhar-toy cases`")->required();
  cmd->add_option("--results", o->v.results,
                  "the candidate's results: one safetensors file per case, same file names")
      ->required();
  cmd->add_option("--repeat", o->v.repeat,
                  "a second run's results: every tensor must have the same bits (determinism)");
  cmd->add_flag("--forward-only", o->v.forward_only,
                "a forward-only candidate: grade out and alpha, leave the gradients unchecked");
  cmd->add_option("--serves", o->serves,
                  "the cases the candidate serves: all, or h1 (single-head kernels: only the H = 1 "
                  "cases are graded, and COMPLETE means every one of them)")
      ->check(one_of({"all", "h1"}))
      ->capture_default_str();
  cmd->add_option("--convention", o->convention,
                  "the rounding convention the yardstick follows: exact, or hf-rmsnorm (the "
                  "normalised key rounded to the storage dtype before the gain)")
      ->check(one_of({"exact", "hf-rmsnorm"}))
      ->capture_default_str();
  cmd->add_flag("--json", o->json, "print one JSON object instead of the table");
  return {cmd, [o]() -> int {
            mhar::verify::VerifyReport r;
            o->v.serves = mhar::verify::parse_scope(o->serves);
            o->v.convention = mhar::verify::parse_convention(o->convention);
            try {
              r = mhar::verify::verify_results(o->v);
            } catch (const mhar::verify::CaseError& e) {
              throw UsageError(e.what());
            }
            if (o->json)
              fmt::print("{}\n", mhar::verify::report_json(r).dump(2));
            else
              fmt::print("{}", mhar::verify::format_report(r));
            return r.ok() ? kOk : kFailure;
          }};
}

}  // namespace mhar::toy

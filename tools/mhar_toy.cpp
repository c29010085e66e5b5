/**
 * @file mhar_toy.cpp
 * @brief mhar-toy: train tiny depth-routing models, look at where each head routes, compare.
 *
 * Exit codes: see errors.h (0 ok, 1 failure, 2 usage, 3 diverged, 130 interrupted).
 */
#include <fmt/format.h>

#include <CLI/CLI.hpp>

#include "cli_common.h"
#include "errors.h"
#include "tensor.h"

int main(int argc, char** argv) {
  using namespace mhar::toy;
  CLI::App app{"mhar-toy: tiny transformers with depth routing (residual, attnres, mhar, block, delta)"};
  app.option_defaults()->always_capture_default();
  app.require_subcommand(1);
  app.set_version_flag("--version", "mhar-toy 0.1.0");
  Runner run_train;
  register_train(app, run_train);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return kUsage;
  }
  try {
    if (app.got_subcommand("train")) return run_train();
  } catch (const UsageError& e) {
    fmt::print(stderr, "mhar-toy: error: {}\n", e.what());
    return kUsage;
  } catch (const mhar::ShapeError& e) {
    fmt::print(stderr, "mhar-toy: error: {}\n", e.what());
    return kUsage;
  } catch (const DivergedError& e) {
    fmt::print(stderr, "\nmhar-toy: diverged: {}\n", e.what());
    return kDiverged;
  } catch (const std::exception& e) {
    fmt::print(stderr, "\nmhar-toy: failed: {}\n", e.what());
    return kFailure;
  }
  return kUsage;
}

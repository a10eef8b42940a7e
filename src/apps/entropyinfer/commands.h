#pragma once

#include <CLI/CLI.hpp>

namespace entropyinfer::cli {

// Each adds its subcommand to the app; the subcommand runs from its callback during parse().
void register_generate(CLI::App& app);
void register_tokenize(CLI::App& app);
void register_bench(CLI::App& app);
void register_inspect(CLI::App& app);
void register_bench_work(CLI::App& app);
void register_eval(CLI::App& app);
void register_needle(CLI::App& app);
// Only in builds with cpp-httplib (ENTROPYINFER_HAVE_HTTPLIB).
void register_serve(CLI::App& app);

}  // namespace entropyinfer::cli

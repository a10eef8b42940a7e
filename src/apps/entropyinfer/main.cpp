// entropyinfer: the command-line tool. Subcommands stay thin; the engine lives in the library.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "apps/entropyinfer/commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"EntropyInfer: long-context LLM inference with entropy-guided sparse attention"};
  app.require_subcommand(1);
  entropyinfer::cli::register_generate(app);
  entropyinfer::cli::register_tokenize(app);
  entropyinfer::cli::register_bench(app);
  entropyinfer::cli::register_inspect(app);
  entropyinfer::cli::register_bench_work(app);
  entropyinfer::cli::register_eval(app);
  entropyinfer::cli::register_needle(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error);
  } catch (const entropyinfer::Error& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "error: out of memory\n");
    return 1;
  }
  return 0;
}

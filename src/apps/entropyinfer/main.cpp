// entropyinfer: the command-line tool. Subcommands stay thin; the engine lives in the library.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <new>
#include <string>

#include "apps/entropyinfer/commands.h"
#include "core/error.h"

#ifndef ENTROPYINFER_HAVE_HTTPLIB
namespace {

// Without cpp-httplib the command still exists, so that asking for it says why it cannot run.
void register_serve_unavailable(CLI::App& app) {
  CLI::App* command = app.add_subcommand("serve", "Serve over HTTP (not in this build)");
  command->allow_extras();
  command->callback([] {
    throw entropyinfer::Error(
        "serve: this build has no HTTP library; install libcpp-httplib-dev "
        "(scripts/install_deps.sh) and configure the build again");
  });
}

}  // namespace
#endif

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
#ifdef ENTROPYINFER_HAVE_HTTPLIB
  entropyinfer::cli::register_serve(app);
#else
  register_serve_unavailable(app);
#endif
  // Every refusal has one shape: "error: <what>" on stderr and exit status 1, whether the command
  // line, a file or the engine is at fault. Help and version requests are not refusals.
  if (argc > 1 && argv[1][0] != '-') {
    // CLI11 would report only that a subcommand is required; name the word that is not one.
    std::string commands;
    bool known = false;
    for (const CLI::App* command : app.get_subcommands([](CLI::App*) { return true; })) {
      known = known || command->get_name() == argv[1];
      commands += (commands.empty() ? "" : ", ") + command->get_name();
    }
    if (!known) {
      std::fprintf(stderr, "error: unknown command '%s' (commands: %s)\n", argv[1],
                   commands.c_str());
      return 1;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& request) {
    return app.exit(request);
  } catch (const CLI::CallForAllHelp& request) {
    return app.exit(request);
  } catch (const CLI::CallForVersion& request) {
    return app.exit(request);
  } catch (const CLI::ParseError& error) {
    std::fprintf(stderr, "error: %s\nRun with --help for the options.\n", error.what());
    return 1;
  } catch (const entropyinfer::Error& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "error: out of memory\n");
    return 1;
  } catch (const std::exception& error) {
    // A failure no check anticipated still ends in one line, not an abort.
    std::fprintf(stderr, "error: %s\n", error.what());
    return 1;
  }
  return 0;
}

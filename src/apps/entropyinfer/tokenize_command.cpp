// `entropyinfer tokenize`: show how a tokenizer splits text.
#include <cstdio>
#include <memory>

#include "apps/entropyinfer/cli_common.h"
#include "apps/entropyinfer/commands.h"
#include "core/error.h"

namespace entropyinfer::cli {
namespace {

struct TokenizeArgs {
  std::string model;
  std::string tokenizer;
  std::string prompt;
  std::string prompt_file;
  bool add_bos = false;
  bool parse_special = false;
  bool ids_only = false;
};

void run_tokenize(const TokenizeArgs& args) {
  const std::string text = read_prompt(args.prompt, args.prompt_file);
  std::unique_ptr<Tokenizer> tokenizer = find_tokenizer(args.model, args.tokenizer);
  EncodeOptions options;
  options.add_bos = args.add_bos;
  options.parse_special = args.parse_special;
  const std::vector<int32_t> ids = tokenizer->encode(text, options);
  if (args.ids_only) {
    for (size_t i = 0; i < ids.size(); ++i) std::printf(i ? " %d" : "%d", ids[i]);
    std::printf("\n");
    return;
  }
  for (int32_t id : ids) {
    std::string piece = tokenizer->token_bytes(id);
    std::string shown;
    for (unsigned char c : piece) {
      if (c == '\n') {
        shown += "\\n";
      } else if (c < 0x20) {
        char buffer[8];
        std::snprintf(buffer, sizeof(buffer), "\\x%02x", c);
        shown += buffer;
      } else {
        shown += static_cast<char>(c);
      }
    }
    std::printf("%8d  '%s'\n", id, shown.c_str());
  }
  std::printf("%zu tokens\n", ids.size());
}

}  // namespace

void register_tokenize(CLI::App& app) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* command = app.add_subcommand("tokenize", "Split text into tokens");
  command->add_option("-m,--model", args->model,
                      "Model folder or checkpoint whose tokenizer to use");
  command->add_option("--tokenizer", args->tokenizer, "Tokenizer file or folder");
  command->add_option("-p,--prompt", args->prompt, "Text to tokenize");
  command->add_option("-f,--prompt-file", args->prompt_file, "Read the text from a file");
  command->add_flag("--bos", args->add_bos, "Prepend BOS");
  command->add_flag("--parse-special", args->parse_special, "Recognise special tokens in the text");
  command->add_flag("--ids", args->ids_only, "Print only the ids");
  command->callback([args] {
    if (args->model.empty() && args->tokenizer.empty()) {
      throw Error("give --model or --tokenizer");
    }
    run_tokenize(*args);
  });
}

}  // namespace entropyinfer::cli

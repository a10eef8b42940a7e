#include "apps/entropyinfer/cli_common.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "core/error.h"
#include "core/json_reader.h"
#include "core/user_file.h"

namespace entropyinfer::cli {
namespace {

void print_load_progress(size_t done, size_t total, void*) {
  if (total == 0) return;
  static int last_percent = -1;
  const int percent = static_cast<int>(100.0 * done / total);
  // A terminal gets a line that updates in place; a log gets only the final line.
  const bool finished = done == total;
  if ((isatty(STDERR_FILENO) && percent != last_percent) || finished) {
    std::fprintf(stderr, "\rloading weights: %3d%% of %.1f MiB%s", percent, total / 1048576.0,
                 finished ? "\n" : "");
    std::fflush(stderr);
  }
  last_percent = finished ? -1 : percent;
}

}  // namespace

ModelWeights load_model_with_progress(const std::string& path) {
  return load_model(path, print_load_progress, nullptr);
}

std::unique_ptr<Tokenizer> find_tokenizer(const std::string& model_path,
                                          const std::string& tokenizer_path) {
  namespace fs = std::filesystem;
  if (!tokenizer_path.empty()) return load_tokenizer(tokenizer_path);
  std::error_code error;
  if (fs::is_directory(model_path, error)) return load_tokenizer(model_path);
  if (!fs::exists(model_path, error)) {
    throw Error("model '" + model_path +
                "' does not exist, so no tokenizer can be found beside it");
  }
  const fs::path folder = fs::path(model_path).parent_path();
  for (const char* name : {"tokenizer.bin"}) {
    if (fs::exists(folder / name, error)) return load_tokenizer((folder / name).string());
  }
  // The non-throwing iterator: a folder that cannot be listed is the same as one without a match.
  fs::directory_iterator entries(folder.empty() ? fs::path(".") : folder, error);
  for (const auto& entry : error ? fs::directory_iterator() : entries) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("tok", 0) == 0 && entry.path().extension() == ".bin" &&
        entry.path() != fs::path(model_path)) {
      return load_tokenizer(entry.path().string());
    }
  }
  throw Error("no tokenizer found beside '" + model_path +
              "': pass --tokenizer (a llama2.c tokenizer .bin, tokenizer.json or tokenizer.model)");
}

std::string read_prompt(const std::string& prompt, const std::string& prompt_file) {
  if (!prompt.empty() && !prompt_file.empty()) {
    throw Error("give either --prompt or --prompt-file, not both");
  }
  if (prompt_file.empty()) return prompt;
  return read_user_file(prompt_file, "prompt file");
}

LanguageModel::ProgressCallback prefill_progress_printer() {
  return [last_percent = -1](int64_t done, int64_t total) mutable {
    const int percent = static_cast<int>(100 * done / std::max<int64_t>(total, 1));
    const bool finished = done == total;
    if ((isatty(STDERR_FILENO) && percent != last_percent) || finished) {
      std::fprintf(stderr, "\rprefill: %3d%% of %lld tokens%s", percent,
                   static_cast<long long>(total), finished ? "\n" : "");
      std::fflush(stderr);
    }
    last_percent = percent;
  };
}

double peak_resident_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss / 1024.0;  // ru_maxrss is in KiB on Linux
}

double resident_anonymous_mib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("RssAnon:", 0) == 0) return std::strtod(line.c_str() + 8, nullptr) / 1024.0;
  }
  return 0.0;
}

}  // namespace entropyinfer::cli

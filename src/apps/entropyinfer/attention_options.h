// Command-line flags for the attention policies. Every parameter of the method has a flag; a JSON
// file
// (--attention-config) gives the base, flags override it, and the result goes through the same JSON
// reader and validation as the file, so both spell the parameters the same way.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <nlohmann/json.hpp>

#include "attention/attention_config.h"
#include "engine/transformer.h"

namespace entropyinfer::cli {

class AttentionOptions {
 public:
  // Adds the flags to `command`.
  void add_to(CLI::App* command);
  // The configuration the user asked for; throws Error for contradictory or impossible settings.
  AttentionConfig resolve() const;

 private:
  std::string config_path_;
  // JSON key -> the option that sets it; read after parsing.
  std::vector<std::pair<std::string, CLI::Option*>> options_;
  std::vector<std::pair<std::string, CLI::Option*>> flags_;
};

// One line: the methods, and (after a run) the fraction of full attention's work that was done.
std::string describe_attention_work(const AttentionConfig& config, const AttentionWork& work);

}  // namespace entropyinfer::cli

// Pieces the subcommands share: loading a model with a progress line, finding its tokenizer,
// reading the prompt, and the resource summary.
#pragma once

#include <memory>
#include <string>

#include "engine/language_model.h"
#include "model/model_weights.h"
#include "tokenizer/tokenizer.h"

namespace entropyinfer::cli {

ModelWeights load_model_with_progress(const std::string& path);

// --tokenizer if given; else the model folder's own files; else, for a llama2.c checkpoint, a
// tok<vocab>.bin or tokenizer.bin beside it.
std::unique_ptr<Tokenizer> find_tokenizer(const std::string& model_path,
                                          const std::string& tokenizer_path);

// Exactly one of prompt / prompt file.
std::string read_prompt(const std::string& prompt, const std::string& prompt_file);

// Progress of a long prefill on stderr: updated in place on a terminal, one final line in a log.
LanguageModel::ProgressCallback prefill_progress_printer();

double peak_resident_mib();
// Host memory the process owns (RssAnon: heap and other anonymous pages), which unlike the
// resident size leaves out a memory-mapped checkpoint's page cache; 0 where /proc is not there.
double resident_anonymous_mib();

}  // namespace entropyinfer::cli

// RULER-style synthetic evaluation tasks (needle retrieval, variable tracking, common and frequent
// words), generated deterministically from a seed exactly as training/tasks.py does: the same
// prompt bytes, answers and token counts for the same (task, length, index, seed). The
// specification both implementations follow is training/TASKS.md; section numbers below refer to
// it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace entropyinfer::eval {

enum class RulerTask {
  kNiahSingle,
  kNiahMultikey,
  kNiahMultivalue,
  kNiahMultiquery,
  kVariableTracking,
  kCommonWords,
  kFrequentWords,
};

// The seven tasks in tasks.py's order (EVAL_TASKS).
const std::vector<RulerTask>& all_ruler_tasks();
// tasks.py's names: niah_single, niah_multikey, niah_multivalue, niah_multiquery, vt, cwe, fwe.
std::string ruler_task_name(RulerTask task);
// Throws Error naming the bad name and the known ones.
RulerTask parse_ruler_task(const std::string& name);
// Tokens left for generation after the prompt (TASKS.md section 4, G): the prompt of a sample at
// `length` takes at most length - G tokens, BOS included.
int ruler_generation_tokens(RulerTask task);

// Which entries of the word pools a sample draws from (section 1): all of them (the default
// evaluation) or only the held-out ones (never seen in training; same task names and seeds).
enum class RulerWordSet { kAll, kHeldout };
// "all" / "heldout", as the manifest's `words` field; parse throws Error on anything else.
std::string ruler_word_set_name(RulerWordSet words);
RulerWordSet parse_ruler_word_set(const std::string& name);

// Everything a sample needs besides the seed and the tokenizer; load once, reuse for every sample.
struct RulerSources {
  RulerWordSet word_set = RulerWordSet::kAll;
  std::vector<std::string> haystack_lines;  // Persuasion split at '\n' (section 1)
  // RULER's noise haystack instead of text: haystack_lines is the noise line alone (section 1), and
  // the needle tasks repeat it as vt does (start line 0; the draws are the same as with text).
  bool noise_haystack = false;
  std::vector<std::string> keys;  // selected pools, in task_words.json's order
  std::vector<std::string> values;
  std::vector<std::string> numbers;     // `values` when fewer than 10 numbers are selected
  std::vector<std::string> list_words;  // sorted union of keys and values (cwe, fwe)
};

// Reads <model_folder>/task_words.json and <text_dir>/janeausten/persuasion.txt. Throws Error
// naming the missing or malformed file.
RulerSources load_ruler_sources(const std::string& model_folder, const std::string& text_dir,
                                RulerWordSet words = RulerWordSet::kAll);
// The same word pools with the noise haystack (noise_haystack), for when no text is at hand; reads
// only <model_folder>/task_words.json. These samples are not those of the evaluation manifest.
RulerSources load_ruler_noise_sources(const std::string& model_folder,
                                      RulerWordSet words = RulerWordSet::kAll);

struct RulerSample {
  RulerTask task = RulerTask::kNiahSingle;
  int length = 0;  // the cell's length; the prompt takes prompt_tokens <= length - max_new_tokens
  int index = 0;
  uint64_t seed = 0;      // this sample's own seed (section 2), as in the manifest
  std::string prompt;     // ends with "It is" / "They are"; feed as [BOS] + encode(prompt)
  int prompt_tokens = 0;  // 1 (BOS) + tokens of the prompt without special tokens
  std::vector<std::string> answers;  // expected words, in the expected order
  int max_new_tokens = 0;            // ruler_generation_tokens(task)
  // The needle lines hidden in the haystack, in the order they were drawn (empty for the list
  // tasks), and the question: the prompt's last line.
  std::vector<std::string> needles;
  std::string question;
  // More questions about the same context, for the multi-turn protocol: the other keys of
  // niah_multikey, each key of niah_multiquery alone (empty for the other tasks). Drawn from what
  // the sample already drew, so the prompt is the same with or without them.
  struct Turn {
    std::string question;  // a line like the prompt's last one
    std::vector<std::string> answers;
  };
  std::vector<Turn> follow_ups;
};

// Seed of evaluation sample `index` (section 2): base_seed ^ fnv1a64("task/length/index").
uint64_t ruler_sample_seed(uint64_t base_seed, RulerTask task, int length, int index);

// Samples index 0..count-1 of `task` at `length` tokens. Deterministic: the same samples as
// tasks.eval_sample for the same (task, length, index, base seed, word set). Throws Error when the
// task cannot fit `length` even with an empty haystack.
std::vector<RulerSample> make_ruler_samples(RulerTask task, int length, int count,
                                            uint64_t base_seed, const Tokenizer& tokenizer,
                                            const RulerSources& sources);
// One sample (what make_ruler_samples does for each index).
RulerSample make_ruler_sample(RulerTask task, int length, int index, uint64_t base_seed,
                              const Tokenizer& tokenizer, const RulerSources& sources);

// Section 7: the fraction of `answers` found as whole words (regex [a-z0-9]+ on the lower-cased
// prediction) in `prediction` - RULER's string_match_all on whole words; every task uses it
// (niah_single and niah_multikey have one answer, so it is 0 or 1 there). `task` is accepted for
// the interface's sake; the rule is the same for all seven. Empty `answers` scores 0.
double ruler_score(RulerTask task, const std::string& prediction,
                   const std::vector<std::string>& answers);

// Building blocks, public for tests and tools.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next();
  uint64_t below(uint64_t n);  // next() % n, n >= 1

 private:
  uint64_t state_;
};
uint64_t fnv1a64(const std::string& text);
// " a", " a and b", " a, b and c" (section 3, without the full stop).
std::string ruler_word_list(const std::vector<std::string>& words);

}  // namespace entropyinfer::eval

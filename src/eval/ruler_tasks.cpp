// Follows training/TASKS.md step by step; every random draw happens in the order tasks.py makes it,
// because one draw out of place changes every sample after it.
#include "eval/ruler_tasks.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <sstream>
#include <utility>

#include "core/error.h"
#include "core/json_reader.h"
#include "core/user_file.h"

namespace entropyinfer::eval {
namespace {

constexpr const char* kNoiseLine =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";
constexpr int kListWordsPerLine = 10;
constexpr int kCommonWordCount = 10;   // cwe: words to name
constexpr int kFrequentWordCount = 3;  // fwe: words to name
constexpr int kDepthSteps = 1001;      // needle depths are 0..1000 (per mille)
constexpr int64_t kNoiseMaxLines = 1000000;

struct TaskInfo {
  RulerTask task;
  const char* name;
  int generation_tokens;
};

constexpr TaskInfo kTasks[] = {
    {RulerTask::kNiahSingle, "niah_single", 4},
    {RulerTask::kNiahMultikey, "niah_multikey", 4},
    {RulerTask::kNiahMultivalue, "niah_multivalue", 12},
    {RulerTask::kNiahMultiquery, "niah_multiquery", 12},
    {RulerTask::kVariableTracking, "vt", 12},
    {RulerTask::kCommonWords, "cwe", 24},
    {RulerTask::kFrequentWords, "fwe", 8},
};

const TaskInfo& info(RulerTask task) {
  for (const TaskInfo& entry : kTasks) {
    if (entry.task == task) return entry;
  }
  throw Error("unknown RULER task value " + std::to_string(static_cast<int>(task)));
}

std::string known_task_names() {
  std::string names;
  for (const TaskInfo& entry : kTasks) {
    if (!names.empty()) names += ", ";
    names += entry.name;
  }
  return names;
}

// k distinct items of `pool` in draw order: a partial Fisher-Yates on a copy.
template <typename T>
std::vector<T> draw_sample(SplitMix64& rng, const std::vector<T>& pool, size_t count) {
  if (count > pool.size()) {
    throw Error("cannot draw " + std::to_string(count) + " distinct items from a pool of " +
                std::to_string(pool.size()));
  }
  std::vector<T> items = pool;
  for (size_t i = 0; i < count; ++i) {
    const size_t j = i + static_cast<size_t>(rng.below(items.size() - i));
    std::swap(items[i], items[j]);
  }
  items.resize(count);
  return items;
}

template <typename T>
void shuffle_items(SplitMix64& rng, std::vector<T>& items) {
  for (size_t i = items.size(); i-- > 1;) {
    const size_t j = static_cast<size_t>(rng.below(i + 1));
    std::swap(items[i], items[j]);
  }
}

// Indices of `depths` in order of (depth, index): the order in which needles appear.
std::vector<size_t> appearance_order(const std::vector<int>& depths) {
  std::vector<size_t> order(depths.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return depths[a] < depths[b]; });
  return order;
}

struct Needle {
  int depth = 0;
  std::string text;
};

// Section 5: k haystack lines from lines[start] on (wrapping), needles in gap depth * k / 1000.
std::string haystack_body(const std::vector<std::string>& lines, size_t start, int64_t k,
                          const std::vector<Needle>& needles) {
  std::vector<int> depths;
  for (const Needle& needle : needles) depths.push_back(needle.depth);
  std::vector<std::pair<int64_t, const std::string*>> placed;  // (gap, text) in appearance order
  for (size_t i : appearance_order(depths)) {
    placed.emplace_back(static_cast<int64_t>(needles[i].depth) * k / 1000, &needles[i].text);
  }
  // Gaps grow with depth, so `placed` is already in gap order.
  std::string body;
  bool first_line = true;
  auto add_line = [&](const std::string& line) {
    if (!first_line) body += '\n';
    body += line;
    first_line = false;
  };
  size_t next_needle = 0;
  for (int64_t gap = 0; gap <= k; ++gap) {
    while (next_needle < placed.size() && placed[next_needle].first == gap) {
      add_line(*placed[next_needle].second);
      ++next_needle;
    }
    if (gap < k) add_line(lines[(start + static_cast<size_t>(gap)) % lines.size()]);
  }
  return body;
}

std::string needle_text(const std::string& key, const std::string& value) {
  return "The secret of " + key + " is " + value + ".";
}

struct Rendered {
  std::string prompt;
  std::vector<std::string> answers;
  std::vector<std::string> needles;  // the needle lines in the prompt
  std::string question;              // the prompt's last line
};

// Section 4: the largest k (to within tol tokens) whose prompt fits `target`, by the project's
// secant-then-bisection search, which must visit the same k values as tasks.fit to end on the same
// k.
template <typename Render>
Rendered fit(const Render& render, const Tokenizer& tokenizer, int64_t target, int64_t k_min,
             int64_t k_max, int64_t k_guess, const std::string& what) {
  auto measure = [&](const Rendered& rendered) {
    return 1 + static_cast<int64_t>(tokenizer.encode(rendered.prompt, EncodeOptions{}).size());
  };
  const int64_t tol = std::max<int64_t>(4, target / 256);
  Rendered lo_rendered = render(k_min);
  const int64_t m_min = measure(lo_rendered);
  if (m_min > target) {
    throw Error(what + ": " + std::to_string(m_min) + " tokens at the smallest size, budget " +
                std::to_string(target));
  }
  int64_t lo = k_min;
  int64_t m_lo = m_min;
  int64_t hi = k_max + 1;
  int64_t k = k_guess;
  for (int step = 0; step < 24; ++step) {
    if (hi - lo <= 1 || target - m_lo <= tol) break;
    if (step >= 8) k = (lo + hi) / 2;
    k = std::min(std::max(k, lo + 1), hi - 1);
    Rendered rendered = render(k);
    const int64_t m = measure(rendered);
    if (m <= target) {
      lo = k;
      m_lo = m;
      lo_rendered = std::move(rendered);
    } else {
      hi = k;
    }
    if (m > m_min) {
      k = k_min + (target - tol / 2 - m_min) * (k - k_min) / (m - m_min);
    } else {
      k = 2 * k;
    }
  }
  return lo_rendered;
}

Rendered fit_haystack(const std::vector<std::string>& lines, size_t start,
                      const std::vector<Needle>& needles, const std::string& question,
                      const std::vector<std::string>& answers, bool noise,
                      const Tokenizer& tokenizer, int64_t target, const std::string& what) {
  static const std::vector<std::string> noise_lines = {kNoiseLine};
  const std::vector<std::string>& source = noise ? noise_lines : lines;
  const size_t source_start = noise ? 0 : start;
  auto render = [&](int64_t k) {
    Rendered rendered;
    rendered.prompt = haystack_body(source, source_start, k, needles) + "\n" + question;
    rendered.answers = answers;
    return rendered;
  };
  const int64_t k_max = noise ? kNoiseMaxLines : static_cast<int64_t>(lines.size());
  Rendered rendered =
      fit(render, tokenizer, target, 0, k_max, std::max<int64_t>(1, target / 16), what);
  for (const Needle& needle : needles) rendered.needles.push_back(needle.text);
  rendered.question = question;
  return rendered;
}

std::string list_body(const std::vector<const std::string*>& items) {
  std::string body;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0 && i % kListWordsPerLine == 0) body += '\n';
    body += ' ';
    body += *items[i];
  }
  return body;
}

// Section 6, cwe: the list of `total` words from a fresh Rng(list_seed), and its answer.
Rendered cwe_list(const std::vector<std::string>& pool, uint64_t list_seed, int64_t total) {
  const int64_t distinct_uncommon = static_cast<int64_t>(pool.size()) - kCommonWordCount;
  const int64_t per_round = 10 * kCommonWordCount + distinct_uncommon;
  const int64_t f = std::max<int64_t>(3, (total + per_round - 1) / per_round);
  const int64_t common_total = 10 * kCommonWordCount * f;
  const int64_t uncommon =
      total < common_total ? 0 : std::min(distinct_uncommon, (total - common_total) / f);
  SplitMix64 rng(list_seed);
  std::vector<size_t> indices(pool.size());
  std::iota(indices.begin(), indices.end(), size_t{0});
  const std::vector<size_t> chosen =
      draw_sample(rng, indices, static_cast<size_t>(kCommonWordCount + uncommon));
  std::vector<size_t> items;
  for (size_t c = 0; c < chosen.size(); ++c) {
    const int64_t copies = c < kCommonWordCount ? 10 * f : f;
    items.insert(items.end(), static_cast<size_t>(copies), chosen[c]);
  }
  shuffle_items(rng, items);
  const std::set<size_t> common(chosen.begin(), chosen.begin() + kCommonWordCount);
  std::set<size_t> seen;
  Rendered rendered;
  std::vector<const std::string*> words;
  words.reserve(items.size());
  for (size_t item : items) {
    words.push_back(&pool[item]);
    if (common.count(item) != 0 && seen.insert(item).second) rendered.answers.push_back(pool[item]);
  }
  rendered.prompt = list_body(words);
  return rendered;
}

// Section 6, fwe: a Zipf (alpha 2) list of `total` words; answer: the three most frequent.
Rendered fwe_list(const std::vector<std::string>& pool, uint64_t list_seed, int64_t total) {
  std::vector<int64_t> counts;
  for (int64_t r = 1; r <= static_cast<int64_t>(pool.size()) && total / (2 * r * r) >= 1; ++r) {
    counts.push_back(total / (2 * r * r));
  }
  if (counts.empty())
    throw Error("fwe: a list of " + std::to_string(total) + " words is too short");
  counts[0] += total - std::accumulate(counts.begin(), counts.end(), int64_t{0});
  SplitMix64 rng(list_seed);
  std::vector<size_t> indices(pool.size());
  std::iota(indices.begin(), indices.end(), size_t{0});
  const std::vector<size_t> ranked = draw_sample(rng, indices, counts.size());
  std::vector<size_t> items;
  for (size_t r = 0; r < counts.size(); ++r) {
    items.insert(items.end(), static_cast<size_t>(counts[r]), ranked[r]);
  }
  shuffle_items(rng, items);
  Rendered rendered;
  std::vector<const std::string*> words;
  words.reserve(items.size());
  for (size_t item : items) words.push_back(&pool[item]);
  rendered.prompt = list_body(words);
  for (size_t r = 0; r < ranked.size() && r < kFrequentWordCount; ++r) {
    rendered.answers.push_back(pool[ranked[r]]);
  }
  return rendered;
}

std::vector<std::string> read_lines(const std::string& path) {
  const std::string text = read_user_file(path, "RULER haystack text");
  std::vector<std::string> lines;
  std::string line;
  for (size_t i = 0; i < text.size(); ++i) {
    // Python's text mode (universal newlines, which tasks.read_lines uses) reads "\r\n" and a lone
    // "\r" as "\n".
    if (text[i] == '\r' && i + 1 < text.size() && text[i + 1] == '\n') continue;
    if (text[i] == '\n' || text[i] == '\r') {
      lines.push_back(std::move(line));
      line.clear();
    } else {
      line += text[i];
    }
  }
  lines.push_back(std::move(line));
  return lines;
}

std::vector<std::string> string_list(const nlohmann::json& words, const char* field,
                                     const std::string& path) {
  if (!words.contains(field) || !words[field].is_array()) {
    throw Error(path + ": field '" + std::string(field) + "' (a list of words) is missing");
  }
  std::vector<std::string> list;
  for (const auto& entry : words[field]) {
    if (!entry.is_string()) throw Error(path + ": '" + field + "' holds a non-string entry");
    list.push_back(entry.get<std::string>());
  }
  return list;
}

}  // namespace

uint64_t SplitMix64::next() {
  state_ += 0x9E3779B97F4A7C15ULL;
  uint64_t z = state_;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

uint64_t SplitMix64::below(uint64_t n) {
  if (n == 0) throw Error("SplitMix64::below needs n >= 1");
  return next() % n;
}

uint64_t fnv1a64(const std::string& text) {
  uint64_t hash = 0xCBF29CE484222325ULL;
  for (unsigned char byte : text) {
    hash ^= byte;
    hash *= 0x100000001B3ULL;
  }
  return hash;
}

std::string ruler_word_list(const std::vector<std::string>& words) {
  std::string list;
  for (size_t i = 0; i < words.size(); ++i) {
    if (i > 0) list += i + 1 < words.size() ? "," : " and";
    list += " " + words[i];
  }
  return list;
}

const std::vector<RulerTask>& all_ruler_tasks() {
  static const std::vector<RulerTask> tasks = [] {
    std::vector<RulerTask> list;
    for (const TaskInfo& entry : kTasks) list.push_back(entry.task);
    return list;
  }();
  return tasks;
}

std::string ruler_task_name(RulerTask task) { return info(task).name; }

RulerTask parse_ruler_task(const std::string& name) {
  for (const TaskInfo& entry : kTasks) {
    if (name == entry.name) return entry.task;
  }
  throw Error("unknown RULER task '" + name + "' (known: " + known_task_names() + ")");
}

int ruler_generation_tokens(RulerTask task) { return info(task).generation_tokens; }

std::string ruler_word_set_name(RulerWordSet words) {
  return words == RulerWordSet::kHeldout ? "heldout" : "all";
}

RulerWordSet parse_ruler_word_set(const std::string& name) {
  if (name == "all") return RulerWordSet::kAll;
  if (name == "heldout") return RulerWordSet::kHeldout;
  throw Error("unknown RULER word set '" + name + "' (known: all, heldout)");
}

namespace {

RulerSources load_word_pools(const std::string& model_folder, RulerWordSet words) {
  const std::string words_path = model_folder + "/task_words.json";
  if (!is_regular_file(words_path)) {
    throw Error("cannot read " + words_path +
                " (the task word pools that training/train.py writes beside the model)");
  }
  const nlohmann::json json = read_json_file(words_path, "RULER task words");
  if (!json.is_object()) throw Error(words_path + " is not a JSON object");
  if (json.value("format", 0) != 1) {
    throw Error(words_path + ": unsupported task words format (expected \"format\": 1)");
  }
  const int every = json.value("heldout_every", 0);
  if (every < 1) throw Error(words_path + ": 'heldout_every' must be a positive integer");

  auto select = [&](const std::vector<std::string>& list) {
    if (words == RulerWordSet::kAll) return list;
    std::vector<std::string> kept;
    for (size_t i = 0; i < list.size(); ++i) {
      if (static_cast<int>(i % static_cast<size_t>(every)) == every - 1) kept.push_back(list[i]);
    }
    return kept;
  };
  RulerSources sources;
  sources.word_set = words;
  sources.keys = select(string_list(json, "keys", words_path));
  sources.values = select(string_list(json, "values", words_path));
  sources.numbers = select(string_list(json, "numbers", words_path));
  // An unusual vocabulary with too few one-token numbers: values stand in (as tasks.py does).
  if (sources.numbers.size() < 10) sources.numbers = sources.values;
  std::set<std::string> union_words(sources.keys.begin(), sources.keys.end());
  union_words.insert(sources.values.begin(), sources.values.end());
  sources.list_words.assign(union_words.begin(), union_words.end());
  if (sources.keys.size() < 16 || sources.values.size() < 16) {
    throw Error(words_path + ": word pools too small (" + std::to_string(sources.keys.size()) +
                " keys, " + std::to_string(sources.values.size()) + " values, " +
                ruler_word_set_name(words) + " words)");
  }
  return sources;
}

}  // namespace

RulerSources load_ruler_sources(const std::string& model_folder, const std::string& text_dir,
                                RulerWordSet words) {
  RulerSources sources = load_word_pools(model_folder, words);
  sources.haystack_lines = read_lines(text_dir + "/janeausten/persuasion.txt");
  return sources;
}

RulerSources load_ruler_noise_sources(const std::string& model_folder, RulerWordSet words) {
  RulerSources sources = load_word_pools(model_folder, words);
  sources.haystack_lines = {kNoiseLine};
  sources.noise_haystack = true;
  return sources;
}

uint64_t ruler_sample_seed(uint64_t base_seed, RulerTask task, int length, int index) {
  return base_seed ^ fnv1a64(ruler_task_name(task) + "/" + std::to_string(length) + "/" +
                             std::to_string(index));
}

RulerSample make_ruler_sample(RulerTask task, int length, int index, uint64_t base_seed,
                              const Tokenizer& tokenizer, const RulerSources& sources) {
  const std::string name = ruler_task_name(task);
  const std::string what = name + " at " + std::to_string(length) + " tokens";
  if (length <= 0 || index < 0) {
    throw Error(what + ", sample " + std::to_string(index) +
                ": the length must be positive and the index not negative");
  }
  if (sources.haystack_lines.empty() || sources.keys.empty()) {
    throw Error(what + ": the RULER sources are not loaded (load_ruler_sources)");
  }
  RulerSample sample;
  sample.task = task;
  sample.length = length;
  sample.index = index;
  sample.seed = ruler_sample_seed(base_seed, task, length, index);
  sample.max_new_tokens = ruler_generation_tokens(task);
  const int64_t target = static_cast<int64_t>(length) - sample.max_new_tokens;
  const std::vector<std::string>& lines = sources.haystack_lines;

  SplitMix64 rng(sample.seed);
  auto draw_depths = [&](size_t count) {
    std::vector<int> depths;
    for (size_t i = 0; i < count; ++i) depths.push_back(static_cast<int>(rng.below(kDepthSteps)));
    return depths;
  };
  Rendered rendered;
  switch (task) {
    case RulerTask::kNiahSingle:
    case RulerTask::kNiahMultikey: {
      const size_t n = task == RulerTask::kNiahSingle ? 1 : 4;
      const auto keys = draw_sample(rng, sources.keys, n);
      const auto values = draw_sample(rng, sources.values, n);
      const auto depths = draw_depths(n);
      const size_t asked = static_cast<size_t>(rng.below(n));
      const size_t start = static_cast<size_t>(rng.below(lines.size()));
      std::vector<Needle> needles;
      for (size_t i = 0; i < n; ++i)
        needles.push_back({depths[i], needle_text(keys[i], values[i])});
      rendered =
          fit_haystack(lines, start, needles, "What is the secret of " + keys[asked] + "? It is",
                       {values[asked]}, sources.noise_haystack, tokenizer, target, what);
      for (size_t i = 0; i < n; ++i) {
        if (i != asked)
          sample.follow_ups.push_back(
              {"What is the secret of " + keys[i] + "? It is", {values[i]}});
      }
      break;
    }
    case RulerTask::kNiahMultivalue: {
      const std::string key = draw_sample(rng, sources.keys, 1)[0];
      const auto values = draw_sample(rng, sources.values, 4);
      const auto depths = draw_depths(4);
      const size_t start = static_cast<size_t>(rng.below(lines.size()));
      std::vector<Needle> needles;
      for (size_t i = 0; i < 4; ++i) needles.push_back({depths[i], needle_text(key, values[i])});
      std::vector<std::string> answers;
      for (size_t i : appearance_order(depths)) answers.push_back(values[i]);
      rendered =
          fit_haystack(lines, start, needles, "What are all the secrets of " + key + "? They are",
                       answers, sources.noise_haystack, tokenizer, target, what);
      break;
    }
    case RulerTask::kNiahMultiquery: {
      const auto keys = draw_sample(rng, sources.keys, 4);
      const auto values = draw_sample(rng, sources.values, 4);
      const auto depths = draw_depths(4);
      const auto order = draw_sample(rng, std::vector<size_t>{0, 1, 2, 3}, 4);
      const size_t start = static_cast<size_t>(rng.below(lines.size()));
      std::vector<Needle> needles;
      for (size_t i = 0; i < 4; ++i)
        needles.push_back({depths[i], needle_text(keys[i], values[i])});
      std::vector<std::string> asked_keys;
      std::vector<std::string> answers;
      for (size_t i : order) {
        asked_keys.push_back(keys[i]);
        answers.push_back(values[i]);
      }
      rendered =
          fit_haystack(lines, start, needles,
                       "What are the secrets of" + ruler_word_list(asked_keys) + "? They are",
                       answers, sources.noise_haystack, tokenizer, target, what);
      for (size_t i : order)
        sample.follow_ups.push_back({"What is the secret of " + keys[i] + "? It is", {values[i]}});
      break;
    }
    case RulerTask::kVariableTracking: {
      const auto names = draw_sample(rng, sources.keys, 5);
      const std::string number = draw_sample(rng, sources.numbers, 1)[0];
      auto depths = draw_depths(5);
      std::sort(depths.begin(), depths.end());
      std::vector<Needle> needles;
      needles.push_back({depths[0], "VAR " + names[0] + " = " + number});
      for (size_t i = 1; i < names.size(); ++i) {
        needles.push_back({depths[i], "VAR " + names[i] + " = VAR " + names[i - 1]});
      }
      rendered = fit_haystack(lines, 0, needles,
                              "Which variables are assigned the value " + number + "? They are",
                              names, true, tokenizer, target, what);
      break;
    }
    case RulerTask::kCommonWords:
    case RulerTask::kFrequentWords: {
      const uint64_t list_seed = rng.next();
      const bool common = task == RulerTask::kCommonWords;
      const std::string question =
          common ? "What are the 10 most common words in the list above? They are"
                 : "What are the 3 most frequent words in the list above? They are";
      if (sources.list_words.size() <= static_cast<size_t>(kCommonWordCount)) {
        throw Error(what + ": the word pools hold too few distinct words for a list task");
      }
      auto render = [&](int64_t total) {
        Rendered list = common ? cwe_list(sources.list_words, list_seed, total)
                               : fwe_list(sources.list_words, list_seed, total);
        list.prompt += "\n" + question;
        list.question = question;
        return list;
      };
      const int64_t k_min = common ? 10 * kCommonWordCount * 3 : 64;
      rendered = fit(render, tokenizer, target, k_min, 8 * target + 1024, target * 10 / 11, what);
      break;
    }
  }
  sample.prompt = std::move(rendered.prompt);
  sample.answers = std::move(rendered.answers);
  sample.needles = std::move(rendered.needles);
  sample.question = std::move(rendered.question);
  sample.prompt_tokens =
      1 + static_cast<int>(tokenizer.encode(sample.prompt, EncodeOptions{}).size());
  return sample;
}

std::vector<RulerSample> make_ruler_samples(RulerTask task, int length, int count,
                                            uint64_t base_seed, const Tokenizer& tokenizer,
                                            const RulerSources& sources) {
  if (count < 0) throw Error("RULER sample count must not be negative");
  std::vector<RulerSample> samples;
  samples.reserve(static_cast<size_t>(count));
  for (int index = 0; index < count; ++index) {
    samples.push_back(make_ruler_sample(task, length, index, base_seed, tokenizer, sources));
  }
  return samples;
}

double ruler_score(RulerTask /*task*/, const std::string& prediction,
                   const std::vector<std::string>& answers) {
  if (answers.empty()) return 0.0;
  std::set<std::string> words;
  std::string word;
  for (char c : prediction) {
    const char lower = (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
    if ((lower >= 'a' && lower <= 'z') || (lower >= '0' && lower <= '9')) {
      word += lower;
    } else if (!word.empty()) {
      words.insert(std::move(word));
      word.clear();
    }
  }
  if (!word.empty()) words.insert(std::move(word));
  size_t found = 0;
  for (const std::string& answer : answers) {
    std::string lower = answer;
    for (char& c : lower) {
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    }
    if (words.count(lower) != 0) ++found;
  }
  return static_cast<double>(found) / static_cast<double>(answers.size());
}

}  // namespace entropyinfer::eval

// The one place numeric flags are read. The text must be a whole number (or a decimal, where the
// flag takes one) inside the flag's range; CLI11 runs these checks before converting, so '', '12x',
// '-5' for a count or a seed of 2^64 all end in one "error: --flag: ..." message, the same shape as
// every other refusal.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <string_view>

namespace entropyinfer::cli {

// The largest prompt, context or token count a flag accepts: 2^30 tokens.
inline constexpr int64_t kMaxTokenCount = int64_t{1} << 30;

// Throw Error("<flag>: ...") for text that is not a number in [min, max].
int64_t parse_integer_flag(std::string_view flag, std::string_view text, int64_t min, int64_t max);
double parse_number_flag(std::string_view flag, std::string_view text, double min, double max);
// 0 to 2^64 - 1.
uint64_t parse_seed_flag(std::string_view flag, std::string_view text);
// A positive number of tokens, optionally with a k suffix (4096 or 4k), up to kMaxTokenCount.
int parse_token_count(std::string_view flag, std::string_view text);

// The same checks as validators, for add_option(...)->check(...).
CLI::Validator integer_in(int64_t min, int64_t max);
CLI::Validator number_in(double min, double max);
CLI::Validator seed_value();
CLI::Validator token_count();

}  // namespace entropyinfer::cli

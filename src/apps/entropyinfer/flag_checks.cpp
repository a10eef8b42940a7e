#include "apps/entropyinfer/flag_checks.h"

#include <charconv>
#include <cmath>
#include <optional>
#include <string>

#include "core/error.h"

namespace entropyinfer::cli {
namespace {

std::string quoted(std::string_view text) { return "'" + std::string(text) + "'"; }

std::string number_text(double value) {
  if (value == std::floor(value) && std::fabs(value) < 1e15) {
    return std::to_string(static_cast<long long>(value));
  }
  char text[32];
  std::snprintf(text, sizeof text, "%g", value);
  return text;
}

// Each returns the problem with `text`, or nothing when it is fine.
std::optional<std::string> integer_problem(std::string_view text, int64_t min, int64_t max,
                                           int64_t& value) {
  const std::string expected =
      "expects a whole number from " + std::to_string(min) + " to " + std::to_string(max);
  if (text.empty()) return expected + ", got an empty value";
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, value);
  if (error == std::errc::result_out_of_range) return expected + ", got " + quoted(text);
  if (error != std::errc() || stop != end) return expected + ", got " + quoted(text);
  if (value < min || value > max) return expected + ", got " + quoted(text);
  return std::nullopt;
}

std::optional<std::string> number_problem(std::string_view text, double min, double max,
                                          double& value) {
  const std::string expected =
      "expects a number from " + number_text(min) + " to " +
      (std::isinf(max) ? std::string("any finite value") : number_text(max));
  if (text.empty()) return expected + ", got an empty value";
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, value);
  if (error != std::errc() || stop != end || !std::isfinite(value) || value < min || value > max) {
    return expected + ", got " + quoted(text);
  }
  return std::nullopt;
}

std::optional<std::string> seed_problem(std::string_view text, uint64_t& value) {
  const std::string expected = "expects a seed from 0 to 18446744073709551615 (2^64 - 1)";
  if (text.empty()) return expected + ", got an empty value";
  const char* end = text.data() + text.size();
  // from_chars for an unsigned type refuses a sign, so "-1" cannot wrap around to 2^64 - 1.
  const auto [stop, error] = std::from_chars(text.data(), end, value);
  if (error != std::errc() || stop != end) return expected + ", got " + quoted(text);
  return std::nullopt;
}

std::optional<std::string> token_count_problem(std::string_view text, int& count) {
  const std::string expected = "expects a positive number of tokens up to " +
                               std::to_string(kMaxTokenCount) + " (e.g. 4096 or 4k)";
  std::string_view digits = text;
  int64_t scale = 1;
  if (!digits.empty() && (digits.back() == 'k' || digits.back() == 'K')) {
    digits.remove_suffix(1);
    scale = 1024;
  }
  int64_t value = 0;
  if (integer_problem(digits, 1, kMaxTokenCount / scale, value)) {
    return expected + ", got " + (text.empty() ? std::string("an empty value") : quoted(text));
  }
  count = static_cast<int>(value * scale);
  return std::nullopt;
}

[[noreturn]] void refuse(std::string_view flag, const std::string& problem) {
  throw Error(std::string(flag) + ": " + problem);
}

}  // namespace

int64_t parse_integer_flag(std::string_view flag, std::string_view text, int64_t min, int64_t max) {
  int64_t value = 0;
  if (auto problem = integer_problem(text, min, max, value)) refuse(flag, *problem);
  return value;
}

double parse_number_flag(std::string_view flag, std::string_view text, double min, double max) {
  double value = 0.0;
  if (auto problem = number_problem(text, min, max, value)) refuse(flag, *problem);
  return value;
}

uint64_t parse_seed_flag(std::string_view flag, std::string_view text) {
  uint64_t value = 0;
  if (auto problem = seed_problem(text, value)) refuse(flag, *problem);
  return value;
}

int parse_token_count(std::string_view flag, std::string_view text) {
  int count = 0;
  if (auto problem = token_count_problem(text, count)) refuse(flag, *problem);
  return count;
}

// CLI11 prefixes a validator's message with the option's name.
CLI::Validator integer_in(int64_t min, int64_t max) {
  return CLI::Validator(
      [min, max](std::string& text) {
        int64_t value = 0;
        return integer_problem(text, min, max, value).value_or(std::string());
      },
      "INT in [" + std::to_string(min) + " - " + std::to_string(max) + "]");
}

CLI::Validator number_in(double min, double max) {
  return CLI::Validator(
      [min, max](std::string& text) {
        double value = 0.0;
        return number_problem(text, min, max, value).value_or(std::string());
      },
      "NUMBER in [" + number_text(min) + " - " + (std::isinf(max) ? "inf" : number_text(max)) +
          "]");
}

CLI::Validator seed_value() {
  return CLI::Validator(
      [](std::string& text) {
        uint64_t value = 0;
        return seed_problem(text, value).value_or(std::string());
      },
      "UINT64");
}

CLI::Validator token_count() {
  return CLI::Validator(
      [](std::string& text) {
        int count = 0;
        return token_count_problem(text, count).value_or(std::string());
      },
      "TOKENS (4096 or 4k)");
}

}  // namespace entropyinfer::cli

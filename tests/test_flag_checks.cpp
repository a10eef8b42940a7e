// The one place numeric flags are read, as a library: every way a number can be written wrong
// (empty, trailing text, out of range, a sign where none is allowed) is refused with the flag's
// name.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "apps/entropyinfer/flag_checks.h"
#include "safetensors_writer.h"

namespace entropyinfer::cli {
namespace {

using testing::error_message_of;
using testing::mentions_all;

TEST(FlagChecks, IntegersMustBeWholeAndInRange) {
  EXPECT_EQ(parse_integer_flag("--threads", "8", 1, 1024), 8);
  EXPECT_EQ(parse_integer_flag("--context", "0", 0, 10), 0);
  for (const char* bad : {"", "0", "1025", "100000", "-3", "8x", " 8", "8 ", "0x10", "1e3", "+"}) {
    SCOPED_TRACE(bad);
    EXPECT_TRUE(
        mentions_all(error_message_of([&] { parse_integer_flag("--threads", bad, 1, 1024); }),
                     {"--threads: expects a whole number from 1 to 1024"}));
  }
  EXPECT_TRUE(mentions_all(
      error_message_of([] { parse_integer_flag("-c", "99999999999999999999999", 0, 10); }),
      {"-c", "got '99999999999999999999999'"}));
}

TEST(FlagChecks, NumbersMustBeFiniteAndInRange) {
  EXPECT_DOUBLE_EQ(parse_number_flag("-t", "0.8", 0.0, HUGE_VAL), 0.8);
  EXPECT_DOUBLE_EQ(parse_number_flag("--top-p", "1", 0.0, 1.0), 1.0);
  for (const char* bad : {"", "nan", "inf", "-0.1", "0.8.1", "1e400", "abc"}) {
    SCOPED_TRACE(bad);
    EXPECT_TRUE(mentions_all(error_message_of([&] { parse_number_flag("-t", bad, 0.0, HUGE_VAL); }),
                             {"-t: expects a number from 0"}));
  }
}

TEST(FlagChecks, SeedsCoverExactlyTheUnsigned64BitRange) {
  EXPECT_EQ(parse_seed_flag("-s", "0"), 0u);
  EXPECT_EQ(parse_seed_flag("-s", "18446744073709551615"), UINT64_MAX);
  for (const char* bad : {"-1", "18446744073709551616", "", "7.5", "-0"}) {
    SCOPED_TRACE(bad);
    EXPECT_TRUE(mentions_all(error_message_of([&] { parse_seed_flag("-s", bad); }),
                             {"-s: expects a seed from 0 to 18446744073709551615"}));
  }
}

TEST(FlagChecks, TokenCountsTakeAKSuffix) {
  EXPECT_EQ(parse_token_count("--length", "4096"), 4096);
  EXPECT_EQ(parse_token_count("--length", "4k"), 4096);
  EXPECT_EQ(parse_token_count("--length", "1024K"), 1 << 20);
  EXPECT_EQ(parse_token_count("--length", "1048576k"), 1 << 30);
  for (const char* bad : {"", "k", "0", "-4k", "4kk", "1048577k", "1073741825"}) {
    SCOPED_TRACE(bad);
    EXPECT_TRUE(mentions_all(error_message_of([&] { parse_token_count("--length", bad); }),
                             {"--length: expects a positive number of tokens"}));
  }
}

TEST(FlagChecks, ValidatorsReportTheSameProblemsToCli11) {
  CLI::App app;
  int threads = 0;
  uint64_t seed = 0;
  app.add_option("--threads", threads)->check(integer_in(1, 1024));
  app.add_option("--seed", seed)->check(seed_value());
  // CLI11 reads an argument vector from the back.
  EXPECT_NO_THROW(
      app.parse(std::vector<std::string>{"4", "--threads", "18446744073709551615", "--seed"}));
  EXPECT_EQ(seed, UINT64_MAX);
  EXPECT_EQ(threads, 4);
  try {
    app.parse(std::vector<std::string>{"", "--threads"});
    ADD_FAILURE() << "an empty --threads was accepted";
  } catch (const CLI::ValidationError& error) {
    EXPECT_NE(std::string(error.what()).find("--threads"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("empty value"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace entropyinfer::cli

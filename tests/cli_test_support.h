// Running the command-line tool from tests: its exit status, stdout and stderr, and the check that
// a bad input gave one clear error.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "test_support.h"

namespace entropyinfer::testing {

struct CommandResult {
  int exit_code = -1;  // -1: killed by a signal (a crash)
  std::string out;
  std::string err;
};

// A path in the temporary folder that belongs to the running test alone: ctest runs tests as
// parallel processes, which must not share files.
inline std::string test_temp_path(const std::string& name) {
  const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
  return ::testing::TempDir() + "/" + test->test_suite_name() + "." + test->name() + "." +
         std::to_string(getpid()) + "." + name;
}

inline CommandResult run_cli(const std::string& arguments) {
  const std::string err_path = test_temp_path("stderr.txt");
  const std::string command = cli_path() + " " + arguments + " 2>" + err_path;
  CommandResult result;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  size_t count;
  while ((count = fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.out.append(buffer, count);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  result.err = read_file_bytes(err_path);
  std::filesystem::remove(err_path);
  return result;
}

// Exit status 1 (not a crash), one "error: " line, naming `fragment`.
inline void expect_error(const CommandResult& result, const std::string& fragment) {
  EXPECT_EQ(result.exit_code, 1) << result.err;
  EXPECT_NE(result.err.find("error: "), std::string::npos) << result.err;
  EXPECT_NE(result.err.find(fragment), std::string::npos)
      << "expected '" << fragment << "' in: " << result.err;
}

}  // namespace entropyinfer::testing

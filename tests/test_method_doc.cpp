// docs/method.md is the method's description that travels with the checkout. Its parameter table
// must name every key an --attention-config file accepts, with the default the code really has, so
// that the page cannot silently drift from AttentionConfig.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "attention/attention_config.h"
#include "test_support.h"

namespace entropyinfer {
namespace {

std::string trimmed(std::string text) {
  const auto keep = [](char c) { return c != ' ' && c != '`'; };
  while (!text.empty() && !keep(text.front())) text.erase(text.begin());
  while (!text.empty() && !keep(text.back())) text.pop_back();
  return text;
}

// Rows of the parameter table: config key -> default column, both without backticks.
std::map<std::string, std::string> documented_defaults(const std::string& page) {
  std::map<std::string, std::string> defaults;
  std::istringstream lines(page);
  std::string line;
  bool in_table = false;
  while (std::getline(lines, line)) {
    if (line.rfind("| config key |", 0) == 0) {
      in_table = true;
      continue;
    }
    if (!in_table) continue;
    if (line.empty() || line[0] != '|') break;
    std::vector<std::string> cells;
    std::istringstream row(line.substr(1));
    std::string cell;
    while (std::getline(row, cell, '|')) cells.push_back(trimmed(cell));
    if (cells.size() >= 3 && cells[0].find("---") == std::string::npos) {
      defaults[cells[0]] = cells[2];
    }
  }
  return defaults;
}

TEST(MethodDoc, ParameterTableListsEveryConfigKeyWithItsDefault) {
  const std::string page =
      testing::read_file_bytes(std::string(ENTROPYINFER_FIXTURES_DIR) + "/../../docs/method.md");
  const std::map<std::string, std::string> documented = documented_defaults(page);
  ASSERT_FALSE(documented.empty()) << "docs/method.md has no '| config key |' table";

  const nlohmann::json defaults = attention_config_to_json(AttentionConfig{});
  std::map<std::string, nlohmann::json> keys = {{"prefill", defaults.at("prefill")},
                                                {"decode", defaults.at("decode")}};
  for (const char* group : {"prefill_params", "decode_params"}) {
    for (const auto& [key, value] : defaults.at(group).items()) keys[key] = value;
  }
  for (const auto& [key, value] : keys) {
    SCOPED_TRACE(key);
    const auto row = documented.find(key);
    ASSERT_NE(row, documented.end()) << "docs/method.md does not document '" << key << "'";
    if (value.is_string()) {
      EXPECT_EQ(row->second, value.get<std::string>());
    } else if (value.is_boolean()) {
      EXPECT_EQ(row->second, value.get<bool>() ? "true" : "false");
    } else {
      const double expected = value.get<double>();
      EXPECT_NEAR(std::stod(row->second), expected, 1e-12 * std::fabs(expected));
    }
  }
  for (const auto& [key, unused] : documented) {
    EXPECT_TRUE(keys.count(key)) << "docs/method.md documents '" << key
                                 << "', which AttentionConfig does not have";
  }
}

}  // namespace
}  // namespace entropyinfer

#include "core/json_reader.h"

#include <set>
#include <vector>

#include "core/error.h"
#include "core/user_file.h"

namespace entropyinfer {

nlohmann::json parse_json(std::string_view text, const std::string& source,
                          JsonReadOptions options) {
  using json = nlohmann::json;
  // Keys seen so far in each open container at the checked depth; a new container there starts
  // afresh.
  std::vector<std::set<std::string>> keys_by_open_object;
  auto on_event = [&](int depth, json::parse_event_t event, json& parsed) {
    if ((event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) &&
        depth >= kMaxJsonDepth) {
      // An exception stops the parser before it builds the rest of the tree.
      throw Error(source + " nests deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    }
    if (options.unique_keys_at_depth > 0) {
      if (event == json::parse_event_t::object_start && depth + 1 == options.unique_keys_at_depth) {
        keys_by_open_object.emplace_back();
      }
      if (event == json::parse_event_t::key && depth == options.unique_keys_at_depth &&
          !keys_by_open_object.empty()) {
        std::string key = parsed.get<std::string>();
        if (!keys_by_open_object.back().insert(key).second) {
          throw Error(source + " gives key '" + key + "' twice");
        }
      }
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), on_event);
  } catch (const json::exception& error) {
    // Includes out_of_range.406, a number beyond a double such as 1e400.
    throw Error(source + " is not valid JSON: " + error.what());
  }
}

nlohmann::json read_json_file(const std::string& path, std::string_view what,
                              JsonReadOptions options) {
  return parse_json(read_user_file(path, what), std::string(what) + " '" + path + "'", options);
}

}  // namespace entropyinfer

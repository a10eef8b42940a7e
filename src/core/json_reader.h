// The one place JSON from users and checkpoints is parsed (config.json, tokenizer.json, safetensors
// headers and indexes, attention configs, task files). Every failure, syntax, a number beyond a
// double, nesting deeper than any real file, a key given twice where it matters, ends in an Error
// naming the source; the standard parser's own exceptions never escape.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace entropyinfer {

// Real configs nest a handful of levels; the bound keeps hostile input from exhausting the stack
// in code that walks the parsed tree recursively.
inline constexpr int kMaxJsonDepth = 256;

struct JsonReadOptions {
  // Refuse an object whose keys repeat at this depth (1 = the top-level object); 0 checks none.
  // nlohmann keeps the last of two equal keys, which for a tensor table would hide a tensor.
  int unique_keys_at_depth = 0;
};

// `source` names the text in messages, e.g. "config.json 'models/x/config.json'".
nlohmann::json parse_json(std::string_view text, const std::string& source,
                          JsonReadOptions options = {});

// read_user_file + parse_json.
nlohmann::json read_json_file(const std::string& path, std::string_view what,
                              JsonReadOptions options = {});

}  // namespace entropyinfer

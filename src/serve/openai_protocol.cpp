#include "serve/openai_protocol.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <sstream>

namespace entropyinfer::serve {
namespace {

using json = nlohmann::json;

// Field names and values echoed in messages are cut to this many bytes, at a character boundary.
constexpr size_t kMaxEchoBytes = 64;

std::string shorten(std::string_view text) {
  if (text.size() <= kMaxEchoBytes) return std::string(text);
  size_t end = kMaxEchoBytes;
  // Back up over continuation bytes so that no character is split.
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
  return std::string(text.substr(0, end)) + "...";
}

// "a string", "an array", ... for "must be X, got Y" messages.
std::string kind_of(const json& value) {
  switch (value.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::object:
      return "an object";
    case json::value_t::array:
      return "an array";
    case json::value_t::string:
      return "a string";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return "an integer";
    case json::value_t::number_float:
      return "a number";
    default:
      return "an unexpected value";
  }
}

std::string number_text(double value) {
  std::ostringstream text;
  text << value;
  return text.str();
}

[[noreturn]] void wrong_type(const std::string& param, const char* expected, const json& value) {
  throw invalid_request("'" + param + "' must be " + expected + ", got " + kind_of(value), param,
                        "invalid_type");
}

[[noreturn]] void unsupported(const std::string& param, const std::string& why = {}) {
  throw invalid_request(
      "'" + param + "' is not supported by this server" + (why.empty() ? "" : " (" + why + ")"),
      param, "unsupported_parameter");
}

std::string read_string(const std::string& param, const json& value) {
  if (!value.is_string()) wrong_type(param, "a string", value);
  return value.get<std::string>();
}

bool read_bool(const std::string& param, const json& value) {
  if (!value.is_boolean()) wrong_type(param, "a boolean", value);
  return value.get<bool>();
}

double read_number(const std::string& param, const json& value, double min, double max,
                   bool min_inclusive = true) {
  if (!value.is_number()) wrong_type(param, "a number", value);
  const double number = value.get<double>();
  const bool above_min = min_inclusive ? number >= min : number > min;
  if (!std::isfinite(number) || !above_min || number > max) {
    throw invalid_request("'" + param + "' must be " + (min_inclusive ? "between " : "above ") +
                              number_text(min) + (min_inclusive ? " and " : " and at most ") +
                              number_text(max) + ", got " + number_text(number),
                          param, "invalid_value");
  }
  return number;
}

// OpenAI's logit_bias: an object from token ids, written as decimal strings, to a bias in
// [-100, 100]. vocab_size > 0 bounds the ids.
std::map<int32_t, float> read_logit_bias(const json& value, int vocab_size) {
  if (!value.is_object()) wrong_type("logit_bias", "an object", value);
  if (value.size() > static_cast<size_t>(kMaxLogitBiasEntries)) {
    throw invalid_request("'logit_bias' may name at most " + std::to_string(kMaxLogitBiasEntries) +
                              " tokens, got " + std::to_string(value.size()),
                          "logit_bias", "invalid_value");
  }
  std::map<int32_t, float> biases;
  for (const auto& [id_text, bias] : value.items()) {
    const std::string param = "logit_bias." + shorten(id_text);
    int64_t id = -1;
    const bool digits = !id_text.empty() && id_text.size() <= 10 &&
                        id_text.find_first_not_of("0123456789") == std::string::npos;
    if (digits) id = std::stoll(id_text);
    if (!digits || (vocab_size > 0 && id >= vocab_size) ||
        id > std::numeric_limits<int32_t>::max()) {
      throw invalid_request(
          "'logit_bias' keys are token ids" +
              (vocab_size > 0 ? " from 0 to " + std::to_string(vocab_size - 1) : std::string()) +
              ", got '" + shorten(id_text) + "'",
          param, "invalid_value");
    }
    biases[static_cast<int32_t>(id)] =
        static_cast<float>(read_number(param, bias, -kMaxLogitBias, kMaxLogitBias));
  }
  return biases;
}

int64_t read_integer(const std::string& param, const json& value, int64_t min, int64_t max) {
  if (!value.is_number_integer()) wrong_type(param, "an integer", value);
  const bool in_range =
      value.is_number_unsigned()
          ? value.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) &&
                value.get<int64_t>() >= min && value.get<int64_t>() <= max
          : value.get<int64_t>() >= min && value.get<int64_t>() <= max;
  if (!in_range) {
    throw invalid_request("'" + param + "' must be an integer from " + std::to_string(min) +
                              " to " + std::to_string(max) + ", got " + value.dump(),
                          param, "invalid_value");
  }
  return value.get<int64_t>();
}

// Fields that ask for output this server does not produce are refused, unless they ask for what it
// does anyway (best_of 1, n 1, tools []), which some clients send by default.
bool is_neutral(const std::string& key, const json& value) {
  if (value.is_null()) return true;
  if (key == "parallel_tool_calls") return value.is_boolean() && !value.get<bool>();
  if (key == "best_of") return value.is_number_integer() && value.get<int64_t>() == 1;
  if (key == "suffix") return value.is_string() && value.get<std::string>().empty();
  if (key == "logit_bias") return value.is_object() && value.empty();
  if (key == "tools" || key == "functions") return value.is_array() && value.empty();
  if (key == "tool_choice" || key == "function_call")
    return value.is_string() && value.get<std::string>() == "none";
  if (key == "response_format")
    return value.is_object() && value.size() == 1 && value.contains("type") &&
           value["type"] == "text";
  return false;
}

const std::set<std::string>& unsupported_fields(Endpoint endpoint) {
  static const std::set<std::string> completions = {"best_of", "suffix"};
  static const std::set<std::string> chat = {
      "tools",           "tool_choice", "functions",  "function_call", "parallel_tool_calls",
      "response_format", "audio",       "modalities", "prediction"};
  return endpoint == Endpoint::kCompletions ? completions : chat;
}

// Parses with the nesting bound and refuses repeated keys, which JSON parsers resolve
// differently (nlohmann keeps the last one): a request means one thing or is refused.
json parse_body(std::string_view body) {
  if (body.empty()) {
    throw invalid_request("the request body is empty; send a JSON object");
  }
  if (const std::optional<size_t> bad = find_invalid_utf8(body)) {
    throw invalid_request("the request body is not valid UTF-8 (byte " + std::to_string(*bad) + ")",
                          {}, "invalid_utf8");
  }
  std::vector<std::set<std::string>> open_objects;
  auto on_event = [&](int depth, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        // A throw stops the parser before it builds anything deeper.
        if (depth >= kMaxRequestDepth) {
          throw invalid_request("the request body nests deeper than " +
                                std::to_string(kMaxRequestDepth) + " levels");
        }
        if (event == json::parse_event_t::object_start) open_objects.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case json::parse_event_t::key:
        if (!open_objects.empty() &&
            !open_objects.back().insert(parsed.get<std::string>()).second) {
          const std::string key = shorten(parsed.get<std::string>());
          throw invalid_request("the key '" + key + "' appears twice in one object", key,
                                "duplicate_key");
        }
        break;
      default:
        break;
    }
    return true;
  };
  try {
    return json::parse(body.begin(), body.end(), on_event);
  } catch (const json::exception& error) {
    // nlohmann's text starts with "[json.exception.parse_error.101] "; the rest says where.
    std::string what = error.what();
    if (const size_t end = what.find("] ");
        what.rfind("[json.exception", 0) == 0 && end != std::string::npos) {
      what = what.substr(end + 2);
    }
    throw invalid_request("the request body is not valid JSON: " + what, {}, "invalid_json");
  }
}

// A request body that must be one JSON object (parse_body's rules).
json parse_object_body(std::string_view body) {
  json root = parse_body(body);
  if (!root.is_object()) {
    throw invalid_request("the request body must be a JSON object, got " + kind_of(root));
  }
  return root;
}

[[noreturn]] void unknown_field(const std::string& key) {
  const std::string name = shorten(key);
  throw invalid_request("unrecognized request field '" + name + "'", name, "unknown_parameter");
}

// One element of a token-id prompt: an integer inside the vocabulary (prompt_vocab_size > 0
// bounds it).
int32_t read_token_id(const std::string& param, const json& value, int prompt_vocab_size) {
  if (!value.is_number_integer()) wrong_type(param, "an integer token id", value);
  const int64_t limit =
      prompt_vocab_size > 0 ? prompt_vocab_size : int64_t{std::numeric_limits<int32_t>::max()} + 1;
  const bool in_range = value.is_number_unsigned()
                            ? value.get<uint64_t>() < static_cast<uint64_t>(limit)
                            : value.get<int64_t>() >= 0 && value.get<int64_t>() < limit;
  if (!in_range) {
    throw invalid_request("'" + param + "' is token id " + value.dump() +
                              ", outside the vocabulary: ids are 0 to " + std::to_string(limit - 1),
                          param, "invalid_value");
  }
  return static_cast<int32_t>(value.get<int64_t>());
}

std::vector<int32_t> read_token_ids(const std::string& param, const json& value,
                                    int prompt_vocab_size) {
  if (value.empty()) {
    throw invalid_request("'" + param + "' is an empty token array; send at least one token id",
                          param, "invalid_value");
  }
  std::vector<int32_t> ids;
  ids.reserve(value.size());
  for (size_t index = 0; index < value.size(); ++index) {
    ids.push_back(
        read_token_id(param + "[" + std::to_string(index) + "]", value[index], prompt_vocab_size));
  }
  return ids;
}

// OpenAI's prompt forms for one prompt: a string, token ids, or an array holding one of either.
// More than one prompt (a batch) is refused, as n > 1 is.
void read_prompt(const json& value, const ServedModel& served, CompletionRequest& request) {
  request.prompt.clear();
  request.prompt_token_ids.reset();
  if (value.is_string()) {
    request.prompt = value.get<std::string>();
    return;
  }
  if (!value.is_array()) {
    wrong_type("prompt", "a string, an array of token ids or an array of one of those", value);
  }
  if (value.empty()) {
    throw invalid_request("'prompt' is an empty array; send a string or at least one token id",
                          "prompt", "invalid_value");
  }
  const json& first = value[0];
  if (first.is_number_integer()) {
    request.prompt_token_ids = read_token_ids("prompt", value, served.prompt_vocab_size);
    return;
  }
  if (!first.is_string() && !first.is_array()) {
    wrong_type("prompt[0]", "a string, an integer token id or an array of token ids", first);
  }
  // A batch is refused as such only when it is one; mixed elements are a type error.
  const char* element_kind = first.is_string() ? "a string" : "an array of token ids";
  for (size_t index = 1; index < value.size(); ++index) {
    if (value[index].type() != first.type()) {
      wrong_type("prompt[" + std::to_string(index) + "]", element_kind, value[index]);
    }
  }
  if (value.size() > 1) {
    throw invalid_request("only one prompt per request is supported, got " +
                              std::to_string(value.size()) + " prompts",
                          "prompt", "unsupported_parameter");
  }
  if (first.is_string()) {
    request.prompt = first.get<std::string>();
  } else {
    request.prompt_token_ids = read_token_ids("prompt[0]", first, served.prompt_vocab_size);
  }
}

std::string read_content(const std::string& param, const json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (!value.is_array()) wrong_type(param, "a string or an array of text parts", value);
  std::string text;
  for (size_t index = 0; index < value.size(); ++index) {
    const std::string part_param = param + "[" + std::to_string(index) + "]";
    const json& part = value[index];
    if (!part.is_object()) wrong_type(part_param, "an object", part);
    if (!part.contains("type")) {
      throw invalid_request("'" + part_param + ".type' is missing", part_param + ".type");
    }
    const std::string type = read_string(part_param + ".type", part["type"]);
    if (type != "text") {
      unsupported(part_param + ".type",
                  "content parts of type '" + shorten(type) + "'; only text parts are");
    }
    for (const auto& [key, field] : part.items()) {
      if (key != "type" && key != "text") {
        throw invalid_request("unrecognized field '" + shorten(key) + "' in '" + part_param + "'",
                              part_param + "." + shorten(key), "unknown_parameter");
      }
    }
    if (!part.contains("text")) {
      throw invalid_request("'" + part_param + ".text' is missing", part_param + ".text");
    }
    // Parts are joined by newlines, as other OpenAI-compatible servers do.
    if (index > 0) text += '\n';
    text += read_string(part_param + ".text", part["text"]);
  }
  return text;
}

std::vector<ChatMessage> read_messages(const json& value) {
  if (!value.is_array()) wrong_type("messages", "an array", value);
  if (value.empty()) throw invalid_request("'messages' is empty; send at least one", "messages");
  std::vector<ChatMessage> messages;
  for (size_t index = 0; index < value.size(); ++index) {
    const std::string param = "messages[" + std::to_string(index) + "]";
    const json& entry = value[index];
    if (!entry.is_object()) wrong_type(param, "an object", entry);
    ChatMessage message;
    bool has_role = false;
    bool has_content = false;
    for (const auto& [key, field] : entry.items()) {
      const std::string field_param = param + "." + shorten(key);
      if (key == "role") {
        message.role = read_string(field_param, field);
        has_role = true;
      } else if (key == "content") {
        // An assistant turn without text (OpenAI allows null there) is an empty one.
        if (!field.is_null()) message.content = read_content(field_param, field);
        has_content = !field.is_null();
      } else if (key == "name") {
        read_string(field_param, field);  // accepted; the chat formats have no place for it
      } else if (key == "tool_calls" || key == "function_call" || key == "tool_call_id" ||
                 key == "audio" || key == "refusal") {
        if (!is_neutral("tools", field) && !field.is_null()) unsupported(field_param);
      } else {
        throw invalid_request("unrecognized field '" + shorten(key) + "' in '" + param + "'",
                              field_param, "unknown_parameter");
      }
    }
    if (!has_role) throw invalid_request("'" + param + ".role' is missing", param + ".role");
    if (message.role == "developer") message.role = "system";  // OpenAI's newer name for it
    if (message.role == "tool" || message.role == "function") {
      unsupported(param + ".role", "role '" + message.role + "'");
    }
    if (message.role != "system" && message.role != "user" && message.role != "assistant") {
      throw invalid_request("'" + param + ".role' must be system, user or assistant, got '" +
                                shorten(message.role) + "'",
                            param + ".role", "invalid_value");
    }
    if (!has_content && message.role != "assistant") {
      throw invalid_request("'" + param + ".content' is missing", param + ".content");
    }
    messages.push_back(std::move(message));
  }
  return messages;
}

std::vector<std::string> read_stop(const json& value) {
  std::vector<std::string> stop;
  if (value.is_null()) return stop;
  if (value.is_string()) {
    stop.push_back(value.get<std::string>());
  } else if (value.is_array()) {
    if (value.size() > static_cast<size_t>(kMaxStopStrings)) {
      throw invalid_request("'stop' may hold at most " + std::to_string(kMaxStopStrings) +
                                " strings, got " + std::to_string(value.size()),
                            "stop", "invalid_value");
    }
    for (size_t index = 0; index < value.size(); ++index) {
      stop.push_back(read_string("stop[" + std::to_string(index) + "]", value[index]));
    }
  } else {
    wrong_type("stop", "a string or an array of strings", value);
  }
  for (const std::string& text : stop) {
    if (text.empty()) throw invalid_request("'stop' strings must not be empty", "stop");
  }
  return stop;
}

// The first whole-word occurrence of a parameter name in an attention config message, so that
// the error's param points at it.
std::string named_parameter(const std::string& message, const json& defaults) {
  std::vector<std::string> names = {"prefill", "decode"};
  for (const char* section : {"prefill_params", "decode_params"}) {
    for (const auto& [name, value] : defaults[section].items()) names.push_back(name);
  }
  auto is_word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  size_t best = std::string::npos;
  std::string best_name;
  for (const std::string& name : names) {
    for (size_t at = message.find(name); at != std::string::npos; at = message.find(name, at + 1)) {
      const size_t end = at + name.size();
      const bool whole = (at == 0 || !is_word(message[at - 1])) &&
                         (end == message.size() || !is_word(message[end]));
      if (!whole) continue;
      if (at < best || (at == best && name.size() > best_name.size())) {
        best = at;
        best_name = name;
      }
      break;
    }
  }
  return best_name;
}

// A request's "model": null, or the served model's id (else 404).
void check_model(const json& value, const ServedModel& served) {
  if (value.is_null()) return;
  const std::string model = read_string("model", value);
  if (model != served.id) throw model_not_found(model, served.id);
}

json error_object(const ApiError& error) {
  return {{"message", error.message},
          {"type", error.type},
          {"param", error.param.empty() ? json(nullptr) : json(error.param)},
          {"code", error.code.empty() ? json(nullptr) : json(error.code)}};
}

double finite_or_zero(double value) { return std::isfinite(value) ? value : 0.0; }

const char* object_name(Endpoint endpoint, bool chunk) {
  if (endpoint == Endpoint::kCompletions) return "text_completion";
  return chunk ? "chat.completion.chunk" : "chat.completion";
}

json response_base(Endpoint endpoint, const ResponseIdentity& identity, bool chunk) {
  return {{"id", identity.id},
          {"object", object_name(endpoint, chunk)},
          {"created", identity.created},
          {"model", identity.model}};
}

json stream_chunk(Endpoint endpoint, const ResponseIdentity& identity, json choice,
                  bool include_usage) {
  json chunk = response_base(endpoint, identity, true);
  chunk["choices"] = json::array({std::move(choice)});
  if (include_usage) chunk["usage"] = nullptr;
  return chunk;
}

}  // namespace

ApiError::ApiError(int status_code, std::string error_type, std::string error_message,
                   std::string error_param, std::string error_code)
    : Error(error_message),
      status(status_code),
      type(std::move(error_type)),
      message(std::move(error_message)),
      param(std::move(error_param)),
      code(std::move(error_code)) {}

ApiError invalid_request(std::string message, std::string param, std::string code) {
  return ApiError(400, "invalid_request_error", std::move(message), std::move(param),
                  std::move(code));
}

ApiError model_not_found(const std::string& model, const std::string& served_id) {
  return ApiError(
      404, "not_found_error",
      "model '" + shorten(model) + "' not found; this server serves '" + served_id + "'", "model",
      "model_not_found");
}

std::string error_body(const ApiError& error) {
  return dump_json({{"error", error_object(error)}});
}

std::optional<size_t> find_invalid_utf8(std::string_view text) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  const size_t size = text.size();
  size_t at = 0;
  while (at < size) {
    const unsigned char lead = bytes[at];
    if (lead < 0x80) {
      ++at;
      continue;
    }
    size_t length = 0;
    unsigned char min_second = 0x80;
    unsigned char max_second = 0xBF;
    if (lead >= 0xC2 && lead <= 0xDF) {
      length = 2;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      length = 3;
      if (lead == 0xE0) min_second = 0xA0;  // overlong
      if (lead == 0xED) max_second = 0x9F;  // surrogates
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      length = 4;
      if (lead == 0xF0) min_second = 0x90;  // overlong
      if (lead == 0xF4) max_second = 0x8F;  // past U+10FFFF
    } else {
      return at;
    }
    if (at + length > size) return at;
    if (bytes[at + 1] < min_second || bytes[at + 1] > max_second) return at;
    for (size_t next = 2; next < length; ++next) {
      if ((bytes[at + next] & 0xC0) != 0x80) return at;
    }
    at += length;
  }
  return std::nullopt;
}

AttentionConfig merge_attention(const json& attention, const AttentionConfig& defaults) {
  if (attention.is_null()) return defaults;
  try {
    if (attention.is_string()) return with_methods(attention.get<std::string>(), defaults);
  } catch (const Error& error) {
    throw invalid_request(std::string("invalid 'attention': ") + error.what(), "attention",
                          "invalid_value");
  }
  if (!attention.is_object()) {
    wrong_type("attention", "an object of methods and parameters or a \"prefill+decode\" string",
               attention);
  }
  json merged = attention_config_to_json(defaults);
  auto section_of = [&](const std::string& key) -> const char* {
    for (const char* section : {"prefill_params", "decode_params"}) {
      if (merged[section].contains(key)) return section;
    }
    return nullptr;
  };
  for (const auto& [key, value] : attention.items()) {
    const std::string param = "attention." + shorten(key);
    if (key == "prefill" || key == "decode") {
      merged[key] = value;
    } else if (key == "prefill_params" || key == "decode_params") {
      if (!value.is_object()) wrong_type(param, "an object", value);
      for (const auto& [inner, inner_value] : value.items()) {
        if (!merged[key].contains(inner)) {
          throw invalid_request(
              "unknown attention parameter '" + shorten(inner) + "' in '" + param + "'",
              param + "." + shorten(inner), "unknown_parameter");
        }
        merged[key][inner] = inner_value;
      }
    } else if (const char* section = section_of(key)) {
      merged[section][key] = value;
    } else {
      throw invalid_request("unknown attention parameter '" + shorten(key) + "'", param,
                            "unknown_parameter");
    }
  }
  try {
    return attention_config_from_json(merged);
  } catch (const Error& error) {
    std::string what = error.what();
    constexpr std::string_view kPrefix = "attention config: ";
    if (what.rfind(kPrefix, 0) == 0) what = what.substr(kPrefix.size());
    const std::string name = named_parameter(what, merged);
    throw invalid_request("invalid 'attention': " + what,
                          name.empty() ? "attention" : "attention." + name, "invalid_value");
  }
}

CompletionRequest parse_completion_request(Endpoint endpoint, std::string_view body,
                                           const ServedModel& served) {
  const json root = parse_object_body(body);
  const bool chat = endpoint == Endpoint::kChatCompletions;
  CompletionRequest request;
  request.endpoint = endpoint;
  request.model = served.id;
  request.attention = served.default_attention;
  request.sampler.temperature = 1.0f;
  request.sampler.top_p = 1.0f;
  bool has_input = false;
  std::optional<int64_t> max_tokens;
  std::optional<int64_t> max_completion_tokens;
  const json* stream_options = nullptr;
  bool chat_logprobs = false;                // chat's "logprobs": true
  std::optional<int64_t> chat_top_logprobs;  // chat's "top_logprobs"
  const std::set<std::string>& refused = unsupported_fields(endpoint);

  for (const auto& [key, value] : root.items()) {
    if (!chat && key == "prompt") {
      if (value.is_null()) continue;
      read_prompt(value, served, request);
      has_input = true;
    } else if (chat && key == "messages") {
      if (value.is_null()) continue;
      request.messages = read_messages(value);
      has_input = true;
    } else if (key == "model") {
      check_model(value, served);
    } else if (key == "max_tokens") {
      // 0 scores an echoed prompt without generating (checked below).
      if (!value.is_null()) max_tokens = read_integer(key, value, 0, kMaxRequestTokens);
    } else if (chat && key == "max_completion_tokens") {
      if (!value.is_null()) max_completion_tokens = read_integer(key, value, 1, kMaxRequestTokens);
    } else if (key == "temperature") {
      if (!value.is_null()) {
        request.sampler.temperature = static_cast<float>(read_number(key, value, 0.0, 2.0));
      }
    } else if (key == "top_p") {
      if (!value.is_null()) {
        request.sampler.top_p = static_cast<float>(read_number(key, value, 0.0, 1.0, false));
      }
    } else if (key == "top_k") {
      // Not OpenAI's, but common among compatible servers; -1 and 0 both mean no limit.
      if (!value.is_null()) {
        request.sampler.top_k = static_cast<int>(
            std::max<int64_t>(0, read_integer(key, value, -1, std::numeric_limits<int>::max())));
      }
    } else if (key == "seed") {
      if (value.is_null()) continue;
      if (!value.is_number_integer()) wrong_type(key, "an integer", value);
      // OpenAI's seeds are signed 64-bit; either kind maps onto the sampler's 64 bits.
      request.seed = value.is_number_unsigned() ? value.get<uint64_t>()
                                                : static_cast<uint64_t>(value.get<int64_t>());
    } else if (key == "stop") {
      request.stop = read_stop(value);
    } else if (key == "stream") {
      if (!value.is_null()) request.stream = read_bool(key, value);
    } else if (key == "stream_options") {
      if (value.is_null()) continue;
      if (!value.is_object()) wrong_type(key, "an object", value);
      stream_options = &value;
    } else if (key == "n") {
      if (value.is_null()) continue;
      if (read_integer(key, value, std::numeric_limits<int64_t>::min(),
                       std::numeric_limits<int64_t>::max()) != 1) {
        throw invalid_request("only n = 1 is supported, got " + value.dump(), "n",
                              "unsupported_parameter");
      }
    } else if (key == "user") {
      if (!value.is_null()) read_string(key, value);  // accepted and not used
    } else if (key == "frequency_penalty" || key == "presence_penalty") {
      if (value.is_null()) continue;
      const auto penalty = static_cast<float>(read_number(key, value, -kMaxPenalty, kMaxPenalty));
      (key == "presence_penalty" ? request.sampler.presence_penalty
                                 : request.sampler.frequency_penalty) = penalty;
    } else if (key == "logit_bias") {
      if (!value.is_null()) request.sampler.logit_bias = read_logit_bias(value, served.vocab_size);
    } else if (key == "logprobs") {
      if (value.is_null()) continue;
      // Completions: how many alternatives per token; chat: whether to report logprobs at all.
      if (chat) {
        chat_logprobs = read_bool(key, value);
      } else {
        request.top_logprobs = static_cast<int>(read_integer(key, value, 0, kMaxTopLogprobs));
      }
    } else if (!chat && key == "echo") {
      if (!value.is_null()) request.echo = read_bool(key, value);
    } else if (chat && key == "top_logprobs") {
      if (!value.is_null()) chat_top_logprobs = read_integer(key, value, 0, kMaxTopLogprobs);
    } else if (key == "attention") {
      request.attention = merge_attention(value, served.default_attention);
    } else if (refused.count(key) > 0) {
      if (!is_neutral(key, value)) unsupported(key);
    } else {
      unknown_field(key);
    }
  }

  if (!has_input) {
    const char* field = chat ? "messages" : "prompt";
    throw invalid_request(std::string("'") + field + "' is missing", field, "missing_required");
  }
  if (stream_options != nullptr) {
    if (!request.stream) {
      throw invalid_request("'stream_options' is only allowed when 'stream' is true",
                            "stream_options");
    }
    for (const auto& [key, value] : stream_options->items()) {
      if (key == "include_usage") {
        if (!value.is_null()) request.include_usage = read_bool("stream_options." + key, value);
      } else {
        const std::string name = "stream_options." + shorten(key);
        throw invalid_request("unrecognized field '" + name + "'", name, "unknown_parameter");
      }
    }
  }
  if (chat_top_logprobs.value_or(0) > 0 && !chat_logprobs) {
    throw invalid_request("'top_logprobs' needs 'logprobs' to be true", "top_logprobs");
  }
  if (chat_logprobs) request.top_logprobs = static_cast<int>(chat_top_logprobs.value_or(0));
  if (max_tokens == 0 && !request.echo) {
    throw invalid_request("'max_tokens' must be an integer from 1 to " +
                              std::to_string(kMaxRequestTokens) +
                              ", got 0 (0 is allowed with 'echo', to score the prompt alone)",
                          "max_tokens", "invalid_value");
  }
  if (max_tokens && max_completion_tokens && *max_tokens != *max_completion_tokens) {
    throw invalid_request("'max_tokens' and 'max_completion_tokens' disagree; give one",
                          "max_completion_tokens");
  }
  if (max_completion_tokens) max_tokens = max_completion_tokens;
  if (max_tokens) request.max_tokens = static_cast<int>(*max_tokens);
  return request;
}

CompletionRequest parse_tokenize_request(std::string_view body, const ServedModel& served) {
  const json root = parse_object_body(body);
  CompletionRequest request;
  request.model = served.id;
  bool has_prompt = false, has_messages = false;
  for (const auto& [key, value] : root.items()) {
    if (key == "model") {
      check_model(value, served);
    } else if (key == "prompt") {
      read_prompt(value, served, request);
      has_prompt = true;
    } else if (key == "messages") {
      request.messages = read_messages(value);
      has_messages = true;
    } else {
      unknown_field(key);
    }
  }
  if (has_prompt == has_messages) {
    throw invalid_request("give either 'prompt' or 'messages'", has_prompt ? "messages" : "prompt",
                          has_prompt ? "invalid_value" : "missing_required");
  }
  request.endpoint = has_prompt ? Endpoint::kCompletions : Endpoint::kChatCompletions;
  return request;
}

std::vector<int32_t> parse_detokenize_request(std::string_view body, const ServedModel& served) {
  const json root = parse_object_body(body);
  std::optional<std::vector<int32_t>> tokens;
  for (const auto& [key, value] : root.items()) {
    if (key == "model") {
      check_model(value, served);
    } else if (key == "tokens") {
      if (!value.is_array()) wrong_type(key, "an array of token ids", value);
      if (value.size() > static_cast<size_t>(kMaxDetokenizeTokens)) {
        throw invalid_request("'tokens' may hold at most " + std::to_string(kMaxDetokenizeTokens) +
                                  " ids, got " + std::to_string(value.size()),
                              "tokens", "invalid_value");
      }
      const int64_t last_id =
          served.vocab_size > 0 ? served.vocab_size - 1 : std::numeric_limits<int32_t>::max();
      tokens.emplace();
      tokens->reserve(value.size());
      for (size_t index = 0; index < value.size(); ++index) {
        tokens->push_back(static_cast<int32_t>(
            read_integer("tokens[" + std::to_string(index) + "]", value[index], 0, last_id)));
      }
    } else {
      unknown_field(key);
    }
  }
  if (!tokens) throw invalid_request("'tokens' is missing", "tokens", "missing_required");
  return *tokens;
}

int resolve_max_tokens(const CompletionRequest& request, int64_t prompt_tokens,
                       int context_length) {
  const std::string counts = "the prompt has " + std::to_string(prompt_tokens) +
                             " tokens and the context holds " + std::to_string(context_length);
  // An echoed prompt scored alone (max_tokens 0) may fill the whole context.
  const bool scores_only = request.max_tokens == 0;
  if (prompt_tokens > context_length || (prompt_tokens == context_length && !scores_only)) {
    throw invalid_request(counts + ", which leaves no room for an answer",
                          request.endpoint == Endpoint::kCompletions ? "prompt" : "messages",
                          "context_length_exceeded");
  }
  if (scores_only) return 0;
  const int room = static_cast<int>(context_length - prompt_tokens);
  if (request.max_tokens) {
    if (*request.max_tokens > room) {
      throw invalid_request("'max_tokens' is " + std::to_string(*request.max_tokens) + ", but " +
                                counts + ": at most " + std::to_string(room) + " tokens fit",
                            "max_tokens", "context_length_exceeded");
    }
    return *request.max_tokens;
  }
  return request.endpoint == Endpoint::kCompletions ? std::min(kDefaultCompletionTokens, room)
                                                    : room;
}

const char* openai_finish_reason(FinishReason reason) {
  return reason == FinishReason::kLength ? "length" : "stop";
}

ResponseIdentity new_response_identity(Endpoint endpoint, const std::string& model) {
  thread_local std::mt19937_64 generator{std::random_device{}()};
  char hex[25];
  std::snprintf(hex, sizeof(hex), "%016llx%08llx", static_cast<unsigned long long>(generator()),
                static_cast<unsigned long long>(generator() & 0xFFFFFFFFu));
  ResponseIdentity identity;
  identity.id = std::string(endpoint == Endpoint::kCompletions ? "cmpl-" : "chatcmpl-") + hex;
  identity.created = std::chrono::duration_cast<std::chrono::seconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count();
  identity.model = model;
  return identity;
}

json usage_json(const RequestStats& stats) {
  return {{"prompt_tokens", stats.prompt_tokens},
          {"completion_tokens", stats.completion_tokens},
          {"total_tokens", stats.prompt_tokens + stats.completion_tokens}};
}

json entropyinfer_stats_json(const RequestStats& stats) {
  // Decode speed counts the tokens after the first, over the time from the first to the last.
  const double tokens_per_second = stats.completion_tokens > 1 && stats.decode_seconds > 0.0
                                       ? (stats.completion_tokens - 1) / stats.decode_seconds
                                       : 0.0;
  return {{"methods", stats.methods},
          {"queue_seconds", finite_or_zero(stats.queue_seconds)},
          {"time_to_first_token", finite_or_zero(stats.time_to_first_token)},
          {"decode_seconds", finite_or_zero(stats.decode_seconds)},
          {"tokens_per_second", finite_or_zero(tokens_per_second)},
          {"prefill_keys_read", stats.prefill_keys_read},
          {"prefill_keys_dense", stats.prefill_keys_dense},
          {"prefill_keys_fraction", finite_or_zero(stats.prefill_keys_fraction())},
          {"cache_entries_before", stats.cache_entries_before},
          {"cache_entries_after", stats.cache_entries_after},
          {"cache_kept_fraction", finite_or_zero(stats.cache_kept_fraction())},
          {"compressed", stats.compressed}};
}

json logprobs_json(Endpoint endpoint, std::span<const TokenLogprob> tokens,
                   const Tokenizer& tokenizer, int64_t& text_offset) {
  // Chat has no text offsets: only completions read and advance text_offset.
  const auto value = [](float logprob) {
    return std::isfinite(logprob) ? std::max<double>(logprob, kLogprobFloor) : kLogprobFloor;
  };
  if (endpoint == Endpoint::kCompletions) {
    json texts = json::array(), logprobs = json::array(), tops = json::array(),
         offsets = json::array();
    for (const TokenLogprob& token : tokens) {
      const std::string text = tokenizer.token_bytes(token.token);
      texts.push_back(text);
      logprobs.push_back(value(token.logprob));
      json top = json::object();
      for (const TokenAlternative& alternative : token.top) {
        top[tokenizer.token_bytes(alternative.token)] = value(alternative.logprob);
      }
      top[text] = value(token.logprob);
      tops.push_back(std::move(top));
      offsets.push_back(text_offset);
      text_offset += static_cast<int64_t>(text.size());
    }
    return {{"tokens", std::move(texts)},
            {"token_logprobs", std::move(logprobs)},
            {"top_logprobs", std::move(tops)},
            {"text_offset", std::move(offsets)}};
  }
  const auto entry = [&](int32_t id, float logprob) {
    const std::string text = tokenizer.token_bytes(id);
    json bytes = json::array();
    for (const char byte : text) bytes.push_back(static_cast<unsigned char>(byte));
    return json{{"token", text}, {"logprob", value(logprob)}, {"bytes", std::move(bytes)}};
  };
  json content = json::array();
  for (const TokenLogprob& token : tokens) {
    json item = entry(token.token, token.logprob);
    json top = json::array();
    for (const TokenAlternative& alternative : token.top) {
      top.push_back(entry(alternative.token, alternative.logprob));
    }
    item["top_logprobs"] = std::move(top);
    content.push_back(std::move(item));
  }
  return {{"content", std::move(content)}, {"refusal", nullptr}};
}

json prompt_logprobs_json(std::span<const int32_t> prompt, std::span<const TokenLogprob> scores,
                          const Tokenizer& tokenizer, int64_t& text_offset, bool bos_added) {
  if (prompt.empty() || scores.size() + 1 != prompt.size()) {
    throw Error("prompt logprobs: " + std::to_string(scores.size()) + " scores for a " +
                std::to_string(prompt.size()) + "-token prompt");
  }
  const bool hidden_bos = bos_added && tokenizer.bos_id() == prompt.front();
  const std::string first = hidden_bos ? std::string() : tokenizer.token_bytes(prompt.front());
  json object = {{"tokens", json::array({first})},
                 {"token_logprobs", json::array({nullptr})},
                 {"top_logprobs", json::array({nullptr})},
                 {"text_offset", json::array({text_offset})}};
  text_offset += static_cast<int64_t>(first.size());
  append_logprobs(object, logprobs_json(Endpoint::kCompletions, scores, tokenizer, text_offset));
  return object;
}

void append_logprobs(json& logprobs, const json& more) {
  for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
    json& list = logprobs.at(key);
    for (const json& item : more.at(key)) list.push_back(item);
  }
}

json completion_response(Endpoint endpoint, const ResponseIdentity& identity,
                         const std::string& text, const std::string& finish_reason,
                         const RequestStats& stats, const json& logprobs) {
  json response = response_base(endpoint, identity, false);
  json choice = {{"index", 0}, {"logprobs", logprobs}, {"finish_reason", finish_reason}};
  if (endpoint == Endpoint::kCompletions) {
    choice["text"] = text;
  } else {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  }
  response["choices"] = json::array({std::move(choice)});
  response["usage"] = usage_json(stats);
  response["entropyinfer"] = entropyinfer_stats_json(stats);
  return response;
}

json role_chunk(const ResponseIdentity& identity, bool include_usage) {
  return stream_chunk(Endpoint::kChatCompletions, identity,
                      {{"index", 0},
                       {"delta", {{"role", "assistant"}, {"content", ""}}},
                       {"logprobs", nullptr},
                       {"finish_reason", nullptr}},
                      include_usage);
}

json text_chunk(Endpoint endpoint, const ResponseIdentity& identity, const std::string& text,
                bool include_usage, const json& logprobs) {
  json choice = {{"index", 0}, {"logprobs", logprobs}, {"finish_reason", nullptr}};
  if (endpoint == Endpoint::kCompletions) {
    choice["text"] = text;
  } else {
    choice["delta"] = {{"content", text}};
  }
  return stream_chunk(endpoint, identity, std::move(choice), include_usage);
}

json finish_chunk(Endpoint endpoint, const ResponseIdentity& identity,
                  const std::string& finish_reason, const RequestStats& stats, bool include_usage,
                  const json& logprobs) {
  json choice = {{"index", 0}, {"logprobs", logprobs}, {"finish_reason", finish_reason}};
  if (endpoint == Endpoint::kCompletions) {
    choice["text"] = "";
  } else {
    choice["delta"] = json::object();
  }
  json chunk = stream_chunk(endpoint, identity, std::move(choice), include_usage);
  chunk["entropyinfer"] = entropyinfer_stats_json(stats);
  return chunk;
}

json usage_chunk(Endpoint endpoint, const ResponseIdentity& identity, const RequestStats& stats) {
  json chunk = response_base(endpoint, identity, true);
  chunk["choices"] = json::array();
  chunk["usage"] = usage_json(stats);
  chunk["entropyinfer"] = entropyinfer_stats_json(stats);
  return chunk;
}

json model_object(const std::string& model_id, int64_t created) {
  return {
      {"id", model_id}, {"object", "model"}, {"created", created}, {"owned_by", "entropyinfer"}};
}

json models_list(const std::string& model_id, int64_t created) {
  return {{"object", "list"}, {"data", json::array({model_object(model_id, created)})}};
}

std::string sse_event(const json& payload) { return "data: " + dump_json(payload) + "\n\n"; }

std::string sse_done() { return "data: [DONE]\n\n"; }

std::string dump_json(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace entropyinfer::serve

#include "model/safetensors.h"

#include <algorithm>
#include <bit>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <utility>

#include "core/error.h"
#include "core/json_reader.h"

namespace entropyinfer {
namespace {

using nlohmann::json;

struct DtypeEntry {
  const char* name;
  TensorDtype dtype;
  size_t size;
};

constexpr DtypeEntry kDtypes[] = {
    {"F32", TensorDtype::kF32, 4},
    {"BF16", TensorDtype::kBF16, 2},
    {"F16", TensorDtype::kF16, 2},
    {"F8_E4M3", TensorDtype::kF8E4M3, 1},
};

const DtypeEntry* find_dtype(const std::string& name) {
  for (const DtypeEntry& entry : kDtypes) {
    if (name == entry.name) return &entry;
  }
  return nullptr;
}

const DtypeEntry& entry_of(TensorDtype dtype) {
  for (const DtypeEntry& entry : kDtypes) {
    if (entry.dtype == dtype) return entry;
  }
  return kDtypes[0];
}

// A non-negative integer from the header; a float, a negative number or a string is an error.
bool as_size(const json& value, uint64_t& out) {
  if (!value.is_number_integer()) return false;
  if (value.is_number_unsigned()) {
    out = value.get<uint64_t>();
    return true;
  }
  const int64_t signed_value = value.get<int64_t>();
  if (signed_value < 0) return false;
  out = static_cast<uint64_t>(signed_value);
  return true;
}

// A shard name must stay inside the model folder: an index is data, not a licence to read anywhere.
bool is_safe_shard_name(const std::string& name) {
  if (name.empty()) return false;
  const std::filesystem::path path(name);
  if (path.is_absolute() || path.has_root_name()) return false;
  for (const std::filesystem::path& part : path) {
    if (part == "..") return false;
  }
  return true;
}

}  // namespace

const char* dtype_name(TensorDtype dtype) { return entry_of(dtype).name; }
size_t dtype_size(TensorDtype dtype) { return entry_of(dtype).size; }

std::string shape_to_string(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(shape[i]);
  }
  return text + "]";
}

int64_t SafetensorsTensor::numel() const {
  int64_t count = 1;
  for (int64_t extent : shape) count *= extent;
  return count;
}

std::string SafetensorsTensor::shape_string() const { return shape_to_string(shape); }

SafetensorsLayout parse_safetensors_layout(const uint8_t* bytes, size_t file_size,
                                           const std::string& where) {
  static_assert(std::endian::native == std::endian::little,
                "safetensors data is little-endian and is used in place");
  if (file_size < 8) {
    throw Error(where + " is truncated: " + std::to_string(file_size) +
                " bytes, too short for the 8-byte header length");
  }
  uint64_t header_length = 0;
  for (int i = 7; i >= 0; --i) header_length = (header_length << 8) | bytes[i];
  if (header_length > file_size - 8) {
    throw Error(where + " is truncated or corrupt: its header length (" +
                std::to_string(header_length) + " bytes) runs past the end of the file (" +
                std::to_string(file_size) + " bytes)");
  }
  // The format requires the header to start with '{': no byte-order mark, no leading space.
  if (header_length == 0 || bytes[8] != '{') {
    throw Error(where + " is corrupt: its JSON header does not start with '{'");
  }
  const std::string_view header_text(reinterpret_cast<const char*>(bytes + 8),
                                     static_cast<size_t>(header_length));
  const json header = parse_json(header_text, where + "'s header", {.unique_keys_at_depth = 1});
  if (!header.is_object()) throw Error(where + " has a header that is not a JSON object");

  const size_t data_start = 8 + static_cast<size_t>(header_length);
  const uint64_t data_size = file_size - data_start;
  struct Range {
    uint64_t begin, end;
    size_t tensor;
  };
  std::vector<Range> ranges;
  SafetensorsLayout layout;
  std::vector<SafetensorsTensor>& tensors = layout.tensors;
  tensors.reserve(header.size());

  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) throw Error(where + " has a '__metadata__' that is not an object");
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) {
          throw Error(where + " has metadata '" + key + "' that is not a string");
        }
        layout.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    const std::string tensor_where = where + ", tensor '" + name + "'";
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
        !entry.contains("data_offsets")) {
      throw Error(tensor_where + ": the header entry needs dtype, shape and data_offsets");
    }
    const json& dtype_json = entry.at("dtype");
    if (!dtype_json.is_string()) throw Error(tensor_where + ": dtype is not a string");
    const std::string dtype_text = dtype_json.get<std::string>();
    const DtypeEntry* dtype = find_dtype(dtype_text);
    if (dtype == nullptr) {
      throw Error(tensor_where + " has dtype '" + dtype_text +
                  "', which is not supported (supported: F32, BF16, F16)");
    }

    SafetensorsTensor tensor;
    tensor.name = name;
    tensor.dtype = dtype->dtype;
    const json& shape_json = entry.at("shape");
    if (!shape_json.is_array()) throw Error(tensor_where + ": shape is not a list");
    // Element count with overflow checks: a hostile shape must not wrap around to a small size.
    uint64_t numel = 1;
    for (const json& extent_json : shape_json) {
      uint64_t extent = 0;
      if (!as_size(extent_json, extent) ||
          extent > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        throw Error(tensor_where + " has shape " + shape_json.dump() +
                    ", which is not a list of non-negative integers");
      }
      if (extent != 0 && numel > std::numeric_limits<uint64_t>::max() / extent) {
        throw Error(tensor_where + " has shape " + shape_json.dump() + ", too large to address");
      }
      numel *= extent;
      tensor.shape.push_back(static_cast<int64_t>(extent));
    }
    if (numel > std::numeric_limits<uint64_t>::max() / dtype->size) {
      throw Error(tensor_where + " has shape " + shape_json.dump() + ", too large to address");
    }
    const uint64_t expected_bytes = numel * dtype->size;

    const json& offsets = entry.at("data_offsets");
    uint64_t begin = 0;
    uint64_t end = 0;
    if (!offsets.is_array() || offsets.size() != 2 || !as_size(offsets[0], begin) ||
        !as_size(offsets[1], end)) {
      throw Error(tensor_where + " has data_offsets " + offsets.dump() +
                  ", which are not two non-negative integers");
    }
    if (begin > end || end > data_size) {
      throw Error(tensor_where + " has data_offsets [" + std::to_string(begin) + ", " +
                  std::to_string(end) + "] out of range: the data section holds " +
                  std::to_string(data_size) + " bytes");
    }
    if (end - begin != expected_bytes) {
      throw Error(tensor_where + " (" + dtype->name + " " + tensor.shape_string() + ") needs " +
                  std::to_string(expected_bytes) + " bytes but its data_offsets [" +
                  std::to_string(begin) + ", " + std::to_string(end) + "] span " +
                  std::to_string(end - begin));
    }
    tensor.file_offset = data_start + static_cast<size_t>(begin);
    tensor.byte_size = static_cast<size_t>(expected_bytes);
    ranges.push_back({begin, end, tensors.size()});
    tensors.push_back(std::move(tensor));
  }

  // The data section is exactly the tensors' bytes: two tensors sharing bytes would alias each
  // other, and a byte no tensor covers means the header length or an offset is off (a header one
  // byte short shifts every tensor by one). Empty tensors occupy nothing.
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered_to = 0;
  const Range* previous = nullptr;
  for (const Range& range : ranges) {
    if (range.begin == range.end) continue;
    if (previous != nullptr && range.begin < previous->end) {
      throw Error(where + ": tensors '" + tensors[previous->tensor].name + "' (bytes " +
                  std::to_string(previous->begin) + "-" + std::to_string(previous->end) +
                  ") and '" + tensors[range.tensor].name + "' (bytes " +
                  std::to_string(range.begin) + "-" + std::to_string(range.end) + ") overlap");
    }
    if (range.begin > covered_to) {
      throw Error(where + " is corrupt: data bytes " + std::to_string(covered_to) + "-" +
                  std::to_string(range.begin) + " belong to no tensor (before tensor '" +
                  tensors[range.tensor].name + "')");
    }
    covered_to = range.end;
    previous = &range;
  }
  if (covered_to != data_size) {
    throw Error(where + " is corrupt: data bytes " + std::to_string(covered_to) + "-" +
                std::to_string(data_size) + " at the end of the file belong to no tensor");
  }
  return layout;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : mapping_(path) {
  SafetensorsLayout layout =
      parse_safetensors_layout(mapping_.data(), mapping_.size(), "safetensors file '" + path + "'");
  tensors_ = std::move(layout.tensors);
  metadata_ = std::move(layout.metadata);
  for (size_t i = 0; i < tensors_.size(); ++i) {
    tensors_[i].data = mapping_.data() + tensors_[i].file_offset;
    index_.emplace(tensors_[i].name, i);
  }
}

SafetensorsIndex parse_safetensors_index(std::string_view text, const std::string& where) {
  // Keys at depth 2 are the weight_map's tensor names: one name mapped twice is ambiguous.
  const json index = parse_json(text, where, {.unique_keys_at_depth = 2});
  if (!index.is_object() || !index.contains("weight_map") || !index.at("weight_map").is_object()) {
    throw Error(where + " has no 'weight_map' object");
  }
  SafetensorsIndex result;
  std::unordered_map<std::string, size_t> shard_of_name;
  for (const auto& [tensor_name, shard_json] : index.at("weight_map").items()) {
    if (!shard_json.is_string()) {
      throw Error(where + " maps tensor '" + tensor_name + "' to " + shard_json.dump() +
                  ", not a file name");
    }
    const std::string shard = shard_json.get<std::string>();
    if (!is_safe_shard_name(shard)) {
      throw Error(where + " maps tensor '" + tensor_name + "' to '" + shard +
                  "', which is not a file inside the model folder");
    }
    auto [it, inserted] = shard_of_name.emplace(shard, result.shard_names.size());
    if (inserted) result.shard_names.push_back(shard);
    result.entries.emplace_back(tensor_name, it->second);
  }
  if (result.entries.empty()) throw Error(where + " has an empty 'weight_map'");
  return result;
}

const SafetensorsTensor* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace entropyinfer

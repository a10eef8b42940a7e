// A reader for the safetensors format: an 8-byte little-endian header length, a JSON header that
// maps each tensor name to {dtype, shape, data_offsets} (plus an optional "__metadata__" map of
// strings), then the tensor bytes. The file is memory-mapped and every header entry is checked
// against the file before any tensor is handed out, so a corrupt or hostile file ends in an Error,
// never a bad read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/half.h"
#include "core/mapped_file.h"

namespace entropyinfer {

// The safetensors name of an element type ("F32", "BF16", "F16", "F8_E4M3"); any other dtype in a
// header is rejected by name.
const char* dtype_name(TensorDtype dtype);
size_t dtype_size(TensorDtype dtype);

struct SafetensorsTensor {
  std::string name;
  TensorDtype dtype = TensorDtype::kF32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // into the mapping; valid while the mapping lives
  size_t byte_size = 0;
  size_t file_offset = 0;  // of the first byte, from the start of the file

  int64_t numel() const;
  std::string shape_string() const;  // e.g. "[4096, 11008]"
};

// What a safetensors header says, checked against the file's size: tensors sorted by name, with
// file_offset set and data left null.
struct SafetensorsLayout {
  std::vector<SafetensorsTensor> tensors;
  std::map<std::string, std::string> metadata;
};

// Validates the whole file layout from its bytes (header length, JSON header, every entry, and
// that the tensors tile the data section exactly); throws Error naming `where`.
SafetensorsLayout parse_safetensors_layout(const uint8_t* bytes, size_t size,
                                           const std::string& where);

// model.safetensors.index.json: which shard holds each tensor.
struct SafetensorsIndex {
  std::vector<std::string> shard_names;                 // each once, in order of first use
  std::vector<std::pair<std::string, size_t>> entries;  // tensor name, index into shard_names
};

// Parses and checks an index (a weight_map of tensor names to shard file names inside the model
// folder); throws Error naming `where`.
SafetensorsIndex parse_safetensors_index(std::string_view text, const std::string& where);

class SafetensorsFile {
 public:
  // Maps and validates `path`; throws Error naming the file (and the tensor, where one is at
  // fault).
  explicit SafetensorsFile(const std::string& path);

  const std::string& path() const { return mapping_.path(); }
  // Sorted by name.
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  // nullptr when the file has no tensor of that name.
  const SafetensorsTensor* find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  const MappedFile& mapping() const { return mapping_; }
  // Hands the mapping to a new owner; tensor data pointers stay valid for as long as it lives (a
  // moved mapping keeps its address).
  MappedFile take_mapping() { return std::move(mapping_); }

 private:
  MappedFile mapping_;
  std::vector<SafetensorsTensor> tensors_;
  std::unordered_map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

std::string shape_to_string(const std::vector<int64_t>& shape);

}  // namespace entropyinfer

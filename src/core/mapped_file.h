// A read-only memory map of a whole file. Checkpoints are mapped, not read, so that fp32 weights
// are used in place and loading a large model costs no copy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace entropyinfer {

class MappedFile {
 public:
  // Throws Error naming the path when it is missing, unreadable or not a regular file.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace entropyinfer

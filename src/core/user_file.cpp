#include "core/user_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>

#include "core/error.h"

namespace entropyinfer {
namespace {

namespace fs = std::filesystem;

std::string quoted(std::string_view what, const std::string& path) {
  return std::string(what) + " '" + path + "'";
}

const char* kind_of(mode_t mode) {
  if (S_ISREG(mode)) return "a file";
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  return "neither a file nor a folder";
}

class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

std::string folder_of(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

}  // namespace

bool is_regular_file(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode);
}

void check_regular_file(const std::string& path, std::string_view what) {
  if (path.empty()) throw Error(std::string(what) + ": the path is empty");
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) {
    throw Error("cannot read " + quoted(what, path) + ": " + std::strerror(errno));
  }
  if (!S_ISREG(info.st_mode)) {
    throw Error(quoted(what, path) + " is " + kind_of(info.st_mode) + ", not a regular file");
  }
}

std::string read_user_file(const std::string& path, std::string_view what, uint64_t max_bytes) {
  check_regular_file(path, what);
  struct stat info {};
  // O_NONBLOCK: should the path be swapped for a FIFO after the check, open() still returns.
  FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (fd.get() < 0) throw Error("cannot open " + quoted(what, path) + ": " + std::strerror(errno));
  if (::fstat(fd.get(), &info) != 0 || !S_ISREG(info.st_mode)) {
    throw Error(quoted(what, path) + " is not a regular file");
  }
  if (static_cast<uint64_t>(info.st_size) > max_bytes) {
    throw Error(quoted(what, path) + " is " + std::to_string(info.st_size) +
                " bytes, more than the " + std::to_string(max_bytes) + " this tool reads");
  }
  // The size is a hint: files under /proc report 0 and may grow, so the read is bounded itself.
  std::string content;
  content.reserve(static_cast<size_t>(info.st_size));
  char buffer[1 << 16];
  for (;;) {
    const ssize_t got = ::read(fd.get(), buffer, sizeof buffer);
    if (got < 0) {
      if (errno == EINTR) continue;
      throw Error("cannot read " + quoted(what, path) + ": " + std::strerror(errno));
    }
    if (got == 0) break;
    if (content.size() + static_cast<size_t>(got) > max_bytes) {
      throw Error(quoted(what, path) + " is larger than the " + std::to_string(max_bytes) +
                  " bytes this tool reads");
    }
    content.append(buffer, static_cast<size_t>(got));
  }
  return content;
}

void check_output_file(const std::string& path, std::string_view what) {
  if (path.empty()) throw Error(std::string(what) + ": the path is empty");
  struct stat info {};
  if (::stat(path.c_str(), &info) == 0 && !S_ISREG(info.st_mode)) {
    throw Error("cannot write " + quoted(what, path) + ": it is " + kind_of(info.st_mode));
  }
  const std::string folder = folder_of(path);
  if (::stat(folder.c_str(), &info) != 0) {
    throw Error("cannot write " + quoted(what, path) + ": folder '" + folder + "' " +
                (errno == ENOENT ? "does not exist" : std::strerror(errno)));
  }
  if (!S_ISDIR(info.st_mode)) {
    throw Error("cannot write " + quoted(what, path) + ": '" + folder + "' is not a folder");
  }
}

void write_user_file(const std::string& path, std::string_view what, std::string_view content) {
  check_output_file(path, what);
  const std::string temporary = path + ".partial";
  std::FILE* file = std::fopen(temporary.c_str(), "wb");
  if (file == nullptr) {
    throw Error("cannot write " + quoted(what, path) + ": " + std::strerror(errno));
  }
  const bool written = std::fwrite(content.data(), 1, content.size(), file) == content.size();
  const int saved = errno;
  const bool closed = std::fclose(file) == 0;
  if (!written || !closed) {
    std::remove(temporary.c_str());
    throw Error("cannot write " + quoted(what, path) + ": " +
                std::strerror(written ? errno : saved));
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    const int rename_error = errno;
    std::remove(temporary.c_str());
    throw Error("cannot write " + quoted(what, path) + ": " + std::strerror(rename_error));
  }
}

void prepare_output_folder(const std::string& path, std::string_view what) {
  if (path.empty()) throw Error(std::string(what) + ": the path is empty");
  struct stat info {};
  if (::stat(path.c_str(), &info) == 0) {
    if (!S_ISDIR(info.st_mode)) {
      throw Error(quoted(what, path) + " is " + kind_of(info.st_mode) + ", not a folder");
    }
    if (::access(path.c_str(), W_OK) != 0) {
      throw Error("cannot write into " + quoted(what, path) + ": " + std::strerror(errno));
    }
    return;
  }
  std::error_code error;
  fs::create_directories(path, error);
  if (error) throw Error("cannot create " + quoted(what, path) + ": " + error.message());
}

}  // namespace entropyinfer

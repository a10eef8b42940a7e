// Files a user names: prompts, tokenizers, configs, result files. Every path the tool reads or
// writes on a user's behalf goes through here, so that folders, devices, FIFOs and unbounded files
// end in one Error naming the path, never a hang, an endless read or an exception from the
// standard library.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace entropyinfer {

// Text and binary files the tool reads whole are bounded; checkpoints are mapped, not read.
inline constexpr uint64_t kMaxUserFileBytes = uint64_t{1} << 30;

// The whole content of a regular file. `what` names the file's role in messages ("prompt file").
// Refuses folders, devices, FIFOs and sockets before opening them for reading (a FIFO would block),
// and files larger than `max_bytes`.
std::string read_user_file(const std::string& path, std::string_view what,
                           uint64_t max_bytes = kMaxUserFileBytes);

// Throws the Error read_user_file would for a path that is missing or not a regular file; for
// callers that pick a reader by looking at the file first.
void check_regular_file(const std::string& path, std::string_view what);

// Whether `path` names an existing regular file (symlinks followed); never throws.
bool is_regular_file(const std::string& path);

// Writes `content` to `path`, replacing a regular file there. Refuses a path that is a folder or
// whose folder does not exist, and reports a failed write; what was there stays until the new
// content is complete (it is written beside and renamed over).
void write_user_file(const std::string& path, std::string_view what, std::string_view content);

// Makes sure `path` is a folder that output can go into, creating it (and its parents) when
// missing; refuses an existing file at that path before any work is done.
void prepare_output_folder(const std::string& path, std::string_view what);

// Checks, before long work starts, that write_user_file(path, ...) can succeed: the folder exists
// and `path` is not a folder.
void check_output_file(const std::string& path, std::string_view what);

}  // namespace entropyinfer

// One exception type for every error a user can cause (bad paths, corrupt files, nonsense options).
// The command-line tool catches it, prints the message once and exits non-zero.
#pragma once

#include <stdexcept>
#include <string>

namespace entropyinfer {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace entropyinfer

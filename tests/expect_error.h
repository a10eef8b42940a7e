// One expectation for "this is refused with one clear error": the action must throw Error, and the
// message must name every given part (the file, the option, the number that was wrong).
#pragma once

#include <gtest/gtest.h>

#include <initializer_list>
#include <string>
#include <string_view>

#include "core/error.h"

namespace entropyinfer::testing {

// `refused` describes what should not have gone through, for the failure message.
template <typename Action>
void expect_error_naming(Action&& action, std::initializer_list<std::string_view> parts,
                         std::string_view refused) {
  try {
    action();
  } catch (const Error& error) {
    const std::string message = error.what();
    for (std::string_view part : parts) {
      EXPECT_NE(message.find(part), std::string::npos)
          << "'" << part << "' is not named in: " << message;
    }
    return;
  }
  ADD_FAILURE() << "no Error: " << refused;
}

}  // namespace entropyinfer::testing

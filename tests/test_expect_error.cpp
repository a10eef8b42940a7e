// The shared "refused with one clear error" expectation fails when it should: no error, another
// exception type, or a message that does not name what it must.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <stdexcept>

#include "expect_error.h"

namespace entropyinfer {
namespace {

TEST(ExpectErrorNaming, PassesOnAnErrorNamingEveryPart) {
  testing::expect_error_naming([] { throw Error("--chunk must be >= 1, not 0"); }, {"--chunk", "0"},
                               "a zero chunk");
}

TEST(ExpectErrorNaming, FailsWhenNothingIsThrown) {
  EXPECT_NONFATAL_FAILURE(testing::expect_error_naming([] {}, {"x"}, "a silent action"),
                          "no Error: a silent action");
}

TEST(ExpectErrorNaming, FailsWhenThePartIsNotNamed) {
  EXPECT_NONFATAL_FAILURE(
      testing::expect_error_naming([] { throw Error("bad input"); }, {"prompt.txt"}, "a file"),
      "'prompt.txt' is not named in: bad input");
}

TEST(ExpectErrorNaming, LetsOtherExceptionsThrough) {
  EXPECT_THROW(
      testing::expect_error_naming([] { throw std::runtime_error("not ours"); }, {"x"}, "x"),
      std::runtime_error);
}

}  // namespace
}  // namespace entropyinfer

// libFuzzer entry for fuzz_openai_request (see fuzz_inputs.cpp).
#include <cstddef>
#include <cstdint>

#include "fuzz_inputs.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  entropyinfer::fuzz::fuzz_openai_request(data, size);
  return 0;
}

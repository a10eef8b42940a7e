// libFuzzer entry for fuzz_llama2c_checkpoint (see fuzz_inputs.cpp).
#include <cstddef>
#include <cstdint>

#include "fuzz_inputs.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  entropyinfer::fuzz::fuzz_llama2c_checkpoint(data, size);
  return 0;
}

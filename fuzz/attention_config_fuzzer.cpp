// libFuzzer entry for fuzz_attention_config (see fuzz_inputs.cpp).
#include <cstddef>
#include <cstdint>

#include "fuzz_inputs.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  entropyinfer::fuzz::fuzz_attention_config(data, size);
  return 0;
}

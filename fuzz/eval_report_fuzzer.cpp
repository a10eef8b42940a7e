// libFuzzer entry for fuzz_eval_report (see fuzz_inputs.cpp).
#include <cstddef>
#include <cstdint>

#include "fuzz_inputs.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  entropyinfer::fuzz::fuzz_eval_report(data, size);
  return 0;
}

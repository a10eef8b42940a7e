# libFuzzer targets for the parsers of untrusted input, included from the top-level CMakeLists.txt
# when ENTROPYINFER_FUZZ is ON (scripts/fuzz.sh configures such a build and runs them).
if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "ENTROPYINFER_FUZZ needs clang for libFuzzer (this is "
    "${CMAKE_CXX_COMPILER_ID}): configure a fresh build folder with CC=clang CXX=clang++")
endif()

# The core sources behind the fuzzed parsers, built again with coverage instrumentation, ASan and
# UBSan (the evaluation report's reader and the task code it hashes with among them); the engine
# and backends would only add build time.
set(ENTROPYINFER_FUZZ_CORE_SOURCES ${ENTROPYINFER_CORE_SOURCES})
list(FILTER ENTROPYINFER_FUZZ_CORE_SOURCES INCLUDE REGEX
  "/src/(core/|tokenizer/|model/(safetensors|model_config|model_weights|llama2c_loader)|attention/attention_config|serve/openai_protocol|eval/(eval_report|ruler_tasks))")
# Every undefined-behaviour report aborts, so that libFuzzer counts it as a crash.
set(ENTROPYINFER_FUZZ_SANITIZERS -fsanitize=address,undefined -fno-sanitize-recover=all
  -fno-omit-frame-pointer)
add_library(entropyinfer_fuzz_core STATIC ${ENTROPYINFER_FUZZ_CORE_SOURCES} fuzz/fuzz_inputs.cpp)
target_include_directories(entropyinfer_fuzz_core PUBLIC src)
target_compile_options(entropyinfer_fuzz_core PRIVATE ${ENTROPYINFER_WARNINGS}
  -fsanitize=fuzzer-no-link PUBLIC ${ENTROPYINFER_FUZZ_SANITIZERS})
target_link_libraries(entropyinfer_fuzz_core PUBLIC nlohmann_json::nlohmann_json)

set(ENTROPYINFER_FUZZ_TARGETS safetensors_header safetensors_index config_json tokenizer_json
  sentencepiece_model tiktoken llama2c_checkpoint llama2c_tokenizer attention_config openai_request eval_report)
add_custom_target(entropyinfer_fuzzers)
foreach(target IN LISTS ENTROPYINFER_FUZZ_TARGETS)
  add_executable(${target}_fuzzer fuzz/${target}_fuzzer.cpp)
  target_compile_options(${target}_fuzzer PRIVATE ${ENTROPYINFER_WARNINGS} -fsanitize=fuzzer)
  target_link_options(${target}_fuzzer PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(${target}_fuzzer PRIVATE entropyinfer_fuzz_core)
  add_dependencies(entropyinfer_fuzzers ${target}_fuzzer)
endforeach()

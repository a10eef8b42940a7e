# The CUDA backend, included from the top-level CMakeLists.txt when ENTROPYINFER_CUDA is ON: the
# entropyinfer_cuda library (src/backends/cuda/*.cu), the GPU tests (tests/gpu, their own executable:
# every test skips when no GPU is present) and the GPU benchmarks (bench/gpu).
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  # Hopper with its architecture-specific instructions (wgmma); other targets get the mma.sync kernels.
  set(CMAKE_CUDA_ARCHITECTURES 90a)
endif()
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)
# The CUDA sources are C++20 like the rest; CMake before 3.26 does not know nvcc's flag for it.
if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
endif()
set(CMAKE_CUDA_STANDARD 20)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
set(CMAKE_CUDA_EXTENSIONS OFF)

file(GLOB ENTROPYINFER_CUDA_SOURCES CONFIGURE_DEPENDS src/backends/cuda/*.cu src/engine/cuda/*.cu)
add_library(entropyinfer_cuda STATIC ${ENTROPYINFER_CUDA_SOURCES})
target_include_directories(entropyinfer_cuda PUBLIC src)
# cuBLASLt is opened at run time (cublaslt_library.cu), not linked: its headers come with cudart's.
target_link_libraries(entropyinfer_cuda PUBLIC entropyinfer_core CUDA::cudart ${CMAKE_DL_LIBS})
# The directory-wide options are host-compiler flags (the sanitizers' among them) that nvcc would
# reject; this target gets its own, with the sanitizers passed through to the host compiler.
set_property(TARGET entropyinfer_cuda PROPERTY COMPILE_OPTIONS "")
if(ENTROPYINFER_SANITIZE)
  target_compile_options(entropyinfer_cuda PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-fsanitize=address,-fsanitize=undefined,-fno-omit-frame-pointer>)
endif()
target_compile_options(entropyinfer_cuda PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:-lineinfo --expt-relaxed-constexpr
  -Xcompiler=-Wall,-Wextra,-Wno-unused-parameter>)
if(CMAKE_CUDA_ARCHITECTURES MATCHES "90a")
  target_compile_definitions(entropyinfer_cuda PRIVATE ENTROPYINFER_HAS_SM90A)
endif()

if(ENTROPYINFER_BUILD_TESTS)
  file(GLOB ENTROPYINFER_GPU_TEST_SOURCES CONFIGURE_DEPENDS tests/gpu/*.cpp)
  add_executable(entropyinfer_gpu_tests ${ENTROPYINFER_GPU_TEST_SOURCES}
    ${ENTROPYINFER_DEVICE_TEST_SOURCES})
  target_include_directories(entropyinfer_gpu_tests PRIVATE tests)
  target_compile_options(entropyinfer_gpu_tests PRIVATE ${ENTROPYINFER_WARNINGS})
  target_link_libraries(entropyinfer_gpu_tests PRIVATE entropyinfer_cuda GTest::gtest GTest::gtest_main)
  # The parity-fixture test reads tests/fixtures/parity in place.
  target_compile_definitions(entropyinfer_gpu_tests PRIVATE
    ENTROPYINFER_FIXTURES_DIR="${CMAKE_CURRENT_SOURCE_DIR}/tests/fixtures"
    ENTROPYINFER_TEST_DEVICE="cuda")
  # Listed when ctest runs rather than after the build, so that building needs no GPU and no driver.
  gtest_discover_tests(entropyinfer_gpu_tests DISCOVERY_MODE PRE_TEST DISCOVERY_TIMEOUT 60
    PROPERTIES TIMEOUT 1200 LABELS gpu)
endif()

file(GLOB ENTROPYINFER_GPU_BENCH_SOURCES CONFIGURE_DEPENDS bench/gpu/*.cpp)
add_executable(entropyinfer_gpu_bench ${ENTROPYINFER_GPU_BENCH_SOURCES})
target_compile_options(entropyinfer_gpu_bench PRIVATE ${ENTROPYINFER_WARNINGS})
target_link_libraries(entropyinfer_gpu_bench PRIVATE entropyinfer_cuda nlohmann_json::nlohmann_json)
# The serving benchmark drives the scheduler, which names executors through the engine library.
target_link_libraries(entropyinfer_gpu_bench PRIVATE entropyinfer_engine)
# --kernel-trace loads CUPTI at run time (bench/gpu/kernel_trace.cpp).
target_link_libraries(entropyinfer_gpu_bench PRIVATE ${CMAKE_DL_LIBS})

# The command-line tool runs on the GPU too (`entropyinfer bench --device cuda`).
target_link_libraries(entropyinfer PRIVATE entropyinfer_cuda)
target_compile_definitions(entropyinfer PRIVATE ENTROPYINFER_WITH_CUDA)

# The CUDA-only sources (HT_CUDA_SOURCES: the CUDA arena, CUDA-event timing; NCCL's branch on
# ATen's stream) are built only where libtorch has CUDA, the GPU machine. Where it has none but
# ships its CUDA headers (Debian's libtorch-dev does) and the CUDA toolkit is found (CI), they
# are compiled anyway and not linked, so a mistake against libtorch's CUDA API or CUDA's runtime
# API fails CI, not the GPU session.
# What is guarded by libtorch's version (base/compat.h: the pluggable allocator of 2.x) is
# compiled on the GPU machine only. Debian leaves out one generated header, which
# cmake/cuda_api_check/ stands in for (after libtorch's own folders, so a real one wins).
if(HT_TORCH_CUDA OR NOT CUDAToolkit_FOUND)
  return()
endif()
find_file(HT_C10_CUDA_HEADER c10/cuda/CUDACachingAllocator.h PATHS ${TORCH_INCLUDE_DIRS} NO_DEFAULT_PATH)
if(NOT HT_C10_CUDA_HEADER)
  message(STATUS "hybrid_train: libtorch ships no CUDA headers: the CUDA sources are not checked here")
  return()
endif()
message(STATUS "hybrid_train: the CUDA sources are compiled against ${HT_C10_CUDA_HEADER} (not linked)")
set(_ht_checked ${HT_CUDA_SOURCES})
if(HT_NCCL_INCLUDE)  # its ATen-stream branch (HT_TORCH_CUDA)
  list(APPEND _ht_checked ${PROJECT_SOURCE_DIR}/parallel/cuda_side_stream.cpp ${PROJECT_SOURCE_DIR}/parallel/nccl_communicator.cpp)
endif()
add_library(ht_cuda_api_check OBJECT ${_ht_checked})
target_compile_options(ht_cuda_api_check PRIVATE -Wall -Wextra -Wno-unused-parameter -Werror)
separate_arguments(_ht_check_flags UNIX_COMMAND "${TORCH_CXX_FLAGS}")
target_compile_options(ht_cuda_api_check PRIVATE ${_ht_check_flags})
target_compile_definitions(ht_cuda_api_check PRIVATE HT_TORCH_CUDA)
target_include_directories(ht_cuda_api_check PRIVATE ${PROJECT_SOURCE_DIR} ${TORCH_INCLUDE_DIRS}
                           ${CUDAToolkit_INCLUDE_DIRS} ${HT_NCCL_INCLUDE} ${PROJECT_SOURCE_DIR}/cmake/cuda_api_check)

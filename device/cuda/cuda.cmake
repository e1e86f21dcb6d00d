# The CUDA backend, compiled into paradev_device when PARADEV_HAVE_CUDA is set
# (included from the root CMakeLists.txt after paradev_device is defined).
#
# Host code is C11 (backend.c, device.c, fence.c, memory.c, collective.c and
# coll_*.c, matmul.c, fused_matmul.c (cuBLASLt), graph.c, register.c); kernels are
# CUDA C++ in a few kernels_*.cu files (kernels_split.cu: Split, SplitV,
# Unpack, Pack). No separable compilation: every .cu is
# self-contained, so no device link step is needed and executables link with
# the C compiler.
set(PARADEV_CUDA_DIR ${CMAKE_SOURCE_DIR}/device/cuda)
target_sources(paradev_device PRIVATE
  ${PARADEV_CUDA_DIR}/backend.c
  ${PARADEV_CUDA_DIR}/device.c
  ${PARADEV_CUDA_DIR}/fence.c
  ${PARADEV_CUDA_DIR}/memory.c
  ${PARADEV_CUDA_DIR}/collective.c
  ${PARADEV_CUDA_DIR}/coll_common.c
  ${PARADEV_CUDA_DIR}/coll_copy.c
  ${PARADEV_CUDA_DIR}/coll_nccl.c
  ${PARADEV_CUDA_DIR}/matmul.c
  ${PARADEV_CUDA_DIR}/fused_matmul.c
  ${PARADEV_CUDA_DIR}/graph.c
  ${PARADEV_CUDA_DIR}/register.c
  ${PARADEV_CUDA_DIR}/kernels_elementwise.cu
  ${PARADEV_CUDA_DIR}/kernels_reduce.cu
  ${PARADEV_CUDA_DIR}/kernels_array.cu
  ${PARADEV_CUDA_DIR}/kernels_fused.cu
  ${PARADEV_CUDA_DIR}/kernels_split.cu)
target_compile_definitions(paradev_device PUBLIC PARADEV_HAVE_CUDA=1)
target_link_libraries(paradev_device PUBLIC ${PARADEV_CUDART} CUDA::cublas CUDA::cublasLt)
if(PARADEV_HAVE_NCCL)
  target_compile_definitions(paradev_device PRIVATE PARADEV_HAVE_NCCL=1)
  target_link_libraries(paradev_device PUBLIC NCCL::nccl)
endif()

# nvcc: host warnings through -Xcompiler, nvcc's own diagnostics as errors in
# CI (PARADEV_WERROR). IEEE division and square roots (nvcc's defaults) are
# relied on for CPU/GPU agreement: never add --use_fast_math here.
set(_cu_host_warn -Wall,-Wextra,-Wno-unused-parameter)
target_compile_options(paradev_device PRIVATE
  "$<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=${_cu_host_warn};--expt-relaxed-constexpr>")
if(PARADEV_WERROR)
  target_compile_options(paradev_device PRIVATE
    "$<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings;-Xcompiler=-Werror>")
endif()
unset(_cu_host_warn)

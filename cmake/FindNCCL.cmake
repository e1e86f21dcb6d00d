# FindNCCL: NCCL, NVIDIA's collective communication library.
#
# NCCL ships a CMake package only in recent releases, and the CUDA toolkit's
# copy (/usr/local/cuda/{include,lib64}) has none; this module finds the header
# and the shared library wherever they are.
#
# Hints: NCCL_ROOT (CMake variable or environment), NCCL_HOME, CUDAToolkit_ROOT
# and the toolkit found by find_package(CUDAToolkit).
#
# Result variables:
#   NCCL_FOUND, NCCL_INCLUDE_DIR, NCCL_LIBRARY, NCCL_VERSION (MAJOR.MINOR.PATCH)
# Imported target:
#   NCCL::nccl
include(FindPackageHandleStandardArgs)

set(_nccl_hints ${NCCL_ROOT} $ENV{NCCL_ROOT} $ENV{NCCL_HOME} ${CUDAToolkit_ROOT}
    $ENV{CUDA_HOME} /usr/local/cuda)
if(CUDAToolkit_INCLUDE_DIRS)
  list(APPEND _nccl_hints ${CUDAToolkit_INCLUDE_DIRS}/..)
endif()

find_path(NCCL_INCLUDE_DIR nccl.h
          HINTS ${_nccl_hints} ${CUDAToolkit_INCLUDE_DIRS}
          PATH_SUFFIXES include)
find_library(NCCL_LIBRARY NAMES nccl
             HINTS ${_nccl_hints} ${CUDAToolkit_LIBRARY_DIR}
             PATH_SUFFIXES lib64 lib lib/x86_64-linux-gnu lib/aarch64-linux-gnu)

if(NCCL_INCLUDE_DIR AND EXISTS ${NCCL_INCLUDE_DIR}/nccl.h)
  file(STRINGS ${NCCL_INCLUDE_DIR}/nccl.h _nccl_defs
       REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) +[0-9]+")
  foreach(part MAJOR MINOR PATCH)
    string(REGEX REPLACE ".*NCCL_${part} +([0-9]+).*" "\\1" _nccl_${part}
           "${_nccl_defs}")
  endforeach()
  if(_nccl_MAJOR MATCHES "^[0-9]+$" AND _nccl_MINOR MATCHES "^[0-9]+$")
    set(NCCL_VERSION "${_nccl_MAJOR}.${_nccl_MINOR}.${_nccl_PATCH}")
  endif()
endif()

find_package_handle_standard_args(NCCL
  REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR
  VERSION_VAR NCCL_VERSION)

if(NCCL_FOUND AND NOT TARGET NCCL::nccl)
  add_library(NCCL::nccl UNKNOWN IMPORTED)
  set_target_properties(NCCL::nccl PROPERTIES
    IMPORTED_LOCATION ${NCCL_LIBRARY}
    INTERFACE_INCLUDE_DIRECTORIES ${NCCL_INCLUDE_DIR})
endif()
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
unset(_nccl_hints)
unset(_nccl_defs)

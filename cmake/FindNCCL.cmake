# FindNCCL: NCCL, NVIDIA's collective communication library.
#
# NCCL ships a CMake package only in recent releases, and the CUDA toolkit's
# copy (/usr/local/cuda/{include,lib64}) has none; this module finds the header
# and the shared library wherever they are.
#
# Hints: NCCL_ROOT (CMake variable or environment), NCCL_HOME, CUDAToolkit_ROOT
# and the toolkit found by find_package(CUDAToolkit). When none of those holds
# it, the python3 on PATH is asked for its site-packages, where pip's
# nvidia-nccl-cu* wheels put nvidia/nccl/{include,lib} (the library there is
# only libnccl.so.2, without the libnccl.so link).
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

set(_nccl_suffixes lib64 lib lib/x86_64-linux-gnu lib/aarch64-linux-gnu)
find_path(NCCL_INCLUDE_DIR nccl.h
          HINTS ${_nccl_hints} ${CUDAToolkit_INCLUDE_DIRS}
          PATH_SUFFIXES include)
find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2
             HINTS ${_nccl_hints} ${CUDAToolkit_LIBRARY_DIR}
             PATH_SUFFIXES ${_nccl_suffixes})

# pip's wheels (nvidia-nccl-cu12, -cu13): site-packages/nvidia/nccl.
if(NOT NCCL_INCLUDE_DIR OR NOT NCCL_LIBRARY)
  find_program(NCCL_PYTHON3 NAMES python3)
  mark_as_advanced(NCCL_PYTHON3)
  if(NCCL_PYTHON3)
    execute_process(
      COMMAND ${NCCL_PYTHON3} -c
        "import site, sysconfig; print(';'.join(site.getsitepackages() + [sysconfig.get_paths()['purelib']]))"
      OUTPUT_VARIABLE _nccl_sites OUTPUT_STRIP_TRAILING_WHITESPACE
      ERROR_QUIET TIMEOUT 20)
    set(_nccl_pip_hints)
    foreach(_site ${_nccl_sites})
      list(APPEND _nccl_pip_hints ${_site}/nvidia/nccl)
    endforeach()
    if(_nccl_pip_hints)
      find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_nccl_pip_hints} PATH_SUFFIXES include
                NO_DEFAULT_PATH)
      find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${_nccl_pip_hints}
                   PATH_SUFFIXES ${_nccl_suffixes} NO_DEFAULT_PATH)
    endif()
    unset(_nccl_sites)
    unset(_nccl_pip_hints)
    unset(_site)
  endif()
endif()

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
unset(_nccl_suffixes)
unset(_nccl_defs)

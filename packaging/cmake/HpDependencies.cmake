# Finds every third-party dependency. Each is a Debian package; when one is missing we stop with the
# package name so `packaging/install-deps.sh` (or apt-get) can fix it.
include_guard(GLOBAL)

macro(hp_require_package pkg debian)
  find_package(${pkg} ${ARGN} QUIET)
  if(NOT ${pkg}_FOUND)
    message(FATAL_ERROR "hp: dependency '${pkg}' not found; install the Debian package '${debian}' "
                        "(or run packaging/install-deps.sh)")
  endif()
endmacro()

hp_require_package(fmt libfmt-dev)
hp_require_package(CLI11 libcli11-dev)
hp_require_package(tomlplusplus libtomlplusplus-dev)
hp_require_package(nlohmann_json nlohmann-json3-dev)
hp_require_package(Protobuf libprotobuf-dev)
hp_require_package(ONNX libonnx-dev)
hp_require_package(dnnl libdnnl-dev)
hp_require_package(MPI libopenmpi-dev)
if(HP_BUILD_TESTS)
  hp_require_package(Catch2 catch2 2)
endif()
find_package(Threads REQUIRED)

# The CUDA plugin resolves cudart/cuBLAS at run time (dlopen), so the build needs only the
# toolkit's headers and nvcc for the kernels.
set(HP_HAVE_CUDA 0)
if(NOT HP_WITH_CUDA STREQUAL "OFF")
  find_package(CUDAToolkit QUIET)
  include(CheckLanguage)
  check_language(CUDA)
  if(CUDAToolkit_FOUND AND CMAKE_CUDA_COMPILER)
    set(HP_HAVE_CUDA 1)
  elseif(HP_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "hp: HP_WITH_CUDA=ON but no CUDA toolkit (nvcc + headers) was found; "
                        "install nvidia-cuda-toolkit or set HP_WITH_CUDA=AUTO")
  endif()
endif()
message(STATUS "hp: CUDA plugin ${HP_HAVE_CUDA} (HP_WITH_CUDA=${HP_WITH_CUDA})")

# One helper per target kind, so every library, plugin and test is declared the same way.
include_guard(GLOBAL)

set(HP_WARNINGS -Wall -Wextra -Wno-unused-parameter)
if(HP_WERROR)
  list(APPEND HP_WARNINGS -Werror)
endif()
# UBSan's null and alignment checks are left out: they instrument every dereference and took a third
# of the sanitized build's compile time (libs/train/src/data_parallel.cpp at -O1: 20.3 s with them,
# 13.6 s without, 6.7 s unsanitized), which CI's time limit cannot spare. A null dereference still
# stops the run (AddressSanitizer reports the SEGV with its stack); hp's typed views of byte buffers
# point into std::vector/new storage, aligned for every element type, and the nonnull-attribute
# check (null buffers handed to memcpy and friends) stays on.
if(HP_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-sanitize=null,alignment
                      -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
endif()
# ThreadSanitizer (a separate build: it cannot be combined with AddressSanitizer). CI builds hp and
# the plugins with it and repeats simulated runs, whose ranks are threads of one process.
if(HP_TSAN)
  add_compile_options(-fsanitize=thread -fno-omit-frame-pointer)
  add_link_options(-fsanitize=thread)
endif()
# The libFuzzer target (tests/fuzz, clang only): every library it runs is compiled with libFuzzer's
# coverage instrumentation, so the fuzzer is guided by hp's own branches (the loader, shape
# inference, the summary), not only by the driver's.
option(HP_FUZZ_LIBFUZZER "build the libFuzzer target hp_fuzz_model_libfuzzer (clang)" OFF)
if(HP_FUZZ_LIBFUZZER AND CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  add_compile_options(-fsanitize=fuzzer-no-link)
endif()

# hp_add_library(name SOURCES... DEPS...): libs/<name> with include/ public and src/ private.
function(hp_add_library name)
  cmake_parse_arguments(A "" "" "SOURCES;DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(hp_${name} STATIC ${A_SOURCES})
  add_library(hp::${name} ALIAS hp_${name})
  target_include_directories(hp_${name} PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/include
                                        PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src)
  target_link_libraries(hp_${name} PUBLIC ${A_DEPS} PRIVATE ${A_PRIVATE_DEPS})
  target_compile_options(hp_${name} PRIVATE ${HP_WARNINGS})
endfunction()

# hp_add_plugin(name SOURCES...): a MODULE library libhp-backend-<name>.so exporting only the entry
# symbols (version script), placed in the build-tree plugin dir and installed to lib/hp/plugins.
function(hp_add_plugin name)
  cmake_parse_arguments(A "" "" "SOURCES;DEPS" ${ARGN})
  add_library(hp_plugin_${name} MODULE ${A_SOURCES})
  set_target_properties(hp_plugin_${name} PROPERTIES
    PREFIX "" OUTPUT_NAME "libhp-backend-${name}"
    LIBRARY_OUTPUT_DIRECTORY ${HP_BUILD_PLUGIN_DIR}
    CXX_VISIBILITY_PRESET hidden C_VISIBILITY_PRESET hidden)
  target_link_libraries(hp_plugin_${name} PRIVATE hp::plugin_abi ${A_DEPS})
  target_compile_options(hp_plugin_${name} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${HP_WARNINGS}>)
  target_link_options(hp_plugin_${name} PRIVATE
    -Wl,--version-script=${PROJECT_SOURCE_DIR}/plugins/exports.map -Wl,--no-undefined)
  install(TARGETS hp_plugin_${name} LIBRARY DESTINATION ${HP_INSTALL_PLUGIN_DIR})
endfunction()

# hp_add_test(file LIBS... LABELS...): one Catch2 executable per test file, registered with CTest.
function(hp_add_test file)
  cmake_parse_arguments(A "" "" "LIBS;LABELS" ${ARGN})
  get_filename_component(stem ${file} NAME_WE)
  set(target test_${stem})
  add_executable(${target} ${file})
  target_link_libraries(${target} PRIVATE hp_catch_main ${A_LIBS})
  target_compile_options(${target} PRIVATE ${HP_WARNINGS})
  target_compile_definitions(${target} PRIVATE
    HP_SOURCE_DIR="${PROJECT_SOURCE_DIR}" HP_BINARY_DIR="${PROJECT_BINARY_DIR}"
    HP_BUILD_PLUGIN_DIR="${HP_BUILD_PLUGIN_DIR}")
  add_test(NAME ${stem} COMMAND ${target})
  set(labels unit ${A_LABELS})
  set_tests_properties(${stem} PROPERTIES LABELS "${labels}" TIMEOUT 300)
endfunction()

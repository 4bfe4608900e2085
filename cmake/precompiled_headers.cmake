# Precompiled headers for the targets with many sources (KILN_PCH, off by default for now:
# `cmake -DKILN_PCH=ON`).
#
# Nearly every source includes the same ~170,000 preprocessed lines (the standard library,
# oneTBB, kiln's kernel and tensor headers; the tests add Catch2), and parsing them is a large
# part of compiling a small source: ops/elementwise/bitcast.cpp took 4.7 s of CPU time, 1.2 s with the
# header precompiled (g++ 12, -O3, AMD EPYC). The project is compiled five times in
# `make test` (release, x86-64-v4, ASan, TSan, fuzz), so this is where its build time can
# shrink most; the option is to be turned on by default once every one of those builds has
# been checked with it.
#
# Every target that uses a precompiled header gets the compiler's check that the header was
# used (-Winvalid-pch, an error with KILN_WERROR): a flag that differs between the header and
# a source would otherwise fall back silently to parsing the text.
#
# With GCC < 13 the intrinsics prelude (ops/math/intrinsics_prelude.h) must come before
# anything else; a forced -include would come before the precompiled header and make the
# compiler refuse it, so on these targets the prelude is the header's first entry instead
# (kiln_flags leaves out its -include where the target property KILN_PRECOMPILED is set).

# kiln_precompile(TARGET [REUSE_FROM OTHER] HEADERS h1 h2 ...)
function(kiln_precompile target)
  if(NOT KILN_PCH)
    return()
  endif()
  cmake_parse_arguments(PCH "" "REUSE_FROM" "HEADERS" ${ARGN})
  set_target_properties(${target} PROPERTIES KILN_PRECOMPILED ON)
  target_compile_options(${target} PRIVATE -Winvalid-pch)
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    # GCC 12 reports its middle-end access warnings inside libstdc++ (std::string's
    # char_traits.h, in two of our sources) when the standard headers come from a precompiled
    # header, as if they were not system headers: the same sources with the same headers
    # included as text compile clean. `make check-v4` compiles the library without precompiled
    # headers, so these warnings stay checked on all of the library's code.
    target_compile_options(${target} PRIVATE -Wno-stringop-overflow -Wno-array-bounds
                                             -Wno-stringop-overread)
  endif()
  if(PCH_REUSE_FROM)
    target_precompile_headers(${target} REUSE_FROM ${PCH_REUSE_FROM})
  else()
    target_precompile_headers(${target} PRIVATE ${KILN_PRELUDE_HEADER} ${PCH_HEADERS})
  endif()
endfunction()

# A source of a precompiled target that must not see the header (Catch2's main, which
# defines its configuration macros before including catch.hpp) still needs the prelude.
function(kiln_skip_precompile target source)
  if(NOT KILN_PCH)
    return()
  endif()
  set_source_files_properties(${source} TARGET_DIRECTORY ${target} PROPERTIES SKIP_PRECOMPILE_HEADERS ON)
  if(KILN_PRELUDE_HEADER)
    set_property(SOURCE ${source} TARGET_DIRECTORY ${target} APPEND PROPERTY COMPILE_OPTIONS
                 "-include${KILN_PRELUDE_HEADER}")
  endif()
endfunction()

set(KILN_PCH_COMMON "<algorithm>" "<cmath>" "<cstring>" "<functional>" "<limits>" "<memory>"
                    "<string>" "<vector>" ${PROJECT_SOURCE_DIR}/ops/common.h)

# The library's object targets share one flag set (kiln_flags, -fPIC): one header for them all.
kiln_precompile(kiln_ops HEADERS ${KILN_PCH_COMMON} ${PROJECT_SOURCE_DIR}/ops/elementwise.h
                ${PROJECT_SOURCE_DIR}/ops/workspace.h "<Eigen/Core>")
foreach(target kiln_passes kiln_plan kiln_runtime kiln_generate kiln_proto)
  kiln_precompile(${target} REUSE_FROM kiln_ops)
endforeach()

if(TARGET kiln-unit-tests)
  kiln_precompile(kiln-unit-tests HEADERS ${KILN_PCH_COMMON} "<random>" "<filesystem>"
                  ${PROJECT_SOURCE_DIR}/test/unit/op_test.h)
  kiln_precompile(kiln_test_main REUSE_FROM kiln-unit-tests)
  kiln_skip_precompile(kiln_test_main ${PROJECT_SOURCE_DIR}/test/unit/main.cpp)
endif()

# Helpers that give every target of our own the same warnings and layout.

# Warnings are errors on our own code (not on generated protobuf code).
function(tandem_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Werror -Wno-unused-parameter
      -Wnon-virtual-dtor -Wimplicit-fallthrough>)
endfunction()

# tandem_library(NAME SOURCES ... DEPS ...): a static library rooted at the
# repository so that includes read "engine/model/gguf_file.h".
function(tandem_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR})
  target_link_libraries(${name} PUBLIC ${ARG_DEPS})
  tandem_warnings(${name})
endfunction()

# tandem_test(NAME SOURCES ... DEPS ... [LABELS ...] [TIMEOUT SECONDS]
# [COST SECONDS]): a GoogleTest binary whose tests are registered with ctest
# one by one. Every test has a timeout: TIMEOUT, else 120 s for unit tests
# and 600 s for the others (a hung test fails instead of stalling CI). The
# label `tsan` marks the tests scripts/test --sanitize=thread runs, `gpu`
# those that need one. COST (the seconds its longest test takes) puts the
# binary's tests first on a fresh clone, where ctest has no timings of its
# own to order by, so a long one is not left running alone at the end.
function(tandem_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT;COST" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gmock GTest::gtest_main)
  tandem_warnings(${name})
  set(labels unit)
  if(ARG_LABELS)
    set(labels ${ARG_LABELS})
  endif()
  set(timeout 600)
  if("unit" IN_LIST labels)
    set(timeout 120)
  endif()
  if(ARG_TIMEOUT)
    set(timeout ${ARG_TIMEOUT})
  endif()
  # gtest_discover_tests splits a list of labels into separate property
  # arguments, so several labels become one joined by '-' ("unit-tsan"):
  # ctest -L takes a regular expression, so -L unit and -L tsan both match.
  string(JOIN "-" labels ${labels})
  set(cost 0)
  if(ARG_COST)
    set(cost ${ARG_COST})
  endif()
  gtest_discover_tests(${name}
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
    PROPERTIES LABELS "${labels}" TIMEOUT ${timeout} COST ${cost}
    DISCOVERY_TIMEOUT 60)
endfunction()

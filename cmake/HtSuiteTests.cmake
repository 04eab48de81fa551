# One ctest test per GoogleTest suite (`Suite`, running `--gtest_filter=Suite.*`) instead of one per
# test: each process loads libtorch (Debian's links about 300 libraries: 0.8-1.5 s before main on
# CI's machine), and 790 tests in their own processes spent 600 core-seconds starting. A suite's
# tests share the process, in their source order, as they do when a program runs whole.
#
# ht_discover_suites(target): after each build of `target`, lists its tests (POST_BUILD, as
# gtest_discover_tests does) and writes the suites' add_test calls where ctest reads them.
# `ctest -R Suite` runs a suite; one test: the program with --gtest_filter (docs/testing.md).
#
# tests/ctest_costs.txt (written by scripts/update_test_costs.sh from a run's cost data) seeds
# ctest's cost data in a new build folder, so that the longest tests start first on a fresh
# clone instead of last with one core idle.

set(HT_SUITE_SCRIPT "${CMAKE_CURRENT_LIST_DIR}/HtSuiteList.cmake")

function(ht_discover_suites target)
  set(ctest_file "${CMAKE_CURRENT_BINARY_DIR}/${target}_suites.cmake")
  set(include_file "${CMAKE_CURRENT_BINARY_DIR}/${target}_suites_include.cmake")
  add_custom_command(TARGET ${target} POST_BUILD
    COMMAND "${CMAKE_COMMAND}" -D "TEST_EXECUTABLE=$<TARGET_FILE:${target}>" -D "CTEST_FILE=${ctest_file}"
            -D "WORKING_DIRECTORY=${CMAKE_CURRENT_BINARY_DIR}" -P "${HT_SUITE_SCRIPT}"
    BYPRODUCTS "${ctest_file}" VERBATIM)
  file(WRITE "${include_file}"
    "if(EXISTS \"${ctest_file}\")\n"
    "  include(\"${ctest_file}\")\n"
    "else()\n"
    "  add_test(${target}_NOT_BUILT ${target}_NOT_BUILT)\n"
    "endif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${include_file}")
endfunction()

# The recorded costs, where this build folder has none of its own yet.
function(ht_seed_test_costs costs)
  set(data "${CMAKE_BINARY_DIR}/Testing/Temporary/CTestCostData.txt")
  if(EXISTS "${costs}" AND NOT EXISTS "${data}")
    file(READ "${costs}" text)
    string(REGEX REPLACE "#[^\n]*\n" "" text "${text}")
    file(WRITE "${data}" "${text}---\n")
  endif()
endfunction()

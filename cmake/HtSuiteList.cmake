# Run by ht_discover_suites (HtSuiteTests.cmake) after a test program is built: its suites as
# ctest tests, in CTEST_FILE.
cmake_minimum_required(VERSION 3.18)
execute_process(COMMAND "${TEST_EXECUTABLE}" --gtest_list_tests
                OUTPUT_VARIABLE listing ERROR_VARIABLE errors RESULT_VARIABLE result TIMEOUT 120)
if(NOT result EQUAL 0)
  file(REMOVE "${CTEST_FILE}")
  message(FATAL_ERROR "listing the tests of ${TEST_EXECUTABLE} failed (${result}):\n${listing}\n${errors}")
endif()
string(REPLACE "\n" ";" lines "${listing}")
set(suites "")
set(suite_of_each_test "")
foreach(line IN LISTS lines)
  # A suite's line starts in column 0 ("Suite." or "Prefix/Suite.  # TypeParam = ..."); its
  # tests' lines are indented.
  if(line MATCHES "^([^ #][^ ]*)\\.( |$)")
    set(suite "${CMAKE_MATCH_1}")
    if(NOT suite IN_LIST suites)
      list(APPEND suites "${suite}")
    endif()
  elseif(line MATCHES "^  [^ ]" AND DEFINED suite)
    list(APPEND suite_of_each_test "${suite}")
  endif()
endforeach()
set(script "")
foreach(suite IN LISTS suites)
  # As long as each test had (600 s), up to 3000 s for a suite of five tests or more.
  set(tests ${suite_of_each_test})
  list(FILTER tests INCLUDE REGEX "^${suite}$")
  list(LENGTH tests count)
  if(count LESS 1)
    set(count 1)
  elseif(count GREATER 5)
    set(count 5)
  endif()
  math(EXPR timeout "600 * ${count}")
  string(APPEND script
    "add_test([=[${suite}]=] \"${TEST_EXECUTABLE}\" [=[--gtest_filter=${suite}.*]=])\n"
    "set_tests_properties([=[${suite}]=] PROPERTIES WORKING_DIRECTORY \"${WORKING_DIRECTORY}\" TIMEOUT ${timeout})\n")
endforeach()
file(WRITE "${CTEST_FILE}" "${script}")

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
set(script "")
set(suites "")
foreach(line IN LISTS lines)
  # A suite's line starts in column 0 ("Suite." or "Prefix/Suite.  # TypeParam = ..."); its
  # tests' lines are indented.
  if(line MATCHES "^([^ #][^ ]*)\\.( |$)")
    set(suite "${CMAKE_MATCH_1}")
    if(NOT suite IN_LIST suites)
      list(APPEND suites "${suite}")
      string(APPEND script
        "add_test([=[${suite}]=] \"${TEST_EXECUTABLE}\" [=[--gtest_filter=${suite}.*]=])\n"
        "set_tests_properties([=[${suite}]=] PROPERTIES WORKING_DIRECTORY \"${WORKING_DIRECTORY}\" TIMEOUT 3000)\n")
    endif()
  endif()
endforeach()
file(WRITE "${CTEST_FILE}" "${script}")

# The libraries hybrid_train builds on, found as Debian installs them, or, on a machine without
# them (the GPU machine: PyTorch's libtorch, no Debian packages), from HT_DEPS_DIR, the folder
# scripts/device-deps.sh fills here and the device tool carries there: CLI11's, toml++'s and
# nlohmann/json's headers (header-only), zlib's headers, GoogleTest's sources. Each target has
# one name either way.

set(HT_DEPS_DIR "" CACHE PATH "headers and sources for a machine without Debian's packages (scripts/device-deps.sh)")

# CLI11 (header-only).
find_package(CLI11 CONFIG QUIET)
if(NOT TARGET CLI11::CLI11)
  find_path(HT_CLI11_INCLUDE CLI/CLI.hpp HINTS ${HT_DEPS_DIR}/include)
  if(NOT HT_CLI11_INCLUDE)
    message(FATAL_ERROR "CLI11 not found: install libcli11-dev, or give -DHT_DEPS_DIR=<folder with include/CLI>")
  endif()
  add_library(CLI11::CLI11 INTERFACE IMPORTED)
  target_include_directories(CLI11::CLI11 INTERFACE ${HT_CLI11_INCLUDE})
endif()

# toml++: Debian's shared library, or its headers alone (TOML_HEADER_ONLY).
find_package(tomlplusplus QUIET)
if(NOT TARGET tomlplusplus::tomlplusplus)
  find_path(HT_TOML_INCLUDE toml++/toml.h HINTS ${HT_DEPS_DIR}/include)
  if(NOT HT_TOML_INCLUDE)
    message(FATAL_ERROR "toml++ not found: install libtomlplusplus-dev, or give -DHT_DEPS_DIR=<folder with include/toml++>")
  endif()
  add_library(tomlplusplus::tomlplusplus INTERFACE IMPORTED)
  target_include_directories(tomlplusplus::tomlplusplus INTERFACE ${HT_TOML_INCLUDE})
  target_compile_definitions(tomlplusplus::tomlplusplus INTERFACE TOML_HEADER_ONLY=1)
endif()

# nlohmann/json (header-only): safetensors headers and transformers' config.json (launcher/export/).
find_package(nlohmann_json 3 QUIET)
if(NOT TARGET nlohmann_json::nlohmann_json)
  find_path(HT_NLOHMANN_JSON_INCLUDE nlohmann/json.hpp HINTS ${HT_DEPS_DIR}/include)
  if(NOT HT_NLOHMANN_JSON_INCLUDE)
    message(FATAL_ERROR "nlohmann/json not found: install nlohmann-json3-dev, or give -DHT_DEPS_DIR=<folder with include/nlohmann>")
  endif()
  add_library(nlohmann_json::nlohmann_json INTERFACE IMPORTED)
  target_include_directories(nlohmann_json::nlohmann_json INTERFACE ${HT_NLOHMANN_JSON_INCLUDE})
endif()

# zlib: every Linux has libz.so.1; a machine without zlib1g-dev lacks its headers and the
# libz.so link, so those come from HT_DEPS_DIR and the library by its full name.
find_package(ZLIB QUIET)
if(NOT TARGET ZLIB::ZLIB)
  find_path(HT_ZLIB_INCLUDE zlib.h HINTS ${HT_DEPS_DIR}/include)
  find_library(HT_ZLIB_LIBRARY NAMES z libz.so.1 PATHS /lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu /usr/lib64 /lib64)
  if(NOT HT_ZLIB_INCLUDE OR NOT HT_ZLIB_LIBRARY)
    message(FATAL_ERROR "zlib not found: install zlib1g-dev, or give -DHT_DEPS_DIR=<folder with include/zlib.h>")
  endif()
  add_library(ZLIB::ZLIB UNKNOWN IMPORTED)
  set_target_properties(ZLIB::ZLIB PROPERTIES IMPORTED_LOCATION ${HT_ZLIB_LIBRARY}
                                              INTERFACE_INCLUDE_DIRECTORIES ${HT_ZLIB_INCLUDE})
endif()

# GoogleTest, for the tests: Debian's, or built from its sources (GTest::gtest, gtest_main, gmock).
macro(ht_find_gtest)
  find_package(GTest QUIET)
  # Debian ships GoogleMock apart (libgmock-dev): without it GTest::gmock is missing, and a test
  # program that links it fails to configure far from here. Say so here.
  if(TARGET GTest::gtest AND NOT TARGET GTest::gmock)
    message(FATAL_ERROR "GoogleTest found without GoogleMock: install libgmock-dev (bash scripts/install-deps.sh "
                        "--tests), or build without tests (-DHT_BUILD_TESTS=OFF)")
  endif()
  if(NOT TARGET GTest::gtest)
    if(NOT EXISTS ${HT_DEPS_DIR}/googletest/CMakeLists.txt)
      message(FATAL_ERROR "GoogleTest not found: install libgtest-dev googletest, give -DHT_DEPS_DIR=<folder with "
                          "googletest/>, or build without tests (-DHT_BUILD_TESTS=OFF)")
    endif()
    set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
    add_subdirectory(${HT_DEPS_DIR}/googletest ${CMAKE_BINARY_DIR}/googletest EXCLUDE_FROM_ALL)
  endif()
endmacro()

#include "alloc/memory_trace.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <unistd.h>

namespace ht {
namespace {

std::string fresh_path(const std::string& stem) {
  const std::string path =
      testing::TempDir() + "ht_trace_" + stem + "_" + std::to_string(getpid()) + ".json";
  std::remove(path.c_str());
  std::remove((path + ".tmp").c_str());
  return path;
}

bool exists(const std::string& path) { return std::ifstream(path).good(); }

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// No JSON library is available: checks that brackets and braces outside strings nest and
// close, and that every string ends.
bool balanced(const std::string& json) {
  std::string stack;
  bool in_string = false;
  for (size_t i = 0; i < json.size(); ++i) {
    const char c = json[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      stack += c;
    } else if (c == '}' || c == ']') {
      if (stack.empty() || stack.back() != (c == '}' ? '{' : '[')) return false;
      stack.pop_back();
    }
  }
  return !in_string && stack.empty();
}

TEST(MemoryTrace, WritesEventsAndRenamesOnClose) {
  const std::string path = fresh_path("events");
  MemoryTrace trace(path);
  EXPECT_EQ(trace.path(), path);
  trace.span("matmul", "kernel", 10, 2.5, {{"bytes", 4096}, {"flops", 1e9}});
  trace.instant("evict", "memory", 12.25, {{"bytes", 1024}});
  trace.counter("memory", 13, {{"in_use", 8192}, {"evicted", 1024}});
  trace.instant("oom", "memory", 14);
  EXPECT_EQ(trace.events(), 4);
  EXPECT_FALSE(exists(path)) << "the final name must appear only at close()";
  EXPECT_TRUE(exists(path + ".tmp"));
  trace.close();
  trace.close();  // a second close does nothing
  EXPECT_TRUE(exists(path));
  EXPECT_FALSE(exists(path + ".tmp"));

  const std::string json = read_all(path);
  EXPECT_TRUE(balanced(json)) << json;
  EXPECT_EQ(json.rfind("{\"traceEvents\":[", 0), 0u) << json;
  EXPECT_NE(json.find("\"displayTimeUnit\":\"ms\"}"), std::string::npos) << json;
  EXPECT_NE(json.find("{\"name\":\"matmul\",\"cat\":\"kernel\",\"ph\":\"X\",\"ts\":10,"
                      "\"dur\":2.5,\"pid\":1,\"tid\":1,"
                      "\"args\":{\"bytes\":4096,\"flops\":1000000000}}"),
            std::string::npos) << json;
  EXPECT_NE(json.find("{\"name\":\"evict\",\"cat\":\"memory\",\"ph\":\"i\",\"ts\":12.25,"
                      "\"s\":\"t\",\"pid\":1,\"tid\":1,\"args\":{\"bytes\":1024}}"),
            std::string::npos) << json;
  EXPECT_NE(json.find("{\"name\":\"memory\",\"ph\":\"C\",\"ts\":13,\"pid\":1,\"tid\":1,"
                      "\"args\":{\"in_use\":8192,\"evicted\":1024}}"),
            std::string::npos) << json;
  EXPECT_NE(json.find("{\"name\":\"oom\",\"cat\":\"memory\",\"ph\":\"i\",\"ts\":14,"
                      "\"s\":\"t\",\"pid\":1,\"tid\":1}"),
            std::string::npos) << json;
  EXPECT_THROW(trace.instant("late", "memory", 15), std::logic_error);
  std::remove(path.c_str());
}

TEST(MemoryTrace, EmptyTraceIsValid) {
  const std::string path = fresh_path("empty");
  { MemoryTrace trace(path); }  // the destructor closes
  const std::string json = read_all(path);
  EXPECT_TRUE(balanced(json)) << json;
  EXPECT_NE(json.find("\"traceEvents\":[\n]"), std::string::npos) << json;
  EXPECT_FALSE(exists(path + ".tmp"));
  std::remove(path.c_str());
}

TEST(MemoryTrace, EscapesStringsAndZeroesNonFiniteNumbers) {
  const std::string path = fresh_path("escape");
  {
    MemoryTrace trace(path);
    trace.span("say \"hi\" C:\\dir", "cat\"x", 1, 2);
    trace.instant("line\nbreak\ttab\x01", "memory", 3);
    trace.counter("memory", std::numeric_limits<double>::quiet_NaN(),
                  {{"in_use", std::numeric_limits<double>::infinity()}, {"neg", -5}});
  }
  const std::string json = read_all(path);
  EXPECT_TRUE(balanced(json)) << json;
  EXPECT_NE(json.find("\"name\":\"say \\\"hi\\\" C:\\\\dir\",\"cat\":\"cat\\\"x\""),
            std::string::npos) << json;
  EXPECT_NE(json.find("\"name\":\"line\\nbreak\\ttab\\u0001\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"ph\":\"C\",\"ts\":0,\"pid\":1,\"tid\":1,"
                      "\"args\":{\"in_use\":0,\"neg\":-5}"),
            std::string::npos) << json;
  EXPECT_EQ(json.find("nan"), std::string::npos) << json;
  EXPECT_EQ(json.find("inf"), std::string::npos) << json;
  std::remove(path.c_str());
}

TEST(MemoryTrace, UnwritablePathThrowsNamingIt) {
  const std::string path = "/nonexistent_ht_dir/sub/trace.json";
  try {
    MemoryTrace trace(path);
    FAIL() << "opening " << path << " should have thrown";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ht

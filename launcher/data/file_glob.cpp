#include "launcher/data/file_glob.h"

#include <glob.h>

#include <algorithm>
#include <filesystem>
#include <regex>
#include <system_error>

namespace ht {
namespace {

namespace fs = std::filesystem;

// The pattern as a regular expression over whole paths: * and ? stay within a folder, ** does not.
std::regex glob_regex(const std::string& pattern) {
  std::string re;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char ch = pattern[i];
    if (ch == '*' && i + 1 < pattern.size() && pattern[i + 1] == '*') {
      const bool folder = i + 2 < pattern.size() && pattern[i + 2] == '/';
      re += folder ? "(?:.*/)?" : ".*";
      i += folder ? 2 : 1;
    } else if (ch == '*') {
      re += "[^/]*";
    } else if (ch == '?') {
      re += "[^/]";
    } else if (ch == '[' && pattern.find(']', i + 1) != std::string::npos) {
      size_t close = pattern.find(']', i + 2);  // "[]...]" holds a ']'
      if (close == std::string::npos) close = pattern.find(']', i + 1);
      std::string cls = pattern.substr(i + 1, close - i - 1);
      if (!cls.empty() && cls[0] == '!') cls[0] = '^';
      for (size_t k = 0; k < cls.size(); ++k)
        if (cls[k] == '\\') cls.insert(k++, "\\");
      re += "[" + cls + "]";
      i = close;
    } else {
      if (std::string(".^$|()+{}\\[]").find(ch) != std::string::npos) re += '\\';
      re += ch;
    }
  }
  return std::regex(re, std::regex::ECMAScript);
}

// The folders of `pattern` before its first component with a wildcard ("" if it starts with one).
std::string literal_folder(const std::string& pattern) {
  const size_t wild = pattern.find_first_of("*?[");
  const size_t slash = pattern.rfind('/', wild);
  return slash == std::string::npos ? "" : pattern.substr(0, slash == 0 ? 1 : slash);
}

std::vector<std::string> files_below(const std::string& folder) {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(folder, fs::directory_options::skip_permission_denied, ec), end;
       !ec && it != end; it.increment(ec)) {
    if (it->is_regular_file(ec)) out.push_back(it->path().generic_string());
  }
  return out;
}

std::vector<std::string> deep_matches(const std::string& pattern) {
  const std::string folder = literal_folder(pattern);
  const std::regex re = glob_regex(pattern);
  std::vector<std::string> out;
  for (std::string path : files_below(folder.empty() ? "." : folder)) {
    if (folder.empty() && path.rfind("./", 0) == 0) path = path.substr(2);
    if (std::regex_match(path, re)) out.push_back(path);
  }
  return out;
}

std::vector<std::string> shell_matches(const std::string& pattern) {
  std::vector<std::string> out;
  glob_t g{};
  if (::glob(pattern.c_str(), GLOB_NOSORT, nullptr, &g) == 0) {
    std::error_code ec;
    for (size_t i = 0; i < g.gl_pathc; ++i)
      if (fs::is_regular_file(g.gl_pathv[i], ec)) out.emplace_back(g.gl_pathv[i]);
  }
  ::globfree(&g);
  return out;
}

}  // namespace

bool has_wildcards(const std::string& pattern) { return pattern.find_first_of("*?[") != std::string::npos; }

std::vector<std::string> match_files(const std::string& pattern, bool folders_recursively) {
  std::vector<std::string> out;
  std::error_code ec;
  if (!has_wildcards(pattern)) {
    if (fs::is_regular_file(pattern, ec)) out.push_back(pattern);
    if (folders_recursively && fs::is_directory(pattern, ec)) out = files_below(pattern);
  } else {
    out = pattern.find("**") != std::string::npos ? deep_matches(pattern) : shell_matches(pattern);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace ht

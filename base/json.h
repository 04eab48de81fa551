#pragma once
// A JSON object written field by field: enough for metrics lines and summaries.

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

namespace ht {

class JsonObject {
 public:
  JsonObject& add(const std::string& key, int64_t v) { return raw(key, std::to_string(v)); }
  JsonObject& add(const std::string& key, double v) {
    if (!std::isfinite(v)) return raw(key, "null");  // JSON has no inf or NaN
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.6g", v);
    return raw(key, buf);
  }
  JsonObject& add(const std::string& key, const std::string& v) { return raw(key, quote(v)); }
  JsonObject& add(const std::string& key, const char* v) { return raw(key, quote(v)); }
  JsonObject& add(const std::string& key, bool v) { return raw(key, v ? "true" : "false"); }
  JsonObject& add(const std::string& key, std::optional<int64_t> v) {
    return v ? add(key, *v) : raw(key, "null");
  }
  JsonObject& add(const std::string& key, std::optional<double> v) {
    return v ? add(key, *v) : raw(key, "null");
  }
  JsonObject& add(const std::string& key, const std::vector<double>& v) {
    std::string text = "[";
    for (size_t i = 0; i < v.size(); ++i) {
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%.10g", std::isfinite(v[i]) ? v[i] : 0.0);
      text += (i ? ", " : "") + std::string(buf);
    }
    return raw(key, text + "]");
  }
  JsonObject& add(const std::string& key, const JsonObject& v) { return raw(key, v.str()); }  // nested
  std::string str() const { return "{" + body_ + "}"; }

  static std::string quote(const std::string& s) {
    std::string out = "\"";
    for (char ch : s) {
      if (ch == '"' || ch == '\\') {
        out += '\\';
        out += ch;
      } else if (static_cast<unsigned char>(ch) < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof(buf), "\\u%04x", ch);
        out += buf;
      } else {
        out += ch;
      }
    }
    return out + "\"";
  }

 private:
  JsonObject& raw(const std::string& key, const std::string& value) {
    body_ += (body_.empty() ? "" : ", ") + quote(key) + ": " + value;
    return *this;
  }
  std::string body_;
};

}  // namespace ht

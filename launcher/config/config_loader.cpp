#include "launcher/config/config_loader.h"

#include "launcher/config/config_schema.h"
#include "launcher/config/config_validation.h"
#include "base/user_error.h"

#include <toml++/toml.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>

namespace ht {
namespace {

std::string describe(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string: return "a string (\"" + std::string(*node.as_string()) + "\")";
    case toml::node_type::integer: return "an integer (" + std::to_string(node.as_integer()->get()) + ")";
    case toml::node_type::floating_point: return "a number (" + std::to_string(node.as_floating_point()->get()) + ")";
    case toml::node_type::boolean: return node.as_boolean()->get() ? "a boolean (true)" : "a boolean (false)";
    case toml::node_type::array: return "an array";
    case toml::node_type::table: return "a table";
    default: return "a date or time";
  }
}

std::string expected(const FieldSpec& spec) {
  std::string what = (spec.type == ValueType::kInt ? "an " : "a ") + type_name(spec.type);
  if (!spec.choices.empty()) {
    what = "one of";
    for (const auto& c : spec.choices) what += " \"" + c + "\"";
  }
  return what;
}

// Converts a TOML value to the field's type and checks its allowed values.
ConfigValue convert(const toml::node& node, const FieldSpec& spec, const std::string& where) {
  auto fail = [&](const std::string& why) -> UserError {
    return UserError(where + ": " + spec.path() + ": " + why);
  };
  auto check_range = [&](double v, const std::string& text) {
    if (spec.min && v < *spec.min)
      throw fail(text + " is out of range: must be >= " + limit_text(spec, *spec.min));
    if (spec.max && v > *spec.max)
      throw fail(text + " is out of range: must be <= " + limit_text(spec, *spec.max));
  };
  switch (spec.type) {
    case ValueType::kInt: {
      if (!node.is_integer()) throw fail("expected an integer, got " + describe(node));
      const int64_t v = node.as_integer()->get();
      check_range(static_cast<double>(v), std::to_string(v));
      return v;
    }
    case ValueType::kFloat: {
      if (!node.is_number()) throw fail("expected a number, got " + describe(node));
      const double v = node.is_integer() ? static_cast<double>(node.as_integer()->get())
                                         : node.as_floating_point()->get();
      check_range(v, to_toml(v));
      return v;
    }
    case ValueType::kBool:
      if (!node.is_boolean()) throw fail("expected true or false, got " + describe(node));
      return node.as_boolean()->get();
    case ValueType::kString: {
      if (!node.is_string()) throw fail("expected " + expected(spec) + ", got " + describe(node));
      const std::string v(*node.as_string());
      if (!spec.choices.empty() && std::find(spec.choices.begin(), spec.choices.end(), v) == spec.choices.end()) {
        std::string hint = nearest_name(v, spec.choices);
        throw fail("\"" + v + "\" is not allowed; expected " + expected(spec) +
                   (hint.empty() ? "" : " (did you mean \"" + hint + "\"?)"));
      }
      return v;
    }
    case ValueType::kIntList: {
      const toml::array* arr = node.as_array();
      if (arr == nullptr) throw fail("expected a list of integers like [64, 64], got " + describe(node));
      std::vector<int64_t> v;
      for (const toml::node& item : *arr) {
        if (!item.is_integer()) throw fail("expected a list of integers, but an element is " + describe(item));
        v.push_back(item.as_integer()->get());
        check_range(static_cast<double>(v.back()), "element " + std::to_string(v.back()));
      }
      return v;
    }
  }
  throw fail("unsupported type");
}

std::string at(const std::string& file, const toml::source_region& src) {
  return file + ":" + std::to_string(src.begin.line) + ":" + std::to_string(src.begin.column);
}

std::vector<std::string> all_paths() {
  std::vector<std::string> paths;
  for (const FieldSpec& f : config_schema()) paths.push_back(f.path());
  return paths;
}

std::string unknown_key_message(const std::string& section, const std::string& key) {
  std::vector<std::string> in_section;
  for (const FieldSpec& f : config_schema())
    if (f.section == section) in_section.push_back(f.key);
  std::string hint = nearest_name(key, in_section);
  if (hint.empty()) {
    const std::string anywhere = nearest_name(section + "." + key, all_paths());
    if (!anywhere.empty()) return "unknown key " + section + "." + key + "; did you mean " + anywhere + "?";
    return "unknown key " + section + "." + key + "; see hybrid_train --help for the keys of [" + section + "]";
  }
  return "unknown key " + section + "." + key + "; did you mean " + section + "." + hint + "?";
}

class Loader {
 public:
  void read_file(const std::string& path);
  void apply(const ConfigOverride& o);
  LoadedConfig finish();

 private:
  void set(const FieldSpec& spec, const toml::node& node, const std::string& where) {
    spec.set(config_, convert(node, spec, where));
    where_[spec.path()] = where;
  }
  void read_section(const std::string& file, const std::string& section, const toml::table& table);

  Config config_;
  std::map<std::string, std::string> where_;  // path -> where it was set
};

void Loader::read_file(const std::string& path) {
  config_.source = path;
  std::ifstream probe(path);
  if (!probe) throw UserError(path + ": cannot read the config file (does it exist? try configs/quickstart.toml)");
  toml::table root;
  try {
    root = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    throw UserError(at(path, e.source()) + ": TOML syntax error: " + std::string(e.description()));
  }
  for (auto&& [key, node] : root) {
    const std::string name(key.str());
    const auto& sections = config_sections();
    if (const toml::table* table = node.as_table()) {
      if (std::find(sections.begin(), sections.end(), name) == sections.end()) {
        std::string hint = nearest_name(name, sections);
        throw UserError(at(path, key.source()) + ": unknown section [" + name + "]" +
                        (hint.empty() ? "; sections are job, model, data, training, parallel, memory, cluster, checkpoint, metrics"
                                      : "; did you mean [" + hint + "]?"));
      }
      read_section(path, name, *table);
      continue;
    }
    std::string hint;
    for (const FieldSpec& f : config_schema())
      if (f.key == name) hint = f.path();
    throw UserError(at(path, key.source()) + ": key '" + name + "' must be inside a section" +
                    (hint.empty() ? "" : "; did you mean " + hint + " (under [" + hint.substr(0, hint.find('.')) + "])?"));
  }
}

void Loader::read_section(const std::string& file, const std::string& section, const toml::table& table) {
  for (auto&& [key, node] : table) {
    const std::string name(key.str());
    const FieldSpec* spec = find_field(section, name);
    if (spec == nullptr) throw UserError(at(file, key.source()) + ": " + unknown_key_message(section, name));
    set(*spec, node, at(file, node.source()));
  }
}

void Loader::apply(const ConfigOverride& o) {
  const std::string where = "argument " + o.argument;
  const size_t dot = o.path.find('.');
  if (dot == std::string::npos) {
    throw UserError(where + ": overrides look like --section.key=value, e.g. --training.steps=20");
  }
  const std::string section = o.path.substr(0, dot), key = o.path.substr(dot + 1);
  const FieldSpec* spec = find_field(section, key);
  if (spec == nullptr) {
    const std::string hint = nearest_name(o.path, all_paths());
    throw UserError(where + ": unknown key " + o.path + (hint.empty() ? "" : "; did you mean --" + hint + "?"));
  }
  // A string may be typed bare (--model.name=resnet); everything else is read as a TOML value.
  std::string text = o.value;
  if (spec->type == ValueType::kString && (text.empty() || text.front() != '"')) text = to_toml(ConfigValue(text));
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + text);
  } catch (const toml::parse_error&) {
    throw UserError(where + ": " + o.path + ": expected " + expected(*spec) + ", got '" + o.value + "'");
  }
  set(*spec, *parsed.get("v"), where);
}

LoadedConfig Loader::finish() {
  for (const FieldSpec& f : config_schema()) {
    if (f.required && where_.count(f.path()) == 0) {
      throw UserError(config_.source + ": " + f.path() + " is required: " + expected(f) + " (under [" +
                      f.section + "])");
    }
  }
  LoadedConfig out;
  out.warnings = validate_config(config_, where_);
  out.config = config_;
  return out;
}

}  // namespace

std::string nearest_name(const std::string& name, const std::vector<std::string>& candidates) {
  auto distance = [](const std::string& a, const std::string& b) {
    std::vector<size_t> row(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
      size_t diagonal = row[0];
      row[0] = i;
      for (size_t j = 1; j <= b.size(); ++j) {
        const size_t up = row[j];
        row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
        diagonal = up;
      }
    }
    return row[b.size()];
  };
  std::string best;
  size_t best_distance = std::max<size_t>(2, name.size() / 3) + 1;
  for (const std::string& c : candidates) {
    const size_t d = distance(name, c);
    if (d < best_distance) {
      best = c;
      best_distance = d;
    }
  }
  return best;
}

LoadedConfig load_config(const std::string& path, const std::vector<ConfigOverride>& overrides) {
  Loader loader;
  loader.read_file(path);
  for (const ConfigOverride& o : overrides) loader.apply(o);
  return loader.finish();
}

}  // namespace ht

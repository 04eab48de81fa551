#pragma once
// The table of every config key: its type, documentation, allowed values, when it matters, and
// how to read and write it in Config. Parsing, command-line overrides, validation, warnings,
// --help, the resolved config and docs/config-reference.md are all driven by this one table.

#include "launcher/config/config.h"

#include <functional>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace ht {

enum class ValueType { kInt, kFloat, kBool, kString, kIntList };
using ConfigValue = std::variant<int64_t, double, bool, std::string, std::vector<int64_t>>;

struct FieldSpec {
  std::string section, key;
  ValueType type = ValueType::kString;
  std::string doc;                     // one line
  std::vector<std::string> choices;    // allowed strings: an enum field's names (base/choice.h); empty: any
  std::optional<double> min, max;      // numbers, and every element of a list
  bool required = false;
  // When the key has an effect; setting it explicitly when it has none gives a warning.
  std::function<bool(const Config&)> applies;
  std::string applies_when;            // the same condition in words, for that warning
  // A feature not built yet: any value but the default is refused, naming what will bring it.
  std::string not_built;
  std::function<void(Config&, const ConfigValue&)> set;
  std::function<ConfigValue(const Config&)> get;

  std::string path() const { return section + "." + key; }
};

const std::vector<FieldSpec>& config_schema();
const std::vector<std::string>& config_sections();
const FieldSpec* find_field(const std::string& section, const std::string& key);

std::string type_name(ValueType type);
// TOML text of a value: 3, 0.05, true, "cpu", [256, 256]
std::string to_toml(const ConfigValue& value);
// A numeric limit as the field's type writes it: 0 for integers, 0.5 for numbers.
std::string limit_text(const FieldSpec& field, double limit);

}  // namespace ht

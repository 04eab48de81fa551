#include "launcher/config/config_text.h"

#include "launcher/config/config_schema.h"

namespace ht {
namespace {

std::string default_text(const FieldSpec& f) {
  if (f.required) return "required";
  const std::string value = to_toml(f.get(Config{}));
  if (value == "\"\"" && f.section == "data" && f.key == "path") return "see doc";
  return value;
}

std::string constraints(const FieldSpec& f, const std::string& separator) {
  std::string out;
  if (!f.choices.empty()) {
    for (const auto& c : f.choices) out += (out.empty() ? "" : separator) + c;
  }
  if (f.min) out += (out.empty() ? "" : ", ") + std::string(">= ") + limit_text(f, *f.min);
  if (f.max) out += (out.empty() ? "" : ", ") + std::string("<= ") + limit_text(f, *f.max);
  return out;
}

std::string notes(const FieldSpec& f) {
  std::string out;
  if (!f.applies_when.empty()) out += " Only when " + f.applies_when + ".";
  if (!f.not_built.empty()) out += " Not built yet: " + f.not_built + ".";
  return out;
}

}  // namespace

std::string resolved_toml(const Config& config) {
  std::string out = "# hybrid_train resolved config (from " + config.source + ")\n";
  for (const std::string& section : config_sections()) {
    out += "\n[" + section + "]\n";
    for (const FieldSpec& f : config_schema()) {
      if (f.section != section) continue;
      out += f.key + " = " + to_toml(f.get(config)) + "  # " + f.doc + "\n";
    }
  }
  return out;
}

std::string config_changes_text(const Config& config) {
  const Config defaults;
  std::string out;
  for (const std::string& section : config_sections()) {
    std::string line;
    for (const FieldSpec& f : config_schema()) {
      if (f.section != section) continue;
      const std::string value = to_toml(f.get(config));
      if (!f.required && value == to_toml(f.get(defaults))) continue;
      line += (line.empty() ? "" : ", ") + f.key + " = " + value;
    }
    if (!line.empty()) out += "  [" + section + "] " + line + "\n";
  }
  return out;
}

std::string config_reference_text() {
  std::string out = "Config keys (in CONFIG.toml, or as --section.key=value):\n";
  for (const std::string& section : config_sections()) {
    out += "\n  [" + section + "]\n";
    for (const FieldSpec& f : config_schema()) {
      if (f.section != section) continue;
      std::string line = "    " + f.key + " (" + type_name(f.type);
      const std::string limits = constraints(f, " | ");
      if (!limits.empty()) line += ": " + limits;
      line += f.required ? ", required)" : ", default " + default_text(f) + ")";
      out += line + "\n        " + f.doc + "." + notes(f) + "\n";
    }
  }
  return out;
}

std::string config_reference_markdown() {
  std::string out =
      "# Config reference\n\n"
      "Every key of a job's TOML file, by section. Each may also be given on the command line as\n"
      "`--section.key=value`, which wins over the file ([running.md](running.md)). This page is\n"
      "generated from the schema, `launcher/config/config_schema.cpp`, which also drives parsing,\n"
      "checking, `--help` and the resolved config; regenerate it with\n"
      "`./build/launcher/hybrid_train --config-reference-markdown > docs/config-reference.md`\n"
      "(a test fails while the two differ).\n";
  for (const std::string& section : config_sections()) {
    out += "\n`[" + section + "]`\n\n| key | type | default | meaning |\n| --- | --- | --- | --- |\n";
    for (const FieldSpec& f : config_schema()) {
      if (f.section != section) continue;
      std::string type = type_name(f.type);
      const std::string limits = constraints(f, ", ");
      if (!limits.empty()) type += ": " + limits;
      out += "| `" + f.key + "` | " + type + " | `" + default_text(f) + "` | " + f.doc + "." + notes(f) + " |\n";
    }
  }
  return out;
}

}  // namespace ht

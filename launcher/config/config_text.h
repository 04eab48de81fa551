#pragma once
// Texts generated from the schema: the resolved config (TOML), and the reference of every
// section and key, for --help and for the README.

#include "launcher/config/config.h"

#include <string>

namespace ht {

// Every key with its value, as a TOML file that loads back to the same Config.
std::string resolved_toml(const Config& config);
// Every section and key: type, default and documentation, for --help.
std::string config_reference_text();
// The same as Markdown tables (the README's "Config reference" is this text).
std::string config_reference_markdown();

}  // namespace ht

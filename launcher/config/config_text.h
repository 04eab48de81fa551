#pragma once
// Texts generated from the schema: the resolved config (TOML), and the reference of every
// section and key, for --help and for docs/config-reference.md.

#include "launcher/config/config.h"

#include <string>

namespace ht {

// Every key with its value, as a TOML file that loads back to the same Config.
std::string resolved_toml(const Config& config);
// What the run changed from the defaults (required keys included), a line per section:
// "  [training] steps = 300, optimizer = "adamw"" (the start-up screen; the rest is the file above).
std::string config_changes_text(const Config& config);
// Every section and key: type, default and documentation, for --help.
std::string config_reference_text();
// The same as a Markdown page: docs/config-reference.md is this text (a test keeps them equal).
std::string config_reference_markdown();

}  // namespace ht

#pragma once
// Rules that span keys (divisibility, model and data that go together, features not built yet),
// defaults that depend on other keys, and warnings for options without effect. Called once, by
// load_config, after the file and the overrides have been read.

#include "launcher/config/config.h"

#include <map>
#include <string>
#include <vector>

namespace ht {

// `where` maps "section.key" to where the user set it ("file:line:col" or "argument --x=y").
// Throws UserError; returns the warnings.
std::vector<std::string> validate_config(Config& config, const std::map<std::string, std::string>& where);

// The job's `world` ranks must divide into parallel.pipeline_parallel stages (before the grid is
// divided); UserError saying what would work otherwise.
void check_pipeline_ranks(const Config& config, int64_t world);

}  // namespace ht

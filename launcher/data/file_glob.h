#pragma once
// Files named by a pattern, as data.path, data.eval_path and `hybrid_train tokenize --input` take
// them: a file; a glob (*, ?, [abc] within one folder, as the shell's), where ** also crosses
// folders ("docs/**/*.rst.txt": every .rst.txt below docs/, at any depth); or, where the caller
// allows, a folder, meaning every file below it. Matches are regular files, in byte order of
// their paths, so shards numbered _000001, _000002, ... come in order.

#include <string>
#include <vector>

namespace ht {

// Whether `pattern` has a wildcard (*, ? or [).
bool has_wildcards(const std::string& pattern);

// The files `pattern` names, sorted; empty when none. A folder counts only with
// folders_recursively (then: every regular file below it).
std::vector<std::string> match_files(const std::string& pattern, bool folders_recursively = false);

}  // namespace ht

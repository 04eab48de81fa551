#pragma once
// What `plan` prints after its table (issue 66, part 2): each layout's memory/time frontier (the
// plans of one layout, from keeping everything to recomputing every block, as the search
// predicted them), and what a per-block plan keeps and regenerates, one line per kind of tensor.

#include "planner/profile.h"
#include "planner/search.h"

#include <string>
#include <vector>

namespace ht {

// Plans that differ only in how they trade compute for memory (policy, budget, per-block share,
// weight copies): one layout.
bool same_layout(const Plan& a, const Plan& b);

// The frontier of `of`'s layout among `ranked`: one line per plan, most memory first, with its
// peak, step and the step against the layout's fastest that fits. Empty where `ranked` has fewer
// than two plans of that layout.
std::string frontier_text(const std::vector<RankedPlan>& ranked, const Plan& of);

// A per_block plan's repeating block (as replayed: at the plan's micro-batch, or the smallest
// traced size where the planner puts the plan's on a line, and says which): what backward reads,
// what forward keeps and what backward runs again, per kind of tensor (the op that makes it).
// Empty for other policies, and where the replay solved no block.
std::string block_kinds_text(const ModelProfile& profile, const Plan& plan);

}  // namespace ht

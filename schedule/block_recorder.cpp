#include "schedule/block_recorder.h"

namespace ht::schedule {

void BlockRecorder::clear() {
  graph_ = {};
  ids_.clear();
  position_.clear();
}

void BlockRecorder::op(const char* name, double cost_ms, const std::vector<uint64_t>& reads,
                       const std::vector<std::pair<uint64_t, int64_t>>& made) {
  if (made.empty()) return;
  BlockOp op;
  op.name = name;
  op.cost_ms = cost_ms;
  for (uint64_t id : reads) {
    auto it = position_.find(id);
    if (it != position_.end()) op.inputs.push_back(it->second);
  }
  const int index = static_cast<int>(graph_.ops.size());
  graph_.ops.push_back(std::move(op));
  for (const auto& [id, bytes] : made) {
    position_[id] = static_cast<int>(ids_.size());
    ids_.push_back(id);
    graph_.values.push_back({bytes, index, false});
  }
}

void BlockRecorder::forget(uint64_t id) {
  auto it = position_.find(id);
  if (it == position_.end()) return;
  ids_[it->second] = 0;
  position_.erase(it);
}

BlockGraph BlockRecorder::graph(const std::vector<bool>& saved) const {
  BlockGraph g = graph_;
  for (size_t i = 0; i < g.values.size(); ++i) g.values[i].saved = i < saved.size() && saved[i];
  return g;
}

const BlockPlan& BlockPlans::plan(const BlockGraph& graph) {
  const std::string key = graph.signature();
  auto it = index_.find(key);
  if (it == index_.end()) {
    const int64_t budget =
        share_ > 0 ? static_cast<int64_t>(share_ * static_cast<double>(graph.saved_bytes())) : budget_;
    solved_.push_back({graph, solve_block_plan(graph, budget, link_), 0});
    it = index_.emplace(key, solved_.size() - 1).first;
  }
  SolvedBlock& block = solved_[it->second];
  ++block.uses;
  return block.plan;
}

}  // namespace ht::schedule

#pragma once
// Records one block's forward as a BlockGraph (block_plan.h) while it runs, and keeps the plans
// solved for the blocks seen. The engine (memory/memory_manager.cpp, ids: its tensor records) and
// the planner's replay (planner/dtr_replay.cpp, ids: trace tensors) both record through it, so a
// block's plan is the same in the run and in its prediction.

#include "schedule/block_plan.h"

#include <cstdint>
#include <deque>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace ht::schedule {

class BlockRecorder {
 public:
  void clear();
  // A forward op of the block (views excepted): the values it read (their roots; ids the block did
  // not make are from outside it) and the ones it made (id, bytes), in its outputs' order.
  void op(const char* name, double cost_ms, const std::vector<uint64_t>& reads, const std::vector<std::pair<uint64_t, int64_t>>& made);
  // The value is gone before the block ended (its id may be given to another).
  void forget(uint64_t id);
  // The values made, in order; 0 where forgotten.
  const std::vector<uint64_t>& values() const { return ids_; }
  // The block's graph, saved[i] saying whether backward reads value i.
  BlockGraph graph(const std::vector<bool>& saved) const;

 private:
  BlockGraph graph_;
  std::vector<uint64_t> ids_;
  std::unordered_map<uint64_t, int> position_;
};

// A block's graph and the plan it was given; `uses`: the blocks (of every micro-batch) that ran it.
struct SolvedBlock {
  BlockGraph graph;
  BlockPlan plan;
  int64_t uses = 0;
};

// The plans of the blocks seen, by their graphs' signatures: blocks that repeat are solved once.
class BlockPlans {
 public:
  // Each block keeps `keep_budget_bytes`, or with a `share` in (0, 1], that share of what its
  // backward reads (BlockGraph::saved_bytes); with a `link` (on), it may offload to host too.
  explicit BlockPlans(int64_t keep_budget_bytes, double share = 0, BlockLink link = {})
      : budget_(keep_budget_bytes), share_(share), link_(link) {}
  // `graph`'s plan: per value, kept through forward, or offloaded (BlockPlan::keep, offload).
  const BlockPlan& plan(const BlockGraph& graph);
  const std::vector<bool>& keep(const BlockGraph& graph) { return plan(graph).keep; }
  int solved() const { return static_cast<int>(solved_.size()); }
  // Each distinct block solved, in the order first seen.
  const std::deque<SolvedBlock>& solved_blocks() const { return solved_; }

 private:
  int64_t budget_;
  double share_;
  BlockLink link_;
  std::unordered_map<std::string, size_t> index_;  // signature -> solved_
  std::deque<SolvedBlock> solved_;  // a deque: keep()'s references stay valid as blocks are added
};

}  // namespace ht::schedule

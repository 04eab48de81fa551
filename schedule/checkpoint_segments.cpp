#include "schedule/checkpoint_segments.h"

#include <algorithm>
#include <cmath>

namespace ht::schedule {

Schedule checkpoint_segments(const StepGraph& g, const std::vector<int>& block_starts) {
  const int ops = static_cast<int>(g.forward.size());
  const int blocks = static_cast<int>(block_starts.size());
  // Segment of each forward op: -1 outside any checkpointed segment (before the first block, in
  // the last segment, after the last block).
  std::vector<int> segment_of(static_cast<size_t>(ops), -1);
  if (blocks >= 2) {
    const int segments = static_cast<int>(std::ceil(std::sqrt(static_cast<double>(blocks))));
    const int per = (blocks + segments - 1) / segments;
    for (int j = 0; j + 1 < segments && (j + 1) * per < blocks; ++j) {
      const int begin = block_starts[static_cast<size_t>(j * per)];
      const int end = block_starts[static_cast<size_t>((j + 1) * per)];
      for (int k = begin; k < end; ++k) segment_of[static_cast<size_t>(k)] = j;
    }
  }
  const size_t n = g.values.size();
  Schedule s;
  s.keep.assign(n, 1);
  s.recompute.assign(g.backward.size(), {});
  s.free_after.assign(g.backward.size(), {});
  std::vector<char> dropped(n, 0);
  std::vector<int> free_at(n, -1);  // kept values: the stage after which nothing needs them
  for (size_t v = 0; v < n; ++v) {
    const Value& val = g.values[v];
    const int seg = segment_of[static_cast<size_t>(val.producer)];
    // What crosses the segment's end is its output: a checkpoint.
    const bool crosses = val.last_forward_use >= 0 && segment_of[static_cast<size_t>(val.last_forward_use)] != seg;
    if (seg >= 0 && val.droppable && !crosses) {
      s.keep[v] = 0;
      dropped[v] = 1;
    } else if (g.last_backward_read[v] < 0 && !crosses) {
      s.keep[v] = 0;  // nobody reads it in backward or recomputes from it: freed after its forward use
    } else {
      free_at[v] = g.last_backward_read[v];
    }
  }
  // Backward: the first stage of a segment recomputes all the segment dropped; every value is
  // freed after its last read (or, read by nobody, right after the recomputation), and a
  // checkpoint after the last recomputation that reads it.
  std::vector<char> segment_done(static_cast<size_t>(std::max(blocks, 1)), 0);
  for (size_t st = 0; st < g.backward.size(); ++st) {
    const int op = g.backward[st].forward_op;
    const int seg = op >= 0 ? segment_of[static_cast<size_t>(op)] : -1;
    if (seg < 0 || segment_done[static_cast<size_t>(seg)]) continue;
    segment_done[static_cast<size_t>(seg)] = 1;
    for (size_t v = 0; v < n; ++v) {
      if (!dropped[v] || segment_of[static_cast<size_t>(g.values[v].producer)] != seg) continue;
      s.recompute[st].push_back(static_cast<int>(v));
      const int last = g.last_backward_read[v];
      s.free_after[last > static_cast<int>(st) ? static_cast<size_t>(last) : st].push_back(static_cast<int>(v));
      for (int u : g.forward[static_cast<size_t>(g.values[v].producer)].inputs) {
        if (!dropped[static_cast<size_t>(u)]) free_at[static_cast<size_t>(u)] = std::max(free_at[static_cast<size_t>(u)], static_cast<int>(st));
      }
    }
  }
  for (size_t v = 0; v < n; ++v) {
    if (!dropped[v] && s.keep[v] && g.values[v].droppable && free_at[v] >= 0) {
      s.free_after[static_cast<size_t>(free_at[v])].push_back(static_cast<int>(v));
    }
  }
  return s;
}

}  // namespace ht::schedule

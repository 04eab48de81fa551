#pragma once
// What the planner's walks derive from a shared step (planner/step_trace.h) and keep on the
// profile for its last few traces: the step without the weights' casts, its fold. Found by the
// trace it came from; a hit moves to the back, the front goes first; made once where two threads
// asked for it at once.

#include "planner/step_trace.h"

#include <algorithm>
#include <cstddef>
#include <iterator>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace ht {

template <typename V>
using TraceDerived = std::vector<std::pair<SharedTrace, std::shared_ptr<const V>>>;

// `kept`'s entry for `trace`, else make() (outside `mutex`, which guards `kept`) kept beside it,
// at most `keep` entries in all.
template <typename V, typename Make>
std::shared_ptr<const V> derived_from(TraceDerived<V>& kept, std::mutex& mutex, const SharedTrace& trace,
                                      size_t keep, Make&& make) {
  auto find = [&]() -> std::shared_ptr<const V> {
    for (auto it = kept.begin(); it != kept.end(); ++it) {
      if (it->first != trace) continue;
      std::rotate(it, std::next(it), kept.end());
      return kept.back().second;
    }
    return nullptr;
  };
  {
    const std::lock_guard<std::mutex> lock(mutex);
    if (auto hit = find()) return hit;
  }
  std::shared_ptr<const V> made = std::make_shared<const V>(make());
  const std::lock_guard<std::mutex> lock(mutex);
  if (auto other = find()) return other;  // another thread made it meanwhile: one copy kept
  kept.emplace_back(trace, made);
  if (kept.size() > keep) kept.erase(kept.begin());
  return made;
}

}  // namespace ht

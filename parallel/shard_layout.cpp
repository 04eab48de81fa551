#include "parallel/shard_layout.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace ht {

std::vector<int64_t> even_counts(int64_t n, int ranks) {
  if (ranks < 1 || n < 0) {
    throw std::invalid_argument("even_counts: " + std::to_string(n) + " elements among " + std::to_string(ranks) +
                                " ranks");
  }
  std::vector<int64_t> counts(static_cast<size_t>(ranks), n / ranks);
  for (int64_t r = 0; r < n % ranks; ++r) ++counts[static_cast<size_t>(r)];
  return counts;
}

BucketShards shard_bucket(const std::vector<int64_t>& member_elements, int ranks) {
  BucketShards s;
  for (int64_t n : member_elements) {
    if (n < 0) throw std::invalid_argument("shard_bucket: a member of negative size");
    s.elements += n;
  }
  s.counts = even_counts(s.elements, ranks);
  s.pieces.resize(static_cast<size_t>(ranks));
  int64_t begin = 0;
  for (int r = 0; r < ranks; ++r) {
    s.begins.push_back(begin);
    begin += s.counts[static_cast<size_t>(r)];
  }
  // Walk the members once, cutting each where the ranks' ranges cut it.
  int64_t member_start = 0;
  int r = 0;
  for (size_t m = 0; m < member_elements.size(); ++m) {
    const int64_t member_end = member_start + member_elements[m];
    int64_t at = member_start;
    while (at < member_end) {
      while (s.begins[static_cast<size_t>(r)] + s.counts[static_cast<size_t>(r)] <= at) ++r;
      const int64_t range_end = s.begins[static_cast<size_t>(r)] + s.counts[static_cast<size_t>(r)];
      const int64_t end = std::min(member_end, range_end);
      s.pieces[static_cast<size_t>(r)].push_back(ShardPiece{m, at - member_start, end - at, at});
      at = end;
    }
    member_start = member_end;
  }
  return s;
}

}  // namespace ht

// The split of a bucket among data-parallel ranks (parallel/shard_layout.h): as even as possible,
// every element owned by exactly one rank, pieces cut where the ranks' ranges cut parameters.
#include "parallel/shard_layout.h"

#include <gtest/gtest.h>

#include <numeric>

namespace ht {
namespace {

TEST(ShardLayout, EvenCountsGiveTheRemainderToTheFirstRanks) {
  EXPECT_EQ(even_counts(10, 4), (std::vector<int64_t>{3, 3, 2, 2}));
  EXPECT_EQ(even_counts(12, 3), (std::vector<int64_t>{4, 4, 4}));
  EXPECT_EQ(even_counts(2, 3), (std::vector<int64_t>{1, 1, 0})) << "more ranks than elements: empty shards";
  EXPECT_EQ(even_counts(7, 1), (std::vector<int64_t>{7}));
  EXPECT_THROW(even_counts(5, 0), std::invalid_argument);
}

// Every element of every member is in exactly one piece, of the rank whose range holds it.
void expect_exact_cover(const BucketShards& s, const std::vector<int64_t>& members) {
  std::vector<std::vector<int>> owners;
  for (int64_t n : members) owners.emplace_back(static_cast<size_t>(n), -1);
  for (size_t r = 0; r < s.pieces.size(); ++r) {
    int64_t covered = 0;
    for (const ShardPiece& p : s.pieces[r]) {
      ASSERT_LT(p.member, members.size());
      ASSERT_GT(p.length, 0) << "no empty pieces";
      ASSERT_LE(p.offset + p.length, members[p.member]);
      EXPECT_GE(p.at, s.begins[r]);
      EXPECT_LE(p.at + p.length, s.begins[r] + s.counts[r]);
      for (int64_t i = p.offset; i < p.offset + p.length; ++i) {
        EXPECT_EQ(owners[p.member][static_cast<size_t>(i)], -1) << "owned twice";
        owners[p.member][static_cast<size_t>(i)] = static_cast<int>(r);
      }
      covered += p.length;
    }
    EXPECT_EQ(covered, s.counts[r]) << "rank " << r << "'s pieces fill its range";
  }
  for (const auto& member : owners)
    for (int owner : member) EXPECT_GE(owner, 0) << "an element nobody owns";
}

TEST(ShardLayout, RangesCutParametersIntoPieces) {
  const std::vector<int64_t> members{5, 2, 9};  // 16 elements: 6, 5, 5 among 3 ranks
  const BucketShards s = shard_bucket(members, 3);
  EXPECT_EQ(s.elements, 16);
  EXPECT_EQ(s.counts, (std::vector<int64_t>{6, 5, 5}));
  EXPECT_EQ(s.begins, (std::vector<int64_t>{0, 6, 11}));
  ASSERT_EQ(s.pieces[0].size(), 2u);  // all of member 0, the first element of member 1
  EXPECT_EQ(s.pieces[0][1].member, 1u);
  EXPECT_EQ(s.pieces[0][1].length, 1);
  ASSERT_EQ(s.pieces[1].size(), 2u);  // the rest of member 1, then member 2 from its start
  EXPECT_EQ(s.pieces[1][0].offset, 1);
  EXPECT_EQ(s.pieces[1][1].member, 2u);
  EXPECT_EQ(s.pieces[1][1].length, 4);
  ASSERT_EQ(s.pieces[2].size(), 1u);
  EXPECT_EQ(s.pieces[2][0].offset, 4);
  EXPECT_EQ(s.pieces[2][0].at, 11);
  expect_exact_cover(s, members);
}

TEST(ShardLayout, EveryRankCountAndShapeIsCoveredExactly) {
  const std::vector<std::vector<int64_t>> buckets{{1}, {3, 0, 4}, {100}, {7, 7, 7, 1}, {2, 1}, {}};
  for (int ranks = 1; ranks <= 5; ++ranks) {
    for (const auto& members : buckets) {
      SCOPED_TRACE("ranks " + std::to_string(ranks) + ", " + std::to_string(members.size()) + " members");
      const BucketShards s = shard_bucket(members, ranks);
      EXPECT_EQ(s.elements, std::accumulate(members.begin(), members.end(), int64_t{0}));
      expect_exact_cover(s, members);
    }
  }
}

TEST(ShardLayout, OneParameterAcrossSeveralRanks) {
  const BucketShards s = shard_bucket({10}, 4);  // 3, 3, 2, 2
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ(s.pieces[static_cast<size_t>(r)].size(), 1u);
    EXPECT_EQ(s.pieces[static_cast<size_t>(r)][0].offset, s.begins[static_cast<size_t>(r)]);
  }
}

}  // namespace
}  // namespace ht

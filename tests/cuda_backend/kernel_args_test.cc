// overlap_problem (cuda_backend/kernel_args.h): which overlaps of input and output the
// communicator accepts (disjoint, and each op's one in-place form) and which it refuses.
#include "cuda_backend/kernel_args.h"

#include <gtest/gtest.h>

#include <vector>

namespace exactcoll::cuda {
namespace {

TEST(OverlapProblem, DisjointAndEachOpsInPlaceFormPass) {
  std::vector<char> buf(4096);
  char* p = buf.data();
  for (const Op op : {Op::kAllReduce, Op::kReduceScatter, Op::kAllGather}) {
    EXPECT_EQ(overlap_problem(op, p, 256, p + 256, 256, 1), "");  // touching, not overlapping
    EXPECT_EQ(overlap_problem(op, p + 512, 256, p, 256, 1), "");
  }
  EXPECT_EQ(overlap_problem(Op::kAllReduce, p, 256, p, 256, 3), "");
  // 4 ranks: rank 2's reduce-scatter writes its block of 64 bytes of the 256-byte input in place.
  EXPECT_EQ(overlap_problem(Op::kReduceScatter, p, 256, p + 2 * 64, 64, 2), "");
  // 4 ranks: rank 3's all-gather input is its block of the 4 x 64-byte output.
  EXPECT_EQ(overlap_problem(Op::kAllGather, p + 3 * 64, 64, p, 256, 3), "");
}

TEST(OverlapProblem, PartialOverlapsAreNamed) {
  std::vector<char> buf(4096);
  char* p = buf.data();
  EXPECT_NE(overlap_problem(Op::kAllReduce, p, 256, p + 16, 256, 0).find("same buffer"), std::string::npos);
  EXPECT_NE(overlap_problem(Op::kAllReduce, p + 16, 256, p, 256, 0), "");
  // The right form for another rank is still wrong for this one.
  EXPECT_NE(overlap_problem(Op::kReduceScatter, p, 256, p + 64, 64, 2).find("this rank's block"), std::string::npos);
  EXPECT_NE(overlap_problem(Op::kReduceScatter, p, 256, p, 64, 1), "");
  EXPECT_NE(overlap_problem(Op::kAllGather, p, 64, p, 256, 1).find("this rank's block"), std::string::npos);
  EXPECT_NE(overlap_problem(Op::kAllGather, p + 3 * 64 + 16, 64, p, 256, 3), "");
}

}  // namespace
}  // namespace exactcoll::cuda

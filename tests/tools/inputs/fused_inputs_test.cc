// tools/inputs/fused_inputs.h: a rank's own x, a few rows of everyone's, and the whole problem
// agree bit for bit (bench checks sampled rows against the reference on that promise); the
// specials appear; different seeds give different problems.
#include "tools/inputs/fused_inputs.h"

#include <cstring>
#include <vector>

#include <gtest/gtest.h>

namespace exactcoll::gpu {
namespace {

TEST(FusedInputs, OwnRankAndRowSubsetsMatchTheWholeProblem) {
  for (DType dtype : {DType::kBF16, DType::kFP16, DType::kFP32}) {
    for (bool specials : {false, true}) {
      const int ranks = 3, rows = 37, hidden = 48;
      const size_t elem = static_cast<size_t>(dtype_size(dtype));
      const FusedInputs all = make_fused_inputs(dtype, ranks, rows, hidden, 9, specials);
      const FusedInputs mine = make_fused_inputs(dtype, ranks, rows, hidden, 9, specials, 1);
      EXPECT_TRUE(mine.x[0].empty());
      EXPECT_TRUE(mine.x[2].empty());
      EXPECT_EQ(mine.x[1], all.x[1]);
      EXPECT_EQ(mine.residual, all.residual);
      EXPECT_EQ(mine.weight, all.weight);
      const std::vector<int> picked = {0, 5, 36, 17};
      const FusedInputs some = make_fused_rows(dtype, ranks, hidden, 9, specials, picked);
      ASSERT_EQ(some.rows, 4);
      const size_t row_bytes = static_cast<size_t>(hidden) * elem;
      for (size_t k = 0; k < picked.size(); ++k) {
        const size_t at = static_cast<size_t>(picked[k]) * row_bytes;
        for (int r = 0; r < ranks; ++r) {
          EXPECT_EQ(std::memcmp(some.x[r].data() + k * row_bytes, all.x[r].data() + at, row_bytes), 0);
        }
        EXPECT_EQ(std::memcmp(some.residual.data() + k * row_bytes, all.residual.data() + at, row_bytes), 0);
      }
      EXPECT_EQ(some.weight, all.weight);
    }
  }
}

TEST(FusedInputs, SpecialsAppearAndSeedsDiffer) {
  const FusedInputs a = make_fused_inputs(DType::kBF16, 4, 200, 64, 3, true);  // seed % 3 == 0: weight specials
  const FusedInputs b = make_fused_inputs(DType::kBF16, 4, 200, 64, 4, true);
  EXPECT_NE(a.x[0], b.x[0]);
  auto count = [](const std::vector<uint8_t>& v, auto pred) {
    size_t n = 0;
    for (size_t i = 0; i + 1 < v.size(); i += 2) n += pred(static_cast<uint16_t>(v[i] | (v[i + 1] << 8)));
    return n;
  };
  auto is_nan = [](uint16_t h) { return (h & 0x7F80) == 0x7F80 && (h & 0x7F) != 0; };
  auto is_inf = [](uint16_t h) { return (h & 0x7FFF) == 0x7F80; };
  size_t nans = 0, infs = 0;
  for (const auto& x : a.x) {
    nans += count(x, is_nan);
    infs += count(x, is_inf);
  }
  EXPECT_GT(nans, 0u);
  EXPECT_GT(infs + count(a.residual, is_inf), 0u);
  EXPECT_EQ(count(a.weight, is_nan), 1u);
  EXPECT_EQ(count(a.weight, is_inf), 1u);
  // Without specials: every value finite.
  const FusedInputs plain = make_fused_inputs(DType::kBF16, 4, 50, 64, 3, false);
  for (const auto& x : plain.x) EXPECT_EQ(count(x, is_nan) + count(x, is_inf), 0u);
}

}  // namespace
}  // namespace exactcoll::gpu

// The contract travels with the library: this file is compiled with FMA contraction ON
// (-ffp-contract=fast -mfma, the flags a dependent might use), yet the C API's results are the
// contract's, because the core templates are compiled inside the library with the project's flags.
// It also checks that core/contract.h's host functions, compiled here under these flags, still do
// not contract (their products pass through canonicalize_nan's bit select).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/contract.h"
#include "exactcoll/exactcoll.h"
#include "sim/fused/random.h"
#include "sim/fused/reference.h"

namespace exactcoll {
namespace {

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// The sum of squares written the naive way, compiled here with contraction on: acc + v * v becomes
// an FMA. Same lanes and butterflies as the contract (docs/numerics.md section 6), fp32 pack 4.
float contracted_sum_squares(const float* v, int hidden) {
  const int np = hidden / 4;
  const int lanes = 32 * (((np < 1024 ? np : 1024) + 31) / 32);
  std::vector<float> lane(static_cast<size_t>(lanes), 0.0f);
  for (int l = 0; l < lanes; ++l) {
    float acc = 0.0f;
    for (int p = l; p < np; p += lanes) {
      for (int e = 0; e < 4; ++e) acc = acc + v[p * 4 + e] * v[p * 4 + e];
    }
    lane[static_cast<size_t>(l)] = acc;
  }
  auto butterfly = [](float* a) {
    for (int off = 16; off >= 1; off /= 2) {
      float next[32];
      for (int l = 0; l < 32; ++l) next[l] = a[l] + a[l ^ off];
      for (int l = 0; l < 32; ++l) a[l] = next[l];
    }
  };
  float groups[32] = {};
  for (int g = 0; g < lanes / 32; ++g) {
    butterfly(&lane[static_cast<size_t>(g) * 32]);
    groups[g] = lane[static_cast<size_t>(g) * 32];
  }
  butterfly(groups);
  return groups[0];
}

// x * x + y written plainly; its own function, so that no other use of x * x keeps the product.
__attribute__((noinline)) float naive_square_plus(float x, float y) { return x * x + y; }

TEST(Contraction, ThisFileIsCompiledWithContractionOn) {
  if (!__builtin_cpu_supports("fma")) GTEST_SKIP() << "no FMA instructions on this CPU";
  // a = 1 + 2^-12, c = 2^-24: unfused gives 1 + 2^-11 (two ties to even), fused 1 + 2^-11 + 2^-23.
  volatile float a = 1.0f + 0x1p-12f, c = 0x1p-24f;
  const float x = a, y = c;
  EXPECT_EQ(bits(naive_square_plus(x, y)), bits(1.0f + 0x1p-11f + 0x1p-23f)) << "the flags did not take effect";
  EXPECT_EQ(bits(contract::add(y, contract::mul(x, x))), bits(1.0f + 0x1p-11f)) << "core contracted under them";
}

TEST(Contraction, TheCApiKeepsTheContractUnderADependentsFlags) {
  if (!__builtin_cpu_supports("fma")) GTEST_SKIP() << "no FMA instructions on this CPU";
  constexpr int kRanks = 2, kRows = 64, kHidden = 2880;
  fused::SplitMix64 g(2026);
  std::vector<float> x(static_cast<size_t>(kRanks) * kRows * kHidden), residual(static_cast<size_t>(kRows) * kHidden),
      weight(kHidden);
  for (auto& v : x) v = g.normal();
  for (auto& v : residual) v = g.normal();
  for (auto& v : weight) v = g.normal();
  std::vector<float> ro(x.size()), out(x.size());
  ASSERT_EQ(exactcoll_sim_fused_add_rmsnorm(EXACTCOLL_FUSED_ONE_STAGE, EXACTCOLL_CONTRACT_CANONICAL, EXACTCOLL_FP32,
                                            kRanks, kRows, kHidden, 1e-6f, x.data(), residual.data(), weight.data(),
                                            ro.data(), out.data(), nullptr, nullptr),
            EXACTCOLL_OK)
      << exactcoll_last_error();
  // The reference (sim/fused/reference.cc, compiled with the project's flags, contraction off).
  std::vector<float> want_ro(residual.size()), want_out(residual.size());
  fused::FusedProblem<float> problem{kRanks, kRows, kHidden, 1e-6f, x.data(), residual.data(), weight.data()};
  fused::fused_reference<float>(fused::Contract::kCanonical, problem, want_ro.data(), want_out.data());
  EXPECT_EQ(std::memcmp(ro.data(), want_ro.data(), want_ro.size() * 4), 0);
  EXPECT_EQ(std::memcmp(out.data(), want_out.data(), want_out.size() * 4), 0);

  // These rows are ones where contraction matters: the naive sum of squares compiled here differs
  // from the contract's on some of them, while core/contract.h compiled here agrees on all.
  contract::RmsNormTree tree;
  ASSERT_TRUE(contract::make_rmsnorm_tree<float>(kHidden, &tree));
  int contracted_differs = 0;
  for (int row = 0; row < kRows; ++row) {
    const float* v = want_ro.data() + static_cast<size_t>(row) * kHidden;
    const float want = fused::reference_sum_squares(v, kHidden, 4);
    if (bits(contracted_sum_squares(v, kHidden)) != bits(want)) ++contracted_differs;
    EXPECT_EQ(bits(contract::sum_squares(tree, [&](int j) { return v[j]; })), bits(want)) << "row " << row;
  }
  EXPECT_GT(contracted_differs, 0) << "no row where contraction changes the sum of squares: the test proves nothing";
}

}  // namespace
}  // namespace exactcoll

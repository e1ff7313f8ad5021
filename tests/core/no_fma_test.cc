// The contract never fuses a multiply and an add (no FMA): contract::add(acc, contract::mul(a, b))
// is two roundings, and the RMSNorm sum of squares is built from such pairs. On inputs where the
// fused result differs from the unfused one, the contract must give the unfused one.
//
// Why it matters: nvcc contracts a*b + c into an FMA by default (-fmad=true) and the fused result
// differs from the unfused one in 6.3% of random inputs on H200 (../shared/facts/environment.md);
// host g++ contracts with -ffp-contract=fast when FMA instructions are enabled. The contract
// functions use __fmul_rn/__fadd_rn on the device and the host build passes -ffp-contract=off.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "core/contract.h"
#include "core/storage.h"
#include "gtest/gtest.h"
#include "tests/core/contract_test_support.h"

namespace exactcoll {
namespace {

using testing::bits_of;
using testing::Rng;

// Unfused a*b + c, whatever the compiler flags: the volatile store forces the product to be
// rounded to float before the add.
float unfused_multiply_add(float a, float b, float c) {
  volatile float product = a * b;
  return c + product;
}

// The crafted input: a = 1 + 2^-12, c = 2^-24.
//   a*a = 1 + 2^-11 + 2^-24 exactly; rounded to float that is a tie, to even: 1 + 2^-11.
//   unfused: 2^-24 + (1 + 2^-11) = 1 + 2^-11 + 2^-24, again a tie, to even: 1 + 2^-11.
//   fused:   2^-24 + (1 + 2^-11 + 2^-24) = 1 + 2^-11 + 2^-23, exact: one ulp higher.
constexpr float kA = 0x1.001p0f;  // 1 + 2^-12
constexpr float kC = 0x1p-24f;
constexpr float kUnfused = 0x1.002p0f;   // 1 + 2^-11
constexpr float kFused = 0x1.002002p0f;  // 1 + 2^-11 + 2^-23

// Returns x through a volatile load, so the compiler cannot fold the computation that uses it at
// compile time (folding would hide a contraction that the generated code performs).
float opaque(float x) {
  volatile float v = x;
  return v;
}

TEST(NoFma, CraftedInputSeparatesFusedFromUnfused) {
  const float a = opaque(kA), c = opaque(kC);
  ASSERT_EQ(unfused_multiply_add(a, a, c), kUnfused);
  ASSERT_EQ(std::fma(a, a, c), kFused);  // the input does discriminate
  EXPECT_EQ(contract::add(c, contract::mul(a, a)), kUnfused);
}

TEST(NoFma, LaneSumOfSquaresIsUnfused) {
  // fp32 storage (P = 4), H = 4: one pack, lane 0 sums 0 + (2^-12)^2 = 2^-24, then + a*a.
  contract::RmsNormTree tree;
  ASSERT_TRUE(contract::make_rmsnorm_tree<float>(4, &tree));
  const float row[4] = {opaque(0x1p-12f), opaque(kA), opaque(0.0f), opaque(0.0f)};
  const float lane0 = contract::lane_sum_squares(tree, 0, [&](int j) { return row[j]; });
  EXPECT_EQ(bits_of(lane0), bits_of(kUnfused));
  EXPECT_NE(bits_of(lane0), bits_of(kFused));
  // The tree adds only zeros from the other 31 lanes: ss is the lane value.
  EXPECT_EQ(contract::sum_squares(tree, [&](int j) { return row[j]; }), kUnfused);
}

// Random fp32 triples: the contract always equals the unfused result, and the fused one differs
// often enough that a contracted build could not pass.
TEST(NoFma, RandomTriplesAreUnfused) {
  const uint64_t seed = 777;
  std::printf("seed=%llu\n", static_cast<unsigned long long>(seed));
  Rng rng(seed);
  int contract_differs_from_unfused = 0;
  int fused_differs_from_unfused = 0;
  const int trials = 1 << 18;
  for (int i = 0; i < trials; ++i) {
    const float a = std::ldexp(1.0f + rng.unit(), static_cast<int>(rng.below(8)) - 4);
    const float b = std::ldexp(1.0f + rng.unit(), static_cast<int>(rng.below(8)) - 4);
    const float c = std::ldexp(1.0f + rng.unit(), static_cast<int>(rng.below(8)) - 4);
    const float unfused = unfused_multiply_add(a, b, c);
    contract_differs_from_unfused += bits_of(contract::add(c, contract::mul(a, b))) != bits_of(unfused);
    fused_differs_from_unfused += bits_of(std::fma(a, b, c)) != bits_of(unfused);
  }
  std::printf("fused != unfused in %.2f%% of %d triples\n", 100.0 * fused_differs_from_unfused / trials, trials);
  EXPECT_EQ(contract_differs_from_unfused, 0);
  EXPECT_GT(fused_differs_from_unfused, trials / 100);
}

// Reduces 32 * groups lane values as the canonical tree does (butterfly per group of 32, then over
// the group values padded with zeros).
float reduce_lanes(std::vector<float> lanes) {
  float group_values[32] = {};
  for (size_t g = 0; g < lanes.size() / 32; ++g) {
    contract::butterfly32(&lanes[g * 32]);
    group_values[g] = lanes[g * 32];
  }
  contract::butterfly32(group_values);
  return group_values[0];
}

// Random fp32 rows: every lane of the contract's tree and ss equal an unfused recomputation, and a
// fused computation of the same tree differs (in many lanes and in ss), so a contracted build of
// lane_sum_squares could not pass.
TEST(NoFma, RandomFp32RowsLaneByLane) {
  // H = 16384: 1024 lanes of 16 squares each (many lanes differ when fused, but ss is large and
  // absorbs those differences); H = 64: 16 lanes of 4 squares, where the fused ss differs in a good
  // share of rows.
  int rows_where_fused_ss_differs = 0;
  for (const int hidden : {16384, 64}) {
    contract::RmsNormTree tree;
    ASSERT_TRUE(contract::make_rmsnorm_tree<float>(hidden, &tree));
    const uint64_t rows = hidden == 64 ? 200 : 3;
    for (uint64_t seed = 31337; seed < 31337 + rows; ++seed) {
      SCOPED_TRACE(::testing::Message() << "H " << hidden << " seed " << seed);
      Rng rng(seed);
      std::vector<float> row(hidden);
      for (float& x : row) x = std::ldexp(1.0f + rng.unit(), static_cast<int>(rng.below(8)) - 4);
      const auto widen = [&](int j) { return row[j]; };
      std::vector<float> unfused(tree.lanes, 0.0f), fused(tree.lanes, 0.0f);
      int contract_mismatches = 0, fused_differs = 0;
      for (int lane = 0; lane < tree.lanes; ++lane) {
        for (int p = lane; p < tree.num_packs; p += tree.lanes) {
          for (int e = 0; e < 4; ++e) {
            unfused[lane] = unfused_multiply_add(row[p * 4 + e], row[p * 4 + e], unfused[lane]);
            fused[lane] = std::fma(row[p * 4 + e], row[p * 4 + e], fused[lane]);
          }
        }
        contract_mismatches += bits_of(contract::lane_sum_squares(tree, lane, widen)) != bits_of(unfused[lane]);
        fused_differs += bits_of(fused[lane]) != bits_of(unfused[lane]);
      }
      ASSERT_EQ(contract_mismatches, 0);
      if (hidden == 16384) {
        EXPECT_GT(fused_differs, tree.lanes / 10);
      }
      const float unfused_ss = reduce_lanes(unfused);
      ASSERT_EQ(bits_of(contract::sum_squares(tree, widen)), bits_of(unfused_ss));
      rows_where_fused_ss_differs += bits_of(reduce_lanes(fused)) != bits_of(unfused_ss);
    }
  }
  std::printf("fused ss differs in %d of 203 rows\n", rows_where_fused_ss_differs);
  EXPECT_GT(rows_where_fused_ss_differs, 10);
}

// Why the 16-bit types are less exposed: a bf16 or fp16 value has at most 11 significant bits, so
// its square (at most 22 bits) is exact in fp32 unless it overflows or underflows; there a fused
// and an unfused sum of squares agree. Only fp32 rows (and underflowing squares) can tell them
// apart, which is why the checks above use fp32 rows.
TEST(NoFma, SixteenBitSquaresAreExactInFloat) {
  int inexact = 0, checked = 0;
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    for (int type = 0; type < 2; ++type) {
      const float x =
          type == 0 ? bf16_bits_to_float(static_cast<uint16_t>(h)) : fp16_bits_to_float(static_cast<uint16_t>(h));
      const float square = contract::mul(x, x);
      if (!std::isfinite(square) || (square != 0 && std::fabs(square) < 0x1p-126f) || (square == 0 && x != 0)) continue;
      ++checked;
      inexact += static_cast<double>(square) != static_cast<double>(x) * static_cast<double>(x);
    }
  }
  EXPECT_EQ(inexact, 0);
  EXPECT_GT(checked, 60000);
}

}  // namespace
}  // namespace exactcoll

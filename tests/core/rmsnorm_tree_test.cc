// The rounding contract of core/contract.h against independent transcriptions of issue 2's text:
//   - the canonical RMSNorm tree shape (pack, lanes, groups) for many H and every storage type;
//   - contract::sum_squares / rmsnorm_inverse / rmsnorm_row bit for bit against a scalar
//     transcription written here (explicit lane array, explicit butterfly on a copy of the previous
//     values), for random rows and special rows;
//   - rmsnorm_row against a float64 RMSNorm within a derived error bound;
//   - the all-reduce fold (n = 1..16), the residual add and NaN canonicalization of fp32 results.
// The transcriptions widen and narrow through tests/core/reference_conversions.h, not core.
#include <algorithm>
#include <array>
#include <cfloat>
#include <cinttypes>
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
using testing::canonical_bits;
using testing::float_of;
using testing::random_storage;
using testing::RefStorage;
using testing::Rng;
using testing::storage_ulp;

// ---- the scalar transcription of issue 2 ---------------------------------------------------------

// Issue 2, "canonical RMSNorm": every step as the text says it, nothing shared with core/contract.h.
template <class T>
struct ScalarRmsNorm {
  int pack = 0, num_packs = 0, lanes = 0;
  std::vector<float> lane_values;  // acc_l after the pack loop
  float ss = 0, inv = 0;
  std::vector<uint32_t> y_bits;
};

// Returns a[0] after "for off in 16, 8, 4, 2, 1: every lane l takes a_l + a_(l xor off) from the
// previous values".
float scalar_butterfly(std::array<float, 32> a) {
  for (int off : {16, 8, 4, 2, 1}) {
    const std::array<float, 32> previous = a;
    for (int l = 0; l < 32; ++l) a[l] = previous[l] + previous[l ^ off];
  }
  return a[0];
}

template <class T>
ScalarRmsNorm<T> scalar_rmsnorm(const std::vector<T>& row, const std::vector<T>& weight, float eps) {
  ScalarRmsNorm<T> out;
  const int hidden = static_cast<int>(row.size());
  std::vector<float> v(hidden);
  for (int j = 0; j < hidden; ++j) v[j] = RefStorage<T>::widen(row[j]);
  // 1. pack P = 16 bytes / sizeof(storage); np = H / P.
  out.pack = 16 / static_cast<int>(sizeof(T));
  out.num_packs = hidden / out.pack;
  // 2. lanes L = 32 * ceil(min(np, 1024) / 32).
  out.lanes = 32 * static_cast<int>(std::ceil(std::min(out.num_packs, 1024) / 32.0));
  // 3. lane l: acc = 0; packs p = l, l+L, ...; elements in order; product rounded, then sum rounded.
  out.lane_values.assign(out.lanes, 0.0f);
  for (int l = 0; l < out.lanes; ++l) {
    for (int p = l; p < out.num_packs; p += out.lanes) {
      for (int e = 0; e < out.pack; ++e) {
        const float square = v[p * out.pack + e] * v[p * out.pack + e];
        out.lane_values[l] = out.lane_values[l] + square;
      }
    }
  }
  // 4. butterfly within each group of 32 lanes; the group's value is lane 0's result.
  // 5. the L/32 group values, padded with 0.0f to 32, get the same butterfly.
  std::array<float, 32> group_values{};  // zeros
  for (int g = 0; g < out.lanes / 32; ++g) {
    std::array<float, 32> lanes;
    for (int l = 0; l < 32; ++l) lanes[l] = out.lane_values[g * 32 + l];
    group_values[g] = scalar_butterfly(lanes);
  }
  out.ss = scalar_butterfly(group_values);
  // 6. mean = ss / float(H); inv = 1 / sqrtf(mean + eps); y_j = round((v_j * inv) * float(w_j)).
  const float mean = out.ss / static_cast<float>(hidden);
  out.inv = 1.0f / std::sqrt(mean + eps);
  out.y_bits.resize(hidden);
  for (int j = 0; j < hidden; ++j) {
    const float scaled = v[j] * out.inv;
    const float weighted = scaled * RefStorage<T>::widen(weight[j]);
    out.y_bits[j] = RefStorage<T>::bits(RefStorage<T>::narrow(weighted));  // fp32: NaN -> 0x7FFFFFFF
  }
  return out;
}

// Returns how many of the row's outputs differ; prints the first few.
template <class T>
int count_output_mismatches(const std::vector<T>& got, const std::vector<uint32_t>& want_bits) {
  int mismatches = 0;
  for (size_t j = 0; j < got.size(); ++j) {
    if (RefStorage<T>::bits(got[j]) != want_bits[j] && ++mismatches <= 5) {
      std::printf("  y[%zu]: contract 0x%08" PRIx32 ", scalar 0x%08" PRIx32 "\n", j, RefStorage<T>::bits(got[j]),
                  want_bits[j]);
    }
  }
  return mismatches;
}

// Runs the contract on one row and compares every intermediate with the scalar transcription.
template <class T>
void expect_contract_equals_scalar(const std::vector<T>& row, const std::vector<T>& weight, float eps) {
  const int hidden = static_cast<int>(row.size());
  contract::RmsNormTree tree;
  ASSERT_TRUE(contract::make_rmsnorm_tree<T>(hidden, &tree));
  const ScalarRmsNorm<T> want = scalar_rmsnorm(row, weight, eps);
  ASSERT_EQ(tree.lanes, want.lanes);
  const auto widen_row = [&](int j) { return to_float(row[j]); };
  int lane_mismatches = 0;
  for (int l = 0; l < tree.lanes; ++l) {
    lane_mismatches +=
        canonical_bits(contract::lane_sum_squares(tree, l, widen_row)) != canonical_bits(want.lane_values[l]);
  }
  EXPECT_EQ(lane_mismatches, 0);
  const float ss = contract::sum_squares(tree, widen_row);
  EXPECT_EQ(bits_of(ss), canonical_bits(want.ss)) << "ss " << ss << " vs " << want.ss;
  const float inv = contract::rmsnorm_inverse(ss, hidden, eps);
  EXPECT_EQ(bits_of(inv), canonical_bits(want.inv)) << "inv " << inv << " vs " << want.inv;
  std::vector<T> out(hidden);
  contract::rmsnorm_row<T>(tree, row.data(), weight.data(), eps, out.data());
  EXPECT_EQ(count_output_mismatches(out, want.y_bits), 0);
}

// ---- typed test fixture -----------------------------------------------------------------------------

template <class T>
class ContractTest : public ::testing::Test {};
using StorageTypes = ::testing::Types<bf16, fp16, float>;
TYPED_TEST_SUITE(ContractTest, StorageTypes);

// ---- tree shape --------------------------------------------------------------------------------------

struct TreeCase {
  int hidden, num_packs, lanes, groups;
};

// Worked by hand from the issue text (P = 8 for bf16/fp16, 4 for fp32).
TEST(RmsNormTreeShape, HandWorkedCases16Bit) {
  const TreeCase cases[] = {
      {8, 1, 32, 1},          {256, 32, 32, 1},        {264, 33, 64, 2},        {2880, 360, 384, 12},
      {4096, 512, 512, 16},   {5120, 640, 640, 20},    {7168, 896, 896, 28},    {8192, 1024, 1024, 32},
      {8200, 1025, 1024, 32}, {16384, 2048, 1024, 32}, {65536, 8192, 1024, 32},
  };
  for (const TreeCase& c : cases) {
    SCOPED_TRACE(c.hidden);
    for (int type = 0; type < 2; ++type) {
      contract::RmsNormTree tree;
      const bool ok = type == 0 ? contract::make_rmsnorm_tree<bf16>(c.hidden, &tree)
                                : contract::make_rmsnorm_tree<fp16>(c.hidden, &tree);
      ASSERT_TRUE(ok);
      EXPECT_EQ(tree.hidden, c.hidden);
      EXPECT_EQ(tree.pack, 8);
      EXPECT_EQ(tree.num_packs, c.num_packs);
      EXPECT_EQ(tree.lanes, c.lanes);
      EXPECT_EQ(tree.groups, c.groups);
    }
  }
}

TEST(RmsNormTreeShape, HandWorkedCasesFp32) {
  const TreeCase cases[] = {
      {4, 1, 32, 1},          {2880, 720, 736, 23},   {4096, 1024, 1024, 32},  {5120, 1280, 1024, 32},
      {7168, 1792, 1024, 32}, {8192, 2048, 1024, 32}, {16384, 4096, 1024, 32},
  };
  for (const TreeCase& c : cases) {
    SCOPED_TRACE(c.hidden);
    contract::RmsNormTree tree;
    ASSERT_TRUE(contract::make_rmsnorm_tree<float>(c.hidden, &tree));
    EXPECT_EQ(tree.pack, 4);
    EXPECT_EQ(tree.num_packs, c.num_packs);
    EXPECT_EQ(tree.lanes, c.lanes);
    EXPECT_EQ(tree.groups, c.groups);
  }
}

// Every H in 1..40000: accepted iff a positive multiple of the pack; lanes the smallest multiple of
// 32 covering min(np, 1024) (found by counting up, not by the ceil formula).
TYPED_TEST(ContractTest, TreeShapeForEveryHiddenSize) {
  using T = TypeParam;
  const int pack = RefStorage<T>::kPack;
  int wrong = 0;
  for (int hidden = -8; hidden <= 40000; ++hidden) {
    contract::RmsNormTree tree;
    const bool ok = contract::make_rmsnorm_tree<T>(hidden, &tree);
    const bool want_ok = hidden > 0 && hidden % pack == 0;
    if (ok != want_ok) {
      if (++wrong <= 5) std::printf("H=%d: accepted=%d\n", hidden, ok);
      continue;
    }
    if (!ok) continue;
    const int num_packs = hidden / pack;
    int lanes = 32;
    while (lanes < num_packs && lanes < 1024) lanes += 32;
    if (tree.num_packs != num_packs || tree.lanes != lanes || tree.groups * 32 != lanes || tree.pack != pack ||
        tree.hidden != hidden) {
      if (++wrong <= 5)
        std::printf("H=%d: np=%d lanes=%d groups=%d\n", hidden, tree.num_packs, tree.lanes, tree.groups);
    }
  }
  EXPECT_EQ(wrong, 0);
}

// ---- RMSNorm bit for bit against the scalar transcription -----------------------------------------

template <class T>
std::vector<int> hidden_sizes_for() {
  if (RefStorage<T>::kPack == 8) return {8, 64, 2880, 4096, 5120, 7168, 8192, 8200, 16384, 65536};
  return {4, 2880, 4096, 7168, 8192, 16384};
}

constexpr uint64_t kSeeds[] = {1, 20261121, 0xC0FFEE};

template <class T>
void fill_random_row(uint64_t seed, int hidden, std::vector<T>* row, std::vector<T>* weight) {
  Rng rng(seed * 1000003u + static_cast<uint64_t>(hidden));
  row->resize(hidden);
  weight->resize(hidden);
  // Values spanning 2^-8 .. 2^5 so that summation order changes low bits of ss; a few zeros.
  for (int j = 0; j < hidden; ++j) {
    (*row)[j] = rng.below(64) == 0 ? RefStorage<T>::narrow(0.0f) : random_storage<T>(rng, -8, 4);
    (*weight)[j] = RefStorage<T>::narrow(0.5f + 1.5f * rng.unit());
  }
}

TYPED_TEST(ContractTest, RandomRowsMatchScalarTranscriptionBitForBit) {
  using T = TypeParam;
  for (int hidden : hidden_sizes_for<T>()) {
    for (uint64_t seed : kSeeds) {
      std::printf("%s H=%d seed=%" PRIu64 "\n", RefStorage<T>::kName, hidden, seed);
      SCOPED_TRACE(::testing::Message() << RefStorage<T>::kName << " H=" << hidden << " seed=" << seed);
      std::vector<T> row, weight;
      fill_random_row(seed, hidden, &row, &weight);
      expect_contract_equals_scalar(row, weight, 1e-6f);
    }
  }
}

// The bit-for-bit comparison is sensitive to the tree: a plain left-to-right sum of the same
// squares (a different tree) gives a different ss for these rows. Were it not so, the test above
// could not tell trees apart.
TYPED_TEST(ContractTest, ComparisonDistinguishesTrees) {
  using T = TypeParam;
  int rows_where_order_matters = 0;
  for (uint64_t seed : kSeeds) {
    std::vector<T> row, weight;
    fill_random_row(seed, 4096, &row, &weight);
    contract::RmsNormTree tree;
    ASSERT_TRUE(contract::make_rmsnorm_tree<T>(4096, &tree));
    const float ss = contract::sum_squares(tree, [&](int j) { return to_float(row[j]); });
    float sequential = 0.0f;
    for (const T& x : row) sequential = sequential + RefStorage<T>::widen(x) * RefStorage<T>::widen(x);
    rows_where_order_matters += bits_of(ss) != bits_of(sequential);
  }
  EXPECT_GT(rows_where_order_matters, 0);
}

// ---- special rows --------------------------------------------------------------------------------

template <class T>
std::vector<T> filled(int hidden, float value) {
  return std::vector<T>(hidden, RefStorage<T>::narrow(value));
}

template <class T>
uint32_t storage_nan_bits() {
  return sizeof(T) == 2 ? 0x7FFFu : 0x7FFFFFFFu;
}

TYPED_TEST(ContractTest, ZeroRowGivesSignedZeros) {
  using T = TypeParam;
  const int hidden = 4096;
  std::vector<T> row = filled<T>(hidden, 0.0f);
  for (int j = 0; j < hidden; j += 3) row[j] = RefStorage<T>::narrow(-0.0f);
  const std::vector<T> weight = filled<T>(hidden, 1.5f);
  expect_contract_equals_scalar(row, weight, 1e-6f);
  contract::RmsNormTree tree;
  ASSERT_TRUE(contract::make_rmsnorm_tree<T>(hidden, &tree));
  std::vector<T> out(hidden);
  contract::rmsnorm_row<T>(tree, row.data(), weight.data(), 1e-6f, out.data());
  for (int j = 0; j < hidden; ++j) {
    ASSERT_EQ(bits_of(to_float(out[j])), j % 3 == 0 ? 0x80000000u : 0u) << j;
  }
}

TYPED_TEST(ContractTest, ZeroRowWithZeroEpsIsNaN) {
  // ss = 0, eps = 0: inv = 1/sqrt(0) = inf, y = 0 * inf = NaN -> the storage NaN everywhere.
  using T = TypeParam;
  const int hidden = 2880;
  const std::vector<T> row = filled<T>(hidden, 0.0f), weight = filled<T>(hidden, 1.0f);
  expect_contract_equals_scalar(row, weight, 0.0f);
  contract::RmsNormTree tree;
  ASSERT_TRUE(contract::make_rmsnorm_tree<T>(hidden, &tree));
  std::vector<T> out(hidden);
  contract::rmsnorm_row<T>(tree, row.data(), weight.data(), 0.0f, out.data());
  for (const T& y : out) ASSERT_EQ(RefStorage<T>::bits(y), storage_nan_bits<T>());
}

TYPED_TEST(ContractTest, HugeValuesOverflowSumOfSquares) {
  using T = TypeParam;
  const int hidden = 8192;
  // bf16/fp32: 2^100 squared overflows fp32, so ss = inf, inv = 0 and every y is a signed zero.
  // fp16 cannot overflow ss (65504^2 * 16384 < FLT_MAX): its largest values just go through.
  const float huge = sizeof(T) == 2 && RefStorage<T>::kMantissaBits == 10 ? 65504.0f : 0x1p100f;
  std::vector<T> row = filled<T>(hidden, huge);
  for (int j = 1; j < hidden; j += 2) row[j] = RefStorage<T>::narrow(-huge);
  const std::vector<T> weight = filled<T>(hidden, 1.0f);
  expect_contract_equals_scalar(row, weight, 1e-6f);
  contract::RmsNormTree tree;
  ASSERT_TRUE(contract::make_rmsnorm_tree<T>(hidden, &tree));
  const float ss = contract::sum_squares(tree, [&](int j) { return to_float(row[j]); });
  if (huge == 65504.0f) {
    EXPECT_TRUE(std::isfinite(ss));
    return;
  }
  EXPECT_EQ(bits_of(ss), 0x7F800000u);
  std::vector<T> out(hidden);
  contract::rmsnorm_row<T>(tree, row.data(), weight.data(), 1e-6f, out.data());
  for (int j = 0; j < hidden; ++j) ASSERT_EQ(bits_of(to_float(out[j])), j % 2 ? 0x80000000u : 0u) << j;
}

TYPED_TEST(ContractTest, NaNElementMakesWholeRowCanonicalNaN) {
  using T = TypeParam;
  const int hidden = 7168;
  std::vector<T> row, weight;
  fill_random_row(7, hidden, &row, &weight);
  // A NaN with sign and payload: 0xFFC1 for 16-bit, 0xFFC01234 for fp32.
  row[1234] =
      RefStorage<T>::from_bits(sizeof(T) == 2 ? (RefStorage<T>::kMantissaBits == 7 ? 0xFFC1u : 0xFE01u) : 0xFFC01234u);
  expect_contract_equals_scalar(row, weight, 1e-6f);
  contract::RmsNormTree tree;
  ASSERT_TRUE(contract::make_rmsnorm_tree<T>(hidden, &tree));
  const float ss = contract::sum_squares(tree, [&](int j) { return to_float(row[j]); });
  EXPECT_EQ(bits_of(ss), 0x7FFFFFFFu);
  std::vector<T> out(hidden);
  contract::rmsnorm_row<T>(tree, row.data(), weight.data(), 1e-6f, out.data());
  for (const T& y : out) ASSERT_EQ(RefStorage<T>::bits(y), storage_nan_bits<T>());
}

TYPED_TEST(ContractTest, InfElementGivesNaNThereAndZerosElsewhere) {
  using T = TypeParam;
  const int hidden = 4096;
  std::vector<T> row = filled<T>(hidden, 1.0f);
  row[100] = RefStorage<T>::narrow(-INFINITY);
  const std::vector<T> weight = filled<T>(hidden, 1.0f);
  expect_contract_equals_scalar(row, weight, 1e-6f);
  contract::RmsNormTree tree;
  ASSERT_TRUE(contract::make_rmsnorm_tree<T>(hidden, &tree));
  std::vector<T> out(hidden);
  contract::rmsnorm_row<T>(tree, row.data(), weight.data(), 1e-6f, out.data());
  for (int j = 0; j < hidden; ++j) {
    ASSERT_EQ(RefStorage<T>::bits(out[j]), j == 100 ? storage_nan_bits<T>() : 0u) << j;  // inf*0, 1*0
  }
}

TYPED_TEST(ContractTest, SubnormalRowsMatchScalar) {
  using T = TypeParam;
  // Storage subnormals: bf16/fp32 squares underflow to 0 (ss = 0, eps decides); fp16 squares are
  // normal floats. Mixed with a few normal values in a second row.
  for (int hidden : {2880, 16384}) {
    Rng rng(99 + hidden);
    std::vector<T> row(hidden), weight = filled<T>(hidden, 1.0f);
    const uint32_t max_subnormal = sizeof(T) == 2 ? (RefStorage<T>::kMantissaBits == 7 ? 0x7Fu : 0x3FFu) : 0x7FFFFFu;
    for (int j = 0; j < hidden; ++j) {
      uint32_t bits = 1 + rng.below(max_subnormal);
      if (rng.below(2)) bits |= sizeof(T) == 2 ? 0x8000u : 0x80000000u;
      row[j] = RefStorage<T>::from_bits(bits);
    }
    expect_contract_equals_scalar(row, weight, 1e-6f);
    expect_contract_equals_scalar(row, weight, 0.0f);
    for (int j = 0; j < hidden; j += 97) row[j] = random_storage<T>(rng, -3, 3);
    expect_contract_equals_scalar(row, weight, 1e-6f);
  }
}

// ---- against float64 ---------------------------------------------------------------------------------
// Bound: every fp32 operation rounds to nearest, relative error <= u = 2^-24 (no underflow in these
// rows). ss is a tree of nonnegative terms: one rounded product, then at most k = ceil(np/L)*P lane
// adds and 5 + 5 butterfly adds along any path, so |ss - ss64| <= (k + 11) u ss64 (to first order).
// mean (/H) and + eps add u each; sqrt halves the relative error and adds u; 1/x adds u; the two
// products add u each: the fp32 y before the final rounding is within
//   e = ((k + 13) / 2 + 4) u   (with 1% slack for second-order terms)
// of the exact value. The final rounding to storage adds at most half a storage ulp. So
//   |y - y64| <= 0.5 ulp_T(max(|y|, |y64|)) + e |y64|.
// For bf16 at H = 16384, e ~ 2^-20: the bound is essentially half a bf16 ulp.
TYPED_TEST(ContractTest, RandomRowsWithinBoundOfFloat64) {
  using T = TypeParam;
  for (int hidden : hidden_sizes_for<T>()) {
    contract::RmsNormTree tree;
    ASSERT_TRUE(contract::make_rmsnorm_tree<T>(hidden, &tree));
    const int adds_per_lane = (tree.num_packs + tree.lanes - 1) / tree.lanes * tree.pack;
    const double fp32_relative = ((adds_per_lane + 13) / 2.0 + 4) * 0x1p-24 * 1.01;
    double worst_in_ulps = 0;
    int out_of_bound = 0;
    for (uint64_t seed : kSeeds) {
      std::vector<T> row, weight;
      fill_random_row(seed, hidden, &row, &weight);
      const float eps = 1e-6f;
      std::vector<T> out(hidden);
      contract::rmsnorm_row<T>(tree, row.data(), weight.data(), eps, out.data());
      double ss64 = 0;
      for (const T& x : row) ss64 += static_cast<double>(RefStorage<T>::widen(x)) * RefStorage<T>::widen(x);
      const double inv64 = 1.0 / std::sqrt(ss64 / hidden + static_cast<double>(eps));
      for (int j = 0; j < hidden; ++j) {
        const double y64 = RefStorage<T>::widen(row[j]) * inv64 * RefStorage<T>::widen(weight[j]);
        const double y = RefStorage<T>::widen(out[j]);
        const double ulp = storage_ulp<T>(std::max(std::fabs(y), std::fabs(y64)));
        const double error = std::fabs(y - y64);
        worst_in_ulps = std::max(worst_in_ulps, error / ulp);
        if (error > 0.5 * ulp + fp32_relative * std::fabs(y64) && ++out_of_bound <= 5) {
          std::printf("  H=%d seed=%" PRIu64 " y[%d] = %.9g, float64 %.17g\n", hidden, seed, j, y, y64);
        }
      }
    }
    std::printf("%s H=%d: worst |y - y64| = %.4f storage ulp (bound 0.5 ulp + %.3g relative)\n", RefStorage<T>::kName,
                hidden, worst_in_ulps, fp32_relative);
    EXPECT_EQ(out_of_bound, 0) << "H=" << hidden;
  }
}

// ---- all-reduce fold -----------------------------------------------------------------------------

// Issue 2: acc = float(x_0); acc = acc + float(x_r) for r = 1..n-1 in rank order; one rounding.
template <class T>
uint32_t scalar_fold_bits(const std::vector<T>& x) {
  float acc = RefStorage<T>::widen(x[0]);
  for (size_t r = 1; r < x.size(); ++r) acc = acc + RefStorage<T>::widen(x[r]);
  return RefStorage<T>::bits(RefStorage<T>::narrow(acc));
}

template <class T>
T random_fold_input(Rng& rng) {
  switch (rng.below(40)) {
    case 0: return RefStorage<T>::narrow(INFINITY);
    case 1: return RefStorage<T>::narrow(-INFINITY);
    case 2: return RefStorage<T>::from_bits(sizeof(T) == 2 ? 0xFFC1u : 0xFFC01234u);  // NaN with sign/payload
    case 3: return RefStorage<T>::narrow(RefStorage<T>::kMantissaBits == 10 ? 60000.0f : 0x1.8p127f);
    default: return random_storage<T>(rng, -12, 12);
  }
}

TYPED_TEST(ContractTest, FoldMatchesScalarForOneToSixteenRanks) {
  using T = TypeParam;
  for (int n = 1; n <= 16; ++n) {
    const uint64_t seed = 500 + n;
    Rng rng(seed);
    int mismatches = 0;
    for (int trial = 0; trial < 20000; ++trial) {
      std::vector<T> x(n);
      for (T& value : x) value = random_fold_input<T>(rng);
      const T got = contract::fold<T>(n, [&](int r) { return x[r]; });
      const uint32_t want = scalar_fold_bits(x);
      if (RefStorage<T>::bits(got) != want && ++mismatches <= 5) {
        std::printf("  n=%d seed=%" PRIu64 " trial %d: contract 0x%08" PRIx32 ", scalar 0x%08" PRIx32 "\n", n, seed,
                    trial, RefStorage<T>::bits(got), want);
      }
    }
    EXPECT_EQ(mismatches, 0) << "n=" << n << " seed=" << seed;
  }
}

TEST(Fold, RankOrderAndOneRoundingNamedCases) {
  // fp32, left fold in rank order: (1 + 2^-24) + 2^-24 = 1 (two ties to even); the reverse order
  // would give 1 + 2^-23.
  const float fp32_ranks[] = {1.0f, 0x1p-24f, 0x1p-24f};
  EXPECT_EQ(contract::fold<float>(3, [&](int r) { return fp32_ranks[r]; }), 1.0f);
  const float fp32_reversed[] = {0x1p-24f, 0x1p-24f, 1.0f};
  EXPECT_EQ(contract::fold<float>(3, [&](int r) { return fp32_reversed[r]; }), 0x1.000002p0f);
  // bf16: fp32 accumulation, one rounding: 1 + 2^-8 + 2^-8 = 1 + 2^-7 exactly -> 0x3F81.
  // Rounding to bf16 after each add (accumulating in storage) would give 1.0 (0x3F80) twice.
  const bf16 bf16_ranks[] = {bf16{0x3F80}, bf16{0x3B80}, bf16{0x3B80}};  // 1, 2^-8, 2^-8
  EXPECT_EQ(contract::fold<bf16>(3, [&](int r) { return bf16_ranks[r]; }).bits, 0x3F81);
  // fp16: 65504 + 16 = 65520 would be inf if rounded there; the fold rounds once, at the end:
  // 65504 + 16 - 32 = 65488, a tie between 65472 (0x7BFE, even) and 65504 -> 0x7BFE.
  const fp16 fp16_ranks[] = {fp16{0x7BFF}, fp16{0x4C00}, fp16{0xD000}};  // 65504, 16, -32
  EXPECT_EQ(contract::fold<fp16>(3, [&](int r) { return fp16_ranks[r]; }).bits, 0x7BFE);
  EXPECT_EQ(contract::fold<fp16>(2, [&](int r) { return fp16_ranks[r]; }).bits, 0x7C00);
  // One rank: the value itself; fp32 NaN payloads are canonicalized even with no arithmetic.
  const float nan_rank[] = {float_of(0xFFC01234u)};
  EXPECT_EQ(bits_of(contract::fold<float>(1, [&](int r) { return nan_rank[r]; })), 0x7FFFFFFFu);
  const bf16 nan_bf16[] = {bf16{0xFFC1}};
  EXPECT_EQ(contract::fold<bf16>(1, [&](int r) { return nan_bf16[r]; }).bits, 0x7FFF);
  // inf + -inf: x86 gives 0xFFC00000, the contract (and the GPU) 0x7FFFFFFF.
  const float infs[] = {INFINITY, -INFINITY};
  EXPECT_EQ(bits_of(contract::fold<float>(2, [&](int r) { return infs[r]; })), 0x7FFFFFFFu);
}

// ---- residual add ------------------------------------------------------------------------------------

TYPED_TEST(ContractTest, ResidualAddMatchesScalar) {
  using T = TypeParam;
  Rng rng(4242);
  int mismatches = 0;
  for (int trial = 0; trial < 1 << 18; ++trial) {
    const T s = random_fold_input<T>(rng);
    const T residual = random_fold_input<T>(rng);
    const uint32_t want =
        RefStorage<T>::bits(RefStorage<T>::narrow(RefStorage<T>::widen(s) + RefStorage<T>::widen(residual)));
    const uint32_t got = RefStorage<T>::bits(contract::residual_add<T>(s, residual));
    if (got != want && ++mismatches <= 5) {
      std::printf("  trial %d: contract 0x%08" PRIx32 ", scalar 0x%08" PRIx32 "\n", trial, got, want);
    }
  }
  EXPECT_EQ(mismatches, 0) << "seed 4242";
}

TEST(ResidualAdd, NamedCases) {
  EXPECT_EQ(contract::residual_add<bf16>(bf16{0x3F80}, bf16{0x3B80}).bits, 0x3F80);  // 1 + 2^-8: tie to even
  EXPECT_EQ(contract::residual_add<bf16>(bf16{0x3F81}, bf16{0x3B80}).bits, 0x3F82);  // (1+2^-7) + 2^-8: tie up
  EXPECT_EQ(contract::residual_add<fp16>(fp16{0x7BFF}, fp16{0x4C00}).bits, 0x7C00);  // 65504 + 16 -> inf
  EXPECT_EQ(contract::residual_add<fp16>(fp16{0x7C00}, fp16{0xFC00}).bits, 0x7FFF);  // inf - inf -> NaN
  EXPECT_EQ(bits_of(contract::residual_add<float>(INFINITY, -INFINITY)), 0x7FFFFFFFu);
  EXPECT_EQ(bits_of(contract::residual_add<float>(-0.0f, -0.0f)), 0x80000000u);
  EXPECT_EQ(bits_of(contract::residual_add<float>(-0.0f, 0.0f)), 0u);
}

// ---- fp32 NaN results --------------------------------------------------------------------------------

TEST(Fp32Arithmetic, EveryNaNResultIsCanonical) {
  const float payload_nan = float_of(0xFFC01234u);
  EXPECT_EQ(bits_of(contract::add(INFINITY, -INFINITY)), 0x7FFFFFFFu);
  EXPECT_EQ(bits_of(contract::add(payload_nan, 1.0f)), 0x7FFFFFFFu);
  EXPECT_EQ(bits_of(contract::add(1.0f, payload_nan)), 0x7FFFFFFFu);
  EXPECT_EQ(bits_of(contract::mul(0.0f, INFINITY)), 0x7FFFFFFFu);
  EXPECT_EQ(bits_of(contract::mul(payload_nan, 2.0f)), 0x7FFFFFFFu);
  EXPECT_EQ(bits_of(contract::div(0.0f, 0.0f)), 0x7FFFFFFFu);
  EXPECT_EQ(bits_of(contract::div(INFINITY, -INFINITY)), 0x7FFFFFFFu);
  EXPECT_EQ(bits_of(contract::sqrt(-1.0f)), 0x7FFFFFFFu);
  EXPECT_EQ(bits_of(contract::sqrt(payload_nan)), 0x7FFFFFFFu);
  // Non-NaN results are the plain IEEE ones.
  EXPECT_EQ(bits_of(contract::sqrt(-0.0f)), 0x80000000u);
  EXPECT_EQ(contract::div(1.0f, 3.0f), 0x1.555556p-2f);
  EXPECT_EQ(contract::sqrt(2.0f), 0x1.6a09e6p0f);
}

TEST(Fp32RmsNorm, NaNOutputsAreCanonical) {
  // fp32 rows whose outputs are NaN: y bits are 0x7FFFFFFF, never x86's 0xFFC00000 or a payload.
  const int hidden = 16;
  contract::RmsNormTree tree;
  ASSERT_TRUE(contract::make_rmsnorm_tree<float>(hidden, &tree));
  std::vector<float> row(hidden, -2.0f), weight(hidden, 1.0f), out(hidden);
  row[3] = float_of(0xFFC01234u);
  contract::rmsnorm_row<float>(tree, row.data(), weight.data(), 1e-6f, out.data());
  for (float y : out) EXPECT_EQ(bits_of(y), 0x7FFFFFFFu);
  // inf in the row: inv = 0, y = -inf * 0 = NaN at that element (x86 would give 0xFFC00000).
  row[3] = -INFINITY;
  contract::rmsnorm_row<float>(tree, row.data(), weight.data(), 1e-6f, out.data());
  EXPECT_EQ(bits_of(out[3]), 0x7FFFFFFFu);
  EXPECT_EQ(bits_of(out[0]), 0x80000000u);  // -2 * 0 = -0
}

}  // namespace
}  // namespace exactcoll

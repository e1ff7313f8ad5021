// core/fused_rmsnorm.h against sim/fused's scalar reference, bit for bit; identical bits across
// one_stage, two_stage, push_one_stage and unfused for many shapes, world sizes and dtypes; the
// AITER case; the alternative contracts' documented behaviour.
#include "core/fused_rmsnorm.h"

#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <gtest/gtest.h>

#include "sim/fused/reference.h"
#include "tests/core/fused_runner.h"

namespace exactcoll {
namespace {

using fused::Contract;
using testing_world::count_differing;
using testing_world::RandomProblem;
using testing_world::run_algo;
using testing_world::same_bits;

template <class T>
struct Reference {
  std::vector<T> residual_out, out;
};

template <class T>
Reference<T> reference(Contract c, const RandomProblem<T>& p) {
  Reference<T> r;
  r.residual_out.resize(p.count());
  r.out.resize(p.count());
  fused::fused_reference<T>(c, p.view(), r.residual_out.data(), r.out.data());
  return r;
}

std::string label(const char* dtype, FusedAlgorithm algo, int ranks, int rows, int hidden, int blocks, int threads) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s %s ranks=%d rows=%d H=%d blocks=%d threads=%d", dtype, fused_algorithm_name(algo),
                ranks, rows, hidden, blocks, threads);
  return buf;
}

// Every rank of run_algo's outputs equals the reference (one flipped bit anywhere fails).
template <class T>
void expect_matches_reference(FusedAlgorithm algo, const RandomProblem<T>& p, const Reference<T>& ref, int blocks,
                              int threads, bool unfused_two_shot = false) {
  const auto got = run_algo<T>(algo, p, blocks, threads, unfused_two_shot);
  const std::string what = label(Storage<T>::kName, algo, p.ranks, p.rows, p.hidden, blocks, threads) +
                           (unfused_two_shot ? " (two_shot all-reduce)" : "");
  for (int r = 0; r < p.ranks; ++r) {
    EXPECT_EQ(count_differing(got.residual_out[r], ref.residual_out), 0u) << what << " rank " << r << " residual_out";
    EXPECT_EQ(count_differing(got.out[r], ref.out), 0u) << what << " rank " << r << " out";
  }
}

constexpr FusedAlgorithm kAlgos[] = {FusedAlgorithm::kOneStage,        FusedAlgorithm::kTwoStage,
                                     FusedAlgorithm::kPushOneStage,    FusedAlgorithm::kLamportOneStage,
                                     FusedAlgorithm::kLamportTwoStage, FusedAlgorithm::kUnfused};

// ---- The reference itself ---------------------------------------------------------------------------

TEST(FusedReference, HandComputedDoubleRounding) {
  // bf16, 2 ranks, H = 8: x0 = 1, x1 = 0.75 ulp(1) = 2^-8 + 2^-9, residual = -0.25 ulp(1) = -2^-9.
  //   canonical:    s = round(1 + 0.75 ulp) = 1 + 1 ulp; s + res = 1 + 0.75 ulp -> 1 + 1 ulp = 0x3F81.
  //   f32_residual: t + res = 1 + 0.5 ulp, a tie -> even -> 1.0 = 0x3F80.
  const int H = 8;
  std::vector<bf16> x(2 * H, round_to<bf16>(1.0f)), residual(H, round_to<bf16>(-0x1p-9f)),
      weight(H, round_to<bf16>(1.0f));
  for (int j = 0; j < H; ++j) x[H + j] = round_to<bf16>(0x1p-8f + 0x1p-9f);
  fused::FusedProblem<bf16> p;
  p.ranks = 2, p.rows = 1, p.hidden = H, p.eps = 0.0f;
  p.x = x.data(), p.residual = residual.data(), p.weight = weight.data();
  std::vector<bf16> ro(H), out(H);
  fused::fused_reference<bf16>(Contract::kCanonical, p, ro.data(), out.data());
  EXPECT_EQ(ro[0].bits, 0x3F81);
  EXPECT_EQ(out[0].bits, 0x3F80);  // v * (1 / v) rounds to 1 in bf16
  fused::fused_reference<bf16>(Contract::kF32Residual, p, ro.data(), out.data());
  EXPECT_EQ(ro[0].bits, 0x3F80);
}

TEST(FusedReference, SumSquaresTreeEqualsTheContractsAndIsOrderSensitive) {
  fused::SplitMix64 rng(7);
  bool some_sequential_sum_differs = false;
  for (int H : {8, 64, 256, 2880, 4096, 8192, 16384, 20000}) {
    for (int pack : {8, 4}) {
      std::vector<float> v(H);
      for (auto& x : v) x = rng.normal() * 3.0f;
      contract::RmsNormTree tree;
      const bool ok =
          pack == 8 ? contract::make_rmsnorm_tree<bf16>(H, &tree) : contract::make_rmsnorm_tree<float>(H, &tree);
      ASSERT_TRUE(ok);
      const float a = fused::reference_sum_squares(v.data(), H, pack);
      const float b = contract::sum_squares(tree, [&](int j) { return v[j]; });
      EXPECT_EQ(float_to_bits(a), float_to_bits(b)) << "H=" << H << " pack=" << pack;
      float sequential = 0.0f;
      for (float x : v) sequential += x * x;
      some_sequential_sum_differs |= float_to_bits(sequential) != float_to_bits(a);
    }
  }
  // The comparison above can fail: the order of the adds shows in the bits.
  EXPECT_TRUE(some_sequential_sum_differs);
}

TEST(FusedReference, HiddenNotAMultipleOfThePackIsAnError) {
  for (int H : {0, 4, 2884, 4100}) {
    RandomProblem<bf16> p(2, 1, 8, 1);
    p.hidden = H;
    std::vector<bf16> ro(8), out(8);
    EXPECT_THROW(fused::fused_reference<bf16>(Contract::kCanonical, p.view(), ro.data(), out.data()),
                 std::invalid_argument)
        << "H=" << H;
    FusedRmsNormArgs<bf16> a;
    a.hidden = H;
    EXPECT_NE(fused_rmsnorm_args_error(a), nullptr) << "H=" << H;
  }
  // fp32's pack is 4: 2884 and 4100 are fine there, 6 is not.
  alignas(16) float buf[4][8] = {};
  FusedRmsNormArgs<float> f;
  f.residual = buf[0], f.weight = buf[1], f.residual_out = buf[2], f.out = buf[3], f.rows = 1;
  f.hidden = 2884;
  EXPECT_EQ(fused_rmsnorm_args_error(f), nullptr);
  f.hidden = 6;
  EXPECT_NE(fused_rmsnorm_args_error(f), nullptr);
  f.hidden = 8;
  f.out = buf[3] + 1;  // misaligned
  EXPECT_NE(fused_rmsnorm_args_error(f), nullptr);
}

// ---- Templates against the reference -----------------------------------------------------------------

template <class T>
void templates_match_reference_for() {
  uint64_t seed = 100;
  for (int ranks : {1, 2, 3, 5, 8}) {
    for (int hidden : {64, 2880}) {
      for (int rows : {0, 1, 3, 7}) {
        const RandomProblem<T> p(ranks, rows, hidden, ++seed);
        const Reference<T> ref = reference(Contract::kCanonical, p);
        for (FusedAlgorithm algo : kAlgos) {
          expect_matches_reference(algo, p, ref, 1, 1);
          if (rows == 7) expect_matches_reference(algo, p, ref, 3, 2);  // blocks and threads split rows and packs
        }
      }
    }
  }
}

TEST(FusedTemplates, MatchReferenceBf16) { templates_match_reference_for<bf16>(); }
TEST(FusedTemplates, MatchReferenceFp16) { templates_match_reference_for<fp16>(); }
TEST(FusedTemplates, MatchReferenceFp32) { templates_match_reference_for<float>(); }

TEST(FusedTemplates, UnfusedWithTwoShotAllReduceToo) {
  const RandomProblem<bf16> p(5, 6, 512, 3);
  expect_matches_reference(FusedAlgorithm::kUnfused, p, reference(Contract::kCanonical, p), 2, 1, true);
}

// The issue's hidden sizes, at small row counts (CI time), every dtype, 4 and 3 ranks.
TEST(FusedTemplates, IssueHiddenSizesAllAlgorithmsIdentical) {
  uint64_t seed = 900;
  for (int hidden : {2880, 4096, 5120, 7168, 8192, 16384}) {
    for (int ranks : {3, 4}) {
      const int rows = ranks == 4 ? 2 : 1;
      {
        const RandomProblem<bf16> p(ranks, rows, hidden, ++seed);
        const auto ref = reference(Contract::kCanonical, p);
        for (FusedAlgorithm algo : kAlgos) expect_matches_reference(algo, p, ref, 2, 1);
      }
      {
        const RandomProblem<fp16> p(ranks, rows, hidden, ++seed);
        const auto ref = reference(Contract::kCanonical, p);
        for (FusedAlgorithm algo : kAlgos) expect_matches_reference(algo, p, ref, 2, 1);
      }
      {
        const RandomProblem<float> p(ranks, rows, hidden, ++seed);
        const auto ref = reference(Contract::kCanonical, p);
        for (FusedAlgorithm algo : kAlgos) expect_matches_reference(algo, p, ref, 2, 1);
      }
    }
  }
}

TEST(FusedTemplates, WorldSizesOneToEight) {
  for (int ranks = 1; ranks <= 8; ++ranks) {
    const RandomProblem<bf16> p(ranks, 5, 256, 50 + ranks);
    const auto ref = reference(Contract::kCanonical, p);
    for (FusedAlgorithm algo : kAlgos) expect_matches_reference(algo, p, ref, 2, 1);
  }
}

// Many rows over several blocks (uneven chunks), and rows < ranks (two_stage ranks with no rows).
TEST(FusedTemplates, ManyRowsAndFewRows) {
  {
    const RandomProblem<bf16> p(3, 301, 64, 77);
    const auto ref = reference(Contract::kCanonical, p);
    for (FusedAlgorithm algo : kAlgos) expect_matches_reference(algo, p, ref, 7, 1);
  }
  {
    const RandomProblem<float> p(6, 2, 8, 78);
    const auto ref = reference(Contract::kCanonical, p);
    for (FusedAlgorithm algo : kAlgos) expect_matches_reference(algo, p, ref, 3, 1);
  }
}

// NaN (with payloads and signs), infinities, -0, overflow to inf in the fold and in the residual
// add, subnormals: the templates' bits still equal the reference's (every NaN stored canonical).
template <class T>
void specials_for() {
  RandomProblem<T> p(3, 4, 64, 31);
  const float big = sizeof(T) == 2 && std::is_same_v<T, fp16> ? 60000.0f : 3.0e38f;
  auto set_x = [&](int r, size_t i, float v) { p.x[r * p.count() + i] = round_to<T>(v); };
  // Row 0: a NaN in one rank's x poisons the whole row's norm.
  set_x(1, 5, NAN);
  // Row 1: +inf and -inf in the fold -> NaN; a residual of inf.
  set_x(0, 64 + 3, INFINITY);
  set_x(2, 64 + 3, -INFINITY);
  p.residual[64 + 9] = round_to<T>(-INFINITY);
  // Row 2: overflow of the fold, -0 everywhere in one element, a subnormal.
  for (int r = 0; r < 3; ++r) set_x(r, 128 + 1, big);
  for (int r = 0; r < 3; ++r) set_x(r, 128 + 2, -0.0f);
  p.residual[128 + 2] = round_to<T>(-0.0f);
  set_x(0, 128 + 4, 1e-40f);
  // Row 3: NaN payload patterns straight into storage.
  // Element 200: the Lamport sentinel's pattern (all ones) in rank 2's x, which lamport_one_stage
  // must canonicalize before its push (numerics.md §9).
  if constexpr (sizeof(T) == 2) {
    p.x[0 * p.count() + 192] = T{0xFFC1};
    p.residual[192 + 7] = T{0x7FA5};
    p.x[2 * p.count() + 200] = T{0xFFFF};
  } else {
    p.x[0 * p.count() + 192] = bits_to_float(0xFFC00123u);
    p.residual[192 + 7] = bits_to_float(0x7FA00001u);
    p.x[2 * p.count() + 200] = bits_to_float(0xFFFFFFFFu);
  }
  const auto ref = reference(Contract::kCanonical, p);
  for (FusedAlgorithm algo : kAlgos) expect_matches_reference(algo, p, ref, 2, 1);
  // The reference stores the canonical NaN and keeps -0.
  const uint32_t nan_bits = sizeof(T) == 2 ? kStorageNaN16 : kCanonicalNaN32;
  EXPECT_EQ(Storage<T>::bits(ref.out[0]), nan_bits);
  EXPECT_EQ(Storage<T>::bits(ref.residual_out[64 + 3]), nan_bits);
  EXPECT_EQ(Storage<T>::bits(ref.residual_out[128 + 2]), sizeof(T) == 2 ? 0x8000u : 0x80000000u);
}

TEST(FusedTemplates, SpecialValuesBf16) { specials_for<bf16>(); }
TEST(FusedTemplates, SpecialValuesFp16) { specials_for<fp16>(); }
TEST(FusedTemplates, SpecialValuesFp32) { specials_for<float>(); }

// ---- The AITER case ------------------------------------------------------------------------------------
// H = 4096, 4 ranks, rows 1..16: canonical one_stage == two_stage == unfused bit for bit (and ==
// the reference), while f32_residual (the pre-PR-2586 AITER 1-stage kernel) moves about a quarter
// of the residual outputs.
TEST(FusedAiterCase, CanonicalAlgorithmsAgreeF32ResidualMovesAQuarter) {
  const int H = 4096, ranks = 4;
  size_t elements = 0, moved = 0, moved_out = 0;
  for (int rows = 1; rows <= 16; ++rows) {
    const RandomProblem<bf16> p(ranks, rows, H, 4096 + rows);
    const auto canonical = reference(Contract::kCanonical, p);
    for (FusedAlgorithm algo : kAlgos) expect_matches_reference(algo, p, canonical, 4, 1);
    const auto f32 = reference(Contract::kF32Residual, p);
    elements += p.count();
    moved += count_differing(f32.residual_out, canonical.residual_out);
    moved_out += count_differing(f32.out, canonical.out);
  }
  const double fraction = static_cast<double>(moved) / elements;
  std::printf(
      "AITER case (bf16, H=4096, 4 ranks, rows 1..16): f32_residual moves %zu of %zu residual outputs "
      "(%.1f%%) and %zu normed outputs (%.1f%%)\n",
      moved, elements, 100.0 * fraction, moved_out, 100.0 * moved_out / elements);
  EXPECT_GE(fraction, 0.15);
  EXPECT_LE(fraction, 0.35);
}

// ---- Alternative contracts ------------------------------------------------------------------------------

TEST(FusedAlternatives, Bf16AccumulateDiffersFromThreeRanksOnAndNotForFp32) {
  {
    const RandomProblem<bf16> p(4, 2, 1024, 11);
    const auto a = reference(Contract::kCanonical, p), b = reference(Contract::kBf16Accumulate, p);
    EXPECT_GT(count_differing(a.residual_out, b.residual_out), 0u);
  }
  {
    const RandomProblem<bf16> p(2, 2, 1024, 12);  // one add: rounding after it is the canonical rounding
    const auto a = reference(Contract::kCanonical, p), b = reference(Contract::kBf16Accumulate, p);
    EXPECT_TRUE(same_bits(a.residual_out, b.residual_out));
    EXPECT_TRUE(same_bits(a.out, b.out));
  }
  {
    const RandomProblem<float> p(4, 2, 1024, 13);  // rounding to fp32 changes nothing
    const auto a = reference(Contract::kCanonical, p), b = reference(Contract::kBf16Accumulate, p);
    EXPECT_TRUE(same_bits(a.residual_out, b.residual_out));
    EXPECT_TRUE(same_bits(a.out, b.out));
  }
}

// fp32 storage: an fp32 sum of four bf16 values is almost always exact (8-bit significands), so
// the fold order rarely shows in bf16; with fp32 inputs it shows in many elements.
TEST(FusedAlternatives, RotatedTwoShotDependsOnMessageSize) {
  // Two ranks: a + b == b + a, so rotation changes nothing.
  {
    const RandomProblem<float> p(2, 3, 1024, 21);
    EXPECT_TRUE(same_bits(reference(Contract::kCanonical, p).residual_out,
                          reference(Contract::kRotatedTwoShot, p).residual_out));
  }
  // Four ranks: row 0 computed in a batch of 1 row and in a batch of 3 rows (same row-0 data). The
  // canonical bits do not depend on the batch; rotated_two_shot's do (the slice owners move).
  const int H = 1024, ranks = 4;
  const RandomProblem<float> big(ranks, 3, H, 22);
  RandomProblem<float> one(ranks, 1, H, 0);
  for (int r = 0; r < ranks; ++r) {
    for (int j = 0; j < H; ++j) one.x[r * H + j] = big.x[r * big.count() + j];
  }
  for (int j = 0; j < H; ++j) one.residual[j] = big.residual[j];
  one.weight = big.weight;
  auto row0 = [&](const std::vector<float>& v) { return std::vector<float>(v.begin(), v.begin() + H); };
  const auto c1 = reference(Contract::kCanonical, one), c3 = reference(Contract::kCanonical, big);
  EXPECT_TRUE(same_bits(c1.residual_out, row0(c3.residual_out)));
  EXPECT_TRUE(same_bits(c1.out, row0(c3.out)));
  const auto r1 = reference(Contract::kRotatedTwoShot, one), r3 = reference(Contract::kRotatedTwoShot, big);
  const size_t batch_moves = count_differing(r1.residual_out, row0(r3.residual_out));
  std::printf("rotated_two_shot: row 0 alone vs in a batch of 3 differs in %zu of %d residual outputs\n", batch_moves,
              H);
  EXPECT_GT(batch_moves, 0u);
  EXPECT_GT(count_differing(r3.residual_out, c3.residual_out), 0u);
}

// ---- lamport_two_stage's slot layout (exhaustive over small shapes) ------------------------------------
// For 1..8 ranks, 1..40 rows and H of 1, 2, 3 and 8 packs (bf16): every element of x lands in its
// row owner's half at an offset inside [0, stride), no two elements with one owner share an
// offset, and the owner's rows fill [0, stride) with no gap up to its last row; the bytes a slot
// needs, the region and lamport_two_stage_max_rows agree for every slot of 16..2048 bytes: a row
// count fits exactly when it is at most max_rows (a multiple of n).
TEST(LamportTwoStageLayout, EveryElementHasItsOwnPlaceInItsOwnersHalf) {
  for (int n = 1; n <= 8; ++n) {
    for (int rows = 1; rows <= 40; ++rows) {
      for (size_t H : {size_t{8}, size_t{16}, size_t{24}, size_t{64}}) {
        const size_t stride = lamport_two_stage_stride(rows, H, n);
        std::vector<std::vector<int>> used(n, std::vector<int>(stride, 0));
        for (size_t i = 0; i < static_cast<size_t>(rows) * H; ++i) {
          const int owner = lamport_row_owner(static_cast<int>(i / H), n);
          ASSERT_GE(owner, 0);
          ASSERT_LT(owner, n);
          const size_t at = lamport_owned_offset(i, H, n);
          ASSERT_LT(at, stride) << "n " << n << " rows " << rows << " H " << H << " element " << i;
          ASSERT_EQ(used[owner][at]++, 0) << "n " << n << " rows " << rows << " H " << H << " element " << i;
        }
        // Rank 0 owns the most rows (ceil(rows / n)): its half is full; the others' are full up to
        // their last row.
        for (int p = 0; p < n; ++p) {
          const size_t owned = static_cast<size_t>(rows / n + (p < rows % n ? 1 : 0));
          for (size_t at = 0; at < stride; ++at) EXPECT_EQ(used[p][at], at < owned * H ? 1 : 0) << p << " " << at;
        }
        EXPECT_EQ(lamport_two_stage_slot_bytes(rows, H, 2, n), 2 * stride * 2);
        EXPECT_EQ(lamport_two_stage_region_bytes(rows, H, 2, n), 3 * static_cast<size_t>(n) * 2 * stride * 2);
      }
    }
    for (size_t slot = 16; slot <= 2048; slot += 16) {
      for (size_t H : {size_t{8}, size_t{64}}) {
        const size_t max_rows = lamport_two_stage_max_rows(slot, H, 2, n);
        EXPECT_EQ(max_rows % static_cast<size_t>(n), 0u);
        for (int rows = 1; rows <= static_cast<int>(max_rows) + n; ++rows) {
          const bool fits = lamport_two_stage_slot_bytes(rows, H, 2, n) <= slot;
          EXPECT_EQ(fits, static_cast<size_t>(rows) <= max_rows)
              << "n " << n << " slot " << slot << " H " << H << " rows " << rows;
        }
      }
    }
  }
  // The example of core/fused_rmsnorm.h: 4 ranks, 6 rows of H 8: rank 1 owns rows 1 and 5 at 0 and 8.
  EXPECT_EQ(lamport_two_stage_stride(6, 8, 4), 16u);
  EXPECT_EQ(lamport_owned_offset(1 * 8, 8, 4), 0u);
  EXPECT_EQ(lamport_owned_offset(5 * 8 + 3, 8, 4), 11u);
  EXPECT_EQ(lamport_two_stage_max_rows(size_t{1} << 20, 4096, 2, 4), 256u);
}

}  // namespace
}  // namespace exactcoll

// The tree contract's algebra (core/contract.h: tree_node, tree_leaf, tree_in_place, TreeFold,
// tree_fold) against an independent recursive transcription of its definition (issue 25,
// docs/numerics.md section 10):
//   tree(v_0)           = round(float(v_0))
//   tree(v_0..v_{n-1})  = round(float(tree(v_0..v_{m-1})) + float(tree(v_m..v_{n-1}))), n > 1,
//                         m the largest power of two below n.
// The transcription widens and narrows through tests/core/reference_conversions.h, not core.
//   - every count n = 1..64 (TreeFold, tree_fold) and kN = 1..16 (tree_in_place), and a few large
//     counts, on seeded random bf16/fp16/fp32 values with NaN (payloads, both signs), ±inf, ±0,
//     subnormals and values near the largest finite; the tests' own power to tell trees apart;
//   - hand-worked examples where tree differs from the canonical fold (contract::fold) and from a
//     chain that rounds to storage after every add, with their bit patterns;
//   - TP invariance: L = 8 and 16 leaves, T = 1, 2, 4, 8 (and 16) ranks, each rank's partial the
//     tree over its own L/T contiguous leaves: the tree over the T partials is the tree over all L
//     leaves. It holds whenever every rank holds a power of two of leaves (any T); a concrete
//     example where it fails with 3 leaves a rank (L = 6, T = 2).
// The seeds are printed; EXACTCOLL_TREE_TEST_SEED=N replaces the base seed.
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/contract.h"
#include "core/storage.h"
#include "gtest/gtest.h"
#include "tests/core/contract_test_support.h"

namespace exactcoll {
namespace {

using testing::float_of;
using testing::random_storage;
using testing::RefStorage;
using testing::Rng;

// The base seed of every random test here (printed by each test that uses it).
uint64_t base_seed() {
  const char* text = std::getenv("EXACTCOLL_TREE_TEST_SEED");
  return text != nullptr ? std::strtoull(text, nullptr, 10) : 25;
}

template <class T>
uint32_t bits(T x) {
  return RefStorage<T>::bits(x);
}

template <class T>
T from_bits(uint32_t b) {
  return RefStorage<T>::from_bits(b);
}

// ---- the definition, transcribed ------------------------------------------------------------------

// The largest power of two strictly below n (n >= 2).
int largest_power_of_two_below(int n) {
  int m = 1;
  while (2 * m < n) m *= 2;
  return m;
}

// One internal node as the definition says it: one fp32 add, one rounding to storage.
template <class T>
T definition_node(T left, T right) {
  return RefStorage<T>::narrow(RefStorage<T>::widen(left) + RefStorage<T>::widen(right));
}

// tree(v[0..n-1]) straight from the definition, by recursion.
template <class T>
T definition_tree(const T* v, int n) {
  if (n == 1) return RefStorage<T>::narrow(RefStorage<T>::widen(v[0]));
  const int m = largest_power_of_two_below(n);
  return definition_node(definition_tree(v, m), definition_tree(v + m, n - m));
}

template <class T>
T definition_tree(const std::vector<T>& v) {
  return definition_tree(v.data(), static_cast<int>(v.size()));
}

// Wrong shapes and orders, to show that the comparisons below can tell trees apart.
// The same recursion with the power of two on the right (left gets n - m).
template <class T>
T power_of_two_right_tree(const T* v, int n) {
  if (n == 1) return RefStorage<T>::narrow(RefStorage<T>::widen(v[0]));
  const int m = n - largest_power_of_two_below(n);
  return definition_node(power_of_two_right_tree(v, m), power_of_two_right_tree(v + m, n - m));
}

// Left to right, rounding to storage after every add (what per-peer storage accumulation does).
template <class T>
T rounding_chain(const std::vector<T>& v) {
  T acc = RefStorage<T>::narrow(RefStorage<T>::widen(v[0]));
  for (size_t i = 1; i < v.size(); ++i) acc = definition_node(acc, v[i]);
  return acc;
}

// ---- core's forms -------------------------------------------------------------------------------

template <class T>
T core_tree_fold(const std::vector<T>& v) {
  return contract::tree_fold<T>(static_cast<int>(v.size()), [&](int i) { return v[i]; });
}

template <class T>
T core_tree_fold_class(const std::vector<T>& v) {
  contract::TreeFold<T> tree;
  for (const T& x : v) tree.push(x);
  return tree.result();
}

template <class T>
T core_canonical_fold(const std::vector<T>& v) {
  return contract::fold<T>(static_cast<int>(v.size()), [&](int i) { return v[i]; });
}

template <class T, int kN>
T core_in_place(const std::vector<T>& v) {
  T a[kN];
  for (int i = 0; i < kN; ++i) a[i] = v[i];
  contract::tree_in_place(a);
  return a[0];
}

// core_in_place<T, n> for a run-time n in 1..16.
template <class T, int... kN>
T core_in_place_dispatch(const std::vector<T>& v, std::integer_sequence<int, kN...>) {
  T out{};
  const int n = static_cast<int>(v.size());
  ((n == kN + 1 ? (out = core_in_place<T, kN + 1>(v), true) : false) || ...);
  return out;
}

template <class T>
T core_in_place_any(const std::vector<T>& v) {
  return core_in_place_dispatch<T>(v, std::make_integer_sequence<int, 16>{});
}

// ---- random values --------------------------------------------------------------------------------

// One storage value: mostly normal values within a few binades of each other (their fp32 sums are
// often exact and their roundings to storage often ties, so the order of the adds matters), some
// over a wide range, and a few percent each of NaN (random sign and payload), ±inf, ±0,
// subnormals and values near the largest finite (whose sums overflow).
template <class T>
T random_value(Rng& rng) {
  constexpr int kMantissa = RefStorage<T>::kMantissaBits;
  constexpr int kExponentBits = sizeof(T) == 4 ? 8 : (kMantissa == 10 ? 5 : 8);
  constexpr int kTotal = sizeof(T) == 4 ? 32 : 16;
  const uint32_t exponent_max = (1u << kExponentBits) - 1;
  const uint32_t mantissa_mask = (1u << kMantissa) - 1;
  const uint32_t sign = static_cast<uint32_t>(rng.below(2)) << (kTotal - 1);
  const uint32_t mantissa = static_cast<uint32_t>(rng.next()) & mantissa_mask;
  switch (rng.below(50)) {
    case 0: return from_bits<T>(sign | (exponent_max << kMantissa) | mantissa | 1u);   // NaN
    case 1: return from_bits<T>(sign | (exponent_max << kMantissa));                   // ±inf
    case 2: return from_bits<T>(sign);                                                 // ±0
    case 3: return from_bits<T>(sign | mantissa);                                      // subnormal (or ±0)
    case 4: return from_bits<T>(sign | ((exponent_max - 1) << kMantissa) | mantissa);  // near the largest
    case 5:
    case 6:
    case 7:
    case 8: return random_storage<T>(rng, -12, 12);
    default: return random_storage<T>(rng, -3, 3);
  }
}

template <class T>
std::vector<T> random_values(Rng& rng, int n) {
  std::vector<T> v(n);
  for (T& x : v) x = random_value<T>(rng);
  return v;
}

// "0x3f81" / "0x3f800001".
template <class T>
std::string hex(T x) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%0*" PRIx32, static_cast<int>(2 * sizeof(T)), bits(x));
  return buf;
}

template <class T>
std::string hex_list(const std::vector<T>& v) {
  std::string s;
  for (const T& x : v) {
    if (!s.empty()) s.push_back(' ');
    s.append(hex(x));
  }
  return s;
}

template <class T>
class TreeContract : public ::testing::Test {};
using StorageTypes = ::testing::Types<bf16, fp16, float>;
TYPED_TEST_SUITE(TreeContract, StorageTypes);

// ---- every count against the definition -------------------------------------------------------------

// Records the first few mismatches of one comparison, and counts them all.
struct Mismatches {
  const char* what;
  int count = 0;
  template <class T>
  void check(T got, T want, int n, uint64_t seed, int trial, const std::vector<T>& v) {
    if (bits(got) == bits(want)) return;
    if (++count <= 3) {
      std::printf("  %s n=%d seed=%" PRIu64 " trial %d: got %s, want %s; values %s\n", what, n, seed, trial,
                  hex(got).c_str(), hex(want).c_str(), hex_list(v).c_str());
    }
  }
};

TYPED_TEST(TreeContract, EveryCountOneToSixtyFourMatchesTheDefinition) {
  using T = TypeParam;
  const int kTrials = 4000;
  for (int n = 1; n <= 64; ++n) {
    const uint64_t seed = base_seed() * 1000 + static_cast<uint64_t>(n);
    std::printf("%s n=%d seed=%" PRIu64 "\n", RefStorage<T>::kName, n, seed);
    Rng rng(seed);
    Mismatches tree_fold{"tree_fold"}, tree_fold_class{"TreeFold"}, in_place{"tree_in_place"}, canonical{"fold"};
    for (int trial = 0; trial < kTrials; ++trial) {
      const std::vector<T> v = random_values<T>(rng, n);
      const T want = definition_tree(v);
      tree_fold.check(core_tree_fold(v), want, n, seed, trial, v);
      tree_fold_class.check(core_tree_fold_class(v), want, n, seed, trial, v);
      if (n <= 16) in_place.check(core_in_place_any(v), want, n, seed, trial, v);
      // One or two values: one add (or none) and one rounding, as in the canonical fold.
      if (n <= 2) canonical.check(core_canonical_fold(v), want, n, seed, trial, v);
    }
    EXPECT_EQ(tree_fold.count, 0) << "n=" << n << " seed=" << seed;
    EXPECT_EQ(tree_fold_class.count, 0) << "n=" << n << " seed=" << seed;
    EXPECT_EQ(in_place.count, 0) << "n=" << n << " seed=" << seed;
    EXPECT_EQ(canonical.count, 0) << "n=" << n << " seed=" << seed;
  }
}

// Counts past the bit counter's first levels and past one pending subtree per level.
TYPED_TEST(TreeContract, LargeCountsMatchTheDefinition) {
  using T = TypeParam;
  const uint64_t seed = base_seed() * 1000 + 999;
  std::printf("%s seed=%" PRIu64 "\n", RefStorage<T>::kName, seed);
  Rng rng(seed);
  for (const int n : {100, 127, 128, 129, 255, 256, 1000, 1023, 1024, 1025, 4097, 65535}) {
    Mismatches tree_fold{"tree_fold"}, tree_fold_class{"TreeFold"};
    for (int trial = 0; trial < 20; ++trial) {
      const std::vector<T> v = random_values<T>(rng, n);
      const T want = definition_tree(v);
      tree_fold.check(core_tree_fold(v), want, n, seed, trial, {});
      tree_fold_class.check(core_tree_fold_class(v), want, n, seed, trial, {});
    }
    EXPECT_EQ(tree_fold.count, 0) << "n=" << n << " seed=" << seed;
    EXPECT_EQ(tree_fold_class.count, 0) << "n=" << n << " seed=" << seed;
  }
}

// The comparisons above can tell trees apart: on the same random values, the other shape (the
// power of two on the right) differs from the definition for every n that is not a power of two,
// and the rounding chain and the canonical fold differ for every n >= 4 (at n = 3 the tree is the
// chain, and for fp32 the canonical fold is the chain too). Also reports how often, as evidence
// that the values exercise rounding.
TYPED_TEST(TreeContract, TheComparisonsTellShapesAndOrdersApart) {
  using T = TypeParam;
  const int kTrials = 4000;
  for (int n = 3; n <= 64; ++n) {
    const uint64_t seed = base_seed() * 1000 + static_cast<uint64_t>(n);
    Rng rng(seed);
    int other_shape = 0, chain = 0, canonical = 0;
    for (int trial = 0; trial < kTrials; ++trial) {
      const std::vector<T> v = random_values<T>(rng, n);
      const uint32_t want = bits(definition_tree(v));
      other_shape += bits(power_of_two_right_tree(v.data(), n)) != want;
      chain += bits(rounding_chain(v)) != want;
      canonical += bits(core_canonical_fold(v)) != want;
    }
    if (n <= 8 || n == 64) {
      std::printf("%s n=%d seed=%" PRIu64
                  ": of %d trials, power of two on the right %d, chain %d, canonical %d differ\n",
                  RefStorage<T>::kName, n, seed, kTrials, other_shape, chain, canonical);
    }
    const bool power_of_two = (n & (n - 1)) == 0;
    if (power_of_two) {
      EXPECT_EQ(other_shape, 0) << "n=" << n;  // the same tree: m = n - m = n / 2
    } else {
      EXPECT_GT(other_shape, 0) << "n=" << n << " seed=" << seed;
    }
    // n = 3: tree(v0, v1, v2) = node(node(v0, v1), v2), which is the chain.
    if (n == 3) {
      EXPECT_EQ(chain, 0);
    } else {
      EXPECT_GT(chain, 0) << "n=" << n << " seed=" << seed;
    }
    // fp32 storage: the canonical fold rounds at every add, so it is the chain, and n = 3 agrees.
    if (n == 3 && sizeof(T) == 4) {
      EXPECT_EQ(canonical, 0);
    } else {
      EXPECT_GT(canonical, 0) << "n=" << n << " seed=" << seed;
    }
  }
}

// tree_node and tree_leaf are the definition's node and leaf on random pairs and singles.
TYPED_TEST(TreeContract, NodeAndLeafMatchTheDefinition) {
  using T = TypeParam;
  const uint64_t seed = base_seed() * 1000 + 77;
  std::printf("%s seed=%" PRIu64 "\n", RefStorage<T>::kName, seed);
  Rng rng(seed);
  int mismatches = 0;
  for (int trial = 0; trial < 200000; ++trial) {
    const T a = random_value<T>(rng), b = random_value<T>(rng);
    mismatches += bits(contract::tree_node(a, b)) != bits(definition_node(a, b));
    mismatches += bits(contract::tree_leaf(a)) != bits(RefStorage<T>::narrow(RefStorage<T>::widen(a)));
  }
  EXPECT_EQ(mismatches, 0) << "seed=" << seed;
}

// ---- hand-worked examples ---------------------------------------------------------------------------

template <class T>
struct Worked {
  std::vector<uint32_t> values;
  uint32_t tree, canonical, chain;
};

template <class T>
void check_worked(const Worked<T>& w) {
  std::vector<T> v;
  for (uint32_t b : w.values) v.push_back(from_bits<T>(b));
  SCOPED_TRACE(std::string(RefStorage<T>::kName) + " values " + hex_list(v));
  EXPECT_EQ(bits(core_tree_fold(v)), w.tree);
  EXPECT_EQ(bits(core_tree_fold_class(v)), w.tree);
  EXPECT_EQ(bits(core_in_place_any(v)), w.tree);
  EXPECT_EQ(bits(definition_tree(v)), w.tree);
  EXPECT_EQ(bits(core_canonical_fold(v)), w.canonical);
  EXPECT_EQ(bits(rounding_chain(v)), w.chain);
}

TEST(TreeContractExamples, TreeCanonicalAndChainDiffer) {
  // bf16 1, 2^-8, 2^-8, 2^-8 (one ULP of 1 is 2^-7):
  //   tree      node(node(1, 2^-8), node(2^-8, 2^-8)) = node(1 [tie to even], 2^-7) = 1 + 2^-7 (0x3F81)
  //   canonical 1 + 3 * 2^-8 exactly in fp32, a tie between 1 + 2^-7 and 1 + 2^-6 -> even: 0x3F82
  //   chain     1 + 2^-8 ties to 1.0 three times: 0x3F80
  check_worked<bf16>({{0x3F80, 0x3B80, 0x3B80, 0x3B80}, 0x3F81, 0x3F82, 0x3F80});
  // fp16, the same with one ULP of 1 being 2^-10: 1, 2^-11, 2^-11, 2^-11.
  check_worked<fp16>({{0x3C00, 0x1000, 0x1000, 0x1000}, 0x3C01, 0x3C02, 0x3C00});
  // fp32 1, 2^-24, 2^-24, 2^-24: the canonical fold (and the chain, the same thing in fp32) ties
  // to 1.0 at every add; the tree adds the small ones first: 1 + 2^-23.
  check_worked<float>({{0x3F800000u, 0x33800000u, 0x33800000u, 0x33800000u}, 0x3F800001u, 0x3F800000u, 0x3F800000u});
  // Overflow. fp16 65504, 65504, -65504, -65504: canonical 0 (fp32 holds 131008 exactly);
  // chain: 131008 rounds to inf, inf - 65504 = inf (0x7C00); tree: node(max, max) = inf,
  // node(-max, -max) = -inf, inf + -inf = NaN (0x7FFF).
  check_worked<fp16>({{0x7BFF, 0x7BFF, 0xFBFF, 0xFBFF}, 0x7FFF, 0x0000, 0x7C00});
  // bf16 max, max, -max, -max: 2 * max overflows fp32 too, so canonical and chain give +inf
  // (0x7F80), the tree NaN.
  check_worked<bf16>({{0x7F7F, 0x7F7F, 0xFF7F, 0xFF7F}, 0x7FFF, 0x7F80, 0x7F80});
  // Eight values, bf16 1, 2^-8 x 7: tree: node(1, 2^-8) ties to 1, the three other pairs give
  // 2^-7; node(1, 2^-7) = 1 + 2^-7, node(2^-7, 2^-7) = 2^-6; (1 + 2^-7) + 2^-6 = 1 + 3 * 2^-7
  // (0x3F83). Canonical: 1 + 7 * 2^-8 = 1 + 3.5 ULP, a tie -> 1 + 4 * 2^-7 (0x3F84). Chain: 1.0.
  check_worked<bf16>({{0x3F80, 0x3B80, 0x3B80, 0x3B80, 0x3B80, 0x3B80, 0x3B80, 0x3B80}, 0x3F83, 0x3F84, 0x3F80});
}

TEST(TreeContractExamples, NotAPowerOfTwoPutsTheLargestPowerOfTwoLeft) {
  // n = 3: tree(v0, v1, v2) = node(node(v0, v1), v2). bf16 1, 2^-8, 2^-8: node(1, 2^-8) ties to
  // 1.0, then 1.0 again: 0x3F80. With the power of two on the right, node(1, node(2^-8, 2^-8))
  // = 1 + 2^-7 (0x3F81); the canonical fold gives 0x3F81 too.
  const std::vector<bf16> three = {bf16{0x3F80}, bf16{0x3B80}, bf16{0x3B80}};
  EXPECT_EQ(core_tree_fold(three).bits, 0x3F80);
  EXPECT_EQ(core_in_place_any(three).bits, 0x3F80);
  EXPECT_EQ(power_of_two_right_tree(three.data(), 3).bits, 0x3F81);
  EXPECT_EQ(core_canonical_fold(three).bits, 0x3F81);
  // n = 5: node(tree(v0..v3), v4). bf16 2^-8, 1, 2^-8, 2^-8, 0: tree(v0..v3) =
  // node(node(2^-8, 1) [tie: 1.0], node(2^-8, 2^-8) = 2^-7) = 1 + 2^-7; plus 0: 0x3F81.
  // Power of two on the right: node(2^-8, tree(1, 2^-8, 2^-8, 0)) = node(2^-8, node(1.0, 2^-8))
  // = 1.0 (ties): 0x3F80. Canonical: 1 + 3 * 2^-8, a tie -> 0x3F82.
  const std::vector<bf16> five = {bf16{0x3B80}, bf16{0x3F80}, bf16{0x3B80}, bf16{0x3B80}, bf16{0x0000}};
  EXPECT_EQ(core_tree_fold(five).bits, 0x3F81);
  EXPECT_EQ(core_tree_fold_class(five).bits, 0x3F81);
  EXPECT_EQ(core_in_place_any(five).bits, 0x3F81);
  EXPECT_EQ(definition_tree(five).bits, 0x3F81);
  EXPECT_EQ(power_of_two_right_tree(five.data(), 5).bits, 0x3F80);
  EXPECT_EQ(core_canonical_fold(five).bits, 0x3F82);
  // n = 6: node(tree(v0..v3), tree(v4, v5)). bf16 1, 2^-8, 2^-8, 0, 2^-8, 0: tree(v0..v3) =
  // node(node(1, 2^-8) [tie: 1.0], node(2^-8, 0) = 2^-8) = 1.0 (tie); tree(v4, v5) = 2^-8; their
  // node ties to 1.0: 0x3F80. Power of two on the right: node(tree(1, 2^-8) = 1.0,
  // tree(2^-8, 0, 2^-8, 0) = 2^-7) = 1 + 2^-7: 0x3F81. Canonical: 0x3F82.
  const std::vector<bf16> six = {bf16{0x3F80}, bf16{0x3B80}, bf16{0x3B80}, bf16{0x0000}, bf16{0x3B80}, bf16{0x0000}};
  EXPECT_EQ(core_tree_fold(six).bits, 0x3F80);
  EXPECT_EQ(core_tree_fold_class(six).bits, 0x3F80);
  EXPECT_EQ(core_in_place_any(six).bits, 0x3F80);
  EXPECT_EQ(definition_tree(six).bits, 0x3F80);
  EXPECT_EQ(power_of_two_right_tree(six.data(), 6).bits, 0x3F81);
  EXPECT_EQ(core_canonical_fold(six).bits, 0x3F82);
}

TEST(TreeContractExamples, SignedZerosNaNsAndInfinities) {
  const std::vector<bf16> negative_zeros(4, bf16{0x8000});
  EXPECT_EQ(core_tree_fold(negative_zeros).bits, 0x8000);  // -0 + -0 = -0 at every node
  EXPECT_EQ(core_tree_fold(std::vector<bf16>{bf16{0x8000}, bf16{0x0000}}).bits, 0x0000);
  EXPECT_EQ(core_tree_fold(std::vector<bf16>{bf16{0x8000}}).bits, 0x8000);  // one leaf: the value
  EXPECT_EQ(core_tree_fold(std::vector<float>{-0.0f}), -0.0f);
  EXPECT_TRUE(std::signbit(core_tree_fold(std::vector<float>{-0.0f})));
  // One NaN leaf with a sign and payload: the canonical NaN, even with no add (fp32 too).
  EXPECT_EQ(core_tree_fold(std::vector<bf16>{bf16{0xFFC1}}).bits, 0x7FFF);
  EXPECT_EQ(core_in_place_any(std::vector<bf16>{bf16{0xFFC1}}).bits, 0x7FFF);
  EXPECT_EQ(testing::bits_of(core_tree_fold(std::vector<float>{float_of(0xFFC01234u)})), 0x7FFFFFFFu);
  EXPECT_EQ(testing::bits_of(core_tree_fold_class(std::vector<float>{float_of(0xFFC01234u)})), 0x7FFFFFFFu);
  EXPECT_EQ(testing::bits_of(core_in_place_any(std::vector<float>{float_of(0xFFC01234u)})), 0x7FFFFFFFu);
  // inf + -inf in a node: x86 gives 0xFFC00000, the contract 0x7FFFFFFF.
  EXPECT_EQ(testing::bits_of(core_tree_fold(std::vector<float>{INFINITY, -INFINITY})), 0x7FFFFFFFu);
  EXPECT_EQ(core_tree_fold(std::vector<fp16>{fp16{0x7C00}, fp16{0x3C00}, fp16{0xFC00}}).bits, 0x7FFF);
  // A NaN anywhere makes the result the canonical NaN.
  std::vector<fp16> with_nan(13, fp16{0x3C00});
  with_nan[11] = fp16{0xFE01};
  EXPECT_EQ(core_tree_fold(with_nan).bits, 0x7FFF);
  EXPECT_EQ(core_in_place_any(with_nan).bits, 0x7FFF);
}

// ---- TP invariance ------------------------------------------------------------------------------------

// Rank r's partial at TP = t over `leaves`: the tree over its own contiguous leaves
// r * L / t .. (r + 1) * L / t - 1 (what its linear layer computes locally).
template <class T, class Fold>
std::vector<T> rank_partials(const std::vector<T>& leaves, int t, Fold fold) {
  const int per_rank = static_cast<int>(leaves.size()) / t;
  std::vector<T> partials(t);
  for (int r = 0; r < t; ++r) {
    partials[r] = fold(std::vector<T>(leaves.begin() + r * per_rank, leaves.begin() + (r + 1) * per_rank));
  }
  return partials;
}

TYPED_TEST(TreeContract, RankPartialsGiveTheTreeOverAllLeavesAtEveryTpSize) {
  using T = TypeParam;
  const int kTrials = 20000;
  for (const int leaves_count : {8, 16}) {
    const uint64_t seed = base_seed() * 1000 + 800 + static_cast<uint64_t>(leaves_count);
    std::printf("%s L=%d seed=%" PRIu64 "\n", RefStorage<T>::kName, leaves_count, seed);
    Rng rng(seed);
    int mismatches = 0;
    for (int trial = 0; trial < kTrials; ++trial) {
      const std::vector<T> leaves = random_values<T>(rng, leaves_count);
      const T want = definition_tree(leaves);
      for (int t = 1; t <= leaves_count; t *= 2) {
        // core's fold at both levels, and the in-place tree over the ranks (the kernels' form for
        // a compile-time world size).
        const std::vector<T> partials =
            rank_partials<T>(leaves, t, [](const std::vector<T>& v) { return core_tree_fold(v); });
        const T got = core_tree_fold(partials);
        const T got_in_place = core_in_place_any(partials);
        const T got_definition =
            definition_tree(rank_partials<T>(leaves, t, [](const std::vector<T>& v) { return definition_tree(v); }));
        for (const T g : {got, got_in_place, got_definition}) {
          if (bits(g) != bits(want) && ++mismatches <= 5) {
            std::printf("  L=%d T=%d trial %d: got %s, want %s; leaves %s\n", leaves_count, t, trial, hex(g).c_str(),
                        hex(want).c_str(), hex_list(leaves).c_str());
          }
        }
      }
    }
    EXPECT_EQ(mismatches, 0) << "L=" << leaves_count << " seed=" << seed;
  }
}

// The proof's actual condition: every rank holds a power of two of leaves. Then any number of
// ranks n (power of two or not) gives the tree over all n * g leaves, e.g. L = 6 at T = 3 and
// L = 12 at T = 3.
TYPED_TEST(TreeContract, AnyRankCountWithAPowerOfTwoOfLeavesPerRankIsInvariant) {
  using T = TypeParam;
  const uint64_t seed = base_seed() * 1000 + 900;
  std::printf("%s seed=%" PRIu64 "\n", RefStorage<T>::kName, seed);
  Rng rng(seed);
  int mismatches = 0;
  for (int ranks = 1; ranks <= 16; ++ranks) {
    for (const int per_rank : {1, 2, 4, 8}) {
      for (int trial = 0; trial < 500; ++trial) {
        const std::vector<T> leaves = random_values<T>(rng, ranks * per_rank);
        const T got =
            core_tree_fold(rank_partials<T>(leaves, ranks, [](const std::vector<T>& v) { return core_tree_fold(v); }));
        if (bits(got) != bits(definition_tree(leaves)) && ++mismatches <= 5) {
          std::printf("  ranks=%d per rank %d: leaves %s\n", ranks, per_rank, hex_list(leaves).c_str());
        }
      }
    }
  }
  EXPECT_EQ(mismatches, 0) << "seed=" << seed;
}

// Out of scope: 3 leaves a rank. L = 6 at T = 2, bf16 leaves 1, 2^-8, 2^-8 | 2^-8, 0, 0:
//   rank partials: tree(1, 2^-8, 2^-8) = node(node(1, 2^-8), 2^-8) = 1.0 (two ties to even),
//                  tree(2^-8, 0, 0) = 2^-8; their tree: node(1, 2^-8) = 1.0 (0x3F80);
//   the tree over the 6 leaves: node(tree(1, 2^-8, 2^-8, 2^-8), tree(0, 0))
//                  = node(1 + 2^-7, 0) = 0x3F81.
// And on random leaves the two differ often, for L = 6 at T = 2 and L = 12 at T = 4.
TYPED_TEST(TreeContract, ThreeLeavesPerRankIsNotInvariant) {
  using T = TypeParam;
  if constexpr (std::is_same_v<T, bf16>) {
    const std::vector<bf16> leaves = {bf16{0x3F80}, bf16{0x3B80}, bf16{0x3B80},
                                      bf16{0x3B80}, bf16{0x0000}, bf16{0x0000}};
    const std::vector<bf16> partials =
        rank_partials<bf16>(leaves, 2, [](const std::vector<bf16>& v) { return core_tree_fold(v); });
    EXPECT_EQ(partials[0].bits, 0x3F80);
    EXPECT_EQ(partials[1].bits, 0x3B80);
    EXPECT_EQ(core_tree_fold(partials).bits, 0x3F80);
    EXPECT_EQ(core_tree_fold(leaves).bits, 0x3F81);
    // At T = 3 (2 leaves a rank) the same leaves are invariant.
    EXPECT_EQ(
        core_tree_fold(rank_partials<bf16>(leaves, 3, [](const std::vector<bf16>& v) { return core_tree_fold(v); }))
            .bits,
        0x3F81);
  }
  const uint64_t seed = base_seed() * 1000 + 901;
  std::printf("%s seed=%" PRIu64 "\n", RefStorage<T>::kName, seed);
  Rng rng(seed);
  for (const auto& [leaves_count, t] : {std::pair{6, 2}, std::pair{12, 4}}) {
    int differ = 0;
    const int kTrials = 2000;
    for (int trial = 0; trial < kTrials; ++trial) {
      const std::vector<T> leaves = random_values<T>(rng, leaves_count);
      const T got =
          core_tree_fold(rank_partials<T>(leaves, t, [](const std::vector<T>& v) { return core_tree_fold(v); }));
      differ += bits(got) != bits(definition_tree(leaves));
    }
    std::printf("  L=%d T=%d: %d of %d leaf sets differ from the tree over all leaves\n", leaves_count, t, differ,
                kTrials);
    EXPECT_GT(differ, 0) << "L=" << leaves_count << " T=" << t << " seed=" << seed;
  }
}

// The invariance needs the partials to be trees: a rank that chains its leaves (rounding after
// every add) or folds them canonically (fp32, one rounding) breaks it for some leaf set, at T = 1
// (8 leaves a rank) and T = 2 (4 leaves). With 2 leaves a rank (T = 4) every order is the tree.
TYPED_TEST(TreeContract, PartialsInAnotherOrderBreakTheInvariance) {
  using T = TypeParam;
  const uint64_t seed = base_seed() * 1000 + 902;
  std::printf("%s seed=%" PRIu64 "\n", RefStorage<T>::kName, seed);
  Rng rng(seed);
  for (const int t : {1, 2, 4}) {
    int chain_differs = 0, canonical_differs = 0;
    for (int trial = 0; trial < 2000; ++trial) {
      const std::vector<T> leaves = random_values<T>(rng, 8);
      const uint32_t want = bits(definition_tree(leaves));
      chain_differs += bits(core_tree_fold(rank_partials<T>(
                           leaves, t, [](const std::vector<T>& v) { return rounding_chain(v); }))) != want;
      canonical_differs += bits(core_tree_fold(rank_partials<T>(
                               leaves, t, [](const std::vector<T>& v) { return core_canonical_fold(v); }))) != want;
    }
    std::printf("  T=%d: chained partials differ %d times, canonical partials %d times (of 2000)\n", t, chain_differs,
                canonical_differs);
    if (t == 4) {
      EXPECT_EQ(chain_differs, 0);
      EXPECT_EQ(canonical_differs, 0);
    } else {
      EXPECT_GT(chain_differs, 0) << "T=" << t << " seed=" << seed;
      EXPECT_GT(canonical_differs, 0) << "T=" << t << " seed=" << seed;
    }
  }
}

}  // namespace
}  // namespace exactcoll

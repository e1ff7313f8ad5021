// The tree contract's promise (issue 25, docs/numerics.md section 10) on the simulator: a
// row-parallel layer's reduction split into L leaves gives the same bits at every TP size.
//   - Random leaves (seeded, the seed printed), L = 8 per element. At TP = T (1, 2, 4, 8) rank r's
//     input is contract::tree_fold over its leaves r*L/T .. (r+1)*L/T - 1 (what its linear layer
//     computes locally). Every all-reduce algorithm the registry gives the simulator (auto
//     included), bf16/fp16/fp32, counts 1, 7, 8, 9, 33, 1000, 4099 (two leaf sets each) and one
//     past auto's two_shot threshold, 1, 2, 3 and 5 blocks: every rank's output is, bit for bit,
//     the tree over all L leaves computed on the host (core's tree_fold, itself held to a
//     transcription over tests/sim/reference.h's conversions). L = 16 up to 16 ranks too.
//   - Every world size folds the defined tree (1, 2, 3, 5, 6, 7, 12, 13 ranks; NaN payloads, -0).
//   - reduce_scatter then allgather == the all-reduce, under both library contracts.
//   - The fused op, every fused algorithm the simulator runs, two shapes per type: residual_out
//     and out equal fused_reference(kTree) and, whatever T, the canonical residual add + RMSNorm
//     of the host tree.
//   - Seeded schedules (20 seeds) for every all-reduce algorithm and four fused ones; a traced run.
//   - Mutations the comparisons must catch: the canonical contract on the same inputs, one leaf's
//     low bit flipped, rank partials folded in another order (a chain or the canonical fold).
//   - The comparison helper reports a single flipped bit anywhere.
// Outputs start as a NaN pattern that no result has, so an element nothing writes shows.
// EXACTCOLL_TREE_TEST_SEED=N replaces the base seed.
#include <gtest/gtest.h>

#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "core/contract.h"
#include "core/registry.h"
#include "core/storage.h"
#include "sim/collectives.h"
#include "sim/fused/fused_sim.h"
#include "sim/fused/reference.h"
#include "sim/prng.h"
#include "sim/world.h"
#include "tests/sim/reference.h"
#include "tests/sim/sim_test_util.h"

namespace exactcoll {
namespace {

using sim::Algorithm;
using sim::CollectiveSpec;
using sim::Op;

uint64_t base_seed() {
  const char* text = std::getenv("EXACTCOLL_TREE_TEST_SEED");
  return text != nullptr ? std::strtoull(text, nullptr, 10) : 25;
}

// ---- storage values as bit patterns -----------------------------------------------------------------

template <class T>
uint32_t bits(T x) {
  return Storage<T>::bits(x);
}

template <class T>
T from_bits(uint32_t b) {
  if constexpr (sizeof(T) == 4) {
    return bits_to_float(b);
  } else {
    return T{static_cast<uint16_t>(b)};
  }
}

template <class T>
constexpr DType dtype_of() {
  if constexpr (sizeof(T) == 4) {
    return DType::kFP32;
  } else if constexpr (std::is_same_v<T, bf16>) {
    return DType::kBF16;
  } else {
    return DType::kFP16;
  }
}

// All ones: a NaN that no result has (results' NaNs are canonical); outputs start as it, so an
// element that nothing writes shows.
template <class T>
T unwritten() {
  return from_bits<T>(sizeof(T) == 4 ? 0xFFFFFFFFu : 0xFFFFu);
}

// ---- the comparison ---------------------------------------------------------------------------------

// Elements whose bit patterns differ, and the first of them.
struct BitDiff {
  size_t differing = 0;
  size_t first = 0;
  uint32_t got = 0, want = 0;
  int width = 4;  // hex digits
  std::string text() const {
    if (differing == 0) return "identical";
    char buf[160];
    std::snprintf(buf, sizeof buf, "%zu differing, first at element %zu: got 0x%0*" PRIx32 ", want 0x%0*" PRIx32,
                  differing, first, width, got, width, want);
    return buf;
  }
};

template <class T>
BitDiff bit_diff(const std::vector<T>& got, const std::vector<T>& want) {
  BitDiff d;
  d.width = static_cast<int>(2 * sizeof(T));
  if (got.size() != want.size()) {
    d.differing = got.size() > want.size() ? got.size() : want.size();
    d.first = got.size() < want.size() ? got.size() : want.size();
    return d;
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (bits(got[i]) == bits(want[i])) continue;
    if (d.differing++ == 0) {
      d.first = i;
      d.got = bits(got[i]);
      d.want = bits(want[i]);
    }
  }
  return d;
}

// ---- leaves and the host tree ----------------------------------------------------------------------

// The independent transcription of the definition over tests/sim/reference.h's conversions.
uint32_t independent_tree(reference::Format f, const uint32_t* v, int n) {
  auto widen = [&](uint32_t b) {
    return f == reference::Format::kFP32 ? reference::from_bits32(b) : reference::widen16(f, static_cast<uint16_t>(b));
  };
  auto narrow = [&](float x) -> uint32_t {
    if (f != reference::Format::kFP32) return reference::narrow16(f, x);
    return std::isnan(x) ? reference::kNaN32 : reference::to_bits32(x);
  };
  if (n == 1) return narrow(widen(v[0]));
  int m = 1;
  while (2 * m < n) m *= 2;  // the largest power of two below n goes left
  return narrow(widen(independent_tree(f, v, m)) + widen(independent_tree(f, v + m, n - m)));
}

// One leaf: mostly values within a few binades of each other (their sums round, often to ties),
// and `special_percent` percent drawn by simtest::random_bits (NaN with payloads, ±inf, ±0,
// subnormals, near the largest finite, wider magnitudes).
template <class T>
T random_leaf(sim::Xoshiro256& g, int special_percent) {
  constexpr DType kD = dtype_of<T>();
  if (static_cast<int>(g.below(100)) < special_percent) return from_bits<T>(simtest::random_bits(kD, g));
  const int mantissa_bits = kD == DType::kBF16 ? 7 : kD == DType::kFP16 ? 10 : 23;
  const int total = sizeof(T) == 4 ? 32 : 16;
  const uint32_t bias = kD == DType::kFP16 ? 15 : 127;
  const uint32_t sign = static_cast<uint32_t>(g.below(2)) << (total - 1);
  const uint32_t exponent = bias - 3 + static_cast<uint32_t>(g.below(7));
  const uint32_t mantissa = static_cast<uint32_t>(g.next()) & ((1u << mantissa_bits) - 1);
  return from_bits<T>(sign | (exponent << mantissa_bits) | mantissa);
}

// How a rank folds its own leaves into its partial.
enum class PartialOrder {
  kTree,       // the contract: contract::tree_fold
  kChain,      // left to right, rounding to storage after every add (a mutation)
  kCanonical,  // contract::fold: fp32 left to right, one rounding (a mutation)
};

template <class T>
T fold_leaves(PartialOrder order, const std::vector<T>& v) {
  const int n = static_cast<int>(v.size());
  switch (order) {
    case PartialOrder::kTree: return contract::tree_fold<T>(n, [&](int i) { return v[i]; });
    case PartialOrder::kCanonical: return contract::fold<T>(n, [&](int i) { return v[i]; });
    case PartialOrder::kChain: break;
  }
  T acc = contract::tree_leaf(v[0]);
  for (int i = 1; i < n; ++i) acc = contract::tree_node(acc, v[i]);
  return acc;
}

// L leaves of `count` elements each, and the host's tree over all of them per element.
template <class T>
struct Leaves {
  int num_leaves = 0;
  size_t count = 0;
  std::vector<std::vector<T>> leaf;  // [L][count]
  std::vector<T> tree;               // [count]

  // Rank r's input at TP = t: its leaves r*L/t .. (r+1)*L/t - 1 folded in `order`.
  std::vector<std::vector<T>> rank_inputs(int t, PartialOrder order = PartialOrder::kTree) const {
    const int per_rank = num_leaves / t;
    std::vector<std::vector<T>> in(t, std::vector<T>(count));
    std::vector<T> column(per_rank);
    for (int r = 0; r < t; ++r) {
      for (size_t i = 0; i < count; ++i) {
        for (int k = 0; k < per_rank; ++k) column[k] = leaf[r * per_rank + k][i];
        in[r][i] = fold_leaves(order, column);
      }
    }
    return in;
  }

  // Recomputes `tree` from `leaf` (after a test changed a leaf); returns the number of elements
  // where core's tree_fold and the independent transcription disagree (0 expected).
  size_t recompute_tree() {
    const reference::Format f = simtest::format_of(dtype_of<T>());
    tree.assign(count, T{});
    std::vector<uint32_t> column_bits(num_leaves);
    size_t disagree = 0;
    for (size_t i = 0; i < count; ++i) {
      for (int l = 0; l < num_leaves; ++l) column_bits[l] = bits(leaf[l][i]);
      tree[i] = contract::tree_fold<T>(num_leaves, [&](int l) { return leaf[l][i]; });
      disagree += bits(tree[i]) != independent_tree(f, column_bits.data(), num_leaves);
    }
    return disagree;
  }
};

template <class T>
Leaves<T> make_leaves(int num_leaves, size_t count, uint64_t seed, int special_percent = 12) {
  Leaves<T> p;
  p.num_leaves = num_leaves;
  p.count = count;
  sim::Xoshiro256 g(seed);
  p.leaf.assign(num_leaves, std::vector<T>(count));
  for (auto& l : p.leaf) {
    for (T& x : l) x = random_leaf<T>(g, special_percent);
  }
  const size_t disagree = p.recompute_tree();
  EXPECT_EQ(disagree, 0u) << "core's tree_fold vs the transcription over tests/sim/reference.h, seed " << seed;
  return p;
}

// ---- running the simulator ----------------------------------------------------------------------------

// A world's options: `ranks` ranks under `schedule` (seeded: from schedule seed 1).
sim::WorldOptions world_options(int ranks, sim::Schedule schedule = sim::Schedule::kThreads) {
  sim::WorldOptions options;
  options.ranks = ranks;
  options.schedule = schedule;
  return options;
}

// Every algorithm the registry gives the simulator for the all-reduce, auto included.
std::vector<Algorithm> allreduce_algorithms() {
  std::vector<Algorithm> out;
  for (const AlgorithmInfo& e : kAlgorithmInfos) {
    if ((e.runs_on & kOnSimulator) != 0 && implements(e.algorithm, Op::kAllReduce)) out.push_back(e.algorithm);
  }
  return out;
}

// Runs one collective on world; returns every rank's output (which starts as the unwritten NaN).
template <class T>
std::vector<std::vector<T>> run_op(sim::World& world, const CollectiveSpec& spec,
                                   const std::vector<std::vector<T>>& inputs) {
  const int n = world.ranks();
  std::vector<std::vector<T>> out(n, std::vector<T>(sim::output_count(spec.op, spec.count, n), unwritten<T>()));
  std::vector<const void*> in_ptrs;
  std::vector<void*> out_ptrs;
  for (int r = 0; r < n; ++r) {
    in_ptrs.push_back(inputs[r].data());
    out_ptrs.push_back(out[r].data());
  }
  sim::enqueue_collective(world, spec, in_ptrs, out_ptrs);
  world.run();
  return out;
}

template <class T>
CollectiveSpec allreduce_spec(Algorithm algorithm, size_t count, int blocks, Contract contract) {
  CollectiveSpec spec;
  spec.op = Op::kAllReduce;
  spec.algorithm = algorithm;
  spec.dtype = dtype_of<T>();
  spec.count = count;
  spec.blocks = blocks;
  spec.contract = contract;
  return spec;
}

template <class T>
std::vector<std::vector<T>> run_allreduce(sim::World& world, Algorithm algorithm, size_t count, int blocks,
                                          Contract contract, const std::vector<std::vector<T>>& inputs) {
  return run_op(world, allreduce_spec<T>(algorithm, count, blocks, contract), inputs);
}

// The number of ranks whose output differs from want; reports the first few with their diff.
template <class T>
int ranks_differing(const std::vector<std::vector<T>>& got, const std::vector<T>& want, const std::string& what) {
  int differing = 0;
  for (size_t r = 0; r < got.size(); ++r) {
    const BitDiff d = bit_diff(got[r], want);
    if (d.differing == 0) continue;
    if (++differing <= 2) ADD_FAILURE() << what << " rank " << r << ": " << d.text();
  }
  return differing;
}

template <class T>
std::string case_name(const char* algo, int t, size_t count, int blocks, Contract c = Contract::kTree) {
  return std::string(Storage<T>::kName) + " " + algo + " " + contract_name(c) + " TP=" + std::to_string(t) +
         " count=" + std::to_string(count) + " blocks=" + std::to_string(blocks);
}

template <class T>
class TreeInvariance : public ::testing::Test {};
using StorageTypes = ::testing::Types<bf16, fp16, float>;
TYPED_TEST_SUITE(TreeInvariance, StorageTypes);

constexpr int kTpSizes[] = {1, 2, 4, 8};

// ---- the comparison catches one flipped bit ------------------------------------------------------------

TYPED_TEST(TreeInvariance, TheComparisonReportsEverySingleFlippedBit) {
  using T = TypeParam;
  const Leaves<T> p = make_leaves<T>(8, 1000, base_seed() * 100 + 1);
  for (const size_t at : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{517}, size_t{999}}) {
    for (int b = 0; b < static_cast<int>(8 * sizeof(T)); ++b) {
      std::vector<T> flipped = p.tree;
      flipped[at] = from_bits<T>(bits(flipped[at]) ^ (1u << b));
      const BitDiff d = bit_diff(flipped, p.tree);
      EXPECT_EQ(d.differing, 1u) << "element " << at << " bit " << b;
      EXPECT_EQ(d.first, at);
      EXPECT_EQ(d.got ^ d.want, 1u << b);
    }
  }
  EXPECT_EQ(bit_diff(p.tree, p.tree).differing, 0u);
  // -0 and +0, and two NaN patterns, are different bits.
  EXPECT_EQ(
      bit_diff(std::vector<T>{from_bits<T>(0)}, std::vector<T>{from_bits<T>(sizeof(T) == 4 ? 0x80000000u : 0x8000u)})
          .differing,
      1u);
  EXPECT_EQ(
      bit_diff(std::vector<T>{unwritten<T>()}, std::vector<T>{from_bits<T>(sizeof(T) == 4 ? 0x7FFFFFFFu : 0x7FFFu)})
          .differing,
      1u);
  EXPECT_EQ(bit_diff(std::vector<T>(3), std::vector<T>(4)).differing, 4u);
}

// ---- the all-reduce ------------------------------------------------------------------------------------

TYPED_TEST(TreeInvariance, AllReduceEveryAlgorithmAndTpSizeGivesTheTreeOverAllLeaves) {
  using T = TypeParam;
  const std::vector<Algorithm> algorithms = allreduce_algorithms();
  ASSERT_GE(algorithms.size(), 7u);  // auto, one_shot, two_shot, push_*, lamport_one_shot, lamport_two_shot
  // auto takes two_shot at 256 KiB per rank: 131075 elements is past it for every type.
  // Two leaf sets per count but the largest.
  const size_t kCounts[] = {1, 1, 7, 7, 8, 8, 9, 9, 33, 33, 1000, 1000, 4099, 4099, 131075};
  uint64_t seed = base_seed() * 100 + 100;
  int runs = 0;
  for (const size_t count : kCounts) {
    ++seed;
    std::printf("%s L=8 count=%zu seed=%" PRIu64 "\n", Storage<T>::kName, count, seed);
    const Leaves<T> p = make_leaves<T>(8, count, seed);
    for (const int t : kTpSizes) {
      sim::World world(world_options(t));  // consecutive calls on one world
      const std::vector<std::vector<T>> inputs = p.rank_inputs(t);
      for (const Algorithm algorithm : algorithms) {
        for (const int blocks : count > 100000 ? std::vector<int>{4} : std::vector<int>{1, 2, 3, 5}) {
          const auto got = run_allreduce<T>(world, algorithm, count, blocks, Contract::kTree, inputs);
          ++runs;
          ASSERT_EQ(ranks_differing(got, p.tree, case_name<T>(algorithm_name(algorithm), t, count, blocks)), 0)
              << "seed " << seed;
        }
      }
    }
  }
  std::printf("%d runs: every rank of every run has the bits of the tree over all 8 leaves\n", runs);
}

// L = 16 leaves at TP 1, 2, 4, 8, 16. Up to 8 ranks the kernels fold with a compile-time world
// size (contract::tree_in_place over the loaded packs); 16 ranks take the run-time path
// (contract::TreeFold, rank by rank).
TYPED_TEST(TreeInvariance, SixteenLeavesUpToSixteenRanks) {
  using T = TypeParam;
  const uint64_t seed = base_seed() * 100 + 20;
  std::printf("%s L=16 seed=%" PRIu64 "\n", Storage<T>::kName, seed);
  const size_t count = 37;
  const Leaves<T> p = make_leaves<T>(16, count, seed);
  for (const int t : {1, 2, 4, 8, 16}) {
    sim::World world(world_options(t));
    const auto inputs = p.rank_inputs(t);
    for (const Algorithm algorithm : allreduce_algorithms()) {
      const auto got = run_allreduce<T>(world, algorithm, count, 2, Contract::kTree, inputs);
      ASSERT_EQ(ranks_differing(got, p.tree, case_name<T>(algorithm_name(algorithm), t, count, 2)), 0)
          << "seed " << seed;
    }
  }
}

// The tree is defined for every world size, not only powers of two (the largest power of two
// below n goes left): every algorithm on 1, 2, 3, 5, 6, 7, 12 and 13 ranks gives the tree over the
// ranks' raw inputs (NaN payloads included: one rank's tree is its value with NaNs made canonical),
// by the independent transcription. (Past 8 ranks the kernels take the run-time path,
// contract::TreeFold, whose pending subtrees then merge at the end.)
TYPED_TEST(TreeInvariance, EveryWorldSizeFoldsTheDefinedTree) {
  using T = TypeParam;
  const reference::Format f = simtest::format_of(dtype_of<T>());
  uint64_t seed = base_seed() * 100 + 25;
  for (const int n : {1, 2, 3, 5, 6, 7, 12, 13}) {
    ++seed;
    const size_t count = 45;
    std::printf("%s ranks=%d seed=%" PRIu64 "\n", Storage<T>::kName, n, seed);
    Leaves<T> p = make_leaves<T>(n, count, seed);  // one leaf a rank: the inputs themselves
    // Planted: NaNs with a sign and payload on every rank (element 0), on rank 0 only (2) and on
    // the last rank only (9, in the second pack; 44, past the last full pack); -0 on every rank (1).
    const uint32_t nan_payload = sizeof(T) == 4 ? 0xFFC01234u : std::is_same_v<T, bf16> ? 0xFFC1u : 0xFE01u;
    const uint32_t negative_zero = sizeof(T) == 4 ? 0x80000000u : 0x8000u;
    for (int r = 0; r < n; ++r) {
      p.leaf[r][0] = from_bits<T>(nan_payload);
      p.leaf[r][1] = from_bits<T>(negative_zero);
    }
    p.leaf[0][2] = from_bits<T>(nan_payload);
    p.leaf[n - 1][9] = from_bits<T>(nan_payload);
    p.leaf[n - 1][44] = from_bits<T>(nan_payload);
    std::vector<T> want(count);
    std::vector<uint32_t> column(n);
    for (size_t i = 0; i < count; ++i) {
      for (int r = 0; r < n; ++r) column[r] = bits(p.leaf[r][i]);
      want[i] = from_bits<T>(independent_tree(f, column.data(), n));
    }
    EXPECT_EQ(bits(want[0]), sizeof(T) == 4 ? 0x7FFFFFFFu : 0x7FFFu);
    EXPECT_EQ(bits(want[1]), negative_zero);
    sim::World world(world_options(n));
    for (const Algorithm algorithm : allreduce_algorithms()) {
      for (const int blocks : {1, 2}) {
        const auto got = run_allreduce<T>(world, algorithm, count, blocks, Contract::kTree, p.leaf);
        ASSERT_EQ(ranks_differing(got, want, case_name<T>(algorithm_name(algorithm), n, count, blocks)), 0)
            << "seed " << seed;
      }
    }
  }
}

// reduce_scatter, then allgather of the slices, is the all-reduce, under both library contracts
// (and under tree it is the tree over all leaves).
TYPED_TEST(TreeInvariance, ReduceScatterThenAllGatherIsTheAllReduce) {
  using T = TypeParam;
  uint64_t seed = base_seed() * 100 + 30;
  for (const size_t count : {size_t{8}, size_t{56}, size_t{1000}, size_t{4104}}) {  // multiples of 8
    ++seed;
    std::printf("%s count=%zu seed=%" PRIu64 "\n", Storage<T>::kName, count, seed);
    const Leaves<T> p = make_leaves<T>(8, count, seed);
    for (const int t : kTpSizes) {
      sim::World world(world_options(t));
      const auto inputs = p.rank_inputs(t);
      for (const Contract c : {Contract::kTree, Contract::kCanonical}) {
        for (const int blocks : {1, 2}) {
          CollectiveSpec rs = allreduce_spec<T>(Algorithm::kAuto, count, blocks, c);
          rs.op = Op::kReduceScatter;
          const auto slices = run_op(world, rs, inputs);
          CollectiveSpec ag = rs;
          ag.op = Op::kAllGather;
          ag.count = count / static_cast<size_t>(t);
          const auto gathered = run_op(world, ag, slices);
          const auto all_reduced = run_allreduce<T>(world, Algorithm::kOneShot, count, blocks, c, inputs);
          const std::string what = case_name<T>("reduce_scatter + allgather", t, count, blocks, c);
          ASSERT_EQ(ranks_differing(gathered, all_reduced[0], what + " vs one_shot"), 0) << "seed " << seed;
          if (c == Contract::kTree) {
            ASSERT_EQ(ranks_differing(gathered, p.tree, what + " vs the host tree"), 0) << "seed " << seed;
          }
        }
      }
    }
  }
}

// ---- the fused op ------------------------------------------------------------------------------------

struct FusedShape {
  int rows, hidden;
};

// Small rows and one wider H per type (H a multiple of the pack: 8 for bf16/fp16, 4 for fp32;
// 2880 = 360 packs, more than a warp of lanes, so the RMSNorm tree has several groups).
template <class T>
std::vector<FusedShape> fused_shapes() {
  if constexpr (sizeof(T) == 4) {
    return {{3, 132}, {1, 1028}};
  } else if constexpr (std::is_same_v<T, bf16>) {
    return {{3, 256}, {2, 2880}};
  } else {
    return {{2, 128}, {1, 1024}};
  }
}

template <class T>
struct FusedOutputs {
  std::vector<std::vector<T>> residual_out, out;  // per rank
};

template <class T>
FusedOutputs<T> run_fused_op(sim::World& world, const fused::FusedSpec& spec, const std::vector<std::vector<T>>& x,
                             const std::vector<T>& residual, const std::vector<T>& weight) {
  const int n = world.ranks();
  const size_t count = static_cast<size_t>(spec.rows) * spec.hidden;
  FusedOutputs<T> o;
  o.residual_out.assign(n, std::vector<T>(count, unwritten<T>()));
  o.out.assign(n, std::vector<T>(count, unwritten<T>()));
  fused::FusedIo io;
  for (int r = 0; r < n; ++r) {
    io.x.push_back(x[r].data());
    io.residual.push_back(residual.data());
    io.weight.push_back(weight.data());
    io.residual_out.push_back(o.residual_out[r].data());
    io.out.push_back(o.out[r].data());
  }
  fused::run_fused(world, spec, io);
  return o;
}

// The fused op's expected bits from the host tree alone: residual_out = round(tree + residual)
// and the canonical RMSNorm of it, i.e. the canonical fused reference of ONE rank whose x is the
// tree (one rank's fold is the value itself). The same for every TP size.
template <class T>
void expected_fused(const Leaves<T>& p, const FusedShape& shape, const std::vector<T>& residual,
                    const std::vector<T>& weight, float eps, std::vector<T>* ro, std::vector<T>* out) {
  fused::FusedProblem<T> one;
  one.ranks = 1, one.rows = shape.rows, one.hidden = shape.hidden, one.eps = eps;
  one.x = p.tree.data(), one.residual = residual.data(), one.weight = weight.data();
  ro->assign(p.count, T{});
  out->assign(p.count, T{});
  fused::fused_reference<T>(Contract::kCanonical, one, ro->data(), out->data());
}

TYPED_TEST(TreeInvariance, FusedOpEveryAlgorithmAndTpSizeGivesTheSameBits) {
  using T = TypeParam;
  uint64_t seed = base_seed() * 100 + 40;
  for (const FusedShape& shape : fused_shapes<T>()) {
    ++seed;
    const size_t count = static_cast<size_t>(shape.rows) * shape.hidden;
    std::printf("%s rows=%d H=%d seed=%" PRIu64 "\n", Storage<T>::kName, shape.rows, shape.hidden, seed);
    // No specials in the leaves: a NaN or inf would make its whole row's out NaN.
    const Leaves<T> p = make_leaves<T>(8, count, seed, /*special_percent=*/0);
    sim::Xoshiro256 g(seed + 1);
    std::vector<T> residual(count), weight(shape.hidden);
    for (T& v : residual) v = random_leaf<T>(g, 0);
    for (T& w : weight) w = round_to<T>(0.75f + 0.5f * static_cast<float>(g.below(1024)) / 1024.0f);
    const float eps = 1e-6f;
    std::vector<T> want_ro, want_out;
    expected_fused(p, shape, residual, weight, eps, &want_ro, &want_out);
    // The residual add by hand too: round(float(tree) + float(residual)).
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(bits(want_ro[i]), bits(contract::residual_add(p.tree[i], residual[i]))) << "element " << i;
    }
    const auto algorithms = fused_algorithms_on<kOnSimulator>();
    ASSERT_GE(algorithms.size(), 8u);
    for (const int t : kTpSizes) {
      const auto x = p.rank_inputs(t);
      // The scalar reference under tree over the T rank partials.
      std::vector<T> x_flat;
      for (const auto& xr : x) x_flat.insert(x_flat.end(), xr.begin(), xr.end());
      fused::FusedProblem<T> problem;
      problem.ranks = t, problem.rows = shape.rows, problem.hidden = shape.hidden, problem.eps = eps;
      problem.x = x_flat.data(), problem.residual = residual.data(), problem.weight = weight.data();
      std::vector<T> ref_ro(count), ref_out(count);
      fused::fused_reference<T>(Contract::kTree, problem, ref_ro.data(), ref_out.data());
      ASSERT_EQ(bit_diff(ref_ro, want_ro).differing, 0u)
          << "fused_reference(kTree) TP=" << t << " residual_out: " << bit_diff(ref_ro, want_ro).text();
      ASSERT_EQ(bit_diff(ref_out, want_out).differing, 0u)
          << "fused_reference(kTree) TP=" << t << " out: " << bit_diff(ref_out, want_out).text();
      sim::World world(world_options(t));
      for (const FusedAlgorithm algo : algorithms) {
        for (const int blocks : {1, 2}) {
          fused::FusedSpec spec;
          spec.algo = algo;
          spec.dtype = dtype_of<T>();
          spec.rows = shape.rows;
          spec.hidden = shape.hidden;
          spec.eps = eps;
          spec.blocks = blocks;
          spec.contract = Contract::kTree;
          spec.unfused_two_shot = algo == FusedAlgorithm::kUnfused && blocks == 2;
          const FusedOutputs<T> o = run_fused_op(world, spec, x, residual, weight);
          const std::string what = std::string(Storage<T>::kName) + " " + fused_algorithm_name(algo) +
                                   " TP=" + std::to_string(t) + " blocks=" + std::to_string(blocks);
          ASSERT_EQ(ranks_differing(o.residual_out, want_ro, what + " residual_out"), 0) << "seed " << seed;
          ASSERT_EQ(ranks_differing(o.out, want_out, what + " out"), 0) << "seed " << seed;
        }
      }
    }
  }
}

// ---- seeded schedules and traces ------------------------------------------------------------------------

constexpr int kScheduleSeeds = 20;

// Seeded schedules (sim::Schedule::kSeeded: one simulated thread at a time, the next drawn from
// the schedule seed at every flag signal, wait and launch start) for every all-reduce algorithm
// (the SM-kernel family and Lamport) and the fused one_stage, two_stage, lamport_one_stage,
// lamport_two_stage and push_one_stage_reg, at TP 2, 4, 8, consecutive calls on one world.
TYPED_TEST(TreeInvariance, SeededSchedulesEveryAllReduceAlgorithmAndFiveFusedOnes) {
  using T = TypeParam;
  const uint64_t seed = base_seed() * 100 + 50;
  std::printf("%s leaves seed=%" PRIu64 "; schedule seeds 1..%d\n", Storage<T>::kName, seed, kScheduleSeeds);
  const size_t count = 33;
  const Leaves<T> p = make_leaves<T>(8, count, seed);
  const FusedShape shape{2, 64};
  const Leaves<T> fp = make_leaves<T>(8, static_cast<size_t>(shape.rows) * shape.hidden, seed + 1, 0);
  sim::Xoshiro256 g(seed + 2);
  std::vector<T> residual(fp.count), weight(shape.hidden);
  for (T& v : residual) v = random_leaf<T>(g, 0);
  for (T& w : weight) w = round_to<T>(1.0f);
  std::vector<T> want_ro, want_out;
  expected_fused(fp, shape, residual, weight, 1e-6f, &want_ro, &want_out);
  for (const int t : {2, 4, 8}) {
    const auto inputs = p.rank_inputs(t);
    const auto fused_x = fp.rank_inputs(t);
    sim::World world(world_options(t, sim::Schedule::kSeeded));
    for (uint64_t schedule_seed = 1; schedule_seed <= kScheduleSeeds; ++schedule_seed) {
      world.set_schedule_seed(schedule_seed);
      for (const Algorithm algorithm : allreduce_algorithms()) {
        const auto got = run_allreduce<T>(world, algorithm, count, 2, Contract::kTree, inputs);
        ASSERT_EQ(ranks_differing(got, p.tree, case_name<T>(algorithm_name(algorithm), t, count, 2)), 0)
            << "leaves seed " << seed << ", reproduce with --schedule-seed " << schedule_seed;
      }
      for (const FusedAlgorithm algo :
           {FusedAlgorithm::kOneStage, FusedAlgorithm::kTwoStage, FusedAlgorithm::kLamportOneStage,
            FusedAlgorithm::kLamportTwoStage, FusedAlgorithm::kPushOneStageReg}) {
        fused::FusedSpec spec;
        spec.algo = algo;
        spec.dtype = dtype_of<T>();
        spec.rows = shape.rows;
        spec.hidden = shape.hidden;
        spec.blocks = 2;
        spec.contract = Contract::kTree;
        const FusedOutputs<T> o = run_fused_op(world, spec, fused_x, residual, weight);
        const std::string what =
            std::string(Storage<T>::kName) + " " + fused_algorithm_name(algo) + " TP=" + std::to_string(t);
        ASSERT_EQ(ranks_differing(o.residual_out, want_ro, what + " residual_out"), 0)
            << "leaves seed " << seed << ", reproduce with --schedule-seed " << schedule_seed;
        ASSERT_EQ(ranks_differing(o.out, want_out, what + " out"), 0)
            << "leaves seed " << seed << ", reproduce with --schedule-seed " << schedule_seed;
      }
    }
  }
}

// A traced world (steps and elements recorded) gives the same bits under tree, and each traced
// element's events are its tree: on one_shot every rank records t - 1 tree_node events (the
// nodes' stored bits chaining up to the round's) and one round, and no canonical fold.
TEST(TreeInvarianceSeeded, TracedRunsGiveTheSameBits) {
  using T = fp16;
  const uint64_t seed = base_seed() * 100 + 60;
  const size_t count = 41;
  const Leaves<T> p = make_leaves<T>(8, count, seed);
  const std::vector<uint64_t> elements = {0, 9, 40};
  for (const int t : {4, 8}) {
    sim::WorldOptions options = world_options(t, sim::Schedule::kSeeded);
    options.schedule_seed = 5;
    options.trace = true;
    options.trace_elements = elements;
    const auto inputs = p.rank_inputs(t);
    for (const Algorithm algorithm : allreduce_algorithms()) {
      sim::World world(options);
      const auto got = run_allreduce<T>(world, algorithm, count, 2, Contract::kTree, inputs);
      ASSERT_EQ(ranks_differing(got, p.tree, case_name<T>(algorithm_name(algorithm), t, count, 2) + " traced"), 0)
          << "seed " << seed;
      ASSERT_NE(world.tracer(), nullptr);
      size_t steps = 0, nodes = 0, rounds = 0, folds = 0;
      for (const sim::TraceEvent& e : world.tracer()->merged()) {
        steps += e.kind == sim::TraceEvent::Kind::kStep;
        nodes += e.kind == sim::TraceEvent::Kind::kTreeNode;
        rounds += e.kind == sim::TraceEvent::Kind::kRound;
        folds += e.kind == sim::TraceEvent::Kind::kFold;
        if (e.kind == sim::TraceEvent::Kind::kRound) {
          const size_t k = static_cast<size_t>(e.index);
          EXPECT_EQ(e.stored_bits, bits(p.tree[k])) << algorithm_name(algorithm) << " element " << k;
        }
      }
      EXPECT_GT(steps, 0u);
      EXPECT_EQ(folds, 0u);
      EXPECT_GT(rounds, 0u) << algorithm_name(algorithm);
      EXPECT_EQ(nodes, rounds * static_cast<size_t>(t - 1)) << algorithm_name(algorithm);
    }
  }
}

// ---- mutations the comparisons must catch ---------------------------------------------------------------

// Element 0 of a mutation test's leaves: 1 and seven copies of one unit below half an ULP of 1
// (bf16 2^-8, fp16 2^-11, fp32 2^-24). The tree over all eight: 1 + 3 ULP (bf16 0x3F83, fp16
// 0x3C03, fp32 0x3F800003); the canonical fold over the eight leaves: bf16 and fp16 1 + 3.5 ULP,
// a tie -> 1 + 4 ULP (0x3F84, 0x3C04); fp32 ties to 1.0 at every add (0x3F800000).
template <class T>
void plant_worked_element(Leaves<T>* p) {
  const uint32_t one = sizeof(T) == 4 ? 0x3F800000u : std::is_same_v<T, bf16> ? 0x3F80u : 0x3C00u;
  const uint32_t small = sizeof(T) == 4 ? 0x33800000u : std::is_same_v<T, bf16> ? 0x3B80u : 0x1000u;
  p->leaf[0][0] = from_bits<T>(one);
  for (int l = 1; l < p->num_leaves; ++l) p->leaf[l][0] = from_bits<T>(small);
  EXPECT_EQ(p->recompute_tree(), 0u);
  EXPECT_EQ(bits(p->tree[0]), one + 3);
}

// (a) The canonical contract on the same rank inputs gives other bits: at TP 4 and 8 (for n <= 2
// ranks the two contracts are the same one add and one rounding, so TP 1 and 2 agree).
TYPED_TEST(TreeInvariance, MutationCanonicalContractGivesOtherBits) {
  using T = TypeParam;
  const uint64_t seed = base_seed() * 100 + 70;
  std::printf("%s seed=%" PRIu64 "\n", Storage<T>::kName, seed);
  const size_t count = 1000;
  Leaves<T> p = make_leaves<T>(8, count, seed);
  plant_worked_element(&p);
  for (const int t : kTpSizes) {
    sim::World world(world_options(t));
    const auto inputs = p.rank_inputs(t);
    for (const Algorithm algorithm : allreduce_algorithms()) {
      const auto canonical = run_allreduce<T>(world, algorithm, count, 2, Contract::kCanonical, inputs);
      const auto tree = run_allreduce<T>(world, algorithm, count, 2, Contract::kTree, inputs);
      const BitDiff d = bit_diff(canonical[0], p.tree);
      if (algorithm == Algorithm::kAuto) {
        std::printf("  TP=%d canonical vs tree: %s\n", t, d.text().c_str());
      }
      EXPECT_EQ(ranks_differing(tree, p.tree, case_name<T>(algorithm_name(algorithm), t, count, 2)), 0);
      if (t <= 2) {
        EXPECT_EQ(d.differing, 0u) << algorithm_name(algorithm) << " TP=" << t;
        continue;
      }
      EXPECT_GT(d.differing, 0u) << algorithm_name(algorithm) << " TP=" << t << ": the comparison missed canonical";
      for (size_t r = 0; r < canonical.size(); ++r) {
        EXPECT_EQ(bit_diff(canonical[r], canonical[0]).differing, 0u);  // canonical is itself consistent
      }
      if (t == 8) {
        // The worked element: the canonical fold over the eight leaves.
        const uint32_t want = sizeof(T) == 4 ? 0x3F800000u : std::is_same_v<T, bf16> ? 0x3F84u : 0x3C04u;
        EXPECT_EQ(bits(canonical[0][0]), want);
        EXPECT_EQ(d.first, 0u);
      }
    }
  }
}

// (b) One leaf's low bit flipped: the run on the mutated leaves differs from the original tree in
// exactly that element (and equals the mutated tree), at every TP size and algorithm.
TYPED_TEST(TreeInvariance, MutationFlippedLowBitInOneLeafIsCaught) {
  using T = TypeParam;
  const uint64_t seed = base_seed() * 100 + 80;
  std::printf("%s seed=%" PRIu64 "\n", Storage<T>::kName, seed);
  const size_t count = 33;
  const Leaves<T> p = make_leaves<T>(8, count, seed);
  // The first (element, leaf), in a seeded order, whose low bit changes the tree.
  sim::Xoshiro256 g(seed + 1);
  Leaves<T> mutated = p;
  size_t element = 0;
  bool found = false;
  for (int attempt = 0; attempt < 1000 && !found; ++attempt) {
    element = static_cast<size_t>(g.below(count));
    const int leaf = static_cast<int>(g.below(8));
    mutated = p;
    mutated.leaf[leaf][element] = from_bits<T>(bits(p.leaf[leaf][element]) ^ 1u);
    EXPECT_EQ(mutated.recompute_tree(), 0u);
    found = bits(mutated.tree[element]) != bits(p.tree[element]);
    if (found) {
      std::printf("  leaf %d of element %zu: 0x%x -> 0x%x; tree 0x%x -> 0x%x\n", leaf, element,
                  bits(p.leaf[leaf][element]), bits(mutated.leaf[leaf][element]), bits(p.tree[element]),
                  bits(mutated.tree[element]));
    }
  }
  ASSERT_TRUE(found);
  for (const int t : kTpSizes) {
    sim::World world(world_options(t));
    const auto inputs = mutated.rank_inputs(t);
    for (const Algorithm algorithm : allreduce_algorithms()) {
      const auto got = run_allreduce<T>(world, algorithm, count, 1, Contract::kTree, inputs);
      for (const auto& rank_out : got) {
        const BitDiff d = bit_diff(rank_out, p.tree);
        EXPECT_EQ(d.differing, 1u) << algorithm_name(algorithm) << " TP=" << t << ": " << d.text();
        EXPECT_EQ(d.first, element);
        EXPECT_EQ(bit_diff(rank_out, mutated.tree).differing, 0u);
      }
    }
  }
}

// (c) Rank partials folded in another order than the tree (left to right rounding at every add,
// or the canonical fold) break the invariance at TP 1 (8 leaves a rank) and TP 2 (4 leaves). At
// TP 4 and 8 a rank holds 2 and 1 leaves, where every order is the tree.
TYPED_TEST(TreeInvariance, MutationNonTreePartialsBreakTheInvariance) {
  using T = TypeParam;
  const uint64_t seed = base_seed() * 100 + 90;
  std::printf("%s seed=%" PRIu64 "\n", Storage<T>::kName, seed);
  const size_t count = 1000;
  Leaves<T> p = make_leaves<T>(8, count, seed);
  plant_worked_element(&p);
  for (const int t : kTpSizes) {
    sim::World world(world_options(t));
    for (const PartialOrder order : {PartialOrder::kChain, PartialOrder::kCanonical}) {
      const auto inputs = p.rank_inputs(t, order);
      for (const Algorithm algorithm : {Algorithm::kOneShot, Algorithm::kTwoShot, Algorithm::kLamportOneShot}) {
        const auto got = run_allreduce<T>(world, algorithm, count, 2, Contract::kTree, inputs);
        const BitDiff d = bit_diff(got[0], p.tree);
        if (algorithm == Algorithm::kOneShot) {
          std::printf("  TP=%d %s partials: %s\n", t, order == PartialOrder::kChain ? "chained" : "canonical",
                      d.text().c_str());
        }
        if (t >= 4) {
          EXPECT_EQ(d.differing, 0u) << "TP=" << t;
        } else {
          EXPECT_GT(d.differing, 0u) << algorithm_name(algorithm) << " TP=" << t
                                     << ": the comparison missed non-tree partials";
        }
      }
    }
  }
}

}  // namespace
}  // namespace exactcoll

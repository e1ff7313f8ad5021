// Every algorithm x dtype x world size x size against the independent scalar reference of the
// contract (tests/sim/reference.h), and identical bits across algorithms, block counts and both
// schedulers.
#include <gtest/gtest.h>

#include <cstdint>
#include <iterator>
#include <string>
#include <vector>

#include "core/registry.h"
#include "sim/collectives.h"
#include "sim/world.h"
#include "tests/sim/reference.h"
#include "tests/sim/sim_test_util.h"

namespace exactcoll {
namespace {

using sim::Algorithm;
using sim::CollectiveSpec;
using sim::Op;
using simtest::expected_outputs;
using simtest::first_difference;
using simtest::random_inputs;
using simtest::run_collective;

constexpr int kRanks[] = {1, 2, 3, 4, 5, 8, 16};
constexpr DType kDTypes[] = {DType::kBF16, DType::kFP16, DType::kFP32};
constexpr int kBlocks[] = {1, 2, 3, 5, 64};

struct OpAlgorithm {
  Op op;
  Algorithm algorithm;
};
constexpr OpAlgorithm kOps[] = {{Op::kAllReduce, Algorithm::kOneShot},     {Op::kAllReduce, Algorithm::kTwoShot},
                                {Op::kReduceScatter, Algorithm::kAuto},    {Op::kAllGather, Algorithm::kAuto},
                                {Op::kAllReduce, Algorithm::kPushOneShot}, {Op::kAllReduce, Algorithm::kPushTwoShot}};

// Every (op, algorithm) the registry says the simulator runs (core/registry.h; auto aside): an
// entry added there is held to the reference below without a change to this file.
std::vector<OpAlgorithm> registry_ops() {
  std::vector<OpAlgorithm> out;
  for (const AlgorithmInfo& e : kAlgorithmInfos) {
    if ((e.runs_on & kOnSimulator) == 0 || e.algorithm == Algorithm::kAuto) continue;
    for (const Op op : exactcoll::kOps) {
      if (implements(e.algorithm, op)) out.push_back({op, e.algorithm});
    }
  }
  return out;
}

// Sizes per rank: 1 element, 1 pack, odd counts, a few thousand, one large-ish. Reduce-scatter
// uses ranks x these (its count must divide by the ranks).
std::vector<size_t> sizes(DType d, Op op, int ranks) {
  const size_t pack = static_cast<size_t>(pack_elements(d));
  const size_t large = op == Op::kAllReduce ? 65537 : 9001;
  std::vector<size_t> s = {1, pack, pack + 1, 7, 37, 4099, large};
  if (op == Op::kReduceScatter) {
    for (auto& c : s) c *= static_cast<size_t>(ranks);
  }
  return s;
}

TEST(SimCollectives, EveryAlgorithmDtypeWorldSizeAndSizeMatchesTheReference) {
  uint64_t seed = 1000;
  int cases = 0;
  const std::vector<OpAlgorithm> ops = registry_ops();
  ASSERT_GE(ops.size(), 7u);  // 5 all-reduce algorithms, and direct for reduce_scatter and allgather
  for (const int n : kRanks) {
    sim::WorldOptions options;
    options.ranks = n;
    sim::World world(options);  // one world per size: consecutive collectives on it
    for (const DType d : kDTypes) {
      for (const OpAlgorithm& op : ops) {
        for (const size_t count : sizes(d, op.op, n)) {
          CollectiveSpec spec;
          spec.op = op.op;
          spec.algorithm = op.algorithm;
          spec.dtype = d;
          spec.count = count;
          spec.blocks = kBlocks[cases % 5];
          ++cases;
          const auto in = random_inputs(d, n, count, ++seed);
          if (getenv("SIMTEST_VERBOSE"))
            fprintf(stderr, "case %s %s n=%d count=%zu blocks=%d\n", sim::launch_name(spec).c_str(), dtype_name(d), n,
                    count, spec.blocks);
          const auto got = run_collective(world, spec, in);
          const auto want = expected_outputs(spec, in);
          const std::string diff = first_difference(got, want, static_cast<size_t>(dtype_size(d)));
          ASSERT_EQ(diff, "") << sim::launch_name(spec) << " " << dtype_name(d) << " ranks=" << n << " count=" << count
                              << " blocks=" << spec.blocks;
        }
      }
    }
  }
}

// The reference itself: known roundings (so the comparison above is against the contract, not
// against whatever both sides happen to do).
TEST(SimCollectives, ReferenceKnownValues) {
  using reference::Format;
  using reference::narrow16;
  EXPECT_EQ(narrow16(Format::kBF16, 1.0f), 0x3F80);
  EXPECT_EQ(narrow16(Format::kBF16, 1.0f + 0x1p-8f), 0x3F80);      // tie -> even (down)
  EXPECT_EQ(narrow16(Format::kBF16, 1.0f + 3 * 0x1p-8f), 0x3F82);  // tie -> even (up)
  EXPECT_EQ(narrow16(Format::kBF16, -0.0f), 0x8000);
  EXPECT_EQ(narrow16(Format::kBF16, 3.4e38f), 0x7F80);  // rounds past max -> inf
  EXPECT_EQ(narrow16(Format::kFP16, 65504.0f), 0x7BFF);
  EXPECT_EQ(narrow16(Format::kFP16, 65519.0f), 0x7BFF);
  EXPECT_EQ(narrow16(Format::kFP16, 65520.0f), 0x7C00);    // tie past max -> inf
  EXPECT_EQ(narrow16(Format::kFP16, 0x1p-24f), 0x0001);    // smallest subnormal
  EXPECT_EQ(narrow16(Format::kFP16, 0x1p-25f), 0x0000);    // tie -> even (zero)
  EXPECT_EQ(narrow16(Format::kFP16, 0x1.8p-24f), 0x0002);  // tie -> even (two)
  EXPECT_EQ(narrow16(Format::kFP16, -std::nanf("")), 0x7FFF);
  // 1 + 2^-8 + 2^-8 in rank order: (1 + 2^-8) is exact in fp32; the sum 1 + 2^-7 is a bf16.
  EXPECT_EQ(reference::fold(Format::kBF16, {0x3F80, 0x3B80, 0x3B80}), 0x3F81u);
  // NaN inputs: fp32 results canonical; 16-bit results 0x7FFF.
  EXPECT_EQ(reference::fold(Format::kFP32, {0xFFC00001u}), 0x7FFFFFFFu);
  EXPECT_EQ(reference::fold(Format::kBF16, {0xFFC1, 0x3F80}), 0x7FFFu);
  EXPECT_EQ(reference::fold(Format::kFP32, {0x7F800000u, 0xFF800000u}), 0x7FFFFFFFu);  // inf + -inf
}

// Same inputs: one_shot, two_shot, push_one_shot and push_two_shot, every block count, both schedulers (three seeds)
// give the same bits (and the reference's).
TEST(SimCollectives, IdenticalBitsAcrossAlgorithmsBlocksAndSchedulers) {
  for (const DType d : kDTypes) {
    for (const int n : {3, 5, 6, 7, 8}) {
      for (const size_t count : {size_t{37}, size_t{1001}}) {
        const auto in = random_inputs(d, n, count, 77 + n);
        CollectiveSpec spec;
        spec.dtype = d;
        spec.count = count;
        const auto want = expected_outputs(spec, in);
        int runs = 0;
        for (const sim::Schedule schedule : {sim::Schedule::kThreads, sim::Schedule::kSeeded}) {
          for (const uint64_t schedule_seed : {1, 2, 3}) {
            if (schedule == sim::Schedule::kThreads && schedule_seed > 1) continue;
            sim::WorldOptions options;
            options.ranks = n;
            options.schedule = schedule;
            options.schedule_seed = schedule_seed;
            sim::World world(options);
            for (const Algorithm a :
                 {Algorithm::kOneShot, Algorithm::kTwoShot, Algorithm::kPushOneShot, Algorithm::kPushTwoShot}) {
              for (const int blocks : {1, 2, 7, 64}) {
                spec.algorithm = a;
                spec.blocks = blocks;
                const auto got = run_collective(world, spec, in);
                ASSERT_EQ(first_difference(got, want, static_cast<size_t>(dtype_size(d))), "")
                    << dtype_name(d) << " n=" << n << " count=" << count << " " << sim::algorithm_name(a)
                    << " blocks=" << blocks << " " << sim::schedule_name(schedule) << " seed=" << schedule_seed;
                ++runs;
              }
            }
          }
        }
        EXPECT_EQ(runs, 4 * 4 * 4);
      }
    }
  }
}

// Several collectives queued back to back on one world interleave across ranks (stream order per
// rank only) and still give the contract's bits, under many schedules.
TEST(SimCollectives, ConsecutiveCollectivesInterleavedAcrossRanks) {
  const int n = 4;
  for (uint64_t schedule_seed = 1; schedule_seed <= 20; ++schedule_seed) {
    sim::WorldOptions options;
    options.ranks = n;
    options.schedule = sim::Schedule::kSeeded;
    options.schedule_seed = schedule_seed;
    sim::World world(options);
    std::vector<CollectiveSpec> specs;
    std::vector<std::vector<std::vector<uint8_t>>> ins, outs;
    // push_one_shot (kOps[4]) and push_two_shot (kOps[5]) back to back, after and before the
    // others, with grids that change between calls (the receive half must not depend on the grid).
    const OpAlgorithm ops[] = {kOps[0], kOps[1], kOps[2], kOps[3], kOps[1], kOps[0], kOps[4], kOps[4], kOps[4],
                               kOps[1], kOps[4], kOps[5], kOps[5], kOps[4], kOps[5], kOps[2], kOps[5]};
    const int grids[] = {2, 2, 2, 2, 2, 2, 2, 3, 1, 2, 3, 1, 3, 2, 2, 2, 1};
    for (size_t k = 0; k < std::size(ops); ++k) {
      const OpAlgorithm& op = ops[k];
      CollectiveSpec spec;
      spec.op = op.op;
      spec.algorithm = op.algorithm;
      spec.dtype = DType::kBF16;
      spec.count = 24;
      spec.blocks = grids[k];
      specs.push_back(spec);
      ins.push_back(random_inputs(spec.dtype, n, spec.count, schedule_seed * 100 + specs.size()));
      outs.emplace_back(n, std::vector<uint8_t>(sim::output_count(spec.op, spec.count, n) * 2));
    }
    for (size_t k = 0; k < specs.size(); ++k) {
      std::vector<const void*> inputs;
      std::vector<void*> outputs;
      for (int r = 0; r < n; ++r) {
        inputs.push_back(ins[k][r].data());
        outputs.push_back(outs[k][r].data());
      }
      sim::enqueue_collective(world, specs[k], inputs, outputs);
    }
    world.run();
    for (size_t k = 0; k < specs.size(); ++k) {
      ASSERT_EQ(first_difference(outs[k], expected_outputs(specs[k], ins[k]), 2), "")
          << "collective " << k << " (" << sim::launch_name(specs[k]) << ") schedule seed " << schedule_seed;
    }
  }
}

}  // namespace
}  // namespace exactcoll

// The Lamport (flag-in-data) all-reduces (core/lamport.h: lamport_one_shot, lamport_two_shot) on
// the simulator: every output bit against the independent reference (tests/sim/reference.h) for
// ranks 1..8 (and 11, 16: the run-time world size), all three types, adversarial inputs (-0.0,
// NaNs with every kind of payload, inputs equal to the sentinel's bit pattern, infinities), counts
// down to fewer packs than ranks (two-shot slices empty); consecutive calls (the rotation and the
// clear) of both mixed with the other algorithms, types, counts and grids; the sentinel argument of
// docs/numerics.md checked over every 16-bit pattern; and bounded polls that name the rank that
// never wrote. Tests that hold for either algorithm are parameterized over both (LamportAlgorithm).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/lamport.h"
#include "sim/collectives.h"
#include "sim/prng.h"
#include "sim/world.h"
#include "tests/sim/reference.h"
#include "tests/sim/sim_test_util.h"

namespace exactcoll {
namespace {

using sim::Algorithm;
using sim::CollectiveSpec;
using simtest::expected_outputs;
using simtest::first_difference;
using simtest::random_inputs;
using simtest::run_collective;

constexpr DType kDTypes[] = {DType::kBF16, DType::kFP16, DType::kFP32};

uint32_t sentinel_of(DType d) { return d == DType::kFP32 ? 0xFFFFFFFFu : 0xFFFFu; }

// Adversarial special patterns for a type: signed zeros, the sentinel itself, NaNs of both signs
// with small, large and full payloads (the canonical one too), infinities, the largest finite.
std::vector<uint32_t> specials(DType d) {
  if (d == DType::kFP32) {
    return {0x80000000u, 0x00000000u, 0xFFFFFFFFu, 0x7FFFFFFFu, 0xFFC00000u, 0x7FC00000u, 0xFF800001u,
            0x7F800001u, 0xFFBFFFFFu, 0x7F800000u, 0xFF800000u, 0x7F7FFFFFu, 0xFF7FFFFFu, 0x00000001u};
  }
  if (d == DType::kBF16) {
    return {0x8000, 0x0000, 0xFFFF, 0x7FFF, 0xFFC0, 0x7FC0, 0xFF81,
            0x7F81, 0xFFC1, 0x7F80, 0xFF80, 0x7F7F, 0xFF7F, 0x0001};
  }
  return {0x8000, 0x0000, 0xFFFF, 0x7FFF, 0xFE00, 0x7E00, 0xFC01,
          0x7C01, 0xFDFF, 0x7C00, 0xFC00, 0x7BFF, 0xFBFF, 0x0001};
}

// random_inputs with about a third of the elements replaced by specials (the sentinel among
// them in every input of more than a few elements), so that NaN, -0.0 and the sentinel pattern
// meet each other and ordinary values in every rank position.
std::vector<std::vector<uint8_t>> adversarial_inputs(DType d, int n, size_t count, uint64_t seed) {
  auto in = random_inputs(d, n, count, seed);
  const auto s = specials(d);
  sim::Xoshiro256 g(seed * 7 + 3);
  const size_t esize = static_cast<size_t>(dtype_size(d));
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < count; ++i) {
      if (g.below(3) != 0) continue;
      const uint32_t b = s[g.below(s.size())];
      std::memcpy(in[r].data() + i * esize, &b, esize);
    }
    // Every rank's element 0 is the sentinel pattern in every third seed, -0.0 in another third.
    const uint32_t first = seed % 3 == 0   ? sentinel_of(d)
                           : seed % 3 == 1 ? (d == DType::kFP32 ? 0x80000000u : 0x8000u)
                                           : s[g.below(s.size())];
    std::memcpy(in[r].data(), &first, esize);
  }
  return in;
}

// The Lamport all-reduces; the tests below that hold for either run once per algorithm.
constexpr Algorithm kLamportAlgorithms[] = {Algorithm::kLamportOneShot, Algorithm::kLamportTwoShot};

class LamportAlgorithm : public ::testing::TestWithParam<Algorithm> {};

INSTANTIATE_TEST_SUITE_P(Lamport, LamportAlgorithm, ::testing::ValuesIn(kLamportAlgorithms),
                         [](const ::testing::TestParamInfo<Algorithm>& p) { return algorithm_name(p.param); });

// The counts every rank count and type is run with: fewer elements than a pack, a pack and one
// more, 5 and 9 (on 4 ranks and more: fewer packs than ranks, so two_shot's slices but the last are
// empty), one short of, exactly and one past a pack per rank, 2n - 1 packs and a few elements (the
// last slice's remainder is n - 1 packs, its longest), and longer ones: 37 and 4099 (1031 past 8
// ranks, to keep the run short).
std::vector<size_t> counts_for(int n, size_t pack) {
  const size_t ranks = static_cast<size_t>(n);
  return {1,
          3,
          pack,
          pack + 1,
          5,
          9,
          ranks * pack - 1,
          ranks * pack,
          ranks * pack + 1,
          (2 * ranks - 1) * pack + 3,
          37,
          n <= 8 ? size_t{4099} : size_t{1031}};
}

TEST_P(LamportAlgorithm, EveryRankCountDtypeAndGridMatchesTheReferenceOnAdversarialInputs) {
  int cases = 0;
  uint64_t seed = 1;
  for (const int n : {1, 2, 3, 4, 5, 6, 7, 8, 11, 16}) {
    sim::WorldOptions options;
    options.ranks = n;
    sim::World world(options);  // one world: consecutive calls rotate through the buffers
    for (const DType d : kDTypes) {
      const size_t pack = static_cast<size_t>(pack_elements(d));
      for (const size_t count : counts_for(n, pack)) {
        for (const int blocks : {1, 2, 3, 5}) {
          CollectiveSpec spec;
          spec.algorithm = GetParam();
          spec.dtype = d;
          spec.count = count;
          spec.blocks = blocks;
          const auto in = adversarial_inputs(d, n, count, ++seed);
          const auto got = run_collective(world, spec, in);
          ASSERT_EQ(first_difference(got, expected_outputs(spec, in), static_cast<size_t>(dtype_size(d))), "")
              << algorithm_name(spec.algorithm) << " " << dtype_name(d) << " ranks=" << n << " count=" << count
              << " blocks=" << blocks << " seed=" << seed;
          ++cases;
        }
      }
    }
  }
  EXPECT_EQ(cases, 10 * 3 * 12 * 4);
}

// Named cases through the simulator: -0.0 on every rank stays -0.0 (TensorRT-LLM's -0.0 sentinel
// would give +0.0); the sentinel pattern on every rank, or beside ordinary values, gives the
// canonical NaN; a single rank's sentinel-pattern input (no add at all) gives the canonical NaN.
// Two counts: 4 elements (one pack: on two_shot the last rank's slice only), and 4 x n packs + 3
// (every rank's two_shot slice holds every case, the last one a partial pack too).
TEST_P(LamportAlgorithm, NamedCasesKeepNegativeZeroAndCanonicalizeTheSentinelPattern) {
  for (const DType d : kDTypes) {
    const size_t esize = static_cast<size_t>(dtype_size(d));
    const size_t pack = static_cast<size_t>(pack_elements(d));
    const uint32_t neg_zero = d == DType::kFP32 ? 0x80000000u : 0x8000u;
    const uint32_t canonical = d == DType::kFP32 ? 0x7FFFFFFFu : 0x7FFFu;
    const uint32_t one = d == DType::kFP32 ? 0x3F800000u : d == DType::kBF16 ? 0x3F80u : 0x3C00u;
    const uint32_t two = d == DType::kFP32 ? 0x40000000u : 0x4000u;  // bf16 and fp16 agree on 2.0
    const uint32_t three = d == DType::kFP32 ? 0x40400000u : d == DType::kBF16 ? 0x4040u : 0x4200u;
    for (int n = 1; n <= 4; ++n) {
      for (const size_t count : {size_t{4}, 4 * pack * static_cast<size_t>(n) + 3}) {
        sim::WorldOptions options;
        options.ranks = n;
        options.schedule = sim::Schedule::kSeeded;
        options.schedule_seed = static_cast<uint64_t>(n);
        sim::World world(options);
        // Element i, by i mod 4: -0.0 everywhere; the sentinel everywhere; the sentinel on the last
        // rank only, 1.0 elsewhere; 1.0 everywhere but -0.0 on rank 0.
        std::vector<std::vector<uint8_t>> in(n, std::vector<uint8_t>(count * esize));
        for (int r = 0; r < n; ++r) {
          const uint32_t v[4] = {neg_zero, sentinel_of(d), r == n - 1 ? sentinel_of(d) : one, r == 0 ? neg_zero : one};
          for (size_t i = 0; i < count; ++i) std::memcpy(in[r].data() + i * esize, &v[i % 4], esize);
        }
        CollectiveSpec spec;
        spec.algorithm = GetParam();
        spec.dtype = d;
        spec.count = count;
        const auto got = run_collective(world, spec, in);
        for (int r = 0; r < n; ++r) {
          // -0.0 (+ 1.0 per further rank): -0.0, 1.0, 2.0, 3.0 on 1..4 ranks.
          const uint32_t sums[4] = {neg_zero, one, two, three};
          const uint32_t want[4] = {neg_zero, canonical, canonical, sums[n - 1]};
          for (size_t i = 0; i < count; ++i) {
            ASSERT_EQ(simtest::element(got[r], i, esize), want[i % 4])
                << dtype_name(d) << " n=" << n << " count=" << count << " rank " << r << " element " << i;
          }
        }
        EXPECT_EQ(first_difference(got, expected_outputs(spec, in), esize), "")
            << dtype_name(d) << " n=" << n << " count=" << count;
      }
    }
  }
}

// The argument of docs/numerics.md ("The Lamport sentinel"), pattern by pattern: for every 16-bit
// pattern x (and fp32 NaNs with many payloads), the pushed value canonicalize(x) is never the
// sentinel, equals x unless x is a NaN, and the contract's fold gives the same bits with
// canonicalize(x) as with x in every rank position, beside ordinary values, infinities and NaNs.
TEST(Lamport, CanonicalizedPushNeverEqualsTheSentinelAndNeverChangesAFold) {
  using reference::Format;
  auto check16 = [](auto tag, Format f) {
    using T = decltype(tag);
    const uint16_t partners[] = {0x0000, 0x8000, 0x3F80, 0xBF80, 0x7F80, 0xFF80,
                                 0x7C00, 0xFC00, 0x7FFF, 0xFFC1, 0x0001};
    int nans = 0;
    for (uint32_t b = 0; b <= 0xFFFF; ++b) {
      Pack<T> x;
      for (auto& e : x.v) e = T{static_cast<uint16_t>(b)};
      const Pack<T> y = lamport_canonicalize(x);
      const uint16_t c = y.v[0].bits;
      ASSERT_NE(c, 0xFFFF) << std::hex << b;
      ASSERT_TRUE(lamport_arrived(y)) << std::hex << b;
      const bool nan = std::isnan(reference::widen16(f, static_cast<uint16_t>(b)));
      ASSERT_EQ(storage_is_nan(T{static_cast<uint16_t>(b)}), nan) << std::hex << b;
      if (!nan) {
        ASSERT_EQ(c, b) << std::hex << b;
        continue;
      }
      ++nans;
      ASSERT_EQ(c, 0x7FFF) << std::hex << b;
      for (const uint16_t p : partners) {
        ASSERT_EQ(reference::fold(f, {c}), reference::fold(f, {b})) << std::hex << b;
        ASSERT_EQ(reference::fold(f, {c, p}), reference::fold(f, {b, p})) << std::hex << b;
        ASSERT_EQ(reference::fold(f, {p, c}), reference::fold(f, {p, b})) << std::hex << b;
        ASSERT_EQ(reference::fold(f, {p, c, p}), reference::fold(f, {p, b, p})) << std::hex << b;
      }
    }
    // 2 x (2^mantissa - 1) NaN patterns: bf16 2 x 127, fp16 2 x 1023.
    EXPECT_EQ(nans, f == Format::kBF16 ? 254 : 2046);
  };
  check16(bf16{}, Format::kBF16);
  check16(fp16{}, Format::kFP16);
  // fp32: every NaN exponent pattern with payloads 1, every single bit, all ones, and random ones.
  sim::Xoshiro256 g(5);
  std::vector<uint32_t> payloads = {1u, 0x7FFFFFu, 0x400000u, 0x3FFFFFu};
  for (int bit = 0; bit < 23; ++bit) payloads.push_back(1u << bit);
  for (int i = 0; i < 2000; ++i) payloads.push_back((static_cast<uint32_t>(g.next()) & 0x7FFFFFu) | 1u);
  const uint32_t partners[] = {0u, 0x80000000u, 0x3F800000u, 0x7F800000u, 0xFF800000u, 0x7FFFFFFFu};
  for (const uint32_t sign : {0u, 0x80000000u}) {
    for (const uint32_t m : payloads) {
      const uint32_t b = sign | 0x7F800000u | m;
      Pack<float> x;
      for (auto& e : x.v) e = bits_to_float(b);
      const uint32_t c = float_to_bits(lamport_canonicalize(x).v[0]);
      ASSERT_EQ(c, 0x7FFFFFFFu) << std::hex << b;
      for (const uint32_t p : partners) {
        ASSERT_EQ(reference::fold(Format::kFP32, {c, p}), reference::fold(Format::kFP32, {b, p})) << std::hex << b;
        ASSERT_EQ(reference::fold(Format::kFP32, {p, c}), reference::fold(Format::kFP32, {p, b})) << std::hex << b;
      }
    }
  }
  // Non-NaN fp32 patterns pass unchanged, the sentinel's neighbours included.
  for (const uint32_t b : {0u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7F7FFFFFu, 0xFF7FFFFFu, 0x00000001u}) {
    Pack<float> x;
    for (auto& e : x.v) e = bits_to_float(b);
    EXPECT_EQ(float_to_bits(lamport_canonicalize(x).v[0]), b);
  }
  EXPECT_EQ(lamport_sentinel_bits<bf16>(), 0xFFFFu);
  EXPECT_EQ(lamport_sentinel_bits<float>(), 0xFFFFFFFFu);
}

// Consecutive calls on one world under both schedulers: Lamport calls of both algorithms (every
// type, counts and grids that change between calls, so each buffer is cleared by a call of another
// algorithm, size and grid) mixed with the barrier-based and push algorithms; every call's bits
// against the reference. The Lamport calls alone, numbered (buffer = number mod 3), hold every
// order of the two: one after one, two after one, one after two and two after two. Calls 1 and 12
// are two_shot calls of fewer packs than ranks (on 3 ranks and more) whose extent (two strides: the
// last slice's pieces, then the folded slice) is longer than their message; calls 4 and 15, on
// the same buffer, read past that message: a clear of the message alone would leave them stale
// data.
TEST(Lamport, ConsecutiveCallsMixedWithOtherAlgorithmsTypesCountsAndGrids) {
  struct Call {
    Algorithm algorithm;
    DType dtype;
    size_t count;
    int blocks;
  };
  constexpr Algorithm L1 = Algorithm::kLamportOneShot;
  constexpr Algorithm L2 = Algorithm::kLamportTwoShot;
  const Call calls[] = {{L1, DType::kBF16, 40, 2},  // Lamport call 0
                        {L2, DType::kBF16, 9, 1},   // 1
                        {Algorithm::kOneShot, DType::kBF16, 24, 2},
                        {L2, DType::kFP32, 33, 3},  // 2
                        {L1, DType::kFP16, 64, 1},  // 3
                        {L1, DType::kBF16, 40, 2},  // 4: reads past call 1's message
                        {Algorithm::kPushOneShot, DType::kFP16, 16, 2},
                        {L2, DType::kBF16, 1, 1},    // 5
                        {L2, DType::kBF16, 200, 2},  // 6
                        {L1, DType::kBF16, 17, 2},   // 7
                        {Algorithm::kTwoShot, DType::kFP32, 40, 1},
                        {L2, DType::kFP32, 5, 1},   // 8
                        {L1, DType::kFP32, 5, 1},   // 9
                        {L2, DType::kFP16, 64, 3},  // 10
                        {L1, DType::kBF16, 64, 3},  // 11
                        {L2, DType::kBF16, 5, 2},   // 12
                        {Algorithm::kPushTwoShot, DType::kBF16, 48, 2},
                        {L1, DType::kFP16, 1, 1},   // 13
                        {L2, DType::kFP16, 50, 2},  // 14
                        {L1, DType::kFP16, 50, 2},  // 15: reads past call 12's message
                        {L2, DType::kBF16, 8, 1},   // 16
                        {L1, DType::kBF16, 8, 1}};  // 17
  int runs = 0;
  for (const int n : {2, 3, 4, 7}) {
    for (uint64_t schedule_seed = 0; schedule_seed <= 12; ++schedule_seed) {
      sim::WorldOptions options;
      options.ranks = n;
      options.schedule = schedule_seed == 0 ? sim::Schedule::kThreads : sim::Schedule::kSeeded;
      options.schedule_seed = schedule_seed;
      sim::World world(options);
      std::vector<CollectiveSpec> specs;
      std::vector<std::vector<std::vector<uint8_t>>> ins, outs;
      for (const Call& c : calls) {
        CollectiveSpec spec;
        spec.algorithm = c.algorithm;
        spec.dtype = c.dtype;
        spec.count = c.count;
        spec.blocks = c.blocks;
        specs.push_back(spec);
        ins.push_back(adversarial_inputs(c.dtype, n, c.count, 100 * schedule_seed + specs.size()));
        outs.emplace_back(n, std::vector<uint8_t>(c.count * static_cast<size_t>(dtype_size(c.dtype))));
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
        ASSERT_EQ(first_difference(outs[k], expected_outputs(specs[k], ins[k]),
                                   static_cast<size_t>(dtype_size(specs[k].dtype))),
                  "")
            << "call " << k << " (" << sim::launch_name(specs[k]) << ") n=" << n << " schedule seed " << schedule_seed;
      }
      ++runs;
    }
  }
  EXPECT_EQ(runs, 4 * 13);
}

// The same bits as the other algorithms on the same inputs (they all match the reference; this
// compares the simulator's outputs directly: with one_shot's, untraced and traced, and traced with
// untraced), and the trace names the algorithm's steps.
TEST_P(LamportAlgorithm, SameBitsAsOneShotTracedAndUntraced) {
  const bool two_shot = GetParam() == Algorithm::kLamportTwoShot;
  for (const DType d : kDTypes) {
    std::vector<std::vector<uint8_t>> untraced;
    for (const bool trace : {false, true}) {
      sim::WorldOptions options;
      options.ranks = 5;
      options.trace = trace;
      options.trace_elements = {0, 3, 1000};
      sim::World world(options);
      CollectiveSpec spec;
      spec.dtype = d;
      spec.count = 1001;
      spec.blocks = 3;
      const auto in = adversarial_inputs(d, 5, spec.count, 42);
      spec.algorithm = Algorithm::kOneShot;
      const auto one_shot = run_collective(world, spec, in);
      spec.algorithm = GetParam();
      const auto lamport = run_collective(world, spec, in);
      EXPECT_EQ(first_difference(lamport, one_shot, static_cast<size_t>(dtype_size(d))), "") << dtype_name(d);
      if (!trace) {
        untraced = lamport;
        continue;
      }
      EXPECT_EQ(first_difference(lamport, untraced, static_cast<size_t>(dtype_size(d))), "") << dtype_name(d);
      const std::string json = world.tracer()->json_lines();
      EXPECT_NE(json.find(std::string("\"op\":\"allreduce_") + algorithm_name(GetParam()) + "\""), std::string::npos);
      for (const char* step : two_shot ? std::vector<const char*>{"push_slice", "clear", "fold_slice", "gather_slice"}
                                       : std::vector<const char*>{"push", "clear", "poll_fold"}) {
        EXPECT_NE(json.find(std::string("\"step\":\"") + step + "\""), std::string::npos) << step;
      }
      EXPECT_NE(json.find("\"buffer\":\"lamport\""), std::string::npos);
      EXPECT_NE(json.find("\"event\":\"round\""), std::string::npos);
    }
  }
}

// A rank that never writes: the polls are bounded and the report names it, under both
// schedulers (fault injection stops rank 2 at its first Lamport store). two_shot: 16 bf16 (2 packs:
// only rank 3's slice) and 64 bf16 (2 packs per slice); rank 2 dies before it pushed any piece.
TEST_P(LamportAlgorithm, APollThatNeverSeesDataNamesTheRankThatNeverWrote) {
  for (const size_t count : {size_t{16}, size_t{64}}) {
    for (const sim::Schedule schedule : {sim::Schedule::kThreads, sim::Schedule::kSeeded}) {
      sim::WorldOptions options;
      options.ranks = 4;
      options.schedule = schedule;
      options.schedule_seed = 3;
      options.wait_timeout = std::chrono::milliseconds(300);
      options.fail_rank = 2;
      options.fail_at_step = 1;
      sim::World world(options);
      CollectiveSpec spec;
      spec.algorithm = GetParam();
      spec.dtype = DType::kBF16;
      spec.count = count;
      const auto in = random_inputs(spec.dtype, 4, spec.count, 9);
      try {
        run_collective(world, spec, in);
        FAIL() << "no error with a dead rank";
      } catch (const sim::SimError& e) {
        const std::string what = e.what();
        // Threads: a deadlock once every live rank polls, or the 300 ms timeout on a loaded machine.
        EXPECT_TRUE(e.kind() == sim::SimFailure::kDeadlock ||
                    (schedule == sim::Schedule::kThreads && e.kind() == sim::SimFailure::kTimeout))
            << what;
        EXPECT_NE(what.find("peer 2's slot of Lamport buffer 0 (call 0)"), std::string::npos) << what;
        EXPECT_NE(what.find("never wrote it"), std::string::npos) << what;
        // The seeded report lists every waiting thread: rank 3's poll of rank 2's piece among them
        // (two_shot, 16 elements: ranks 0 and 1 wait on rank 3's folded slice, which rank 3, alive,
        // never wrote either; under threads the first thread to see the stall heads the report).
        if (schedule == sim::Schedule::kSeeded) {
          EXPECT_NE(what.find("rank 2 never wrote it"), std::string::npos) << what;
        }
      }
    }
  }
}

}  // namespace
}  // namespace exactcoll

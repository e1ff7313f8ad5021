// The soak test (issue 15; tagged manual, not in CI): 10^6 simulator collectives of mixed ops,
// dtypes, sizes, algorithms, block counts, world sizes and both schedulers, from one seed, on
// long-lived worlds (one per world size, reused for every call, as a communicator is). Every
// output is checked bit for bit against the independent reference (tests/sim/reference.h); the
// run counts calls and wrong bits (which must be 0) and measures RSS after a warm-up and at the
// end (growth means something accumulates per call).
//
//   bazel test //tests/soak:soak_test --test_output=all             (10^6 calls)
//   ... --test_env=EXACTCOLL_SOAK_CALLS=10000 --test_env=EXACTCOLL_SOAK_SEED=7
// One input is one run of 1..4 collectives queued on one world (or one fused call); the run ends
// once EXACTCOLL_SOAK_CALLS calls (default 10^6) are made. docs/reliability.md records the last
// run's figures.
#include <gtest/gtest.h>
#include <malloc.h>

#include <bit>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "sim/collectives.h"
#include "sim/fused/fused_sim.h"
#include "sim/fused/reference.h"
#include "sim/world.h"
#include "tests/fuzz/fuzz_harness.h"
#include "tests/resident_memory.h"
#include "tests/sim/sim_test_util.h"

namespace exactcoll {
namespace {

using testing_memory::resident_bytes;

uint64_t wrong_bits(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want) {
  uint64_t bits = 0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i)
    bits += std::popcount(static_cast<unsigned>(got[i] ^ want[i]));
  return bits + 8 * (std::max(got.size(), want.size()) - std::min(got.size(), want.size()));
}

const DType kDtypes[] = {DType::kBF16, DType::kFP16, DType::kFP32};
const sim::Algorithm kAlgorithms[] = {sim::Algorithm::kOneShot, sim::Algorithm::kTwoShot, sim::Algorithm::kAuto,
                                      sim::Algorithm::kPushOneShot, sim::Algorithm::kPushTwoShot};
const int kWorldSizes[] = {1, 2, 3, 4, 5, 8};

constexpr size_t kLargestCount = 65536;

// A count per rank: mostly small, sometimes up to kLargestCount elements; a multiple of the ranks
// for reduce_scatter.
size_t random_count(sim::Xoshiro256& rng, sim::Op op, int ranks) {
  const uint64_t scale = rng.below(16) == 0 ? kLargestCount : rng.below(4) == 0 ? 4096 : 300;
  size_t count = 1 + rng.below(scale);
  if (op == sim::Op::kReduceScatter) count = (count + ranks - 1) / ranks * ranks;
  return count;
}

struct Tally {
  uint64_t calls = 0;
  uint64_t fused_calls = 0;
  uint64_t wrong_bits = 0;
  uint64_t elements = 0;
  std::map<std::string, uint64_t> by_op;
};

// 1..4 collectives queued on `world`, run once, each checked against the reference.
void soak_collectives(sim::World& world, sim::Xoshiro256& rng, Tally& tally) {
  const int n = world.ranks();
  struct Call {
    sim::CollectiveSpec spec;
    std::vector<std::vector<uint8_t>> in, out;
    std::vector<const void*> inputs;
    std::vector<void*> outputs;
  };
  std::vector<std::unique_ptr<Call>> calls;
  for (uint64_t k = 1 + rng.below(4); k > 0; --k) {
    auto c = std::make_unique<Call>();
    c->spec.op = static_cast<sim::Op>(rng.below(3));
    c->spec.dtype = fuzz::pick(rng, kDtypes);
    c->spec.algorithm = c->spec.op == sim::Op::kAllReduce ? fuzz::pick(rng, kAlgorithms) : sim::Algorithm::kAuto;
    c->spec.blocks = 1 + static_cast<int>(rng.below(rng.below(4) == 0 ? 8 : 2));
    c->spec.count = random_count(rng, c->spec.op, n);
    ASSERT_EQ(sim::check_spec(c->spec, n), "");
    c->in = simtest::random_inputs(c->spec.dtype, n, c->spec.count, rng.next());
    const size_t out_bytes =
        sim::output_count(c->spec.op, c->spec.count, n) * static_cast<size_t>(dtype_size(c->spec.dtype));
    c->out.assign(n, std::vector<uint8_t>(out_bytes));
    for (int r = 0; r < n; ++r) {
      c->inputs.push_back(c->in[r].data());
      c->outputs.push_back(c->out[r].data());
    }
    sim::enqueue_collective(world, c->spec, c->inputs, c->outputs);
    calls.push_back(std::move(c));
  }
  world.run();
  for (const auto& c : calls) {
    const auto want = simtest::expected_outputs(c->spec, c->in);
    for (int r = 0; r < n; ++r) tally.wrong_bits += wrong_bits(c->out[r], want[r]);
    ++tally.calls;
    tally.elements += c->spec.count * static_cast<uint64_t>(n);
    ++tally.by_op[std::string(sim::op_name(c->spec.op)) +
                  (c->spec.op == sim::Op::kAllReduce
                       ? std::string("/") + sim::algorithm_name(sim::resolve_algorithm(c->spec))
                       : "")];
  }
}

// Grows a world's buffers to the largest the soak will ask of them (fp32 at the largest count:
// reduce_scatter's rounded-up input, the push all-reduces' 2 x ranks slots of scratch), so that
// what the heap holds afterwards no longer depends on which sizes happened to come first.
void grow_to_largest(sim::World& world) {
  const int n = world.ranks();
  std::vector<sim::CollectiveSpec> specs;
  for (const sim::Algorithm a :
       {sim::Algorithm::kPushOneShot, sim::Algorithm::kPushTwoShot, sim::Algorithm::kTwoShot}) {
    sim::CollectiveSpec spec;
    spec.dtype = DType::kFP32;
    spec.algorithm = a;
    spec.count = kLargestCount;
    specs.push_back(spec);
  }
  sim::CollectiveSpec rs;
  rs.op = sim::Op::kReduceScatter;
  rs.dtype = DType::kFP32;
  rs.count = (kLargestCount + n - 1) / n * n;
  specs.push_back(rs);
  for (const sim::CollectiveSpec& spec : specs)
    simtest::run_collective(world, spec, simtest::random_inputs(spec.dtype, n, spec.count, 1));
}

// One fused all-reduce + residual + RMSNorm (bf16, canonical), checked against its reference.
void soak_fused(sim::World& world, sim::Xoshiro256& rng, Tally& tally) {
  const int n = world.ranks();
  fused::FusedSpec spec;
  spec.algo = fuzz::pick(rng, kFusedAlgorithmsOnSimulator);
  spec.rows = 1 + static_cast<int>(rng.below(4));
  spec.hidden = 8 * (1 + static_cast<int>(rng.below(64)));
  spec.blocks = 1 + static_cast<int>(rng.below(2));
  const size_t count = static_cast<size_t>(spec.rows) * spec.hidden;
  const auto x = simtest::random_inputs(DType::kBF16, n, count, rng.next());
  const auto residual = simtest::random_inputs(DType::kBF16, 1, count, rng.next())[0];
  std::vector<bf16> weight(static_cast<size_t>(spec.hidden));
  for (auto& w : weight) w = round_to<bf16>(1.0f + static_cast<float>(rng.below(100)) / 500.0f);
  std::vector<std::vector<uint8_t>> out(n, std::vector<uint8_t>(count * 2)), ro(n, std::vector<uint8_t>(count * 2));
  fused::FusedIo io;
  for (int r = 0; r < n; ++r) {
    io.x.push_back(x[r].data());
    io.residual.push_back(residual.data());
    io.weight.push_back(weight.data());
    io.out.push_back(out[r].data());
    io.residual_out.push_back(ro[r].data());
  }
  spec.dtype = DType::kBF16;
  fused::run_fused(world, spec, io);
  // The reference: x as [n, rows, H].
  std::vector<bf16> all_x(count * n), want_ro(count), want_out(count);
  for (int r = 0; r < n; ++r) std::memcpy(all_x.data() + r * count, x[r].data(), count * 2);
  std::vector<bf16> residual_copy(count);
  std::memcpy(residual_copy.data(), residual.data(), count * 2);
  fused::FusedProblem<bf16> p;
  p.ranks = n, p.rows = spec.rows, p.hidden = spec.hidden, p.eps = spec.eps;
  p.x = all_x.data(), p.residual = residual_copy.data(), p.weight = weight.data();
  fused::fused_reference<bf16>(fused::Contract::kCanonical, p, want_ro.data(), want_out.data());
  const std::vector<uint8_t> want_out_bytes(reinterpret_cast<const uint8_t*>(want_out.data()),
                                            reinterpret_cast<const uint8_t*>(want_out.data()) + count * 2);
  const std::vector<uint8_t> want_ro_bytes(reinterpret_cast<const uint8_t*>(want_ro.data()),
                                           reinterpret_cast<const uint8_t*>(want_ro.data()) + count * 2);
  for (int r = 0; r < n; ++r) tally.wrong_bits += wrong_bits(out[r], want_out_bytes) + wrong_bits(ro[r], want_ro_bytes);
  ++tally.calls;
  ++tally.fused_calls;
  tally.elements += count * static_cast<uint64_t>(n);
  ++tally.by_op[std::string("fused_rmsnorm/") + fused_algorithm_name(spec.algo)];
}

// Bytes the heap holds for the program now (malloc's in-use chunks and its mmapped ones): what a
// leak grows. RSS also grows with the allocator's fragmentation, which is not a leak.
size_t heap_in_use_bytes() {
  const struct mallinfo2 info = mallinfo2();
  return info.uordblks + info.hblkhd;
}

TEST(Soak, AMillionCollectivesKeepEveryBitAndTheirMemory) {
  // Buffers over 128 KiB always come from mmap and go back when freed: glibc otherwise raises its
  // mmap threshold to the largest freed buffer, serves those from the heap, and RSS then grows
  // with fragmentation, hiding what this test looks for.
  mallopt(M_MMAP_THRESHOLD, 128 << 10);
  fuzz::SeededRun run("soak", "EXACTCOLL_SOAK", 1e9);
  const char* calls_text = std::getenv("EXACTCOLL_SOAK_CALLS");
  const uint64_t target_calls = calls_text != nullptr ? std::strtoull(calls_text, nullptr, 10) : 1'000'000;
  const size_t rss_start = resident_bytes();
  // One long-lived world per (world size, schedule), as a communicator lives across calls, each
  // grown to its largest buffers first.
  std::map<std::pair<int, bool>, std::unique_ptr<sim::World>> worlds;
  for (const int ranks : kWorldSizes) {
    for (const bool seeded : {false, true}) {
      sim::WorldOptions o;
      o.ranks = ranks;
      o.schedule = seeded ? sim::Schedule::kSeeded : sim::Schedule::kThreads;
      auto& w = worlds[{ranks, seeded}];
      w = std::make_unique<sim::World>(o);
      grow_to_largest(*w);
    }
  }
  auto world_for = [&](sim::Xoshiro256& rng) -> sim::World& {
    const int ranks = fuzz::pick(rng, kWorldSizes);
    const bool seeded = rng.below(8) == 0;
    sim::World& w = *worlds.at({ranks, seeded});
    if (seeded) w.set_schedule_seed(rng.next());
    return w;
  };
  Tally tally;
  // After a short warm-up (the allocator's caches settle) RSS and the heap are measured.
  const uint64_t warm_up_inputs = std::min<uint64_t>(5000, target_calls / 40);
  size_t rss_after_warm_up = 0, heap_after_warm_up = 0;
  run.each([&](sim::Xoshiro256& rng, uint64_t input) {
    sim::World& world = world_for(rng);
    if (rng.below(10) == 0) {
      soak_fused(world, rng, tally);
    } else {
      soak_collectives(world, rng, tally);
    }
    if (input + 1 == warm_up_inputs) {
      rss_after_warm_up = resident_bytes();
      heap_after_warm_up = heap_in_use_bytes();
    }
    if ((input + 1) % 100000 == 0) {
      std::printf("soak: %llu inputs, %llu calls, %llu wrong bits, RSS %.1f MiB, heap in use %.1f MiB\n",
                  static_cast<unsigned long long>(input + 1), static_cast<unsigned long long>(tally.calls),
                  static_cast<unsigned long long>(tally.wrong_bits), resident_bytes() / 1048576.0,
                  heap_in_use_bytes() / 1048576.0);
      std::fflush(stdout);
    }
    ASSERT_EQ(tally.wrong_bits, 0u) << "input " << input;
    if (tally.calls >= target_calls) run.stop();
  });
  const size_t rss_end = resident_bytes();
  const size_t heap_end = heap_in_use_bytes();
  std::printf("soak: %llu calls (%llu fused), %llu elements per rank-call summed, wrong bits %llu\n",
              static_cast<unsigned long long>(tally.calls), static_cast<unsigned long long>(tally.fused_calls),
              static_cast<unsigned long long>(tally.elements), static_cast<unsigned long long>(tally.wrong_bits));
  for (const auto& [op, count] : tally.by_op)
    std::printf("soak:   %-32s %llu\n", op.c_str(), static_cast<unsigned long long>(count));
  std::printf(
      "soak: RSS %.1f MiB at the start, %.1f MiB after %llu warm-up inputs, %.1f MiB at the end; "
      "heap in use %.2f MiB after the warm-up, %.2f MiB at the end\n",
      rss_start / 1048576.0, rss_after_warm_up / 1048576.0, static_cast<unsigned long long>(warm_up_inputs),
      rss_end / 1048576.0, heap_after_warm_up / 1048576.0, heap_end / 1048576.0);
  EXPECT_EQ(tally.wrong_bits, 0u);
  if (rss_after_warm_up > 0 && fuzz::kRssIsMeaningful) {
    // After the warm-up nothing may accumulate per call: the heap in use stays within 1 MiB (a
    // leak of 1 byte per call would pass it), RSS within 16 MiB of allocator noise.
    EXPECT_LT(heap_end, heap_after_warm_up + (size_t{1} << 20)) << "the heap in use grew after the warm-up";
    EXPECT_LT(rss_end, rss_after_warm_up + (size_t{16} << 20)) << "RSS grew after the warm-up";
  }
}

}  // namespace
}  // namespace exactcoll

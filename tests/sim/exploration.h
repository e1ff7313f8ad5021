// Shared pieces of the seeded-exploration tests (tests/sim/protocol_exploration_test.cc for the
// all-reduces alone, tests/sim/fused/push_exploration_test.cc for push_one_stage mixed with the push
// all-reduces): broken receive-half policies that exist only in these tests, the outcome of one
// seeded run, and the loop that looks for the first failing seed within a fixed bound. Each test
// keeps its own workloads and its own `explore` (one world, one schedule seed, every output
// compared); this header only says what a run's result means and how seeds are searched.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/collectives.h"
#include "core/lamport.h"
#include "core/push.h"
#include "sim/world.h"

namespace exactcoll::exploration {

// Broken push receive halves (each keeps the production choice, AlternatingHalves, of what it does
// not break); the seeded scheduler must catch them within kSeedBound seeds.

// Broken: one receive half instead of two. A peer's next push call (call k+1) stores into the slot
// this rank is still folding from call k: wrong bits.
struct OneHalf : AlternatingHalves {
  static int half(uint32_t, uint32_t) { return 0; }
};

// Broken: half 1 right after the call's own n slots (the layout before 2026-11-21). Fine while
// every call has the same count, but a peer's larger call k+1, writing half 0, reaches into the
// half 1 that this rank is still folding from a smaller call k.
struct CountSizedHalves : AlternatingHalves {
  static size_t half_elements(size_t count, int pack, int n, size_t) {
    return static_cast<size_t>(n) * push_slot_stride(count, pack);
  }
};

// Broken Lamport protocols (core/lamport.h's LamportProtocol knobs), each keeping the production
// choice of what it does not break.

// Broken: two buffers. The clear of call k's previous buffer, (k-1) mod 2 = (k+1) mod 2, can erase
// what a fast peer, already in call k+1, has stored there: that call's poll never ends.
struct LamportTwoBuffers : LamportProtocol {
  static constexpr int kBuffers = 2;
};

// Broken: no clear. Call k+3 finds call k's data in its buffer and folds it: wrong bits.
struct LamportNoClear : LamportProtocol {
  static constexpr bool kClear = false;
};

// Broken: NaNs pushed as they are. An input whose bits are the sentinel's is never seen as arrived.
struct LamportNoCanonicalization : LamportProtocol {
  static constexpr bool kCanonicalize = false;
};

// What one seeded run found: every output equal to the contract, a deadlock report from the
// scheduler, or some output that differs in its bits.
enum class Outcome { kCorrect, kDeadlock, kWrongBits };

// Returns the outcome as printed in the tests' lines ("correct", "deadlock", "wrong bits").
inline const char* name(Outcome o) {
  return o == Outcome::kDeadlock ? "deadlock" : o == Outcome::kWrongBits ? "wrong bits" : "correct";
}

// Runs the seeded world. Returns true (with the scheduler's report in *detail) when it deadlocked;
// any other failure propagates. Every exploration test's run ends here.
inline bool ran_into_deadlock(sim::World& world, std::string* detail) {
  try {
    world.run();
  } catch (const sim::SimError& e) {
    if (e.kind() != sim::SimFailure::kDeadlock) throw;
    *detail = e.what();
    return true;
  }
  return false;
}

// The schedule seeds a broken variant is tried with: 1..kSeedBound.
constexpr uint64_t kSeedBound = 200;

// Returns the first seed in 1..kSeedBound at which `explore` fails (any outcome but kCorrect), or
// 0; *outcome and *detail are that seed's outcome and detail (left as they are when no seed fails).
// *caught counts the failing seeds among all kSeedBound (how often a random schedule exposes the
// bug), so every seed is run even after the first failure. `explore` is callable as
// `Outcome explore(uint64_t seed, std::string* detail)`: one run under schedule `seed`, setting
// *detail when it does not return kCorrect.
template <class Explore>
uint64_t first_failing_seed(Explore explore, Outcome* outcome, std::string* detail, int* caught) {
  uint64_t first = 0;
  *caught = 0;
  for (uint64_t seed = 1; seed <= kSeedBound; ++seed) {
    std::string d;
    const Outcome o = explore(seed, &d);
    if (o == Outcome::kCorrect) continue;
    ++*caught;
    if (first == 0) {
      first = seed;
      *outcome = o;
      *detail = d;
    }
  }
  return first;
}

// Enqueues one bf16 Lamport all-reduce (lamport_one_shot or lamport_two_shot) of `count` elements
// under Protocol, with the world size at compile time as the GPU runs it (dispatch_world_size:
// its folds issue every peer's first load at once up to kLamportPeekRanks ranks).
template <class Protocol>
void enqueue_lamport_allreduce(sim::World& world, const sim::Launch& launch, Algorithm algorithm, size_t count) {
  world.enqueue<bf16>(launch, [algorithm, count](auto& ctx) {
    dispatch_world_size(ctx.world_size(), [&](auto ranks) {
      constexpr int kRanks = decltype(ranks)::value;
      if (algorithm == Algorithm::kLamportTwoShot) {
        allreduce_lamport_two_shot<bf16, kRanks, Protocol>(ctx, count);
      } else {
        allreduce_lamport_one_shot<bf16, kRanks, Protocol>(ctx, count);
      }
    });
  });
}

}  // namespace exactcoll::exploration

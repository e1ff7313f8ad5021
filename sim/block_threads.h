// The threads of one simulated block. The world runs one simulated thread per (rank, block)
// (sim/world.h), which is all that most kernels need: the core templates give the same bits for
// any thread count. Some code paths exist only for a given block size — the register path of
// core/fused_rmsnorm_kernels.h holds a row in registers only when the block has exactly the
// RMSNorm tree's lanes — and run here: every thread of the block is a fiber (sim/fiber.h) nested
// in the block's simulated thread, and the threads take turns, switching only at sync_block().
//
// The schedule: between two sync_block()s the threads run one after another in a fixed order (a
// permutation of 0..threads-1: rising by default, or one drawn from a seed, the same for every
// block of the run), each until its next sync_block() or its end; sync_block() returns once every
// thread of the block has called it as often (a barrier, as __syncthreads()). A drawn order lets
// the seeded schedule show a missing sync_block: a thread reading what another thread of its block
// writes in the same interval reads it early in some orders. A flag wait, or any other scheduling
// point of the world's scheduler, suspends the whole block with the waiting thread: under the
// seeded scheduler the (rank, block) fiber yields from inside the thread's fiber and later resumes
// there; under the threads scheduler the rank's OS thread blocks.
//
// What kernels may wait for: block_barrier's waits (core/signal.h: in one interval between syncs,
// thread t signals peers t, t + nt, ... and then waits for their flags) never deadlock on such a
// schedule, provided every block of the run uses the same order (block_threads.cc says why). A
// wait for data that some thread of a peer's block writes in the same interval — the Lamport
// polls of core/lamport.h — can: a GPU runs a block's threads concurrently, this runs them in
// turn. Such kernels run with one thread, unless every thread's pushes come before a sync_block
// that comes before any poll (lamport_one_stage's step 4, core/fused_rmsnorm.h): then every push
// of a block is done before any of its threads polls, and a poll waits only for pushes that a
// peer's block makes before its own first poll. lamport_two_stage adds one more wait: for the
// folded rows the owner's block pushes while it folds, each thread its packs, all before the
// row's next sync_block; those folds wait only for the first kind of push, so again no thread
// waits for a sibling that has not run.
//
// Cost: two context switches per thread per sync_block(), and a stack per thread while the block
// runs (128 KiB reserved, touched only as used; under the seeded scheduler every block of a launch
// is alive at once). A block whose run the world abandons (a failed seeded run) keeps its threads'
// stacks until the OS thread's stack pool goes.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "sim/fiber.h"

namespace exactcoll::sim {

class BlockThreads {
 public:
  static constexpr int kMaxThreads = 1024;  // a CUDA block's limit
  using Body = std::function<void(int thread, BlockThreads& block)>;

  // Runs body(t, block) for t = 0..threads-1 on the schedule above and returns once every body has
  // returned. The order between syncs is rising without order_seed, else order(threads,
  // *order_seed). One thread runs body(0, block) directly (sync_block() then returns at once).
  // Throws std::invalid_argument for threads outside 1..kMaxThreads; std::logic_error when some
  // threads return while others wait in sync_block() (a barrier that not every thread reaches);
  // otherwise rethrows the first exception that a body let escape, after unwinding the threads
  // suspended in sync_block().
  static void run(int threads, const Body& body, std::optional<uint64_t> order_seed = std::nullopt);

  // The order that a seed picks: a permutation of 0..threads-1 (Fisher-Yates over sim::Xoshiro256),
  // a function of (threads, seed) only.
  static std::vector<int> order(int threads, uint64_t seed);

  // From inside a body: returns once every thread of the block has called sync_block() as often.
  void sync_block();
  int threads() const { return threads_; }

 private:
  explicit BlockThreads(int threads) : threads_(threads) {}
  void unwind_waiting();
  struct Unwind {};  // thrown in a thread suspended in sync_block() when its block stops early

  int threads_;
  std::vector<std::unique_ptr<Fiber>> fibers_;  // empty for one thread
  int running_ = -1;                            // the thread whose fiber runs now
  bool unwinding_ = false;
};

}  // namespace exactcoll::sim

// The fused all-reduce + residual add + RMSNorm on the simulated world: every algorithm the GPU
// runs, from the same templates, launched as the GPU launches them (cuda_backend/fused/
// fused_rmsnorm.cc): core/fused_rmsnorm.h's one_stage, two_stage and push_one_stage,
// core/fused_rmsnorm_kernels.h's gather_norm, one_stage_reg, push_one_stage_reg (the GPU's
// push_one_stage kernel) and fused_rmsnorm_lamport_reg (the GPU's lamport_one_stage and
// lamport_two_stage kernels: core's where the register path does not fit), each one launch on every (rank, block), and
// unfused as three launches (the all-reduce of sim/collectives.h, then residual_add_step, then
// rmsnorm_step).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "core/contract.h"
#include "core/fused_rmsnorm.h"
#include "core/storage.h"
#include "sim/block_threads.h"
#include "sim/world.h"

namespace exactcoll::fused {

// How one simulated block of a fused launch runs (with_fused_ctx).
struct FusedBlockOptions {
  // Threads of the block (sim/block_threads.h), 1..kMaxLanes. More than one only for kernels whose
  // waits are block_barrier's, or polls that follow a sync_block after every push of the block
  // (lamport_one_stage's; block_threads.h says why).
  int threads = 1;
  // The threads' order between two syncs (sim::BlockThreads::run): rising without a seed; run_fused
  // draws it from the schedule seed under the seeded scheduler. The same for every block of a run.
  std::optional<uint64_t> thread_order_seed;
  // x read in place, as the GPU's push_one_stage and lamport_one_stage kernels do (their
  // base.inputs[rank] is the caller's x; no peer's x is readable): when own_x is set,
  // ctx.input(rank) returns own_x and ctx.input(p) for every other p returns unreadable_x, elements
  // of a NaN pattern that no algorithm writes, so that a read of a peer's x shows in the bits.
  const void* own_x = nullptr;
  const void* unreadable_x = nullptr;
};

// What the threads of one simulated block share besides memory: the GPU's shared memory for the
// RMSNorm tree's lane partials (two arrays, alternating between calls as in the device context,
// so one sync_block per call suffices) and the block's options.
struct FusedBlockShared {
  float lane_partials[2][contract::kMaxLanes];
  FusedBlockOptions options;
};

// The simulator's context plus what core/fused_rmsnorm.h and core/fused_rmsnorm_kernels.h add to
// the execution-context concept, for thread `thread` of a block of threads.threads() threads:
//   row_sum_squares(tree, row): thread t computes the partials of lanes t + 1, t + 1 + nt, ...
//       (mod nt: every lane once; contract::lane_sum_squares) into the block's lane array; after a
//       sync_block every thread combines the array (contract::combine_lane_partials): the
//       canonical tree, as the GPU computes it with shuffles. The lanes are shifted by one thread
//       on purpose: the hook may read the row from any thread (core/fused_rmsnorm.h), and lane l
//       then reads packs that thread l mod nt (the kernels' stride) did not store, so a kernel that
//       calls the hook before the sync_block that publishes its row reads it early and shows.
//   sum_lane_partials(tree, partial): the register path's hook; precondition nt == tree.lanes:
//       thread t's partial is lane t's; the same array and combination.
// A trace's steps (trace_step_begin/access/end) are recorded by thread 0 only: the core templates
// describe the whole block's accesses, alike in every thread. Folds and roundings of traced
// elements are recorded by the thread that does them.
template <class Base>
class FusedCtx : public Base {
 public:
  using T = typename Base::value_type;

  FusedCtx(const sim::BlockEnv& env, sim::BlockThreads& threads, FusedBlockShared& shared, int thread)
      : Base(env), threads_(threads), shared_(shared), thread_(thread) {}

  int thread() const { return thread_; }
  int num_threads() const { return threads_.threads(); }
  void sync_block() { threads_.sync_block(); }

  const T* input(int peer) const {
    const FusedBlockOptions& o = shared_.options;
    if (o.own_x == nullptr) return Base::input(peer);
    return static_cast<const T*>(peer == this->rank() ? o.own_x : o.unreadable_x);
  }

  template <class Row>
  float row_sum_squares(const contract::RmsNormTree& tree, Row row) {
    float* lanes = next_lane_array();
    const int nt = num_threads();
    for (int l = (thread_ + 1) % nt; l < tree.lanes; l += nt) lanes[l] = contract::lane_sum_squares(tree, l, row);
    sync_block();
    return contract::combine_lane_partials(tree, [lanes](int l) { return lanes[l]; });
  }

  float sum_lane_partials(const contract::RmsNormTree& tree, float partial) {
    float* lanes = next_lane_array();
    lanes[thread_] = partial;
    sync_block();
    return contract::combine_lane_partials(tree, [lanes](int l) { return lanes[l]; });
  }

  void trace_step_begin(const char* name) {
    if (thread_ == 0) Base::trace_step_begin(name);
  }
  void trace_access(Access access, int peer, Buffer buffer, size_t begin, size_t end) {
    if (thread_ == 0) Base::trace_access(access, peer, buffer, begin, end);
  }
  void trace_step_end() {
    if (thread_ == 0) Base::trace_step_end();
  }

 private:
  // Every thread makes the same sequence of calls, so all agree on the array of each call; call
  // k + 2 reuses call k's array only after every thread passed call k + 1's sync_block.
  float* next_lane_array() { return shared_.lane_partials[lane_calls_++ & 1u]; }

  sim::BlockThreads& threads_;
  FusedBlockShared& shared_;
  int thread_;
  uint32_t lane_calls_ = 0;
};

// Runs body(fused_ctx) on every thread of a block (options.threads of them), each with a FusedCtx
// built on the world's context (the same BlockEnv, so the same rank, block, peers, executor and
// tracer). For kernels enqueued on a sim::World that call the fused templates.
template <class SimCtxT, class Body>
void with_fused_ctx(SimCtxT& ctx, const FusedBlockOptions& options, Body body) {
  FusedBlockShared shared;
  shared.options = options;
  sim::BlockThreads::run(
      options.threads,
      [&](int thread, sim::BlockThreads& threads) {
        FusedCtx<std::remove_cv_t<SimCtxT>> fused_ctx(ctx.env(), threads, shared, thread);
        body(fused_ctx);
      },
      options.thread_order_seed);
}

// One thread, x from the world's input buffers.
template <class SimCtxT, class Body>
void with_fused_ctx(SimCtxT& ctx, Body body) {
  with_fused_ctx(ctx, FusedBlockOptions{}, body);
}

struct FusedSpec {
  FusedAlgorithm algo = FusedAlgorithm::kOneStage;
  DType dtype = DType::kBF16;
  int rows = 1;
  int hidden = 0;  // H
  float eps = 1e-6f;
  int blocks = 1;
  // Threads per block, 1..kMaxLanes; 0: the algorithm's default (fused_threads). Every count gives
  // the same bits; for gather_norm, one_stage_reg, push_one_stage_reg and lamport_one_stage it
  // picks the path (the register path only where threads == the RMSNorm tree's lanes:
  // fused_register_path).
  int threads = 0;
  bool unfused_two_shot = false;  // unfused: two_shot all-reduce instead of one_shot
  // The all-reduce's library contract (canonical or tree); the residual add and the norm are the
  // canonical ones under either.
  Contract contract = Contract::kCanonical;
};

// Returns the threads per block that run_fused runs spec with: spec.threads when not 0; else, for
// gather_norm, one_stage_reg and push_one_stage_reg, the RMSNorm tree's lanes (32 x ceil(min(H /
// pack, 1024) / 32)), so that their register path runs wherever it can (at most 2 packs a thread:
// H up to 2048 packs; beyond, core's path with as many threads); 1 for the others, whose code has
// no path that depends on the thread count, and for lamport_one_stage and lamport_two_stage, whose register path runs
// only with the threads given (its seeded explorations run many calls of many blocks, one thread
// each). (The GPU's default grid has max(64, lanes) threads, so for H of at most 32 packs the GPU
// takes core's path where the simulator runs the register path by default; --threads 64 runs the
// GPU's. The GPU's Lamport kernels may hold a row on a thread-block cluster of C blocks of
// lanes / C threads, which runs core's templates as one block of `lanes` threads: --threads lanes
// here. The bits are the same either way.)
int fused_threads(const FusedSpec& spec);

// Whether spec runs core/fused_rmsnorm_kernels.h's register path: gather_norm, one_stage_reg or
// push_one_stage_reg with fused_threads(spec) == the tree's lanes and at most 2 packs a thread
// (register_path_fits<2>); lamport_one_stage and lamport_two_stage where lamport_register_path(fused_threads(spec),
// tree) (threads == lanes, at most one pack a thread). False for a spec with an invalid H.
bool fused_register_path(const FusedSpec& spec);

// Per-rank buffers of one run, all [rows, H] except weight [H]. Inputs are read during the run;
// outputs are written. Any alignment (the run stages through 16-byte aligned copies).
struct FusedIo {
  std::vector<const void*> x, residual, weight;
  std::vector<void*> residual_out, out;
};

// Under the seeded scheduler every block of a launch is alive at once, each thread with its own
// fiber stack (two memory mappings each; Linux allows about 65530 a process).
inline constexpr int kMaxSeededThreads = 16384;

// Returns "" when spec can run on `ranks` ranks under `schedule`, else what is wrong: ranks outside
// 1..kMaxRanks, rows < 1, H not a positive multiple of the pack, blocks outside 1..kMaxBlocks,
// threads outside 0..kMaxLanes, or (seeded) more than
// kMaxSeededThreads simulated threads at once (ranks x blocks x threads, when threads > 1).
std::string check_fused_spec(const FusedSpec& spec, int ranks, sim::Schedule schedule = sim::Schedule::kThreads);

// Runs the op on world (enqueues its launches and calls world.run()), as the GPU launches it:
//   - one_stage, two_stage, gather_norm, one_stage_reg read every rank's x from its staging
//     buffer (the world's input buffer): each block first copies the rows that block b of every
//     rank reads into its own rank's (stage_fused_input, core/fused_rmsnorm_kernels.h), and the
//     staging buffer holds a NaN pattern before, so a row read unstaged shows in the bits;
//   - push_one_stage, push_one_stage_reg, lamport_one_stage and lamport_two_stage read only their own x, in place
//     (FusedBlockOptions::own_x; a peer's x reads as the NaN pattern);
//   - scratch: two_stage fused_two_stage_scratch_elements(rows, H), gather_norm
//     gather_norm_scratch_elements(rows, H) (both filled with the NaN pattern first), the push
//     algorithms push_scratch_elements(rows * H, pack, ranks); lamport_one_stage the Lamport region
//     lamport_region_bytes(rows * H, sizeof(T), ranks), lamport_two_stage
//     lamport_two_stage_region_bytes(rows, H, sizeof(T), ranks);
//   - residual_out and out hold the NaN pattern before the launches, so an element that no thread
//     writes shows;
//   - blocks of fused_threads(spec) threads; under the seeded scheduler their order between syncs
//     is drawn from the schedule seed (FusedBlockOptions::thread_order_seed).
// Throws std::invalid_argument when check_fused_spec fails for the world's ranks and schedule or
// io does not have one pointer per rank; sim::SimError when the run fails (deadlock, livelock,
// timeout).
void run_fused(sim::World& world, const FusedSpec& spec, const FusedIo& io);

}  // namespace exactcoll::fused

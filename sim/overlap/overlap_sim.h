// The overlap schedules (core/overlap_plan.h) on the simulated world: each rank's call is one
// launch whose blocks are the plan's streams (comm0, comm1, ..., compute), so the seeded scheduler
// interleaves the pulls, the products and the get protocol's flag waits and signals, and traces
// show every step per rank and stream. Products use Eigen with float accumulation
// (sim/overlap/matmul.h), over the row blocks of the shape's ProductGrouping (one shard's rows at a
// time for per_shard).
//
// Bits and the grouping: Eigen's float result for a row of C depends on the row count of the
// product it is in (the blocking, and the path for the rows left over by the register blocking,
// are chosen per shape). In tests/sim/overlap/overlap_sim_test.cc (3-row shards, k = 20, n = 12) fp32 C
// of merged differs from per_shard's in 44 of 576 elements on 4 ranks, 287 of 2304 on 8; rounded to
// bf16 no element differed there, which the rounding makes likely, not certain. So the pipelined C
// equals the unpipelined C of the same grouping bit for bit; C of different groupings may differ.
//
// Example (4 ranks, C = allgather(A) @ B):
//   sim::World world({.ranks = 4, .schedule = sim::Schedule::kSeeded, .schedule_seed = 7});
//   overlap::OverlapSim ov(world);
//   ov.enqueue(shape, io);   // io: per-rank shards, B, gathered and product buffers
//   world.run();             // throws sim::SimError on deadlock (naming flags and epochs)
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/storage.h"
#include "core/overlap_plan.h"
#include "sim/world.h"

namespace exactcoll::overlap {

struct OverlapShape {
  Pattern pattern = Pattern::kAgMatmul;
  ProductGrouping grouping = ProductGrouping::kPerShard;  // kAgMatmul: the row blocks of the products
  DType dtype = DType::kBF16;
  // kAgMatmul: C [m, n] = allgather(A) [m, k] @ B [k, n]; A's rows are split evenly (m % ranks == 0).
  // kPrefetch: C [m, n] = X [m, k] @ W [k, n] on every rank, unrelated to the all-gather.
  size_t m = 0, k = 0, n = 0;
  size_t gather_count = 0;  // kPrefetch: elements per rank all-gathered (kAgMatmul: m / ranks * k)

  // Elements of one rank's shard.
  size_t shard_elements(int ranks) const {
    return pattern == Pattern::kAgMatmul ? m / static_cast<size_t>(ranks) * k : gather_count;
  }
};

// Returns "" when shape is valid on `ranks` ranks, else what is wrong.
std::string check_shape(const OverlapShape& shape, int ranks);

// Host buffers of one call (storage bit patterns; one entry per rank).
struct OverlapIo {
  std::vector<const void*> shards;  // shard_elements(ranks) elements each
  std::vector<const void*> lhs;     // kPrefetch: X [m, k]; kAgMatmul: unused (may be empty)
  std::vector<const void*> rhs;     // B (or W) [k, n]
  std::vector<void*> gathered;      // ranks * shard_elements(ranks) elements each
  std::vector<void*> products;      // C [m, n]
};

// Returns "" when io has one buffer of each kind per rank (lhs only for kPrefetch).
std::string check_io(const OverlapShape& shape, const OverlapIo& io, int ranks);

class OverlapSim {
 public:
  // Adds the flag block (OverlapFlags) to every rank's symmetric heap.
  explicit OverlapSim(sim::World& world, int comm_streams = 2);

  // Queues one call (one launch per rank; the call's epoch is the number of calls queued so far
  // plus one). `plans` replaces the default plans (make_plan), e.g. with a broken protocol in a
  // test; it must hold one plan per rank with comm_streams + 1 streams and the shape's pattern and
  // grouping. The host buffers must stay alive until world.run() returns. Throws
  // std::invalid_argument for a bad shape or io.
  void enqueue(const OverlapShape& shape, const OverlapIo& io, std::vector<RankPlan> plans = {});

  uint32_t calls() const { return epoch_; }
  int comm_streams() const { return comm_streams_; }

 private:
  sim::World& world_;
  int comm_streams_;
  int flags_id_;
  uint32_t epoch_ = 0;
};

// The unpipelined schedule on the same world (its queue must be empty): the simulator's all-gather
// (core/collectives.h allgather) into io.gathered, run, then the products on the host: for
// kAgMatmul each rank's row blocks of the shape's grouping (product_ranges of its plan, the same
// blocks as the pipeline), X @ W for kPrefetch.
void run_unpipelined(sim::World& world, const OverlapShape& shape, const OverlapIo& io);

// Rank `rank`'s products from its gathered A (or X) and B, as run_unpipelined computes them.
void products_for_rank(const OverlapShape& shape, int ranks, int rank, const void* gathered_or_lhs, const void* rhs,
                       void* product);

}  // namespace exactcoll::overlap

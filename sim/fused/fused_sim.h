// The fused all-reduce + residual add + RMSNorm on the simulated world: core/fused_rmsnorm.h's
// one_stage, two_stage, push_one_stage and lamport_one_stage launched on every (rank, block), and unfused as three
// launches (the all-reduce of sim/collectives.h, then residual_add_step, then rmsnorm_step).
#pragma once

#include <string>
#include <type_traits>
#include <vector>

#include "core/contract.h"
#include "core/fused_rmsnorm.h"
#include "core/storage.h"
#include "sim/world.h"

namespace exactcoll::fused {

// The simulator's context plus the row_sum_squares hook that core/fused_rmsnorm.h adds to the
// execution-context concept: one simulated thread per block computes the whole canonical tree.
template <class Base>
class FusedCtx : public Base {
 public:
  using Base::Base;
  template <class Row>
  float row_sum_squares(const contract::RmsNormTree& tree, Row row) {
    return contract::sum_squares(tree, row);
  }
};

// Runs body(fused_ctx) with a FusedCtx built on the world's context (the same BlockEnv, so the same
// rank, block, peers, executor and tracer). For kernels enqueued on a sim::World that call
// core/fused_rmsnorm.h's templates.
template <class SimCtxT, class Body>
void with_fused_ctx(SimCtxT& ctx, Body body) {
  FusedCtx<std::remove_cv_t<SimCtxT>> fused_ctx(ctx.env());
  body(fused_ctx);
}

struct FusedSpec {
  FusedAlgo algo = FusedAlgo::kOneStage;
  DType dtype = DType::kBF16;
  int rows = 1;
  int hidden = 0;  // H
  float eps = 1e-6f;
  int blocks = 1;
  bool unfused_two_shot = false;  // unfused: two_shot all-reduce instead of one_shot
};

// Per-rank buffers of one run, all [rows, H] except weight [H]. Inputs are read during the run;
// outputs are written. Any alignment (the run stages through 16-byte aligned copies).
struct FusedIo {
  std::vector<const void*> x, residual, weight;
  std::vector<void*> residual_out, out;
};

// Returns "" when spec is valid on `ranks` ranks, else what is wrong: ranks outside
// 1..kMaxRanks, rows < 1, H not a positive multiple of the pack, blocks outside 1..kMaxBlocks.
std::string check_fused_spec(const FusedSpec& spec, int ranks);

// Runs the op on world (enqueues its launches and calls world.run()). push_one_stage's scratch is
// sized by push_scratch_elements(rows * H, pack, ranks). Throws std::invalid_argument
// when check_fused_spec fails or io does not have one pointer per rank; sim::SimError when the run
// fails (deadlock, livelock, timeout).
void run_fused(sim::World& world, const FusedSpec& spec, const FusedIo& io);

}  // namespace exactcoll::fused

#include "sim/overlap/overlap_sim.h"

#include <cstring>
#include <stdexcept>

#include "core/collectives.h"
#include "sim/collectives.h"
#include "sim/overlap/matmul.h"

namespace exactcoll::overlap {
namespace {

// What one launch's blocks share (read-only while the launch runs).
struct CallState {
  OverlapShape shape;
  OverlapIo io;
  std::vector<RankPlan> plans;
  uint32_t epoch = 0;
  int flags_id = 0;
  int ranks = 1;
};

// kAgMatmul: the rows of C of shards [range.first, range.first + range.count), one product, from
// `a_rows` (those rows of A) and B into `product` (all of C).
void block_product(const OverlapShape& shape, int ranks, ShardRange range, const void* a_rows, const void* rhs,
                   void* product) {
  const size_t shard_rows = shape.m / static_cast<size_t>(ranks);
  const size_t rows = shard_rows * static_cast<size_t>(range.count);
  const size_t esize = static_cast<size_t>(dtype_size(shape.dtype));
  const std::vector<float> a = widen_all(shape.dtype, a_rows, rows * shape.k);
  const std::vector<float> b = widen_all(shape.dtype, rhs, shape.k * shape.n);
  char* c = static_cast<char*>(product) + static_cast<size_t>(range.first) * shard_rows * shape.n * esize;
  matmul_rounded(shape.dtype, a.data(), rows, shape.k, b.data(), shape.n, c);
}

// Runs stream `ctx.block()` of this rank's plan: the body of one simulated block.
template <class Ctx>
void run_stream(Ctx& ctx, const CallState& s) {
  const int me = ctx.rank();
  const RankPlan& plan = s.plans[static_cast<size_t>(me)];
  const StreamPlan& stream = plan.streams[static_cast<size_t>(ctx.block())];
  const size_t esize = static_cast<size_t>(dtype_size(s.shape.dtype));
  const size_t shard = s.shape.shard_elements(s.ranks);
  const uint32_t epoch = s.epoch;
  auto flags = [&](int rank) { return static_cast<OverlapFlags*>(ctx.buffer(s.flags_id, rank)); };
  char* gathered = reinterpret_cast<char*>(ctx.output());
  for (const PlanOp& op : stream.ops) {
    if constexpr (Ctx::kTraceSteps) ctx.trace_step_begin(op_name(op.kind));
    switch (op.kind) {
      case OpKind::kSignalReady:
        if constexpr (Ctx::kTraceSteps) ctx.trace_step_end();
        ctx.signal(&flags(op.peer)->ready[me], epoch, op.peer, kFlagReady);
        break;
      case OpKind::kWaitReady:
        if constexpr (Ctx::kTraceSteps) ctx.trace_step_end();
        ctx.wait(&flags(me)->ready[op.peer], epoch, op.peer, kFlagReady);
        break;
      case OpKind::kPullShard:
      case OpKind::kCopyOwnShard: {
        const int owner = op.kind == OpKind::kCopyOwnShard ? me : op.peer;
        const size_t offset = shard * static_cast<size_t>(owner);
        if constexpr (Ctx::kTraceSteps) {
          ctx.trace_access(Access::kRead, owner, Buffer::kInput, 0, shard);
          ctx.trace_access(Access::kWrite, me, Buffer::kOutput, offset, offset + shard);
          ctx.trace_step_end();
        }
        // The copy engine's bit copy: NaN payloads and -0 stay.
        std::memcpy(gathered + offset * esize, ctx.input(owner), shard * esize);
        break;
      }
      case OpKind::kSignalConsumed:
        if constexpr (Ctx::kTraceSteps) ctx.trace_step_end();
        ctx.signal(&flags(op.peer)->consumed[me], epoch, op.peer, kFlagConsumed);
        break;
      case OpKind::kRecordArrival:
        if constexpr (Ctx::kTraceSteps) ctx.trace_step_end();
        ctx.signal(&flags(me)->arrived[op.step], epoch, me, kFlagArrived);
        break;
      case OpKind::kWaitArrival:
        if constexpr (Ctx::kTraceSteps) ctx.trace_step_end();
        ctx.wait(&flags(me)->arrived[op.step], epoch, me, kFlagArrived);
        break;
      case OpKind::kMatmul:
        if (plan.pattern == Pattern::kAgMatmul) {
          // Step 0 reads the local shard in place (symmetric input); other products the gathered
          // rows of the shards they cover.
          const size_t offset = shard * static_cast<size_t>(op.peer);
          const size_t length = shard * static_cast<size_t>(op.shards);
          if constexpr (Ctx::kTraceSteps) {
            if (op.step == 0) {
              ctx.trace_access(Access::kRead, me, Buffer::kInput, 0, shard);
            } else {
              ctx.trace_access(Access::kRead, me, Buffer::kOutput, offset, offset + length);
            }
            ctx.trace_step_end();
          }
          const void* rows = op.step == 0 ? static_cast<const void*>(ctx.input(me))
                                          : static_cast<const void*>(gathered + offset * esize);
          block_product(s.shape, s.ranks, {op.peer, op.shards}, rows, s.io.rhs[static_cast<size_t>(me)],
                        s.io.products[static_cast<size_t>(me)]);
        } else {
          if constexpr (Ctx::kTraceSteps) ctx.trace_step_end();
          products_for_rank(s.shape, s.ranks, me, s.io.lhs[static_cast<size_t>(me)], s.io.rhs[static_cast<size_t>(me)],
                            s.io.products[static_cast<size_t>(me)]);
        }
        break;
      case OpKind::kWaitConsumed:
        if constexpr (Ctx::kTraceSteps) ctx.trace_step_end();
        ctx.wait(&flags(me)->consumed[op.peer], epoch, op.peer, kFlagConsumed);
        break;
    }
  }
}

template <class T>
void enqueue_typed(sim::World& world, sim::Launch launch, std::shared_ptr<const CallState> state) {
  world.enqueue<T>(std::move(launch), [state](auto& ctx) { run_stream(ctx, *state); });
}

}  // namespace

std::string check_shape(const OverlapShape& shape, int ranks) {
  if (ranks < 1 || ranks > kMaxOverlapRanks) {
    return "ranks must be 1.." + std::to_string(kMaxOverlapRanks) + ", got " + std::to_string(ranks);
  }
  if (shape.m < 1 || shape.k < 1 || shape.n < 1) return "m, k and n must be at least 1";
  if (shape.pattern == Pattern::kAgMatmul && shape.m % static_cast<size_t>(ranks) != 0) {
    return "ag_matmul splits A's " + std::to_string(shape.m) + " rows evenly over " + std::to_string(ranks) +
           " ranks: m must be a multiple of the ranks";
  }
  if (shape.pattern == Pattern::kPrefetch && shape.gather_count < 1) {
    return "prefetch needs a gather count of at least 1 element per rank";
  }
  return "";
}

std::string check_io(const OverlapShape& shape, const OverlapIo& io, int ranks) {
  const size_t n = static_cast<size_t>(ranks);
  auto bad = [&](size_t size, const char* what) {
    return size != n
               ? std::string(what) + ": " + std::to_string(size) + " buffers for " + std::to_string(ranks) + " ranks"
               : std::string();
  };
  for (const std::string& problem : {bad(io.shards.size(), "shards"), bad(io.rhs.size(), "rhs"),
                                     bad(io.gathered.size(), "gathered"), bad(io.products.size(), "products")}) {
    if (!problem.empty()) return problem;
  }
  if (shape.pattern == Pattern::kPrefetch) return bad(io.lhs.size(), "lhs");
  return "";
}

OverlapSim::OverlapSim(sim::World& world, int comm_streams) : world_(world), comm_streams_(comm_streams) {
  if (comm_streams < 1 || comm_streams + 1 > kMaxBlocks) {
    throw std::invalid_argument("overlap: comm streams must be 1.." + std::to_string(kMaxBlocks - 1));
  }
  flags_id_ = world_.add_buffer("overlap_flags", sizeof(OverlapFlags));
}

void OverlapSim::enqueue(const OverlapShape& shape, const OverlapIo& io, std::vector<RankPlan> plans) {
  const int n = world_.ranks();
  std::string problem = check_shape(shape, n);
  if (problem.empty()) problem = check_io(shape, io, n);
  if (!problem.empty()) throw std::invalid_argument("overlap: " + problem);
  if (plans.empty()) {
    for (int r = 0; r < n; ++r) plans.push_back(make_plan(shape.pattern, r, n, comm_streams_, shape.grouping));
  }
  if (static_cast<int>(plans.size()) != n) throw std::invalid_argument("overlap: one plan per rank is needed");
  for (const RankPlan& p : plans) {
    if (p.comm_streams() != comm_streams_ || p.pattern != shape.pattern || p.grouping != shape.grouping) {
      throw std::invalid_argument("overlap: a plan's stream count, pattern or grouping does not match the call");
    }
  }
  auto state = std::make_shared<CallState>();
  state->shape = shape;
  state->io = io;
  state->plans = std::move(plans);
  state->epoch = ++epoch_;
  state->flags_id = flags_id_;
  state->ranks = n;

  const size_t esize = static_cast<size_t>(dtype_size(shape.dtype));
  const size_t shard = shape.shard_elements(n);
  sim::Launch launch;
  launch.name = std::string("overlap_") + pattern_name(shape.pattern);
  launch.blocks = comm_streams_ + 1;
  launch.inputs = io.shards;
  launch.input_bytes = shard * esize;
  launch.outputs = io.gathered;
  launch.output_bytes = shard * esize * static_cast<size_t>(n);
  with_storage_type(shape.dtype, [&](auto tag) { enqueue_typed<decltype(tag)>(world_, std::move(launch), state); });
}

void products_for_rank(const OverlapShape& shape, int ranks, int rank, const void* gathered_or_lhs, const void* rhs,
                       void* product) {
  if (shape.pattern == Pattern::kPrefetch) {
    const std::vector<float> a = widen_all(shape.dtype, gathered_or_lhs, shape.m * shape.k);
    const std::vector<float> b = widen_all(shape.dtype, rhs, shape.k * shape.n);
    matmul_rounded(shape.dtype, a.data(), shape.m, shape.k, b.data(), shape.n, product);
    return;
  }
  const size_t shard_bytes =
      shape.m / static_cast<size_t>(ranks) * shape.k * static_cast<size_t>(dtype_size(shape.dtype));
  for (const ShardRange range : product_ranges(make_plan(shape.pattern, rank, ranks, 1, shape.grouping))) {
    block_product(shape, ranks, range,
                  static_cast<const char*>(gathered_or_lhs) + static_cast<size_t>(range.first) * shard_bytes, rhs,
                  product);
  }
}

void run_unpipelined(sim::World& world, const OverlapShape& shape, const OverlapIo& io) {
  const int n = world.ranks();
  std::string problem = check_shape(shape, n);
  if (problem.empty()) problem = check_io(shape, io, n);
  if (!problem.empty()) throw std::invalid_argument("overlap: " + problem);
  sim::CollectiveSpec spec;
  spec.op = sim::Op::kAllGather;
  spec.dtype = shape.dtype;
  spec.count = shape.shard_elements(n);
  sim::enqueue_collective(world, spec, io.shards, io.gathered);
  world.run();
  for (int r = 0; r < n; ++r) {
    const void* a = shape.pattern == Pattern::kAgMatmul ? static_cast<const void*>(io.gathered[static_cast<size_t>(r)])
                                                        : io.lhs[static_cast<size_t>(r)];
    products_for_rank(shape, n, r, a, io.rhs[static_cast<size_t>(r)], io.products[static_cast<size_t>(r)]);
  }
}

}  // namespace exactcoll::overlap

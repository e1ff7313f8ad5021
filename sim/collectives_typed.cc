// enqueue_folding<T, kFold> for the one storage type and contract that EXACTCOLL_INSTANCE_T and
// EXACTCOLL_INSTANCE_CONTRACT name: sim/BUILD compiles this file six times (sim/typed_instances.bzl
// says why).
#include <stdexcept>
#include <string>
#include <utility>

#include "core/collectives.h"
#include "core/lamport.h"
#include "core/push.h"
#include "sim/collectives_typed.h"

#if !defined(EXACTCOLL_INSTANCE_T) || !defined(EXACTCOLL_INSTANCE_CONTRACT)
#error "compiled by sim/typed_instances.bzl, which defines EXACTCOLL_INSTANCE_T and EXACTCOLL_INSTANCE_CONTRACT"
#endif

namespace exactcoll::sim {
namespace {

// Runs core's all-reduce template for `algorithm` (resolved: not auto; check_spec refused the
// algorithms the simulator does not run, so those throw here only on a broken precondition).
template <class T, int kRanks, class Ctx>
void run_allreduce(Ctx& ctx, Algorithm algorithm, size_t count) {
  switch (algorithm) {
    case Algorithm::kOneShot: allreduce_one_shot<T, kRanks>(ctx, count); return;
    case Algorithm::kTwoShot: allreduce_two_shot<T, kRanks>(ctx, count); return;
    case Algorithm::kPushOneShot: allreduce_push_one_shot<T, kRanks>(ctx, count); return;
    case Algorithm::kPushTwoShot: allreduce_push_two_shot<T, kRanks>(ctx, count); return;
    case Algorithm::kLamportOneShot: allreduce_lamport_one_shot<T, kRanks>(ctx, count); return;
    case Algorithm::kLamportTwoShot: allreduce_lamport_two_shot<T, kRanks>(ctx, count); return;
    case Algorithm::kAuto:
    case Algorithm::kDirect:
    case Algorithm::kCopyEngine:
    case Algorithm::kNccl: break;
  }
  throw std::logic_error(std::string("the simulator has no all-reduce kernel ") + algorithm_name(algorithm));
}

}  // namespace

template <class T, Contract kFold>
void enqueue_folding(World& world, const CollectiveSpec& spec, Algorithm algorithm, Launch launch) {
  const size_t count = spec.count;
  const Op op = spec.op;
  world.enqueue<T, kFold>(std::move(launch), [count, op, algorithm](auto& ctx) {
    dispatch_world_size(ctx.world_size(), [&](auto ranks) {
      constexpr int kRanks = decltype(ranks)::value;
      switch (op) {
        case Op::kAllReduce: run_allreduce<T, kRanks>(ctx, algorithm, count); break;
        case Op::kReduceScatter: reduce_scatter<T, kRanks>(ctx, count); break;
        case Op::kAllGather: allgather<T, kRanks>(ctx, count); break;
      }
    });
  });
}

template void enqueue_folding<EXACTCOLL_INSTANCE_T, Contract::EXACTCOLL_INSTANCE_CONTRACT>(World&,
                                                                                           const CollectiveSpec&,
                                                                                           Algorithm, Launch);

}  // namespace exactcoll::sim

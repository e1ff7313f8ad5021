#include "sim/fused/fused_sim.h"

#include <cstring>
#include <memory>
#include <new>
#include <stdexcept>

#include "core/collectives.h"
#include "core/contract.h"
#include "sim/collectives.h"

namespace exactcoll::fused {
namespace {

// 16-byte aligned storage, zeroed.
struct Aligned {
  explicit Aligned(size_t bytes) : data(static_cast<std::byte*>(::operator new(bytes + 16, std::align_val_t{16}))) {
    std::memset(data, 0, bytes + 16);
  }
  ~Aligned() { ::operator delete(data, std::align_val_t{16}); }
  Aligned(const Aligned&) = delete;
  Aligned& operator=(const Aligned&) = delete;
  std::byte* data;
};

template <class T>
void run_typed(sim::World& world, const FusedSpec& spec, const FusedIo& io) {
  const int n = world.ranks();
  const size_t count = static_cast<size_t>(spec.rows) * spec.hidden;
  const size_t bytes = count * sizeof(T);
  const size_t weight_bytes = static_cast<size_t>(spec.hidden) * sizeof(T);
  // 1. Aligned per-rank copies of the inputs and room for the outputs (the GPU's buffers).
  std::vector<std::unique_ptr<Aligned>> residual, weight, residual_out, out, s;
  std::vector<FusedRmsNormArgs<T>> args(n);
  for (int r = 0; r < n; ++r) {
    residual.push_back(std::make_unique<Aligned>(bytes));
    weight.push_back(std::make_unique<Aligned>(weight_bytes));
    residual_out.push_back(std::make_unique<Aligned>(bytes));
    out.push_back(std::make_unique<Aligned>(bytes));
    s.push_back(std::make_unique<Aligned>(bytes));
    std::memcpy(residual[r]->data, io.residual[r], bytes);
    std::memcpy(weight[r]->data, io.weight[r], weight_bytes);
    FusedRmsNormArgs<T>& a = args[r];
    a.residual = reinterpret_cast<const T*>(residual[r]->data);
    a.weight = reinterpret_cast<const T*>(weight[r]->data);
    a.residual_out = reinterpret_cast<T*>(residual_out[r]->data);
    a.out = reinterpret_cast<T*>(out[r]->data);
    a.rows = spec.rows;
    a.hidden = spec.hidden;
    a.eps = spec.eps;
    if (const char* problem = fused_rmsnorm_args_error(a)) throw std::invalid_argument(problem);
  }
  // 2. The launches.
  if (spec.algo == FusedAlgo::kUnfused) {
    sim::CollectiveSpec ar;
    ar.op = sim::Collective::kAllReduce;
    ar.algorithm = spec.unfused_two_shot ? sim::Algorithm::kTwoShot : sim::Algorithm::kOneShot;
    ar.dtype = spec.dtype;
    ar.count = count;
    ar.blocks = spec.blocks;
    std::vector<void*> s_ptrs;
    for (int r = 0; r < n; ++r) s_ptrs.push_back(s[r]->data);
    sim::enqueue_collective(world, ar, io.x, s_ptrs);
    sim::Launch add;
    add.name = "residual_add";
    add.blocks = spec.blocks;
    world.enqueue<T>(add, [args, s_ptrs, count](auto& ctx) {
      const FusedRmsNormArgs<T>& a = args[ctx.rank()];
      residual_add_step<T>(ctx, static_cast<const T*>(s_ptrs[ctx.rank()]), a.residual, a.residual_out, count);
    });
    sim::Launch norm;
    norm.name = "rmsnorm";
    norm.blocks = spec.blocks;
    world.enqueue<T>(norm, [args](auto& ctx) {
      with_fused_ctx(ctx, [&](auto& fctx) {
        const FusedRmsNormArgs<T>& a = args[fctx.rank()];
        rmsnorm_step<T>(fctx, a.residual_out, a.weight, a.out, a.rows, a.hidden, a.eps);
      });
    });
  } else {
    sim::Launch launch;
    launch.name = std::string("fused_rmsnorm_") + fused_algo_name(spec.algo);
    launch.blocks = spec.blocks;
    launch.inputs = io.x;
    launch.input_bytes = bytes;
    launch.scratch_bytes =
        (spec.algo == FusedAlgo::kTwoStage       ? fused_two_stage_scratch_elements(spec.rows, spec.hidden)
         : spec.algo == FusedAlgo::kPushOneStage ? push_scratch_elements(count, Storage<T>::kPack, n)
                                                 : 0) *
        sizeof(T);
    launch.lamport_bytes =
        spec.algo == FusedAlgo::kLamportOneStage ? lamport_region_bytes(count, sizeof(T), n) : 0;
    const FusedAlgo algo = spec.algo;
    world.enqueue<T>(launch, [args, algo](auto& ctx) {
      with_fused_ctx(ctx, [&](auto& fctx) {
        const FusedRmsNormArgs<T>& a = args[fctx.rank()];
        dispatch_world_size(fctx.world_size(), [&](auto ranks) {
          constexpr int kRanks = decltype(ranks)::value;
          if (algo == FusedAlgo::kOneStage) {
            fused_rmsnorm_one_stage<T, kRanks>(fctx, a);
          } else if (algo == FusedAlgo::kPushOneStage) {
            fused_rmsnorm_push_one_stage<T, kRanks>(fctx, a);
          } else if (algo == FusedAlgo::kLamportOneStage) {
            fused_rmsnorm_lamport_one_stage<T, kRanks>(fctx, a);
          } else {
            fused_rmsnorm_two_stage<T, kRanks>(fctx, a);
          }
        });
      });
    });
  }
  world.run();
  // 3. Copy the outputs out.
  for (int r = 0; r < n; ++r) {
    std::memcpy(io.residual_out[r], residual_out[r]->data, bytes);
    std::memcpy(io.out[r], out[r]->data, bytes);
  }
}

}  // namespace

std::string check_fused_spec(const FusedSpec& spec, int ranks) {
  if (ranks < 1 || ranks > kMaxRanks) {
    return "ranks must be 1.." + std::to_string(kMaxRanks) + ", got " + std::to_string(ranks);
  }
  if (spec.rows < 1) return "rows must be at least 1, got " + std::to_string(spec.rows);
  const int pack = spec.dtype == DType::kFP32 ? Storage<float>::kPack : Storage<bf16>::kPack;
  if (spec.hidden <= 0 || spec.hidden % pack != 0) {
    return "hidden size " + std::to_string(spec.hidden) + " is not a positive multiple of the " +
           dtype_name(spec.dtype) + " pack (" + std::to_string(pack) + " elements)";
  }
  if (spec.blocks < 1 || spec.blocks > kMaxBlocks) {
    return "blocks must be 1.." + std::to_string(kMaxBlocks) + ", got " + std::to_string(spec.blocks);
  }
  return "";
}

void run_fused(sim::World& world, const FusedSpec& spec, const FusedIo& io) {
  const std::string problem = check_fused_spec(spec, world.ranks());
  if (!problem.empty()) throw std::invalid_argument(problem);
  const size_t n = static_cast<size_t>(world.ranks());
  if (io.x.size() != n || io.residual.size() != n || io.weight.size() != n || io.residual_out.size() != n ||
      io.out.size() != n) {
    throw std::invalid_argument("run_fused: every buffer list needs one pointer per rank");
  }
  switch (spec.dtype) {
    case DType::kBF16: run_typed<bf16>(world, spec, io); break;
    case DType::kFP16: run_typed<fp16>(world, spec, io); break;
    case DType::kFP32: run_typed<float>(world, spec, io); break;
  }
}

}  // namespace exactcoll::fused

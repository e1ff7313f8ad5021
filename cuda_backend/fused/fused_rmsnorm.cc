#include "cuda_backend/fused/fused_rmsnorm.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <stdexcept>

#include "core/fused_rmsnorm.h"
#include "core/lamport.h"
#include "cuda_backend/cuda_check.h"
#include "cuda_backend/fused/fused_kernels.h"

namespace exactcoll::cuda::fused {
namespace {

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

const char* kind_of_error = "internal: no fused kernel for this algorithm";

FusedKernelKind kernel_kind(FusedAlgorithm a) {
  switch (a) {
    case FusedAlgorithm::kOneStage: return FusedKernelKind::kOneStage;
    case FusedAlgorithm::kOneStageReg: return FusedKernelKind::kOneStageReg;
    case FusedAlgorithm::kPushOneStage: return FusedKernelKind::kPushOneStage;
    case FusedAlgorithm::kLamportOneStage: return FusedKernelKind::kLamportOneStage;
    case FusedAlgorithm::kLamportTwoStage: return FusedKernelKind::kLamportTwoStage;
    case FusedAlgorithm::kTwoStage: return FusedKernelKind::kTwoStage;
    case FusedAlgorithm::kGatherNorm: return FusedKernelKind::kGatherNorm;
    default: throw std::logic_error(kind_of_error);
  }
}

void check_shape(const FusedRmsNormShape& s) {
  const int pack = pack_elements(s.dtype);
  if (s.rows < 0) throw std::invalid_argument("fused_rmsnorm: rows must be >= 0, got " + std::to_string(s.rows));
  if (s.hidden <= 0 || s.hidden % pack != 0) {
    throw std::invalid_argument("fused_rmsnorm: hidden size " + std::to_string(s.hidden) +
                                " is not a positive multiple of the " + dtype_name(s.dtype) + " pack (" +
                                std::to_string(pack) + " elements)");
  }
  if (static_cast<int64_t>(s.rows) * s.hidden > (int64_t{1} << 40)) {
    throw std::invalid_argument("fused_rmsnorm: rows * H is too large");
  }
}

void check_grid(const LaunchConfig& g, bool with_barriers) {
  const int max_blocks = with_barriers ? kMaxBlocks : 65535;
  if (g.blocks < 1 || g.blocks > max_blocks || g.threads < 64 || g.threads > 1024 || g.threads % 32 != 0) {
    throw std::invalid_argument("fused_rmsnorm: grid must have 1.." + std::to_string(max_blocks) +
                                " blocks and a multiple of 32 threads in 64..1024");
  }
}

}  // namespace

FusedRmsNorm::FusedRmsNorm(Communicator& comm, std::optional<FusedTable> table)
    : comm_(comm), table_(table ? std::move(*table) : FusedTable::from_environment()) {}

FusedChoice FusedRmsNorm::choose(const FusedRmsNormShape& shape, FusedAlgorithm algo) const {
  // A named algorithm runs in row chunks that fit (run): its default grid, nothing to weigh.
  if (algo != FusedAlgorithm::kAuto) {
    return table_.choose(comm_.arch(), comm_.world_size(), shape.rows, shape.hidden, shape.dtype, algo);
  }
  // auto never runs push_one_stage where its receive halves for all rows do not fit the scratch,
  // nor lamport_one_stage or lamport_two_stage where the rows do not fit one Lamport slot (each
  // would take several launches, which the table's one-launch times do not price): the table's
  // fastest among the others at that point. Each algorithm's answer once, not once per table row of
  // this world size (about 120).
  std::array<bool, std::size(kFusedAlgorithmInfos)> fits{};
  for (const FusedAlgorithmInfo& e : kFusedAlgorithmInfos) {
    const FusedAlgorithm a = e.algorithm;
    const bool chunked_kind = a == FusedAlgorithm::kPushOneStage || is_lamport_fused(a);
    fits[static_cast<size_t>(a)] = !chunked_kind || max_rows_per_launch(a, shape, false) >= shape.rows;
  }
  auto one_launch = [&fits](FusedAlgorithm a) { return fits[static_cast<size_t>(a)]; };
  FusedChoice c =
      table_.choose(comm_.arch(), comm_.world_size(), shape.rows, shape.hidden, shape.dtype, algo, one_launch);
  // Where no allowed algorithm was measured the heuristic decides, which may name one that does not
  // fit: one_stage_reg instead (same bits).
  if (!one_launch(c.algo)) {
    const bool from_table = c.from_table;
    c = table_.choose(comm_.arch(), comm_.world_size(), shape.rows, shape.hidden, shape.dtype,
                      FusedAlgorithm::kOneStageReg);
    c.from_table = from_table;
  }
  return c;
}

int FusedRmsNorm::max_rows_per_launch(FusedAlgorithm algo, const FusedRmsNormShape& shape, bool staged) const {
  const uint64_t row_bytes = static_cast<uint64_t>(shape.hidden) * dtype_size(shape.dtype);
  const uint64_t capacity = comm_.buffer_bytes();
  uint64_t rows = std::numeric_limits<int>::max();
  if (staged) rows = std::min(rows, capacity / row_bytes);
  if (algo == FusedAlgorithm::kTwoStage) rows = std::min(rows, capacity / (2 * row_bytes));
  if (algo == FusedAlgorithm::kGatherNorm) rows = std::min(rows, capacity / row_bytes);
  if (algo == FusedAlgorithm::kPushOneStage) {
    // push_scratch_elements(rows * H, pack, n): H is a multiple of the pack, so 2 x n x rows x H.
    rows = std::min(rows, capacity / (2 * static_cast<uint64_t>(comm_.world_size()) * row_bytes));
  }
  if (algo == FusedAlgorithm::kLamportOneStage) {
    // One Lamport slot (core/lamport.h: 3 buffers x n slots of the communicator's Lamport region).
    rows = std::min<uint64_t>(rows,
                              lamport_layout(comm_.lamport_region_bytes(), comm_.world_size()).slot_bytes / row_bytes);
  }
  if (algo == FusedAlgorithm::kLamportTwoStage) {
    // Two strides of a rank's rows a slot (core/fused_rmsnorm.h, lamport_two_stage_slot_bytes).
    const size_t slot_bytes = lamport_layout(comm_.lamport_region_bytes(), comm_.world_size()).slot_bytes;
    rows = std::min<uint64_t>(
        rows, lamport_two_stage_max_rows(slot_bytes, static_cast<size_t>(shape.hidden),
                                         static_cast<size_t>(dtype_size(shape.dtype)), comm_.world_size()));
  }
  return static_cast<int>(rows);
}

LaunchConfig launch_residual_rmsnorm(const void* s, const void* residual, const void* weight, void* residual_out,
                                     void* out, const FusedRmsNormShape& shape, cudaStream_t stream, bool programmatic,
                                     std::optional<LaunchConfig> grid) {
  check_shape(shape);
  if (!aligned16(s) || !aligned16(residual) || !aligned16(weight) || !aligned16(residual_out) || !aligned16(out)) {
    throw std::invalid_argument("residual_rmsnorm: every buffer must be 16-byte aligned");
  }
  const LaunchConfig g = grid ? *grid : residual_rmsnorm_grid(shape.rows, shape.hidden, shape.dtype);
  check_grid(g, false);
  if (shape.rows == 0) return g;
  FusedKernelArgs a{};
  a.base.world_size = 1;
  a.s = s;
  a.residual = residual;
  a.weight = weight;
  a.residual_out = residual_out;
  a.out = out;
  a.rows = shape.rows;
  a.hidden = shape.hidden;
  a.eps = shape.eps;
  LaunchConfig launch_grid = g;
  launch_grid.programmatic = programmatic;
  launch_grid.cluster = 1;
  EXC_CUDA_CHECK(launch_fused(shape.dtype, FusedKernelKind::kResidualRmsNorm, a, launch_grid, stream));
  return g;
}

LaunchConfig FusedRmsNorm::residual_rmsnorm(const void* s, const void* residual, const void* weight, void* residual_out,
                                            void* out, const FusedRmsNormShape& shape, cudaStream_t stream,
                                            std::optional<LaunchConfig> grid) {
  return launch_residual_rmsnorm(s, residual, weight, residual_out, out, shape, stream, comm_.programmatic_launch(),
                                 grid);
}

FusedCallInfo FusedRmsNorm::run(const FusedRmsNormBuffers& b, const FusedRmsNormShape& shape, FusedAlgorithm algo,
                                cudaStream_t stream, const RegisteredBuffer* registered_x,
                                std::optional<LaunchConfig> grid) {
  // 1. Arguments.
  check_shape(shape);
  if (!aligned16(b.x) || !aligned16(b.residual) || !aligned16(b.weight) || !aligned16(b.residual_out) ||
      !aligned16(b.out)) {
    throw std::invalid_argument("fused_rmsnorm: x, residual, weight, residual_out and out must be 16-byte aligned");
  }
  const size_t elem = static_cast<size_t>(dtype_size(shape.dtype));
  const size_t H = static_cast<size_t>(shape.hidden);
  const size_t count = static_cast<size_t>(shape.rows) * H;
  const FusedChoice choice = choose(shape, algo);
  FusedCallInfo info;
  info.algo = choice.algo;
  info.grid = grid ? *grid : choice.grid;
  if (shape.rows == 0) return info;

  // 2. The split paths: an all-reduce into out, then the separate kernel (s = out).
  if (!is_fused_kernel(choice.algo)) {
    const bool nccl = choice.algo == FusedAlgorithm::kNcclSplit;
    const CallInfo ar = comm_.allreduce(b.x, b.out, count, shape.dtype, nccl ? Algorithm::kNccl : Algorithm::kAuto,
                                        stream, registered_x);
    info.allreduce = algorithm_name(ar.algo);
    info.exact = ar.exact;
    info.staged = ar.staged;
    info.grid = residual_rmsnorm(b.out, b.residual, b.weight, b.residual_out, b.out, shape, stream, grid);
    info.launches = ar.launches + 1;
    return info;
  }

  // 3. Where x comes from: registered (peers' copies at the same offset) or staged; push_one_stage
  //    reads it where it is (only this rank's kernel reads it: peers read what it pushes).
  //    The Lamport kernels' grid: clusters where several blocks hold a row (lamport_launch_grid).
  check_grid(info.grid, true);
  if (is_lamport_fused(choice.algo)) {
    info.grid = lamport_launch_grid(info.grid, shape.hidden, shape.dtype);
  } else {
    info.grid.cluster = 1;  // only the Lamport kernels run on clusters
  }
  const bool x_in_place = choice.algo == FusedAlgorithm::kPushOneStage || is_lamport_fused(choice.algo);
  KernelArgs base = comm_.ipc_kernel_args();
  size_t x_offset = 0;
  if (registered_x != nullptr) {
    const auto x = reinterpret_cast<uintptr_t>(b.x), local = reinterpret_cast<uintptr_t>(registered_x->local);
    if (x < local || x + count * elem > local + registered_x->bytes) {
      throw std::invalid_argument("fused_rmsnorm: x is not inside RegisteredBuffer #" +
                                  std::to_string(registered_x->id));
    }
    x_offset = x - local;
  }
  info.staged = registered_x == nullptr && !x_in_place;
  const int chunk = max_rows_per_launch(choice.algo, shape, info.staged);
  if (chunk < 1) {
    throw std::invalid_argument("fused_rmsnorm: one row of " + std::to_string(H * elem) + " bytes does not fit the " +
                                "communicator's " + std::to_string(comm_.buffer_bytes()) + "-byte buffers");
  }

  // 4. One launch per chunk of rows (all of them when they fit).
  for (int first = 0; first < shape.rows; first += chunk) {
    const int rows = std::min(chunk, shape.rows - first);
    const size_t shift = static_cast<size_t>(first) * H * elem;
    FusedKernelArgs a{};
    a.base = base;
    if (x_in_place) {
      a.base.inputs[comm_.rank()] = static_cast<const char*>(b.x) + shift;
      a.stage_from = nullptr;
    } else if (registered_x != nullptr) {
      for (int r = 0; r < comm_.world_size(); ++r) {
        a.base.inputs[r] = static_cast<const char*>(comm_.peer_address(*registered_x, r)) + x_offset + shift;
      }
      a.stage_from = nullptr;
    } else {
      a.stage_from = static_cast<const char*>(b.x) + shift;
    }
    a.residual = static_cast<const char*>(b.residual) + shift;
    a.weight = b.weight;
    a.residual_out = static_cast<char*>(b.residual_out) + shift;
    a.out = static_cast<char*>(b.out) + shift;
    a.rows = rows;
    a.hidden = shape.hidden;
    a.eps = shape.eps;
    // A chunk smaller than the grid's blocks still runs every block (idle ones only pass the
    // barriers and, for push_one_stage, advance the call counter), so the per-block barrier
    // counts stay equal on every rank. Consecutive push_one_stage chunks of different sizes are
    // safe: the receive halves do not move with the size (core/push.h).
    LaunchConfig launch_grid = info.grid;
    launch_grid.programmatic = comm_.programmatic_launch();
    EXC_CUDA_CHECK(launch_fused(shape.dtype, kernel_kind(choice.algo), a, launch_grid, stream));
    ++info.launches;
  }
  return info;
}

}  // namespace exactcoll::cuda::fused

// The fused op's algorithms and `auto`'s table: for each (GPU arch, world size, row bytes, rows)
// the algorithm that `exactcoll bench --op fused_rmsnorm --write-table` measured fastest. Kept in
// the repo (cuda_backend/fused/tuning/fused_sm90.tsv), compiled into the binary, replaceable at
// run time ($EXACTCOLL_FUSED_TABLE). Plain C++ (no CUDA), tested on CPU.
//
// File format: tab-separated, '#' starts a comment line. Columns:
//   arch  world_size  row_bytes  rows  algo  blocks  threads  time_us  measured_on
//   sm90  4           16384      16    one_stage  16  1024  7.90  nvidia-h200-x4 2026-11-21
// measured_on: as in the all-reduce table (cuda_backend/tsv.h), optional.
// row_bytes = H * element size (bf16 H = 8192 and fp32 H = 4096 share rows). A lookup uses the
// smallest measured row_bytes >= the message's (else the largest), then the smallest measured
// rows >= its rows (else the largest), then the fastest row there. Every IPC algorithm gives the
// contract's bits, so `auto` may pick any of them; nccl_split is never picked (no contract).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/storage.h"
#include "cuda_backend/kernel_args.h"

namespace exactcoll::cuda::fused {

// one_stage, two_stage: core/fused_rmsnorm.h's (what the simulator runs). one_stage_reg:
// core/fused_rmsnorm_kernels.h's one_stage with the row in registers. push_one_stage: core's
// push_one_stage (x pushed into the peers' scratch, one barrier, no end barrier; the push
// all-reduces' call counter and receive halves) on core/fused_rmsnorm_kernels.h's register path;
// needs 2 x n x rows x H elements of scratch. gather_norm: core/fused_rmsnorm_kernels.h's
// two-stage variant (gathers residual_out only, normalizes locally).
// unfused: the project's all-reduce (auto) + the separate residual + RMSNorm kernel. auto: the
// table. nccl_split: NCCL all-reduce + the same separate kernel (baseline; NCCL's sums follow no
// contract, so its bits are not the contract's).
using exactcoll::fused_algorithm_name;
using exactcoll::FusedAlgorithm;  // core/registry.h: the names and properties

// Parses the name of a fused algorithm the GPU runs (fused_algorithm_names(kOnGpu)); nullopt
// otherwise.
std::optional<FusedAlgorithm> parse_fused_algorithm(const std::string& name);
// The algorithms whose bits follow the contract (what auto chooses among).
std::vector<FusedAlgorithm> fused_ipc_algorithms();
// Whether the algorithm is one kernel with peers (the registry's one_kernel: one_stage,
// one_stage_reg, push_one_stage, two_stage, gather_norm, lamport_one_stage, lamport_two_stage).
bool is_fused_kernel(FusedAlgorithm a);
// Whether the algorithm runs over the Lamport protocol (lamport_one_stage, lamport_two_stage):
// x read in place, the Lamport region, thread-block clusters where several blocks hold a row.
bool is_lamport_fused(FusedAlgorithm a);

struct FusedTableError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct FusedTableRow {
  std::string arch;  // "sm90"
  int world_size = 0;
  uint64_t row_bytes = 0;
  int rows = 0;
  FusedAlgorithm algo = FusedAlgorithm::kOneStage;
  LaunchConfig grid;  // as measured (zero for unfused)
  double time_us = 0;
  std::string measured_on;  // "nvidia-h200-x4 2026-11-21"; "" when the row does not say
};

// An algorithm with its grid (the fused kernel's; unfused's all-reduce picks its own).
struct FusedChoice {
  FusedAlgorithm algo = FusedAlgorithm::kOneStage;
  LaunchConfig grid;
  bool from_table = false;  // false: the built-in heuristic decided the algorithm
};

// lamport_one_stage's default grid has at least one block per this many bytes of x (each block
// pushes its share of x into every peer): 8 blocks at 1 row of bf16 H 8192 (16 KiB; it had 1).
// push_one_shot's tuned grids (tuning/sm90.tsv, 4 GPUs) push 2 to 4 KiB a block from 16 to 256
// KiB; the smaller end is taken, as the Lamport kernel's single polling block waits for the
// slowest pusher. Not measured yet: a fused table row's grid overrides it for its problem.
inline constexpr uint64_t kLamportPushBytesPerBlock = 2048;

// The thread-block cluster lamport_one_stage's default grid folds one row of 1 024 lanes on: 8
// blocks of 128 threads. Measured on 4 x H100 at 1 row of H 8192 bf16 (docs/benchmarks.md,
// "lamport_one_stage on thread-block clusters"): 5.24 / 5.48 us on 8 blocks, 5.20 / 6.05 on 4,
// 5.94 / 6.06 on 2, 6.76 / 6.75 on one block of 1 024 threads; at 64 rows, and at 1 row of H 2880
// and 4096, one block a row was as fast or faster, and at 16 rows level with a cluster of 4.
inline constexpr int kLamportRowCluster = 8;

// The grid the fused kernels use for a problem: threads = the RMSNorm tree's lanes (32 *
// ceil(min(H / pack, 1024) / 32), at least 64), so that in the common case each thread owns its
// lanes' packs; blocks = one per row of the block's rows (one_stage, one_stage_reg,
// push_one_stage: rows; two-stage kinds: a rank's slice, ceil(rows / n)); lamport_one_stage: the
// larger of rows and ceil(rows * H * element bytes / kLamportPushBytesPerBlock) (its push is spread
// over the whole grid, its rows go to the blocks whose push share they end in); at most kMaxBlocks.
// lamport_one_stage on one row of 1 024 lanes and at most as many packs (H 8192 bf16/fp16, 4096
// fp32): 1024 / kLamportRowCluster threads, so that a thread-block cluster of kLamportRowCluster
// blocks holds the row, one lane a thread (lamport_register_blocks), and the blocks a multiple of
// the cluster (lamport_launch_grid).
LaunchConfig default_fused_grid(FusedAlgorithm algo, int rows, int hidden, DType dtype, int world_size);

// A Lamport fused kernel's launch on `grid` (the table's or the default): cluster = the blocks that hold a
// row (core's lamport_register_blocks of grid.threads and the row's tree, at most kMaxClusterBlocks) where that is 2 or
// more, else 1 (whatever grid.cluster was); blocks rounded up to a multiple of it, at most the
// largest multiple of it in kMaxBlocks. Preconditions: hidden a positive multiple of the pack,
// 1 <= grid.blocks <= kMaxBlocks.
LaunchConfig lamport_launch_grid(LaunchConfig grid, int hidden, DType dtype);

// The grid of the separate residual + RMSNorm kernel (no barriers: one block per row, up to 8192).
LaunchConfig residual_rmsnorm_grid(int rows, int hidden, DType dtype);

class FusedTable {
 public:
  FusedTable() = default;
  explicit FusedTable(std::vector<FusedTableRow> rows);

  // Parses the file format above. Throws FusedTableError naming `name`, the line and the problem.
  static FusedTable parse(const std::string& text, const std::string& name);
  // The table compiled into the binary (cuda_backend/fused/tuning/fused_sm90.tsv).
  static const FusedTable& embedded();
  // $EXACTCOLL_FUSED_TABLE if set, else the embedded table.
  static FusedTable from_environment();

  // Returns the algorithm and grid for a problem. requested: a concrete algorithm (its default
  // grid) or kAuto (the table's fastest at the nearest measured point among the algorithms
  // `allowed` accepts (null: all); the heuristic without rows for this arch and world size, or
  // where `allowed` refuses every algorithm measured there).
  // Example: FusedRmsNorm::choose allows only the algorithms that run the problem in one launch
  // on its communicator where the fastest (push_one_stage, lamport_*) would take several.
  FusedChoice choose(const std::string& arch, int world_size, int rows, int hidden, DType dtype,
                     FusedAlgorithm requested, const std::function<bool(FusedAlgorithm)>& allowed = nullptr) const;

  // The heuristic without a table: push_one_stage up to 16 rows, one_stage_reg up to 256 KiB per
  // rank, gather_norm above. (FusedRmsNorm::choose takes one_stage_reg where push_one_stage's
  // receive halves do not fit the communicator's scratch.)
  static FusedChoice default_choice(int world_size, int rows, int hidden, DType dtype, FusedAlgorithm requested);

  // The table in the file format, header comment lines first. Throws std::invalid_argument when a
  // row's measured_on holds a tab or a line break.
  std::string to_text(const std::vector<std::string>& header_comments) const;

  const std::vector<FusedTableRow>& rows() const { return rows_; }

 private:
  std::vector<FusedTableRow> rows_;
};

}  // namespace exactcoll::cuda::fused

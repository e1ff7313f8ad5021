// Fused all-reduce + residual add + RMSNorm on the CUDA backend, bound to a Communicator (its
// symmetric signal, staging and scratch buffers, its registered buffers, its NCCL communicator).
//
// Per rank: x [rows, H] partial sums, residual [rows, H] (the same on every rank), weight [H], eps:
//   s = the all-reduce contract of x; residual_out = round(float(s) + float(residual));
//   out = the canonical RMSNorm of residual_out                 (docs/numerics.md)
// Every algorithm except nccl_split gives these bits on every rank, for every rows, H (a positive
// multiple of the pack), world size and grid (fused_table.h names the algorithms).
//
// Inputs reach the fused kernels staged (the kernel copies this rank's x into its staging buffer
// before the first barrier) or registered (Communicator::register_buffer once; peers read x in
// place, so CUDA-graph-captured calls copy nothing). push_one_stage needs neither: peers never
// read x, its kernel pushes x into their scratch (2 x n x rows x H elements of it). Problems
// larger than the communicator's buffers run as consecutive launches over row chunks (rows are
// independent: same bits).
// Same-decision rule (communicator.h): every choice depends only on arguments that are equal on
// every rank (rows, H, dtype, algorithm, the table, whether x is registered).
//
// Example:
//   FusedRmsNorm fused(comm);
//   fused.run({x, residual, weight, residual_out, out}, {rows, 8192, 1e-6f, DType::kBF16},
//             FusedAlgorithm::kAuto, stream, &registered_x);
//   comm.check(stream);  // throws CollectiveError naming a peer that never arrived
#pragma once

#include <cuda_runtime_api.h>

#include <optional>
#include <string>

#include "core/storage.h"
#include "cuda_backend/communicator.h"
#include "cuda_backend/fused/fused_table.h"
#include "cuda_backend/kernel_args.h"

namespace exactcoll::cuda::fused {

// This rank's device buffers, each 16-byte aligned. x and the outputs must not overlap.
struct FusedRmsNormBuffers {
  const void* x = nullptr;         // [rows, H] this rank's partial sums
  const void* residual = nullptr;  // [rows, H]
  const void* weight = nullptr;    // [H]
  void* residual_out = nullptr;    // [rows, H]
  void* out = nullptr;             // [rows, H]
};

struct FusedRmsNormShape {
  int rows = 0;
  int hidden = 0;  // H
  float eps = 1e-6f;
  DType dtype = DType::kBF16;
};

// What one call ran.
struct FusedCallInfo {
  FusedAlgorithm algo = FusedAlgorithm::kOneStage;  // never kAuto
  LaunchConfig grid;                                // the fused kernel's, or the separate kernel's
  int launches = 0;                                 // kernels and all-reduce calls
  bool staged = false;                              // x went through the staging buffer
  bool exact = true;                                // false for nccl_split
  std::string allreduce;                            // unfused / nccl_split: the all-reduce that ran
};

// The canonical residual add + RMSNorm of rows, alone (no peers, no communicator): residual_out =
// residual_add(s, residual), out = RMSNorm(residual_out), on the current device. What the split
// paths run after their all-reduce, and what a single-GPU program runs to get the bits of the
// tensor-parallel paths. s may be the same buffer as out. programmatic: launch with programmatic
// dependent launch. Returns the grid it used. Throws std::invalid_argument on a bad shape, pointer
// or grid, CudaError when the launch fails.
LaunchConfig launch_residual_rmsnorm(const void* s, const void* residual, const void* weight, void* residual_out,
                                     void* out, const FusedRmsNormShape& shape, cudaStream_t stream, bool programmatic,
                                     std::optional<LaunchConfig> grid = {});

class FusedRmsNorm {
 public:
  // table: auto's table (default FusedTable::from_environment()).
  explicit FusedRmsNorm(Communicator& comm, std::optional<FusedTable> table = {});

  // Runs the op on stream (collective: every rank calls with equal shape, algo and grid, and
  // registered_x given on all ranks or none). registered_x: x lies inside it (at the same offset
  // on every rank). grid: forces the fused kernel's grid (tests, tuning). Throws
  // std::invalid_argument on a bad shape, pointer or grid, CollectiveError when the IPC path is
  // unavailable (for the algorithms that need it) or the communicator is unusable.
  FusedCallInfo run(const FusedRmsNormBuffers& buffers, const FusedRmsNormShape& shape, FusedAlgorithm algo,
                    cudaStream_t stream, const RegisteredBuffer* registered_x = nullptr,
                    std::optional<LaunchConfig> grid = {});

  // The separate residual + RMSNorm kernel of the split paths alone (launch_residual_rmsnorm, with
  // the communicator's launch mode). Local (no peers). Returns the grid it used.
  LaunchConfig residual_rmsnorm(const void* s, const void* residual, const void* weight, void* residual_out, void* out,
                                const FusedRmsNormShape& shape, cudaStream_t stream,
                                std::optional<LaunchConfig> grid = {});

  // The choice `auto` (or a named algorithm) makes (no launch): the table's, except that auto never
  // takes push_one_stage, lamport_one_stage or lamport_two_stage where the rows do not fit one
  // launch on this communicator (max_rows_per_launch): the table's fastest among the others there.
  FusedChoice choose(const FusedRmsNormShape& shape, FusedAlgorithm algo) const;

  // Rows one launch of algo can take with these buffers (the communicator's staging and scratch
  // capacity; staged: x goes through the staging buffer, never for push_one_stage); 0 when not
  // even one row fits.
  int max_rows_per_launch(FusedAlgorithm algo, const FusedRmsNormShape& shape, bool staged) const;

  Communicator& communicator() { return comm_; }
  const FusedTable& table() const { return table_; }
  void set_table(FusedTable table) { table_ = std::move(table); }

 private:
  Communicator& comm_;
  FusedTable table_;
};

}  // namespace exactcoll::cuda::fused

// A communicator's options (cuda_backend/communicator.h), in a header of their own without CUDA, so
// that code built without a toolkit (the C API's defaults) shares them.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "cuda_backend/dispatch_table.h"

namespace exactcoll::cuda {

// Returns the input bytes from which an eager call reads its input in place when no threshold is
// set: 2 MiB, except on 4 or more ranks, where staging costs more than the lookup from 512 KiB of
// input for two_shot all-reduces and from 1 MiB of input (256 KiB per rank's part) for
// reduce-scatters (docs/benchmarks.md, "Eager calls in place", "Per algorithm": in place / staged
// 0.89-0.92 for two_shot at 0.5-1 MiB; below 1 for reduce-scatter at 1 MiB of input in 3 runs of 4;
// one_shot and all-gather showed no gain below 2 MiB, nor did 2 ranks). Depends only on what every
// rank passes alike.
inline size_t eager_in_place_default_min_bytes(int world_size, Op op, Algorithm algo) {
  constexpr size_t kDefault = size_t{2} << 20;
  if (world_size < 4) return kDefault;
  if (op == Op::kReduceScatter) return size_t{1} << 20;
  if (op == Op::kAllReduce && algo == Algorithm::kTwoShot) return size_t{512} << 10;
  return kDefault;
}

struct CommunicatorOptions {
  std::string name = "exactcoll";           // store key prefix; unique per communicator in a job
  size_t buffer_bytes = size_t{128} << 20;  // staging and scratch capacity per rank
  // The Lamport region is 3 buffers x world_size slots of this many bytes (core/lamport.h): the
  // largest message lamport_one_shot runs in one launch; lamport_two_shot's slot holds two n-th
  // slices, so it runs about world_size / 2 times this in one launch. Larger messages run in chunks.
  size_t lamport_message_bytes = size_t{1} << 20;
  uint64_t flag_timeout_ms = 5000;  // bound on every in-kernel flag wait (>= 60 s on a shared GPU)
  std::chrono::milliseconds store_timeout{120000};
  bool use_nccl = true;             // create the NCCL communicator (baseline, fallback)
  bool programmatic_launch = true;  // launch kernels with programmatic dependent launch
  // The library contract every exact call folds under: canonical or tree (core/registry.h; the
  // emulations are refused at creation). The residual add and RMSNorm are canonical under both.
  Contract contract = Contract::kCanonical;
  // An out-of-place call captured into a CUDA graph whose peers read its input (one_shot,
  // two_shot, direct; two_shot in place too) leaves the input where it is and reads every rank's
  // address from the graph input table, which
  // register_graph_buffers() fills after the capture (communicator.h). false: such calls stage.
  bool graph_in_place = true;
  // Rows of the graph input table (one per captured launch; world_size pointers each). A capture
  // past the last row stages (CallInfo::note says so).
  size_t graph_input_slots = 65536;
  // An eager call (neither captured nor registered) whose peers read its input (one_shot, two_shot,
  // direct; two_shot in place too) of eager_in_place_min_bytes up to buffer_bytes leaves the input
  // where it is once every peer has mapped its allocation (cudaMalloc'd memory, such as torch's
  // caching allocator's segments, which it reuses): the first call with a new allocation stages
  // and exports it, and the calls after read it in place (core/eager_directory.h). Needs shared
  // memory (/dev/shm) between the ranks' processes; without it every call stages as before.
  bool eager_in_place = true;
  // Below this input size, staging costs no more than the host's allocation lookup
  // (docs/benchmarks.md, "Eager calls in place"). Unset: eager_in_place_default_min_bytes per call.
  // Rank 0's value (or its EXACTCOLL_EAGER_MIN_BYTES) holds for every rank.
  std::optional<size_t> eager_in_place_min_bytes;
  std::optional<DispatchTable> table;  // auto's table; default DispatchTable::from_environment()
};

}  // namespace exactcoll::cuda

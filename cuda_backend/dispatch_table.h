// The `auto` dispatch table: for each (GPU arch, world size, op, message size) the algorithm and
// grid that `exactcoll tune` measured fastest. Kept in the repo (cuda_backend/tuning/sm90.tsv),
// compiled into the binary, and replaceable at run time (--table FILE, or EXACTCOLL_TABLE).
//
// File format: tab-separated, '#' starts a comment line. Columns:
//   arch  world_size  op  bytes  algo  blocks  threads  time_us  measured_on
//   sm90  2           allreduce  524288  one_shot  32  512  5.10  nvidia-h100-x4 2026-11-27
// measured_on (cuda_backend/tsv.h) is free text without tabs naming the machine and UTC date of
// the measurement; optional: a row of the first 8 fields has none (older tables, users' files).
// `bytes` is the per-rank input size in bytes of the measured message; a lookup for b bytes uses
// the rows of the smallest measured size >= b (the largest size when b is beyond every row).
// Every algorithm of the IPC path gives the contract's bits, so `auto` may pick any of them;
// NCCL is never picked by `auto` (its bits follow no contract).
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda_backend/kernel_args.h"

namespace exactcoll::cuda {

// The algorithms (core/registry.h: Algorithm, its names and properties). The GPU runs the entries
// with kOnGpu: the IPC algorithms (picked_by_auto), auto (the table below) and nccl.
using exactcoll::Algorithm;
using exactcoll::algorithm_name;

// Parses the name of an algorithm the GPU runs (algorithm_names(kOnGpu)); nullopt otherwise.
std::optional<Algorithm> parse_algorithm(const std::string& name);
// The IPC algorithms of an op (what auto chooses among), in the registry's order.
std::vector<Algorithm> ipc_algorithms(Op op);
using exactcoll::parse_op;  // core/registry.h: allreduce | reduce_scatter | allgather

// Is `a` push_one_shot or push_two_shot (the algorithms that need push_scratch_elements)?
inline bool is_push_algorithm(Algorithm a) { return info(a).needs == Needs::kPushScratch; }
// lamport_one_shot, lamport_two_shot: a launch per Lamport slot (core/lamport.h).
inline bool is_lamport_algorithm(Algorithm a) { return info(a).needs == Needs::kLamportRegion; }

// Does an all-reduce of `count` elements (elem_bytes each) fit a push algorithm's scratch
// (push_scratch_elements: 2 halves of n slots) of scratch_bytes per rank?
bool push_fits(uint64_t count, int elem_bytes, int world_size, uint64_t scratch_bytes);
// Elements per launch when a push all-reduce that does not fit runs in chunks: 2 x n slots of a
// chunk fit scratch_bytes; a multiple of 64 elements (so every chunk starts 16-byte aligned), at
// least 64.
uint64_t push_chunk_elements(int elem_bytes, int world_size, uint64_t scratch_bytes);

struct TableError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct TableRow {
  std::string arch;  // "sm90"
  int world_size = 0;
  Op op = Op::kAllReduce;
  uint64_t bytes = 0;
  Algorithm algo = Algorithm::kOneShot;
  LaunchConfig grid;
  double time_us = 0;
  std::string measured_on;  // "nvidia-h100-x4 2026-11-27"; "" when the row does not say
};

// An algorithm with its grid.
struct Choice {
  Algorithm algo = Algorithm::kOneShot;
  LaunchConfig grid;
  bool from_table = false;  // false: the built-in heuristic (no row for this arch / world size / op)
};

class DispatchTable {
 public:
  DispatchTable() = default;
  explicit DispatchTable(std::vector<TableRow> rows);

  // Parses the file format above. Throws TableError naming `name`, the line and what is wrong.
  static DispatchTable parse(const std::string& text, const std::string& name);
  // The table compiled into the binary (cuda_backend/tuning/sm90.tsv at build time).
  static const DispatchTable& embedded();
  // The table to use: the file named by $EXACTCOLL_TABLE if set, else the embedded one.
  static DispatchTable from_environment();

  // Returns the algorithm and grid for a message of `bytes` per rank. `requested` is a concrete
  // IPC algorithm (its measured grid) or kAuto (the fastest measured algorithm). Without rows for
  // (arch, world_size, op) it falls back to default_choice.
  Choice choose(const std::string& arch, int world_size, Op op, uint64_t bytes, Algorithm requested) const;

  // `auto` for an all-reduce of `count` elements of elem_bytes each on a communicator whose scratch
  // holds scratch_bytes per rank and whose Lamport region (core/lamport.h) lamport_region_bytes.
  // A push algorithm needs push_scratch_elements(count) of scratch;
  // where that does not fit, the communicator runs it in chunks of push_chunk_elements, so it is
  // priced here as those chunks: ceil(count / chunk) x its measured time at the chunk's size, with
  // the grid measured at that size. A Lamport algorithm (lamport_one_shot, lamport_two_shot) is
  // taken only where the message fits one launch (lamport_fits(algo, ...); tune measures it only
  // there, and beyond it runs in chunks): where it does not, the other algorithms are priced.
  // Every other algorithm is priced at its measured time for the message. Returns the cheapest.
  // Without rows for (arch, world_size, allreduce): the heuristic (never a push or Lamport
  // algorithm). When no algorithm has a row to price it by (a table with gaps), the table's choice
  // for the message, with one_shot / two_shot in place of a push or Lamport algorithm
  // (two_shot for push_two_shot and lamport_two_shot).
  // Example (4 GPUs, 128 MiB scratch, bf16, 32 MiB): push_two_shot needs 256 MiB, so it would run
  // as 2 chunks of 16 MiB; 2 x 80.5 us beats two_shot's 166 us for the whole message.
  Choice choose_allreduce_auto(const std::string& arch, int world_size, uint64_t count, int elem_bytes,
                               uint64_t scratch_bytes, uint64_t lamport_region_bytes) const;

  // The heuristic used without a table: one_shot below 512 KiB (any size on 2 GPUs up to 1 MiB),
  // two_shot above; 512 threads; one block per 512 packs of work, at most kMaxBlocks.
  static Choice default_choice(int world_size, Op op, uint64_t bytes, Algorithm requested);

  // Returns the table in the file format (header comment lines first). Throws
  // std::invalid_argument when a row's measured_on holds a tab or a line break.
  std::string to_text(const std::vector<std::string>& header_comments) const;

  const std::vector<TableRow>& rows() const { return rows_; }

 private:
  // The size whose rows serve a message of `bytes`: the smallest measured >= bytes, else the
  // largest; 0 without rows for (arch, world_size, op).
  uint64_t measured_size(const std::string& arch, int world_size, Op op, uint64_t bytes) const;
  // The fastest row of that size for `requested` (any algorithm for kAuto), or null.
  const TableRow* fastest_row(const std::string& arch, int world_size, Op op, uint64_t size, Algorithm requested) const;

  std::vector<TableRow> rows_;
};

}  // namespace exactcoll::cuda

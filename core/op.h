// The three collectives, named once for every layer (core's multi-node algorithms, the simulator,
// the CUDA backend, the CLI and the C API's enum values, which follow this order).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace exactcoll {

// New values go at the end (tables, traces and the C API's exactcoll_op numbering rely on it).
enum class Op : uint8_t { kAllReduce, kReduceScatter, kAllGather };

// Every Op, in the order the command line lists them.
inline constexpr Op kOps[] = {Op::kAllReduce, Op::kReduceScatter, Op::kAllGather};

// Returns "allreduce", "reduce_scatter" or "allgather": the names of the CLI, the tables and the
// traces.
// Every switch over Op lists each value (no default): -Wswitch, an error under -Werror, then finds
// each place a new Op must be handled.
constexpr const char* op_name(Op op) {
  switch (op) {
    case Op::kAllReduce: return "allreduce";
    case Op::kReduceScatter: return "reduce_scatter";
    case Op::kAllGather: return "allgather";
  }
  return "(not an Op)";
}

// Returns the Op named `name` (op_name's spelling), or nullopt.
inline std::optional<Op> parse_op(std::string_view name) {
  for (Op op : kOps) {
    if (name == op_name(op)) return op;
  }
  return std::nullopt;
}

// Returns the output elements per rank of `op` on `ranks` ranks with `count` input elements per
// rank: count (all-reduce), count / ranks (reduce-scatter; preconditions: ranks divides count),
// count * ranks (all-gather).
// Example: output_count(Op::kAllGather, 4096, 4) == 16384.
constexpr size_t output_count(Op op, size_t count, int ranks) {
  switch (op) {
    case Op::kAllReduce: return count;
    case Op::kReduceScatter: return count / static_cast<size_t>(ranks);
    case Op::kAllGather: return count * static_cast<size_t>(ranks);
  }
  return 0;
}

}  // namespace exactcoll

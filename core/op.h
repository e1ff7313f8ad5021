// The collectives' output sizes. The Op enum, its names and its properties are in the registry
// (core/registry.h), with the algorithms and contracts.
#pragma once

#include <cstddef>

#include "core/registry.h"

namespace exactcoll {

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

// What GPU results are compared with (`exactcoll verify`, `gpu`, `bench` and the GPU tests; any
// caller of the library that checks a collective's outputs), under one of the library's contracts
// (canonical, tree):
//   - the simulator (sim/collectives.h on a sim::World: the same core templates on CPU threads,
//     with the simulator's own contexts, buffers, handle exchange and scheduler), and
//   - an independent scalar transcription of the contract (contract::fold, or contract::tree_fold
//     under tree, per element, no templates), which would catch a bug that the GPU and the
//     simulator share.
// Both compare every output bit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/op.h"
#include "core/registry.h"
#include "core/storage.h"

namespace exactcoll::sim {

class World;

using Bytes = std::vector<uint8_t>;

using exactcoll::Algorithm;
using exactcoll::Contract;
using exactcoll::Op;
using exactcoll::output_count;  // core/op.h

// A simulated world of n ranks, kept across calls (its heaps grow as needed), whose collectives
// fold under `contract` (a library contract: canonical or tree; sim::CollectiveSpec::contract).
class Simulator {
 public:
  explicit Simulator(int world_size, Contract contract = Contract::kCanonical);
  ~Simulator();

  // Returns every rank's output of op over `inputs` (one per rank, count elements each) under the
  // simulator, running the algorithm that `algo` names (one_shot / two_shot / push_one_shot / push_two_shot for
  // all-reduce; the single SM algorithm of the other ops; copy_engine all-gather is simulated as allgather).
  std::vector<Bytes> run(Op op, Algorithm algo, DType dtype, const std::vector<Bytes>& inputs, size_t count,
                         int blocks);

 private:
  std::unique_ptr<sim::World> world_;
  int world_size_;
  Contract contract_;
};

// rank's output under `contract` (canonical: contract::fold; tree: contract::tree_fold), computed
// element by element without the templates. Precondition: contract is a library contract.
Bytes contract_output(Op op, DType dtype, const std::vector<Bytes>& inputs, size_t count, int rank,
                      Contract contract = Contract::kCanonical);

// A bitwise comparison.
struct Comparison {
  uint64_t compared = 0;
  uint64_t mismatches = 0;
  size_t first = 0;  // index of the first mismatch (valid when mismatches > 0)
  uint32_t got_bits = 0, want_bits = 0;
};
Comparison compare_bits(DType dtype, const void* got, const void* want, size_t count);

// What a sum promises when nothing fixes its order (NCCL's all-reduce and reduce-scatter): any
// order of the n - 1 additions, each rounded to the storage type or to fp32 and once to storage,
// lands within
//   bound = gamma_n * sum_r |x_r| + n * (the storage type's smallest subnormal)
// of the exact sum, gamma_n = n*u / (1 - n*u) with u the storage type's unit roundoff (2^-8 bf16,
// 2^-11 fp16, 2^-24 fp32; Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., §4.2).
// Non-finite: when the exact sum is NaN (a NaN input, or +inf and -inf) the result must be a NaN;
// when it is an inf, that inf; a finite sum whose bound reaches the largest finite value may
// overflow to the inf of its sign.
struct SumBoundCheck {
  uint64_t compared = 0;
  uint64_t outside = 0;  // elements outside the bound
  size_t first = 0;      // index of the first (valid when outside > 0)
  double got = 0, exact = 0, bound = 0;
};

// Returns rank's output elements (`got`, output_count(op, count, n) of them) checked against the
// bound above. Preconditions: op is all-reduce or reduce-scatter; one input of count elements per
// rank. Example: bench's NCCL rows count `outside` as #wrong, and the bits that differ from the
// contract (compare_bits) in a column of their own.
SumBoundCheck check_sum_within_bound(Op op, DType dtype, const std::vector<Bytes>& inputs, size_t count, int rank,
                                     const void* got);

// "0x7fc1"/"0x7fc00001": an element's bits in hex.
std::string bits_hex(DType dtype, uint32_t bits);

}  // namespace exactcoll::sim

// What the GPU results are compared with:
//   - the simulator (sim/collectives.h on a sim::World: the same core templates on CPU threads,
//     with the simulator's own contexts, buffers, handle exchange and scheduler), and
//   - an independent scalar transcription of the contract (contract::fold per element, no
//     templates), which would catch a bug that the GPU and the simulator share.
// Both compare every output bit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/storage.h"
#include "cuda_backend/dispatch_table.h"
#include "cuda_backend/kernel_args.h"

namespace exactcoll::sim {
class World;
}

namespace exactcoll::gpu {

using Bytes = std::vector<uint8_t>;

using exactcoll::output_count;  // core/op.h

// A simulated world of n ranks, kept across calls (its heaps grow as needed).
class Simulator {
 public:
  explicit Simulator(int world_size);
  ~Simulator();

  // Returns every rank's output of op over `inputs` (one per rank, count elements each) under the
  // simulator, running the algorithm that `algo` names (one_shot / two_shot / push_one_shot / push_two_shot for all-reduce; the
  // single SM algorithm of the other ops; copy_engine all-gather is simulated as allgather).
  std::vector<Bytes> run(cuda::Op op, cuda::Algorithm algo, DType dtype, const std::vector<Bytes>& inputs, size_t count,
                         int blocks);

 private:
  std::unique_ptr<sim::World> world_;
  int world_size_;
};

// rank's output under the contract, computed element by element without the templates.
Bytes contract_output(cuda::Op op, DType dtype, const std::vector<Bytes>& inputs, size_t count, int rank);

// A bitwise comparison.
struct Comparison {
  uint64_t compared = 0;
  uint64_t mismatches = 0;
  size_t first = 0;  // index of the first mismatch (valid when mismatches > 0)
  uint32_t got_bits = 0, want_bits = 0;
};
Comparison compare_bits(DType dtype, const void* got, const void* want, size_t count);

// "0x7fc1"/"0x7fc00001": an element's bits in hex.
std::string bits_hex(DType dtype, uint32_t bits);

}  // namespace exactcoll::gpu

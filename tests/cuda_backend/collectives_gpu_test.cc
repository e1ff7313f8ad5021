// GPU tests (tagged gpu; need 2+ GPUs with peer access): the checks of `exactcoll verify` at small
// sizes, and the bounded-wait guarantee. The test binary re-executes itself as N workers through
// the launcher (tools/launch); a process with RANK set runs one worker scenario and exits.
#include <gtest/gtest.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "cuda_backend/communicator.h"
#include "cuda_backend/cuda_check.h"
#include "sim/reference.h"
#include "tools/gpu/device_util.h"
#include "tools/inputs/inputs.h"
#include "tools/gpu/worker.h"
#include "tests/cuda_backend/gpu_test_harness.h"

namespace exactcoll::gpu {
namespace {

using cuda::Algorithm;
using cuda::Op;
using sim::bits_hex;
using sim::Bytes;
using sim::compare_bits;
using sim::Comparison;
using sim::contract_output;
using sim::Simulator;

// ---- worker scenarios ----------------------------------------------------------------------------

// Every op × dtype × algorithm × {staged, registered, CUDA graph} at small odd sizes, against the
// simulator and the contract. Returns the number of differing elements (0 expected).
int scenario_exact() {
  Worker w("gpu_test_exact");
  const int n = w.world_size(), rank = w.rank();
  cuda::CommunicatorOptions co;
  co.name = "exact";
  co.buffer_bytes = 1 << 20;
  co.flag_timeout_ms = 5000;
  cuda::Communicator comm(w.store(), rank, n, co);
  if (!comm.ipc_ready()) {
    std::cerr << "IPC unavailable: " << comm.ipc_unavailable_reason() << "\n";
    return 3;
  }
  const size_t max_bytes = 4099 * 4 * static_cast<size_t>(n);
  DeviceBuffer input(max_bytes), output(max_bytes);
  const cuda::RegisteredBuffer reg = comm.register_buffer(input.get(), max_bytes);
  Stream stream;
  Simulator sim(n);
  uint64_t differing = 0, compared = 0;
  for (Op op : {Op::kAllReduce, Op::kReduceScatter, Op::kAllGather}) {
    for (DType d : {DType::kBF16, DType::kFP16, DType::kFP32}) {
      for (size_t c : {size_t{1}, size_t{7}, size_t{9}, size_t{1000}, size_t{4099}}) {
        for (Pattern p : {Pattern::kRandomBits, Pattern::kSpecials, Pattern::kOverflow, Pattern::kCancel}) {
          const size_t count = op == Op::kReduceScatter ? c * static_cast<size_t>(n) : c;
          const size_t elem = static_cast<size_t>(dtype_size(d));
          const size_t out_count = output_count(op, count, n);
          const auto inputs = make_inputs(d, count, n, 1000 + c, p);
          const Bytes by_contract = contract_output(op, d, inputs, count, rank);
          EXC_CUDA_CHECK(
              cudaMemcpy(input.get(), inputs[static_cast<size_t>(rank)].data(), count * elem, cudaMemcpyHostToDevice));
          std::vector<Algorithm> algos = cuda::ipc_algorithms(op);
          algos.push_back(Algorithm::kAuto);
          for (Algorithm a : algos) {
            const cuda::Choice choice = comm.choose(op, count, d, a);
            const Bytes by_sim = sim.run(op, choice.algo, d, inputs, count, 2)[static_cast<size_t>(rank)];
            for (int variant = 0; variant < 3; ++variant) {
              const cuda::RegisteredBuffer* r = variant == 0 ? nullptr : &reg;
              auto call = [&] {
                switch (op) {
                  case Op::kAllReduce: comm.allreduce(input.get(), output.get(), count, d, a, stream.get(), r); break;
                  case Op::kReduceScatter:
                    comm.reduce_scatter(input.get(), output.get(), count, d, a, stream.get(), r);
                    break;
                  case Op::kAllGather: comm.allgather(input.get(), output.get(), count, d, a, stream.get(), r); break;
                }
              };
              EXC_CUDA_CHECK(cudaMemsetAsync(output.get(), 0x5A + variant, out_count * elem, stream.get()));
              if (variant == 2) {
                time_graph_us(stream.get(), call, 2, 1, 1,
                              [&] { comm.check(stream.get()); });  // captured twice, replayed twice
              } else {
                call();
              }
              comm.check(stream.get());
              Bytes got(out_count * elem);
              EXC_CUDA_CHECK(cudaMemcpy(got.data(), output.get(), got.size(), cudaMemcpyDeviceToHost));
              const Comparison vs_sim = compare_bits(d, got.data(), by_sim.data(), out_count);
              const Comparison vs_contract = compare_bits(d, got.data(), by_contract.data(), out_count);
              compared += out_count;
              if (vs_sim.mismatches + vs_contract.mismatches > 0) {
                std::cerr << "rank " << rank << " " << op_name(op) << " " << dtype_name(d) << " "
                          << cuda::algorithm_name(a) << " variant " << variant << " count " << count << " "
                          << pattern_name(p) << ": " << vs_sim.mismatches << " vs sim, " << vs_contract.mismatches
                          << " vs contract; first " << vs_sim.first << " gpu " << bits_hex(d, vs_sim.got_bits)
                          << " sim " << bits_hex(d, vs_sim.want_bits) << "\n";
              }
              differing += vs_sim.mismatches + vs_contract.mismatches;
            }
          }
        }
      }
    }
  }
  const int64_t total = w.sum("differing", static_cast<int64_t>(differing));
  std::cerr << "rank " << rank << ": " << compared << " elements compared, " << differing << " differ\n";
  return total == 0 && compared > 0 ? 0 : 1;
}

// Rank 1 never calls the all-reduce: rank 0's kernel must give up after its flag timeout and the
// host must name the missing peer. Returns 0 when that happens within a few timeouts.
int scenario_absent_peer() {
  Worker w("gpu_test_absent");
  const int rank = w.rank();
  cuda::CommunicatorOptions co;
  co.name = "absent";
  co.buffer_bytes = 1 << 20;
  co.flag_timeout_ms = 300;
  co.use_nccl = false;
  cuda::Communicator comm(w.store(), rank, w.world_size(), co);
  int result = 0;
  if (rank == 0) {
    DeviceBuffer in(4096), out(4096);
    Stream stream;
    const auto start = std::chrono::steady_clock::now();
    try {
      comm.allreduce(in.get(), out.get(), 1024, DType::kBF16, Algorithm::kOneShot, stream.get(), nullptr,
                     cuda::LaunchConfig{4, 128});
      comm.check(stream.get());
      std::cerr << "rank 0: the all-reduce completed without its peer\n";
      result = 1;
    } catch (const cuda::CollectiveError& e) {
      const std::string what = e.what();
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      std::cerr << "rank 0 reported: " << what << " after " << ms << " ms\n";
      if (what.find("rank 0 block ") == std::string::npos ||
          what.find("peer 1 never arrived at barrier") == std::string::npos || ms > 5000) {
        result = 1;
      }
    }
    // The communicator refuses further IPC calls.
    try {
      comm.device_barrier(nullptr);
      result = 1;
    } catch (const cuda::CollectiveError&) {
    }
  }
  w.barrier("absent_done");
  return result;
}

// ---- the tests (parent process) --------------------------------------------------------------------

int launch_scenario(const std::string& scenario, int nproc) {
  return test::launch_scenario("collectives_gpu_test", scenario, nproc, std::chrono::minutes(5));
}

using test::visible_gpus;

TEST(GpuCollectives, BitExactWithTheSimulatorOnEveryWorldSize) {
  const int gpus = visible_gpus();
  if (gpus < 2) GTEST_SKIP() << "needs 2 or more GPUs, " << gpus << " visible";
  for (int n = 2; n <= std::min(gpus, 4); ++n) EXPECT_EQ(launch_scenario("exact", n), 0) << n << " ranks";
}

TEST(GpuCollectives, AMissingPeerIsNamedNotAHang) {
  if (visible_gpus() < 2) GTEST_SKIP() << "needs 2 or more GPUs";
  EXPECT_EQ(launch_scenario("absent", 2), 0);
}

}  // namespace
}  // namespace exactcoll::gpu

int main(int argc, char** argv) {
  return exactcoll::gpu::test::gpu_test_main(
      argc, argv, {{"exact", exactcoll::gpu::scenario_exact}, {"absent", exactcoll::gpu::scenario_absent_peer}});
}

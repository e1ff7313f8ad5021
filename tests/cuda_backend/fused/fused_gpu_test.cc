// GPU tests of the fused all-reduce + residual + RMSNorm (tagged gpu; need 2+ GPUs with peer
// access). The binary re-executes itself as N workers through the launcher (tools/launch); a
// process with RANK set runs one worker scenario and exits.
//   exact  every fused algorithm (push_one_stage included) x bf16/fp16/fp32 x a few shapes x
//          {staged, registered, CUDA graph, forced grids}, against the scalar reference;
//   mixed  push_one_stage's missing end barrier on real GPUs: long sequences of push calls on ONE
//          communicator, enqueued back to back without host synchronization — push_one_stage of
//          other row counts and grids (some in row chunks), push_one_shot and push_two_shot
//          all-reduces of other counts, one_stage_reg between them — with random host-side delays
//          on some ranks' streams so that fast ranks run ahead into their next push call while a
//          slow peer still folds. Every output of every call is compared with the contract
//          afterwards (each call has its own buffers). Then the same sequence once more, captured
//          into a CUDA graph and replayed twice.
#include <gtest/gtest.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cuda_backend/communicator.h"
#include "cuda_backend/cuda_check.h"
#include "cuda_backend/fused/fused_rmsnorm.h"
#include "sim/fused/random.h"
#include "sim/reference.h"
#include "tools/gpu/device_util.h"
#include "tools/inputs/fused_inputs.h"
#include "tools/gpu/fused_reference.h"
#include "tools/inputs/inputs.h"
#include "tools/gpu/worker.h"
#include "tests/cuda_backend/gpu_test_harness.h"

namespace exactcoll::gpu {
namespace {

using cuda::LaunchConfig;
using cuda::fused::FusedAlgorithm;
using sim::bits_hex;
using sim::Bytes;
using sim::compare_bits;
using sim::Comparison;
using sim::contract_output;

// Returns the number of elements of both outputs in [ro, out) (device, count each) that differ
// from want, and prints the first to stderr under `what`.
uint64_t count_fused_mismatches(DType dtype, const void* ro, const void* out, size_t count, const FusedOutputs& want,
                                int rank, const std::string& what) {
  const size_t bytes = count * static_cast<size_t>(dtype_size(dtype));
  Bytes got_ro(bytes), got_out(bytes);
  EXC_CUDA_CHECK(cudaMemcpy(got_ro.data(), ro, bytes, cudaMemcpyDeviceToHost));
  EXC_CUDA_CHECK(cudaMemcpy(got_out.data(), out, bytes, cudaMemcpyDeviceToHost));
  const Comparison a = compare_bits(dtype, got_ro.data(), want.residual_out.data(), count);
  const Comparison b = compare_bits(dtype, got_out.data(), want.out.data(), count);
  if (a.mismatches + b.mismatches > 0) {
    const Comparison& c = a.mismatches > 0 ? a : b;
    std::cerr << "rank " << rank << " " << what << ": " << a.mismatches << " residual_out and " << b.mismatches
              << " out elements differ; first in " << (a.mismatches > 0 ? "residual_out" : "out") << " at " << c.first
              << ": gpu " << bits_hex(dtype, c.got_bits) << ", contract " << bits_hex(dtype, c.want_bits) << "\n";
  }
  return a.mismatches + b.mismatches;
}

// ---- exact ------------------------------------------------------------------------------------------

int scenario_exact() {
  Worker w("fused_gpu_test_exact");
  const int n = w.world_size(), rank = w.rank();
  cuda::CommunicatorOptions co;
  co.name = "fused_exact";
  co.buffer_bytes = size_t{4} << 20;
  co.flag_timeout_ms = 5000;
  co.use_nccl = false;
  cuda::Communicator comm(w.store(), rank, n, co);
  if (!comm.ipc_ready()) {
    std::cerr << "IPC unavailable: " << comm.ipc_unavailable_reason() << "\n";
    return 3;
  }
  cuda::fused::FusedRmsNorm fused(comm);
  const size_t max_bytes = size_t{33} * 4096 * 4;
  DeviceBuffer x(max_bytes), residual(max_bytes), weight(4096 * 4), ro(max_bytes), out(max_bytes);
  const cuda::RegisteredBuffer registered = comm.register_buffer(x.get(), max_bytes);
  Stream stream;
  uint64_t differing = 0, runs = 0;
  for (DType dtype : {DType::kBF16, DType::kFP16, DType::kFP32}) {
    for (const auto& [rows, hidden] :
         {std::pair{1, 4096}, std::pair{3, 2880}, std::pair{16, 1024}, std::pair{33, 64}}) {
      const FusedInputs in = make_fused_inputs(dtype, n, rows, hidden, 77 + rows, true);
      const size_t count = in.count(), bytes = count * static_cast<size_t>(dtype_size(dtype));
      EXC_CUDA_CHECK(cudaMemcpy(x.get(), in.x[static_cast<size_t>(rank)].data(), bytes, cudaMemcpyHostToDevice));
      EXC_CUDA_CHECK(cudaMemcpy(residual.get(), in.residual.data(), bytes, cudaMemcpyHostToDevice));
      EXC_CUDA_CHECK(cudaMemcpy(weight.get(), in.weight.data(), in.weight.size(), cudaMemcpyHostToDevice));
      const FusedOutputs want = reference_fused(in, 1e-6f);
      const cuda::fused::FusedRmsNormShape shape{rows, hidden, 1e-6f, dtype};
      const cuda::fused::FusedRmsNormBuffers buffers{x.get(), residual.get(), weight.get(), ro.get(), out.get()};
      for (FusedAlgorithm algo : cuda::fused::fused_ipc_algorithms()) {
        for (int variant = 0; variant < 5; ++variant) {
          // 0 staged, 1 registered, 2 registered in a CUDA graph (replayed twice), 3 a grid off the
          // register path (3 x 64), 4 more blocks than rows (64 x the default threads).
          const cuda::RegisteredBuffer* r = variant == 0 || variant == 3 ? nullptr : &registered;
          std::optional<LaunchConfig> grid;
          if (variant == 3) grid = LaunchConfig{3, 64};
          if (variant == 4) grid = LaunchConfig{64, fused.choose(shape, algo).grid.threads};
          if (algo == FusedAlgorithm::kUnfused && variant >= 3) continue;
          auto call = [&] { fused.run(buffers, shape, algo, stream.get(), r, grid); };
          std::optional<CapturedGraph> graph;
          if (variant == 2) graph.emplace(stream.get(), call);
          for (int replay = 0; replay < (variant == 2 ? 2 : 1); ++replay) {
            EXC_CUDA_CHECK(cudaMemsetAsync(ro.get(), 0xA5 ^ replay, bytes, stream.get()));
            EXC_CUDA_CHECK(cudaMemsetAsync(out.get(), 0x5A ^ replay, bytes, stream.get()));
            if (graph) {
              graph->launch(stream.get());
            } else {
              call();
            }
            comm.check(stream.get());
            ++runs;
            differing += count_fused_mismatches(
                dtype, ro.get(), out.get(), count, want, rank,
                std::string(dtype_name(dtype)) + " " + cuda::fused::fused_algorithm_name(algo) + " variant " +
                    std::to_string(variant) + " rows " + std::to_string(rows) + " H " + std::to_string(hidden));
          }
        }
      }
    }
  }
  const int64_t total = w.sum("fused_exact_differing", static_cast<int64_t>(differing));
  std::cerr << "rank " << rank << ": " << runs << " runs, " << differing << " elements differ\n";
  return total == 0 && runs > 0 ? 0 : 1;
}

// ---- mixed ------------------------------------------------------------------------------------------

enum class Step { kPushOneStage, kOneStageReg, kPushOneShot, kPushTwoShot };

// One call of the sequence with its own inputs and outputs.
struct MixedCall {
  Step step = Step::kPushOneStage;
  DType dtype = DType::kBF16;
  int rows = 0, hidden = 0;  // fused
  size_t count = 0;          // all-reduce
  std::optional<LaunchConfig> grid;
  FusedInputs fused_in;  // fused: every rank's x (the reference needs them all)
  FusedOutputs fused_want;
  std::vector<Bytes> ar_in;  // all-reduce: every rank's input
  Bytes ar_want;             // this rank's contract output
  DeviceBuffer x, residual, weight, ro, out;
};

const char* step_name(Step s) {
  switch (s) {
    case Step::kPushOneStage: return "push_one_stage";
    case Step::kOneStageReg: return "one_stage_reg";
    case Step::kPushOneShot: return "push_one_shot";
    case Step::kPushTwoShot: return "push_two_shot";
  }
  return "?";
}

// The sequence (the same on every rank: drawn from `seed` only).
std::vector<std::unique_ptr<MixedCall>> make_sequence(int n, int rank, uint64_t seed, int calls) {
  fused::SplitMix64 rng(seed);
  std::vector<std::unique_ptr<MixedCall>> seq;
  constexpr int kRows[] = {1, 2, 3, 5, 8, 16, 40, 97};
  constexpr int kHidden[] = {1024, 2880, 4096};
  constexpr size_t kCounts[] = {8, 1000, 8192, 40000, 100003};
  for (int k = 0; k < calls; ++k) {
    auto c = std::make_unique<MixedCall>();
    const uint64_t pick = rng.next() % 10;
    c->step = pick < 5   ? Step::kPushOneStage
              : pick < 6 ? Step::kOneStageReg
              : pick < 8 ? Step::kPushOneShot
                         : Step::kPushTwoShot;
    c->dtype = rng.next() % 4 == 0 ? DType::kFP32 : DType::kBF16;
    const size_t elem = static_cast<size_t>(dtype_size(c->dtype));
    if (c->step == Step::kPushOneStage || c->step == Step::kOneStageReg) {
      c->rows = kRows[rng.next() % std::size(kRows)];
      c->hidden = kHidden[rng.next() % std::size(kHidden)];
      const uint64_t g = rng.next() % 4;  // the default grid, one block, off the register path, 64 blocks
      if (g == 1) c->grid = LaunchConfig{1, 0};
      if (g == 2) c->grid = LaunchConfig{3, 64};
      if (g == 3) c->grid = LaunchConfig{64, 0};
      c->fused_in = make_fused_inputs(c->dtype, n, c->rows, c->hidden, rng.next(), rng.next() % 2 == 0);
      c->fused_want = reference_fused(c->fused_in, 1e-6f);
      const size_t bytes = c->fused_in.count() * elem;
      c->x = DeviceBuffer(bytes);
      c->residual = DeviceBuffer(bytes);
      c->weight = DeviceBuffer(static_cast<size_t>(c->hidden) * elem);
      c->ro = DeviceBuffer(bytes);
      c->out = DeviceBuffer(bytes);
      EXC_CUDA_CHECK(
          cudaMemcpy(c->x.get(), c->fused_in.x[static_cast<size_t>(rank)].data(), bytes, cudaMemcpyHostToDevice));
      EXC_CUDA_CHECK(cudaMemcpy(c->residual.get(), c->fused_in.residual.data(), bytes, cudaMemcpyHostToDevice));
      EXC_CUDA_CHECK(
          cudaMemcpy(c->weight.get(), c->fused_in.weight.data(), c->fused_in.weight.size(), cudaMemcpyHostToDevice));
    } else {
      c->count = kCounts[rng.next() % std::size(kCounts)];
      c->ar_in = make_inputs(c->dtype, c->count, n, rng.next(), Pattern::kRandomBits);
      c->ar_want = contract_output(cuda::Op::kAllReduce, c->dtype, c->ar_in, c->count, rank);
      c->x = DeviceBuffer(c->count * elem);
      c->out = DeviceBuffer(c->count * elem);
      EXC_CUDA_CHECK(
          cudaMemcpy(c->x.get(), c->ar_in[static_cast<size_t>(rank)].data(), c->count * elem, cudaMemcpyHostToDevice));
    }
    seq.push_back(std::move(c));
  }
  return seq;
}

void sleep_on_stream(void* us) {
  std::this_thread::sleep_for(std::chrono::microseconds(reinterpret_cast<uintptr_t>(us)));
}

// Enqueues the whole sequence on stream; with `delays`, a host function sleeping 0..300 us (drawn
// per rank and call) before some calls, so that the ranks' streams drift apart.
void enqueue_sequence(cuda::Communicator& comm, cuda::fused::FusedRmsNorm& fused,
                      const std::vector<std::unique_ptr<MixedCall>>& seq, cudaStream_t stream, bool delays,
                      uint64_t delay_seed) {
  fused::SplitMix64 rng(delay_seed);
  for (const auto& c : seq) {
    if (delays && rng.next() % 3 == 0) {
      EXC_CUDA_CHECK(cudaLaunchHostFunc(stream, sleep_on_stream, reinterpret_cast<void*>(rng.next() % 300)));
    }
    if (c->step == Step::kPushOneStage || c->step == Step::kOneStageReg) {
      const cuda::fused::FusedRmsNormShape shape{c->rows, c->hidden, 1e-6f, c->dtype};
      const FusedAlgorithm algo =
          c->step == Step::kPushOneStage ? FusedAlgorithm::kPushOneStage : FusedAlgorithm::kOneStageReg;
      std::optional<LaunchConfig> grid = c->grid;
      if (grid && grid->threads == 0) grid->threads = fused.choose(shape, algo).grid.threads;
      fused.run({c->x.get(), c->residual.get(), c->weight.get(), c->ro.get(), c->out.get()}, shape, algo, stream,
                nullptr, grid);
    } else {
      comm.allreduce(c->x.get(), c->out.get(), c->count, c->dtype,
                     c->step == Step::kPushOneShot ? cuda::Algorithm::kPushOneShot : cuda::Algorithm::kPushTwoShot,
                     stream);
    }
  }
}

// Poisons every output, then returns the mismatches of every call after `run` enqueued them.
uint64_t check_sequence(const std::vector<std::unique_ptr<MixedCall>>& seq, int rank, const std::string& label) {
  uint64_t differing = 0;
  for (size_t k = 0; k < seq.size(); ++k) {
    const MixedCall& c = *seq[k];
    const std::string what = label + " call " + std::to_string(k) + " " + step_name(c.step) + " " +
                             dtype_name(c.dtype) +
                             (c.rows > 0 ? " rows " + std::to_string(c.rows) + " H " + std::to_string(c.hidden)
                                         : " count " + std::to_string(c.count));
    if (c.rows > 0) {
      differing +=
          count_fused_mismatches(c.dtype, c.ro.get(), c.out.get(), c.fused_in.count(), c.fused_want, rank, what);
    } else {
      Bytes got(c.ar_want.size());
      EXC_CUDA_CHECK(cudaMemcpy(got.data(), c.out.get(), got.size(), cudaMemcpyDeviceToHost));
      const Comparison cmp = compare_bits(c.dtype, got.data(), c.ar_want.data(), c.count);
      if (cmp.mismatches > 0) {
        std::cerr << "rank " << rank << " " << what << ": " << cmp.mismatches << " elements differ; first at "
                  << cmp.first << ": gpu " << bits_hex(c.dtype, cmp.got_bits) << ", contract "
                  << bits_hex(c.dtype, cmp.want_bits) << "\n";
      }
      differing += cmp.mismatches;
    }
  }
  return differing;
}

void poison_sequence(const std::vector<std::unique_ptr<MixedCall>>& seq, cudaStream_t stream, int value) {
  for (const auto& c : seq) {
    EXC_CUDA_CHECK(cudaMemsetAsync(c->out.get(), value, c->out.bytes(), stream));
    if (c->rows > 0) EXC_CUDA_CHECK(cudaMemsetAsync(c->ro.get(), value ^ 0xFF, c->ro.bytes(), stream));
  }
}

int scenario_mixed() {
  Worker w("fused_gpu_test_mixed");
  const int n = w.world_size(), rank = w.rank();
  cuda::CommunicatorOptions co;
  co.name = "fused_mixed";
  // Small buffers: the larger push_one_stage calls run as several launches over row chunks, and
  // the larger push all-reduces as several chunks, each a push call of its own size.
  co.buffer_bytes = size_t{2} << 20;
  co.flag_timeout_ms = 10000;
  co.use_nccl = false;
  cuda::Communicator comm(w.store(), rank, n, co);
  if (!comm.ipc_ready()) {
    std::cerr << "IPC unavailable: " << comm.ipc_unavailable_reason() << "\n";
    return 3;
  }
  cuda::fused::FusedRmsNorm fused(comm);
  Stream stream;
  uint64_t differing = 0;
  int sequences = 0;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    const auto seq = make_sequence(n, rank, 1000 + seed, 60);
    poison_sequence(seq, stream.get(), 0x5A);
    enqueue_sequence(comm, fused, seq, stream.get(), true, seed * 7919 + static_cast<uint64_t>(rank));
    comm.check(stream.get());
    differing += check_sequence(seq, rank, "eager seed " + std::to_string(seed));
    ++sequences;
  }
  {
    const auto seq = make_sequence(n, rank, 77, 40);
    CapturedGraph graph(stream.get(), [&] { enqueue_sequence(comm, fused, seq, stream.get(), false, 0); });
    for (int replay = 0; replay < 2; ++replay) {
      poison_sequence(seq, stream.get(), 0xA5 ^ replay);
      graph.launch(stream.get());
      comm.check(stream.get());
      differing += check_sequence(seq, rank, "graph replay " + std::to_string(replay));
      ++sequences;
    }
  }
  const int64_t total = w.sum("fused_mixed_differing", static_cast<int64_t>(differing));
  std::cerr << "rank " << rank << ": " << sequences << " sequences, " << differing << " elements differ\n";
  return total == 0 ? 0 : 1;
}

// ---- the tests (parent process) --------------------------------------------------------------------

int launch_scenario(const std::string& scenario, int nproc) {
  return test::launch_scenario("fused_gpu_test", scenario, nproc, std::chrono::minutes(2));
}

using test::visible_gpus;

TEST(GpuFused, EveryAlgorithmMatchesTheContract) {
  const int gpus = visible_gpus();
  if (gpus < 2) GTEST_SKIP() << "needs 2 or more GPUs, " << gpus << " visible";
  for (int n = 2; n <= std::min(gpus, 4); ++n) EXPECT_EQ(launch_scenario("exact", n), 0) << n << " ranks";
}

TEST(GpuFused, PushCallsBackToBackWithDriftingRanksMatchTheContract) {
  const int gpus = visible_gpus();
  if (gpus < 2) GTEST_SKIP() << "needs 2 or more GPUs, " << gpus << " visible";
  for (int n : {2, std::min(gpus, 4)}) {
    EXPECT_EQ(launch_scenario("mixed", n), 0) << n << " ranks";
    if (gpus < 4) break;
  }
}

}  // namespace
}  // namespace exactcoll::gpu

int main(int argc, char** argv) {
  return exactcoll::gpu::test::gpu_test_main(
      argc, argv, {{"exact", exactcoll::gpu::scenario_exact}, {"mixed", exactcoll::gpu::scenario_mixed}});
}

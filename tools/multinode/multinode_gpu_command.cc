// `exactcoll multinode verify|bench`: the multi-node communicator (cuda_backend/multinode) on GPUs,
// one worker per GPU, under `exactcoll launch --nnodes M --node-rank K ...` on every node (or
// tools/multinode/emulate_nodes.sh for nodes emulated on one host), or torchrun.
//
//   verify: every op (allreduce, reduce_scatter, allgather, fused_rmsnorm) x dtype x size on
//           adversarial inputs (every pattern of tools/inputs/inputs.h); each rank compares its
//           output bit for bit with the simulator's multi-node run (sim/multinode) and, for the
//           sums, with contract::fold per element (contract::tree_fold under --contract tree).
//           Exit 0 when no bit differs on any rank, 1 when one does, 3 on a failure.
//   --contract canonical|tree (the registry's library contracts that run across nodes): the
//           communicator's contract, every op of verify and bench under it.
//   bench:  the all-reduce against NCCL's own on the same ranks, sizes 1 MiB .. --max-mib: time
//           per call (the slowest rank's), algbw and busbw (nccl-tests' conventions), and the
//           ratio of bandwidths. The target: >= 0.9 x NCCL at >= 64 MiB.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "core/contract.h"
#include "core/multinode.h"
#include "core/registry.h"
#include "core/storage.h"
#include "cuda_backend/cuda_check.h"
#include "cuda_backend/multinode/multinode_communicator.h"
#include "cuda_backend/multinode/node_env.h"
#include "sim/multinode/multinode_sim.h"
#include "tools/cli.h"
#include "tools/gpu/device_util.h"
#include "tools/inputs/fused_inputs.h"
#include "tools/inputs/inputs.h"
#include "tools/gpu/worker.h"

namespace exactcoll::multinode {
namespace {

using Bytes = std::vector<uint8_t>;

void upload(const Bytes& host, gpu::DeviceBuffer& d) {
  EXC_CUDA_CHECK(cudaMemcpy(d.get(), host.data(), host.size(), cudaMemcpyHostToDevice));
}

// Elements of this rank's output that differ from `want` (bit patterns).
size_t differing(const Bytes& got, const Bytes& want, size_t esize) {
  size_t n = 0;
  for (size_t i = 0; i + esize <= want.size(); i += esize)
    n += std::memcmp(got.data() + i, want.data() + i, esize) != 0;
  return n;
}

// contract::fold (or contract::tree_fold under tree) of element i over every rank's input (the
// scalar check beside the simulator).
uint32_t scalar_fold(Contract c, DType dtype, const std::vector<Bytes>& in, size_t i) {
  const int n = static_cast<int>(in.size());
  uint32_t bits = 0;
  with_storage_type(dtype, [&](auto tag) {
    using T = decltype(tag);
    auto value = [&](int r) {
      T x;
      std::memcpy(static_cast<void*>(&x), in[static_cast<size_t>(r)].data() + i * sizeof(T), sizeof(T));
      return x;
    };
    bits = Storage<T>::bits(c == Contract::kTree ? contract::tree_fold<T>(n, value) : contract::fold<T>(n, value));
  });
  return bits;
}

struct Setup {
  int64_t buffer_mib = 128;
  int64_t chunk = static_cast<int64_t>(kDefaultChunkElements);
  std::string contract = "canonical";
};

int verify(gpu::Worker& w, cuda::MultiNodeCommunicator& comm, uint64_t seed) {
  const int n = w.world_size(), me = w.rank();
  const Contract contract = comm.node().contract();
  const gpu::Stream owned;
  const cudaStream_t stream = owned.get();
  size_t total_differing = 0, cases = 0;
  const std::vector<size_t> counts = {1, 1000, 4099, static_cast<size_t>(n) * 3000, size_t{1} << 20};
  const NetworkOptions net{comm.layout(), sim::Schedule::kThreads, 1, std::chrono::milliseconds(60000), 0, false, {}};
  for (DType dtype : {DType::kBF16, DType::kFP16, DType::kFP32}) {
    const size_t esize = static_cast<size_t>(dtype_size(dtype));
    for (Op op : {Op::kAllReduce, Op::kReduceScatter, Op::kAllGather}) {
      for (size_t count : counts) {
        if (op == Op::kReduceScatter) count = count / static_cast<size_t>(n) * static_cast<size_t>(n);
        if (count == 0) continue;
        const gpu::Pattern pattern = gpu::all_patterns()[cases % gpu::all_patterns().size()];
        const auto in = gpu::make_inputs(dtype, count, n, gpu::mix_seed(seed, cases), pattern);
        const size_t out_count = output_count(op, count, n);
        gpu::DeviceBuffer d_in(count * esize), d_out(out_count * esize);
        upload(in[static_cast<size_t>(me)], d_in);
        cuda::MultiNodeCallInfo info;
        if (op == Op::kAllReduce)
          info = comm.allreduce(d_in.get(), d_out.get(), count, dtype, cuda::Algorithm::kAuto, stream);
        if (op == Op::kReduceScatter)
          info = comm.reduce_scatter(d_in.get(), d_out.get(), count, dtype, cuda::Algorithm::kAuto, stream);
        if (op == Op::kAllGather)
          info = comm.allgather(d_in.get(), d_out.get(), count, dtype, cuda::Algorithm::kAuto, stream);
        comm.check(stream);
        Bytes got(out_count * esize);
        EXC_CUDA_CHECK(cudaMemcpy(got.data(), d_out.get(), got.size(), cudaMemcpyDeviceToHost));
        // The simulator's run of every rank; this rank's output.
        std::vector<Bytes> sim_out(static_cast<size_t>(n), Bytes(out_count * esize));
        std::vector<const void*> ins;
        std::vector<void*> outs;
        for (int r = 0; r < n; ++r) {
          ins.push_back(in[static_cast<size_t>(r)].data());
          outs.push_back(sim_out[static_cast<size_t>(r)].data());
        }
        MultiNodeSpec spec{op, dtype, count, 1, static_cast<size_t>(std::max<size_t>(64, count / 4 / 64 * 64)), 2};
        spec.contract = contract;
        run_multinode(net, spec, ins, outs);
        size_t bad = differing(got, sim_out[static_cast<size_t>(me)], esize);
        if (op != Op::kAllGather) {  // the scalar transcription of the contract, too
          for (size_t j = 0; j < out_count; ++j) {
            const size_t i = op == Op::kAllReduce ? j : static_cast<size_t>(me) * out_count + j;
            uint32_t g = 0;
            std::memcpy(&g, got.data() + j * esize, esize);
            bad += g != scalar_fold(contract, dtype, in, i) ? 1 : 0;
          }
        }
        const int64_t all_bad = w.sum("verify/" + std::to_string(cases), static_cast<int64_t>(bad));
        total_differing += static_cast<size_t>(all_bad);
        if (w.leader()) {
          std::printf("verify multinode %-14s %s count %8zu %-10s: %lld differing (%s%s)\n", op_name(op),
                      dtype_name(dtype), count, gpu::pattern_name(pattern), static_cast<long long>(all_bad),
                      info.algorithm.c_str(), info.exact ? ", exact" : ", NOT exact");
        }
        ++cases;
      }
    }
    // The fused op: rows x H through the carry chain, then the residual add and the norm.
    for (int rows : {1, 7, 64}) {
      const int hidden = dtype == DType::kFP32 ? 2880 : 4096;
      const gpu::FusedInputs fin = gpu::make_fused_inputs(dtype, n, rows, hidden, gpu::mix_seed(seed, cases), true);
      const size_t bytes = fin.count() * esize;
      gpu::DeviceBuffer x(bytes), res(bytes), wgt(static_cast<size_t>(hidden) * esize), ro(bytes), out(bytes);
      upload(fin.x[static_cast<size_t>(me)], x);
      upload(fin.residual, res);
      upload(fin.weight, wgt);
      comm.fused_add_rmsnorm(x.get(), res.get(), wgt.get(), ro.get(), out.get(), rows, hidden, 1e-6f, dtype,
                             cuda::Algorithm::kAuto, stream);
      comm.check(stream);
      Bytes got_ro(bytes), got_out(bytes);
      EXC_CUDA_CHECK(cudaMemcpy(got_ro.data(), ro.get(), bytes, cudaMemcpyDeviceToHost));
      EXC_CUDA_CHECK(cudaMemcpy(got_out.data(), out.get(), bytes, cudaMemcpyDeviceToHost));
      std::vector<Bytes> want_ro(static_cast<size_t>(n), Bytes(bytes)), want_out = want_ro;
      MultiNodeFusedIo io;
      for (int r = 0; r < n; ++r) {
        io.x.push_back(fin.x[static_cast<size_t>(r)].data());
        io.residual.push_back(fin.residual.data());
        io.weight.push_back(fin.weight.data());
        io.residual_out.push_back(want_ro[static_cast<size_t>(r)].data());
        io.out.push_back(want_out[static_cast<size_t>(r)].data());
      }
      MultiNodeFusedSpec spec{dtype, rows, hidden, 1e-6f, 1, 4096};
      spec.contract = contract;
      run_multinode_fused(net, spec, io);
      const size_t bad = differing(got_ro, want_ro[static_cast<size_t>(me)], esize) +
                         differing(got_out, want_out[static_cast<size_t>(me)], esize);
      const int64_t all_bad = w.sum("verify/" + std::to_string(cases), static_cast<int64_t>(bad));
      total_differing += static_cast<size_t>(all_bad);
      if (w.leader()) {
        std::printf("verify multinode fused_rmsnorm  %s rows %3d H %d (specials): %lld differing\n", dtype_name(dtype),
                    rows, hidden, static_cast<long long>(all_bad));
      }
      ++cases;
    }
  }
  if (w.leader()) {
    std::printf("verify multinode: %s, contract %s, %zu cases, %zu differing elements over all ranks: %s\n",
                layout_text(comm.layout()).c_str(), contract_name(contract), cases, total_differing,
                total_differing == 0 ? "EXACT" : "DIFFERENT");
  }
  return total_differing == 0 ? cli::kExitOk : cli::kExitDiffer;
}

int bench(gpu::Worker& w, cuda::MultiNodeCommunicator& comm, int64_t max_mib, int64_t iters) {
  const int n = w.world_size();
  const gpu::Stream owned;
  const cudaStream_t stream = owned.get();
  if (w.leader()) {
    std::printf(
        "bench multinode allreduce bf16, %s, contract %s (times: the slowest rank's)\n%12s %12s %10s %10s %12s %10s "
        "%10s %8s\n",
        layout_text(comm.layout()).c_str(), contract_name(comm.node().contract()), "bytes", "exactcoll us", "algbw",
        "busbw", "nccl us", "algbw", "busbw", "bw ratio");
  }
  for (int64_t mib = 1; mib <= max_mib; mib *= 4) {
    const size_t bytes = static_cast<size_t>(mib) << 20, count = bytes / 2;
    gpu::DeviceBuffer in(bytes), out(bytes);
    EXC_CUDA_CHECK(cudaMemset(in.get(), 0x3c, bytes));
    // The median of 5 rounds of `iters` back-to-back calls (tools/gpu/device_util.h), after 3 untimed.
    const double ours = gpu::time_eager_us(
        stream, [&] { comm.allreduce(in.get(), out.get(), count, DType::kBF16, cuda::Algorithm::kAuto, stream); },
        static_cast<int>(iters), 3, 5, [&] { comm.check(stream); });
    comm.check(stream);
    const double theirs = gpu::time_eager_us(
        stream, [&] { comm.allreduce(in.get(), out.get(), count, DType::kBF16, cuda::Algorithm::kNccl, stream); },
        static_cast<int>(iters), 3, 5, [&] { comm.check(stream); });
    double slowest_ours = 0, slowest_theirs = 0;
    for (const std::string& v :
         w.all_gather("bench/" + std::to_string(mib), std::to_string(ours) + " " + std::to_string(theirs))) {
      double a = 0, b = 0;
      std::sscanf(v.c_str(), "%lf %lf", &a, &b);
      slowest_ours = std::max(slowest_ours, a);
      slowest_theirs = std::max(slowest_theirs, b);
    }
    const double bus = 2.0 * (n - 1) / n;
    const double alg_ours = static_cast<double>(bytes) / slowest_ours / 1e3,
                 alg_theirs = static_cast<double>(bytes) / slowest_theirs / 1e3;
    if (w.leader()) {
      std::printf("%12zu %12.1f %10.2f %10.2f %12.1f %10.2f %10.2f %8.2f\n", bytes, slowest_ours, alg_ours,
                  alg_ours * bus, slowest_theirs, alg_theirs, alg_theirs * bus, alg_ours / alg_theirs);
    }
  }
  return cli::kExitOk;
}

int multinode_main(int argc, char** argv) {
  std::string action;
  int64_t nproc = 0, seed = 1, max_mib = 256, iters = 20;
  Setup setup;
  cli::ArgParser parser(
      "exactcoll multinode verify|bench [--nproc N] [--buffer-mib M] [--chunk-elements E] [--contract " +
          library_contract_names(kOnMultiNode, "|") + "] [--seed S] [--max-mib B] [--iters I]",
      "The multi-node communicator on GPUs: IPC inside each node, NCCL point-to-point between nodes, the\n"
      "contract's bits (core/multinode.h). Run one worker per GPU on every node: `exactcoll launch\n"
      "--nnodes M --node-rank K --master-addr A --master-port P --nproc L -- multinode verify` on each\n"
      "node, or nodes emulated on one host: tools/multinode/emulate_nodes.sh 2 2 multinode verify.\n"
      "verify: every op, dtype and several sizes on adversarial inputs, every output bit against the\n"
      "simulator and the scalar contract. bench: the all-reduce beside NCCL's own on the same ranks.\n"
      "--contract tree: the tree contract (node subtrees, then recursive doubling / halving across\n"
      "nodes; M and L powers of two).");
  parser.add_positional("action", &action, "verify or bench");
  parser.add_int("nproc", &nproc, "start N local workers of one node");
  parser.set_default_note("nproc", "default: run as a launched worker");
  parser.add_int("buffer-mib", &setup.buffer_mib, "the node communicator's staging and scratch, MiB");
  parser.add_int("chunk-elements", &setup.chunk, "pipeline chunk of the carry chain (a multiple of 64)");
  parser.add_choice("contract", &setup.contract, library_contract_name_list(kOnMultiNode),
                    "the rounding contract every exact call folds under");
  parser.add_int("seed", &seed, "verify: seed of the inputs");
  parser.add_int("max-mib", &max_mib, "bench: the largest message, MiB");
  parser.add_int("iters", &iters, "bench: timed calls per size");
  if (auto code = parser.parse(argc, argv)) return *code;
  if (action != "verify" && action != "bench")
    return cli::fail("multinode", "the action is verify or bench, not '" + action + "'");
  if (setup.buffer_mib < 1 || setup.buffer_mib > 4096) return cli::fail("multinode", "--buffer-mib must be 1..4096");
  if (setup.chunk < 64 || setup.chunk % 64 != 0)
    return cli::fail("multinode", "--chunk-elements must be a positive multiple of 64");
  if (max_mib < 1 || iters < 1 || seed < 0)
    return cli::fail("multinode", "--max-mib and --iters must be >= 1, --seed >= 0");
  if (const auto code = gpu::relaunch_unless_worker(argc, argv, nproc, parser.given("nproc"), "multinode"))
    return *code;
  try {
    gpu::Worker w("multinode");
    const RankPlace place = cuda::node_place_from_env(process_environment(), parse_worker_env(process_environment()));
    cuda::MultiNodeOptions options;
    options.node.buffer_bytes = static_cast<size_t>(setup.buffer_mib) << 20;
    options.chunk_elements = static_cast<size_t>(setup.chunk);
    options.node.contract = *parse_contract_name(setup.contract, kOnMultiNode);
    cuda::MultiNodeCommunicator comm(w.store(), w.rank(), w.world_size(), place, options);
    return action == "verify" ? verify(w, comm, static_cast<uint64_t>(seed)) : bench(w, comm, max_mib, iters);
  } catch (const std::exception& e) {
    return cli::fail("multinode", e.what(), cli::kExitFailure);
  }
}

const cli::Registrar kRegistrar({"multinode", "the multi-node communicator on GPUs: verify bits, bench against NCCL",
                                 multinode_main});

}  // namespace
}  // namespace exactcoll::multinode

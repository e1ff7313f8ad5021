// `exactcoll verify --nproc N --ops fused_rmsnorm [--dtypes …] [--hidden …] [--rows …]`: the fused
// all-reduce + residual + RMSNorm on the GPUs, every algorithm and variant, compared bit for bit
// with the simulator and with the scalar reference of the contract, on inputs with NaN payloads,
// infinities, overflowing sums, subnormals and -0 (tools/gpu/fused/fused_inputs.h).
//
// Steps, per (iteration, dtype, H, rows) with rows * H <= --max-elements:
//   1. every rank makes every rank's inputs (seeded: all ranks agree);
//   2. the scalar reference computes the contract's outputs; the simulator runs each algorithm
//      that it has (one_stage, two_stage, push_one_stage, unfused; above --sim-all-max-elements
//      one_stage only) on the same inputs;
//   3. each algorithm (one_stage, one_stage_reg, push_one_stage, two_stage, gather_norm, unfused,
//      auto) runs in these
//      variants: staged x, registered x, registered x replayed twice from a CUDA graph, forced grids
//      (3 blocks x 64 threads staged; 64 x 1024 registered) and chunked (a second communicator with
//      1 MiB buffers, so that larger problems run as several launches over row chunks); both outputs
//      are poisoned first, so an element no thread writes shows as a mismatch. push_one_stage never
//      stages (staged and registered differ only in what the caller passes); its calls and the
//      unfused path's push all-reduces share the communicator's call counter and receive halves,
//      back to back with other row counts and grids;
//   4. every output bit of this rank is compared with the simulator's (the same algorithm, or
//      one_stage for one_stage_reg and gather_norm; all are the contract's bits) and with the
//      reference;
//   5. counts are summed over ranks; rank 0 prints one line per (dtype, algorithm, variant).
// Exit 0 when nothing differs, 1 when something does, 3 on a runtime failure.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "cuda_backend/communicator.h"
#include "cuda_backend/cuda_check.h"
#include "cuda_backend/fused/fused_rmsnorm.h"
#include "sim/world.h"
#include "sim/fused/reference.h"
#include "tools/cli.h"
#include "tools/gpu/device_util.h"
#include "tools/gpu/fused/fused_commands.h"
#include "tools/gpu/fused/fused_inputs.h"
#include "tools/gpu/fused/fused_reference.h"
#include "tools/gpu/inputs.h"
#include "tools/gpu/reference.h"
#include "tools/gpu/tally.h"
#include "tools/gpu/worker.h"

namespace exactcoll::gpu {
namespace {

constexpr const char* kCommand = "verify";

using cuda::LaunchConfig;
using cuda::fused::FusedAlgorithm;

struct VerifyOptions {
  std::vector<DType> dtypes;
  std::vector<int64_t> hidden, rows;
  std::vector<FusedAlgorithm> algos;
  int64_t iters = 1, max_elements = int64_t{1} << 22, sim_all_max_elements = int64_t{1} << 20, timeout_ms = 10000,
          buffer_mib = 256, show = 8;
  uint64_t seed = 0;
  float eps = 1e-6f;
};

std::optional<FusedAlgo> sim_algo(FusedAlgorithm a) {
  switch (a) {
    case FusedAlgorithm::kOneStage: return FusedAlgo::kOneStage;
    case FusedAlgorithm::kOneStageReg: return FusedAlgo::kOneStage;
    case FusedAlgorithm::kPushOneStage: return FusedAlgo::kPushOneStage;
    case FusedAlgorithm::kLamportOneStage: return FusedAlgo::kLamportOneStage;
    case FusedAlgorithm::kTwoStage: return FusedAlgo::kTwoStage;
    case FusedAlgorithm::kUnfused: return FusedAlgo::kUnfused;
    default: return std::nullopt;
  }
}

int verify_worker(const VerifyOptions& o) {
  Worker w("verify_fused");
  const int n = w.world_size(), rank = w.rank();
  cuda::CommunicatorOptions co;
  co.name = "verify_fused";
  co.buffer_bytes = static_cast<size_t>(o.buffer_mib) << 20;
  co.flag_timeout_ms = static_cast<uint64_t>(o.timeout_ms);
  co.use_nccl = false;
  cuda::Communicator comm(w.store(), rank, n, co);
  cuda::CommunicatorOptions small_options = co;
  small_options.name = "verify_fused_small";
  small_options.buffer_bytes = size_t{1} << 20;
  cuda::Communicator small_comm(w.store(), rank, n, small_options);
  {
    std::ostringstream os;
    os << "# exactcoll verify fused_rmsnorm: " << n << " ranks on " << w.device_name() << " (" << comm.arch()
       << "), seed " << o.seed << ", iterations " << o.iters << ", rows * H <= " << o.max_elements << "\n";
    os << "# IPC path: " << (comm.ipc_ready() ? "ready" : "UNAVAILABLE: " + comm.ipc_unavailable_reason()) << "\n";
    print_leader(w, os.str());
  }
  if (!comm.ipc_ready()) return cli::fail(kCommand, "the IPC path is unavailable: " + comm.ipc_unavailable_reason(), 3);
  cuda::fused::FusedRmsNorm fused(comm), small_fused(small_comm);

  // 1. Buffers for the largest problem; x registered once with both communicators.
  size_t max_count = 0, max_hidden = 0;
  for (int64_t h : o.hidden) {
    for (int64_t r : o.rows) {
      if (r * h <= o.max_elements) max_count = std::max(max_count, static_cast<size_t>(r * h));
    }
    max_hidden = std::max(max_hidden, static_cast<size_t>(h));
  }
  const size_t max_bytes = std::max<size_t>(max_count * 4, 16);
  DeviceBuffer x(max_bytes), residual(max_bytes), weight(max_hidden * 4), ro(max_bytes), out(max_bytes);
  const cuda::RegisteredBuffer registered = comm.register_buffer(x.get(), max_bytes);  // the chunked variant stages
  Stream stream;
  sim::WorldOptions world_options;
  world_options.ranks = n;
  sim::World world(world_options);
  Tallies tallies;
  int64_t shown = 0;
  const auto started = std::chrono::steady_clock::now();

  for (int64_t iter = 0; iter < o.iters; ++iter) {
    for (DType dtype : o.dtypes) {
      const size_t elem = static_cast<size_t>(dtype_size(dtype));
      for (int64_t hidden : o.hidden) {
        for (int64_t rows : o.rows) {
          if (rows * hidden > o.max_elements) continue;
          // 1. Inputs; this rank's go to the GPU.
          const uint64_t case_seed =
              mix_seed(mix_seed(mix_seed(o.seed, static_cast<uint64_t>(iter)), static_cast<uint64_t>(dtype)),
                       static_cast<uint64_t>(hidden) * 100003 + static_cast<uint64_t>(rows));
          const FusedInputs in =
              make_fused_inputs(dtype, n, static_cast<int>(rows), static_cast<int>(hidden), case_seed, true);
          const size_t count = in.count(), bytes = count * elem;
          EXC_CUDA_CHECK(cudaMemcpy(x.get(), in.x[static_cast<size_t>(rank)].data(), bytes, cudaMemcpyHostToDevice));
          EXC_CUDA_CHECK(cudaMemcpy(residual.get(), in.residual.data(), bytes, cudaMemcpyHostToDevice));
          EXC_CUDA_CHECK(cudaMemcpy(weight.get(), in.weight.data(), in.weight.size(), cudaMemcpyHostToDevice));
          // 2. The reference and the simulator.
          const FusedOutputs by_reference = reference_fused(in, o.eps);
          std::map<FusedAlgo, FusedOutputs> by_sim;
          auto simulated = [&](FusedAlgo a) -> const FusedOutputs& {
            auto it = by_sim.find(a);
            if (it == by_sim.end()) {
              it = by_sim.emplace(a, simulate_fused(world, a, in, o.eps, 4)[static_cast<size_t>(rank)]).first;
            }
            return it->second;
          };
          const cuda::fused::FusedRmsNormShape shape{static_cast<int>(rows), static_cast<int>(hidden), o.eps, dtype};
          const cuda::fused::FusedRmsNormBuffers buffers{x.get(), residual.get(), weight.get(), ro.get(), out.get()};
          for (FusedAlgorithm requested : o.algos) {
            const cuda::fused::FusedChoice choice = fused.choose(shape, requested);
            // The simulator runs the same algorithm where it has it (and the problem is small
            // enough, --sim-all-max-elements); its one_stage otherwise (every algorithm's bits are
            // the contract's: the simulator's own tests hold its three algorithms equal).
            const FusedAlgo sim_choice = count <= static_cast<size_t>(o.sim_all_max_elements)
                                             ? sim_algo(choice.algo).value_or(FusedAlgo::kOneStage)
                                             : FusedAlgo::kOneStage;
            const FusedOutputs& want = simulated(sim_choice);
            const std::string label = cuda::fused::fused_algorithm_name(requested);
            // 3. The variants.
            struct Variant {
              std::string name;
              bool registered, graph, small;
              std::optional<LaunchConfig> grid;
            };
            std::vector<Variant> variants = {{"staged", false, false, false, std::nullopt},
                                             {"registered", true, false, false, std::nullopt},
                                             {"graph", true, true, false, std::nullopt}};
            if (requested != FusedAlgorithm::kAuto) {
              variants.push_back({"grid3x64", false, false, false, LaunchConfig{3, 64}});
              variants.push_back({"grid64x1024", true, false, false, LaunchConfig{64, 1024}});
              if (requested != FusedAlgorithm::kUnfused) variants.push_back({"chunked", false, false, true, std::nullopt});
            }
            for (const Variant& v : variants) {
              cuda::fused::FusedRmsNorm& f = v.small ? small_fused : fused;
              cuda::Communicator& c = v.small ? small_comm : comm;
              auto call = [&] {
                f.run(buffers, shape, requested, stream.get(), v.registered ? &registered : nullptr, v.grid);
              };
              std::optional<CapturedGraph> graph;
              if (v.graph) graph.emplace(stream.get(), call);
              for (int replay = 0; replay < (v.graph ? 2 : 1); ++replay) {
                // Poison both outputs (a different byte each replay, so stale results show).
                EXC_CUDA_CHECK(cudaMemsetAsync(ro.get(), 0xA5 ^ (replay * 0x3C), bytes, stream.get()));
                EXC_CUDA_CHECK(cudaMemsetAsync(out.get(), 0x5A ^ (replay * 0x3C), bytes, stream.get()));
                if (graph) {
                  graph->launch(stream.get());
                } else {
                  call();
                }
                c.check(stream.get());
                FusedOutputs got;
                got.residual_out.resize(bytes);
                got.out.resize(bytes);
                EXC_CUDA_CHECK(cudaMemcpy(got.residual_out.data(), ro.get(), bytes, cudaMemcpyDeviceToHost));
                EXC_CUDA_CHECK(cudaMemcpy(got.out.data(), out.get(), bytes, cudaMemcpyDeviceToHost));
                // 4. Every bit, against the simulator and the reference.
                const Comparison sim_ro = compare_bits(dtype, got.residual_out.data(), want.residual_out.data(), count);
                const Comparison sim_out = compare_bits(dtype, got.out.data(), want.out.data(), count);
                const Comparison ref_ro =
                    compare_bits(dtype, got.residual_out.data(), by_reference.residual_out.data(), count);
                const Comparison ref_out = compare_bits(dtype, got.out.data(), by_reference.out.data(), count);
                Tally& t = tallies[std::string("fused_rmsnorm ") + dtype_name(dtype) + " " + label + " " + v.name];
                ++t.runs;
                t.compared += 2 * count;
                t.sim_mismatches += sim_ro.mismatches + sim_out.mismatches;
                t.reference_mismatches += ref_ro.mismatches + ref_out.mismatches;
                const uint64_t bad = sim_ro.mismatches + sim_out.mismatches + ref_ro.mismatches + ref_out.mismatches;
                if (bad > 0 && shown++ < o.show) {
                  const bool in_ro = sim_ro.mismatches + ref_ro.mismatches > 0;
                  const Comparison& cmp = in_ro ? (sim_ro.mismatches > 0 ? sim_ro : ref_ro)
                                                : (sim_out.mismatches > 0 ? sim_out : ref_out);
                  std::cerr << "MISMATCH rank " << rank << ": fused_rmsnorm " << dtype_name(dtype) << " " << label << " ("
                            << cuda::fused::fused_algorithm_name(choice.algo) << ") " << v.name << " rows " << rows
                            << " H " << hidden << ": " << (sim_ro.mismatches + sim_out.mismatches)
                            << " elements differ from the simulator, " << (ref_ro.mismatches + ref_out.mismatches)
                            << " from the reference; first in " << (in_ro ? "residual_out" : "out") << " at row "
                            << cmp.first / static_cast<size_t>(hidden) << " column " << cmp.first % static_cast<size_t>(hidden)
                            << ": gpu " << bits_hex(dtype, cmp.got_bits) << ", expected " << bits_hex(dtype, cmp.want_bits)
                            << "\n";
                }
              }
            }
          }
        }
      }
    }
  }

  // 5. Sum over ranks; rank 0 prints.
  const Tallies total = sum_tallies(w.all_gather("fused_tallies", serialize_tallies(tallies)));
  Tally grand;
  std::ostringstream os;
  os << format_tally_table(total, "diff_vs_ref", &grand);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  os << verify_summary_line("verify fused_rmsnorm " + std::to_string(n) + " ranks", grand,
                            "both outputs, all ranks", "reference", seconds);
  print_leader(w, os.str());
  return grand.clean() ? cli::kExitOk : cli::kExitDiffer;
}

}  // namespace

int run_fused_verify(int argc, char** argv) {
  int64_t nproc = 0, seed = -1;
  double eps = 1e-6;
  std::string ops_text, dtypes_text = "bf16,fp16", hidden_text = "2880,4096,5120,7168,8192,16384",
                        rows_text = "1,2,3,7,16,64,257,1024,4096",
                        algos_text = "one_stage,one_stage_reg,push_one_stage,lamport_one_stage,two_stage,gather_norm,unfused,auto";
  VerifyOptions o;
  cli::ArgParser parser(
      "exactcoll verify --nproc N --ops fused_rmsnorm [--dtypes …] [--hidden …] [--rows …] [--algos …] [--iters K] "
      "[--seed S]",
      "Runs the fused all-reduce + residual + RMSNorm on the GPUs (one process each) in every algorithm\n"
      "and variant (staged, registered, CUDA graph, forced grids, row-chunked) on inputs with NaN\n"
      "payloads, infinities, overflowing sums and subnormals, and compares every bit of both outputs\n"
      "with the simulator and with the scalar reference. Exit 0 when nothing differs, 1 when\n"
      "something does, 3 on a runtime failure.");
  parser.add_int("nproc", &nproc, "processes, one per GPU");
  parser.mark_required("nproc");
  parser.add_string("ops", &ops_text, "fused_rmsnorm (the other ops are verified without it)");
  parser.add_string("dtypes", &dtypes_text, "comma list of bf16, fp16, fp32");
  parser.add_string("hidden", &hidden_text, "comma list of H");
  parser.add_string("rows", &rows_text, "comma list of row counts");
  parser.add_string("algos", &algos_text,
                    "comma list of one_stage, one_stage_reg, push_one_stage, lamport_one_stage, two_stage, gather_norm, unfused, "
                    "auto");
  parser.add_int("max-elements", &o.max_elements, "skip (H, rows) with rows * H above this");
  parser.add_int("sim-all-max-elements", &o.sim_all_max_elements,
                 "simulate each GPU algorithm itself up to this rows * H (one_stage above)");
  parser.add_double("eps", &eps, "RMSNorm epsilon");
  parser.add_int("iters", &o.iters, "repetitions with fresh inputs");
  parser.add_int("seed", &seed, "seed of the inputs (default: from the job's store token)");
  parser.add_int("timeout-ms", &o.timeout_ms, "bound on every in-kernel flag wait");
  parser.add_int("buffer-mib", &o.buffer_mib, "staging and scratch MiB per rank");
  parser.add_int("show", &o.show, "mismatch details printed per rank");
  if (const auto code = parser.parse(argc, argv)) return *code;
  if (ops_text != "fused_rmsnorm") {
    return cli::fail(kCommand, "verify the fused op on its own: --ops fused_rmsnorm (got '" + ops_text + "')");
  }
  for (const auto& s : split_list(dtypes_text)) {
    const auto d = parse_dtype(s);
    if (!d) return cli::fail(kCommand, "unknown dtype '" + s + "' (bf16, fp16, fp32)");
    o.dtypes.push_back(*d);
  }
  for (const auto& s : split_list(algos_text)) {
    const auto a = cuda::fused::parse_fused_algorithm(s);
    if (!a || *a == FusedAlgorithm::kNcclSplit) {
      return cli::fail(kCommand,
                       "unknown algorithm '" + s +
                           "' (one_stage, one_stage_reg, push_one_stage, lamport_one_stage, two_stage, gather_norm, unfused, auto)");
    }
    o.algos.push_back(*a);
  }
  if (!parse_counts(hidden_text, &o.hidden)) return cli::fail(kCommand, "--hidden wants positive numbers like 2880,4096");
  if (!parse_counts(rows_text, &o.rows)) return cli::fail(kCommand, "--rows wants positive numbers like 1,2,3");
  for (int64_t h : o.hidden) {
    for (DType d : o.dtypes) {
      if (h % (16 / dtype_size(d)) != 0) {
        return cli::fail(kCommand, "H " + std::to_string(h) + " is not a multiple of the " + dtype_name(d) + " pack");
      }
    }
  }
  if (o.dtypes.empty() || o.algos.empty()) return cli::fail(kCommand, "nothing to verify");
  if (o.iters < 1 || o.max_elements < 1 || o.sim_all_max_elements < 0 || o.timeout_ms < 1 || o.buffer_mib < 1) {
    return cli::fail(kCommand, "--iters, --max-elements, --timeout-ms and --buffer-mib must be positive");
  }
  if (const std::string problem = exactcoll::fused::check_eps(eps); !problem.empty()) return cli::fail(kCommand, problem);
  o.eps = static_cast<float>(eps);
  if (const auto code = relaunch_unless_worker(argc, argv, nproc, parser.given("nproc"), "verify")) return *code;
  // Every rank needs the same seed: without --seed, a hash of the job's store token (the same in
  // every worker of one job, fresh per job).
  o.seed = seed < 0 ? seed_from_store_token() : static_cast<uint64_t>(seed);
  try {
    return verify_worker(o);
  } catch (const std::exception& e) {
    return cli::fail(kCommand, e.what(), cli::kExitFailure);
  }
}

}  // namespace exactcoll::gpu

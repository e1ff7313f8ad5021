// `exactcoll verify --nproc N [--ops …] [--dtypes …] [--iters K]`: every op × algorithm of the IPC
// path on the GPUs, with fresh random and adversarial inputs, compared bit for bit with the
// simulator (and with an independent scalar transcription of the contract) on the same inputs.
//
// Steps, per (iteration, op, dtype, element count, input pattern):
//   1. every rank makes every rank's input (tools/gpu/inputs.h; seeded, so all ranks agree);
//   2. for each algorithm (the op's IPC algorithms and auto) the simulator computes the outputs;
//   3. each variant runs on the GPUs: staged input, registered input, registered input replayed
//      twice from a CUDA graph, and forced grids (3 blocks × 64 threads, kMaxBlocks = 128 × 1024);
//      the output is poisoned first, so an element that no thread writes is a mismatch;
//   4. every output bit of this rank is compared with the simulator's and the contract's;
//   5. the counts are summed over ranks and rank 0 prints one line per (op, dtype, algorithm,
//      variant). Exit 1 on any mismatch, 3 on a runtime failure (a timeout names rank and peer).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "cuda_backend/communicator.h"
#include "cuda_backend/cuda_check.h"
#include "cuda_backend/nccl_api.h"
#include "tools/cli.h"
#include "tools/gpu/device_util.h"
#include "tools/gpu/fused/fused_commands.h"
#include "tools/gpu/inputs.h"
#include "tools/gpu/reference.h"
#include "tools/gpu/tally.h"
#include "tools/gpu/worker.h"

namespace exactcoll::gpu {
namespace {

using cuda::Algorithm;
using cuda::CallInfo;
using cuda::Communicator;
using cuda::LaunchConfig;
using cuda::Op;

struct VerifyOptions {
  std::vector<Op> ops;
  std::vector<DType> dtypes;
  std::vector<Pattern> patterns;
  int64_t iters = 1;
  int64_t max_count = 1 << 20;
  uint64_t seed = 0;
  int64_t timeout_ms = 10000;
  int64_t buffer_mib = 64;
  int64_t show = 8;  // mismatch details printed per rank
  bool pdl = true;
};

// Per-rank element counts (reduce_scatter multiplies them by n so that slices are odd-sized too).
const std::vector<size_t>& base_counts() {
  static const std::vector<size_t> counts = {1,    2,    3,    5,    7,    8,     9,     16,    17,           31,
                                             33,   63,   64,   65,   127,  129,   255,   1000,  1023,         4097,
                                             12345, 65543, 262157, 1048579,
                                             // 8 MiB of bf16: only with --max-count 4194319 or more (the device
                                             // scripts' default stops at 1048579)
                                             4194319};
  return counts;
}

std::string tally_key(Op op, DType dtype, const std::string& algo, const std::string& variant) {
  return std::string(op_name(op)) + " " + dtype_name(dtype) + " " + algo + " " + variant;
}

int verify_worker(const VerifyOptions& o) {
  Worker w("verify");
  const int n = w.world_size(), rank = w.rank();
  cuda::CommunicatorOptions co;
  co.name = "verify";
  co.buffer_bytes = static_cast<size_t>(o.buffer_mib) << 20;
  co.flag_timeout_ms = static_cast<uint64_t>(o.timeout_ms);
  co.programmatic_launch = o.pdl;
  Communicator comm(w.store(), rank, n, co);
  {
    std::ostringstream os;
    os << "# exactcoll verify: " << n << " ranks on " << w.device_name() << " (" << comm.arch() << "), seed " << o.seed
       << ", iterations " << o.iters << ", programmatic launch " << (o.pdl ? "on" : "off") << "\n";
    os << "# IPC path: " << (comm.ipc_ready() ? "ready" : "UNAVAILABLE: " + comm.ipc_unavailable_reason()) << "; NCCL: ";
    if (comm.nccl_ready()) {
      os << cuda::NcclApi::get().version();
    } else {
      os << "not loaded";
    }
    os << "\n";
    print_leader(w, os.str());
  }
  if (!comm.ipc_ready()) return cli::fail("verify", "the IPC path is unavailable: " + comm.ipc_unavailable_reason(), 3);

  // 1. Buffers for the largest case: the input registered once (the registered variants).
  size_t max_in = 0, max_out = 0;
  for (Op op : o.ops) {
    for (size_t c : base_counts()) {
      if (static_cast<int64_t>(c) > o.max_count) continue;
      const size_t count = op == Op::kReduceScatter ? c * static_cast<size_t>(n) : c;
      max_in = std::max(max_in, count * 4);
      max_out = std::max(max_out, output_count(op, count, n) * 4);
    }
  }
  DeviceBuffer input(max_in), output(max_out);
  const cuda::RegisteredBuffer registered = comm.register_buffer(input.get(), max_in);
  Stream stream;
  Simulator simulator(n);
  Tallies tallies;
  int64_t shown = 0;
  const auto started = std::chrono::steady_clock::now();

  for (int64_t iter = 0; iter < o.iters; ++iter) {
    for (Op op : o.ops) {
      for (DType dtype : o.dtypes) {
        const size_t elem = static_cast<size_t>(dtype_size(dtype));
        size_t case_index = 0;
        for (size_t c : base_counts()) {
          if (static_cast<int64_t>(c) > o.max_count) continue;
          const size_t count = op == Op::kReduceScatter ? c * static_cast<size_t>(n) : c;
          const size_t out_count = output_count(op, count, n);
          for (Pattern pattern : o.patterns) {
            // Large counts: the random patterns only (the simulator's time grows with the count).
            if (c > 4097 && pattern != Pattern::kRandom && pattern != Pattern::kRandomBits) continue;
            const uint64_t case_seed =
                mix_seed(mix_seed(mix_seed(o.seed, static_cast<uint64_t>(iter)),
                                  static_cast<uint64_t>(op) * 16 + static_cast<uint64_t>(dtype)),
                         case_index++);
            // 1. Inputs of every rank; this rank's goes to the GPU.
            const std::vector<Bytes> inputs = make_inputs(dtype, count, n, case_seed, pattern);
            const Bytes by_contract = contract_output(op, dtype, inputs, count, rank);
            EXC_CUDA_CHECK(cudaMemcpy(input.get(), inputs[static_cast<size_t>(rank)].data(), count * elem,
                                      cudaMemcpyHostToDevice));
            std::vector<Algorithm> algos = cuda::ipc_algorithms(op);
            algos.push_back(Algorithm::kAuto);
            std::map<Algorithm, Bytes> by_sim;  // per resolved algorithm
            for (Algorithm requested : algos) {
              const cuda::Choice choice = comm.choose(op, count, dtype, requested);
              // 2. The simulator, running the algorithm that the GPU runs (copy_engine all-gather
              //    is a copy: simulated as the SM allgather).
              if (by_sim.count(choice.algo) == 0) {
                by_sim[choice.algo] = simulator.run(op, choice.algo, dtype, inputs, count,
                                                    std::min(choice.grid.blocks, 8))[static_cast<size_t>(rank)];
              }
              const Bytes& want = by_sim[choice.algo];
              const std::string algo_label = requested == Algorithm::kAuto
                                                 ? std::string("auto")
                                                 : std::string(cuda::algorithm_name(requested));
              // 3. The variants.
              struct Variant {
                std::string name;
                bool registered;
                bool graph;
                std::optional<LaunchConfig> grid;
              };
              std::vector<Variant> variants = {{"staged", false, false, std::nullopt},
                                               {"registered", true, false, std::nullopt},
                                               {"graph", true, true, std::nullopt}};
              if (choice.algo != Algorithm::kCopyEngine && requested != Algorithm::kAuto) {
                variants.push_back({"grid3x64", false, false, LaunchConfig{3, 64}});
                variants.push_back({"grid128x1024", true, false, LaunchConfig{kMaxBlocks, 1024}});
              }
              for (const Variant& v : variants) {
                auto call = [&] {
                  const cuda::RegisteredBuffer* reg = v.registered ? &registered : nullptr;
                  switch (op) {
                    case Op::kAllReduce:
                      return comm.allreduce(input.get(), output.get(), count, dtype, requested, stream.get(), reg, v.grid);
                    case Op::kReduceScatter:
                      return comm.reduce_scatter(input.get(), output.get(), count, dtype, requested, stream.get(), reg,
                                                 v.grid);
                    case Op::kAllGather:
                      return comm.allgather(input.get(), output.get(), count, dtype, requested, stream.get(), reg, v.grid);
                  }
                  return CallInfo{};
                };
                const int replays = v.graph ? 2 : 1;
                std::optional<CapturedGraph> graph;
                if (v.graph) graph.emplace(stream.get(), call);
                for (int replay = 0; replay < replays; ++replay) {
                  // Poison: a different byte each time, so stale results from the last run show.
                  EXC_CUDA_CHECK(cudaMemsetAsync(output.get(), 0xA5 ^ (replay * 0x3C), out_count * elem, stream.get()));
                  if (graph) {
                    graph->launch(stream.get());
                  } else {
                    call();
                  }
                  comm.check(stream.get());
                  Bytes got(out_count * elem);
                  EXC_CUDA_CHECK(cudaMemcpy(got.data(), output.get(), got.size(), cudaMemcpyDeviceToHost));
                  // 4. Every bit, against the simulator and the contract.
                  const Comparison vs_sim = compare_bits(dtype, got.data(), want.data(), out_count);
                  const Comparison vs_contract = compare_bits(dtype, got.data(), by_contract.data(), out_count);
                  Tally& t = tallies[tally_key(op, dtype, algo_label, v.name)];
                  ++t.runs;
                  t.compared += out_count;
                  t.sim_mismatches += vs_sim.mismatches;
                  t.reference_mismatches += vs_contract.mismatches;
                  if ((vs_sim.mismatches > 0 || vs_contract.mismatches > 0) && shown++ < o.show) {
                    const Comparison& c = vs_sim.mismatches > 0 ? vs_sim : vs_contract;
                    std::cerr << "MISMATCH rank " << rank << ": " << op_name(op) << " " << dtype_name(dtype) << " "
                              << algo_label << " (" << cuda::algorithm_name(choice.algo) << ") " << v.name << " count "
                              << count << " pattern " << pattern_name(pattern) << ": " << vs_sim.mismatches
                              << " elements differ from the simulator, " << vs_contract.mismatches
                              << " from the contract; first at " << c.first << ": gpu " << bits_hex(dtype, c.got_bits)
                              << ", expected " << bits_hex(dtype, c.want_bits) << "\n";
                  }
                }
              }
            }
          }
        }
      }
    }
  }

  // 5. Sum over ranks; rank 0 prints.
  const Tallies total = sum_tallies(w.all_gather("tallies", serialize_tallies(tallies)));
  Tally grand;
  std::ostringstream os;
  os << format_tally_table(total, "diff_vs_ctr", &grand);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  os << verify_summary_line("verify " + std::to_string(n) + " ranks", grand, "all ranks", "contract", seconds);
  print_leader(w, os.str());
  return grand.clean() ? cli::kExitOk : cli::kExitDiffer;
}

int run_verify(int argc, char** argv) {
  // `exactcoll verify --ops fused_rmsnorm …` (tools/gpu/fused).
  if (asks_for_fused(argc, argv, "ops")) return run_fused_verify(argc, argv);
  int64_t nproc = 0;
  std::string ops_text = "allreduce,reduce_scatter,allgather", dtypes_text = "bf16,fp16,fp32";
  std::string patterns_text = "random,random_bits,specials,overflow,subnormal,cancel";
  int64_t seed = -1;
  VerifyOptions o;
  cli::ArgParser parser(
      "exactcoll verify --nproc N [--ops …] [--dtypes …] [--iters K] [--seed S]",
      "Runs every op and algorithm of the CUDA IPC path (one process per GPU) on random and\n"
      "adversarial inputs (NaN payloads, ±0, ±inf, subnormals, overflowing sums, 1 element, odd\n"
      "counts), in staged, registered, CUDA-graph and forced-grid variants, and compares every\n"
      "output bit with the simulator and with the contract. Without --ops the fused all-reduce +\n"
      "residual + RMSNorm is verified too, after the collectives. Exit 0 when nothing differs, 1 when\n"
      "something does, 3 on a runtime failure (e.g. a peer that never arrived at a barrier).");
  parser.add_int("nproc", &nproc, "processes, one per GPU");
  parser.mark_required("nproc");
  parser.add_string("ops", &ops_text,
                    "comma list of allreduce, reduce_scatter, allgather, or fused_rmsnorm alone (see verify --ops "
                    "fused_rmsnorm --help); without --ops: all of them");
  parser.add_string("dtypes", &dtypes_text, "comma list of bf16, fp16, fp32");
  parser.add_string("patterns", &patterns_text, "comma list of input patterns");
  parser.add_int("iters", &o.iters, "repetitions with fresh inputs");
  parser.add_int("seed", &seed, "seed of the inputs (default: derived from the job's store token, printed)");
  parser.add_int("max-count", &o.max_count, "largest element count per rank tried");
  parser.add_int("timeout-ms", &o.timeout_ms, "bound on every in-kernel flag wait");
  parser.add_int("buffer-mib", &o.buffer_mib, "staging and scratch MiB per rank");
  parser.add_int("show", &o.show, "mismatch details printed per rank");
  bool no_pdl = false;
  parser.add_bool("no-pdl", &no_pdl, "launch without programmatic dependent launch");
  if (const auto code = parser.parse(argc, argv)) return *code;
  for (const auto& s : split_list(ops_text)) {
    const auto op = cuda::parse_op(s);
    if (!op) return cli::fail("verify", "unknown op '" + s + "' (allreduce, reduce_scatter, allgather)");
    o.ops.push_back(*op);
  }
  for (const auto& s : split_list(dtypes_text)) {
    const auto d = parse_dtype(s);
    if (!d) return cli::fail("verify", "unknown dtype '" + s + "' (bf16, fp16, fp32)");
    o.dtypes.push_back(*d);
  }
  for (const auto& s : split_list(patterns_text)) {
    const auto p = parse_pattern(s);
    if (!p) return cli::fail("verify", "unknown pattern '" + s + "'");
    o.patterns.push_back(*p);
  }
  o.pdl = !no_pdl;
  if (o.ops.empty() || o.dtypes.empty() || o.patterns.empty()) return cli::fail("verify", "nothing to verify");
  if (o.iters < 1 || o.max_count < 1 || o.timeout_ms < 1 || o.buffer_mib < 1) {
    return cli::fail("verify", "--iters, --max-count, --timeout-ms and --buffer-mib must be positive");
  }
  const char* rank_env = std::getenv("RANK");
  const bool in_worker = rank_env != nullptr && *rank_env != '\0';
  if (!parser.given("ops") && !in_worker && parser.given("nproc")) {
    // No --ops: every op. Two jobs, one after the other (each with its own store and GPUs' state):
    // the collectives, then the fused all-reduce + residual + RMSNorm with its own defaults for H
    // and rows, and the same dtypes, seed, repetitions and wait bound when they were given.
    std::vector<std::string> collective_args(argv, argv + argc);
    collective_args.insert(collective_args.end(), {"--ops", "allreduce,reduce_scatter,allgather"});
    std::vector<std::string> fused_args = {"verify", "--ops", "fused_rmsnorm", "--nproc", std::to_string(nproc)};
    for (const char* flag : {"dtypes", "seed", "iters", "timeout-ms"}) {
      if (!parser.given(flag)) continue;
      fused_args.push_back(std::string("--") + flag);
      fused_args.push_back(flag == std::string("dtypes") ? dtypes_text
                           : flag == std::string("seed") ? std::to_string(seed)
                           : flag == std::string("iters") ? std::to_string(o.iters)
                                                          : std::to_string(o.timeout_ms));
    }
    auto run_with = [](std::vector<std::string>& args, int (*run)(int, char**)) {
      std::vector<char*> v;
      for (auto& a : args) v.push_back(a.data());
      v.push_back(nullptr);
      return run(static_cast<int>(args.size()), v.data());
    };
    const int collectives = run_with(collective_args, run_verify);
    // A job that could not run at all (no GPU, bad flags) is not tried a second time.
    if (collectives >= cli::kExitUsage) return collectives;
    const int fused = run_with(fused_args, run_fused_verify);
    // The worse of the two: a runtime failure (3) over differing bits (1) over success (0).
    return std::max(collectives, fused);
  }
  if (!parser.given("ops") && in_worker && std::string(rank_env) == "0") {
    std::cerr << "exactcoll verify: under torchrun or launch, verify the fused op with a second job: "
                 "exactcoll verify --ops fused_rmsnorm\n";
  }
  if (const auto code = relaunch_unless_worker(argc, argv, nproc, parser.given("nproc"), "verify")) return *code;
  // Every rank needs the same seed: without --seed, rank 0's clock is shared through the store
  // (below, inside the worker) -- here the launcher has not started workers, so take it from the
  // environment the launcher passes through (EXACTCOLL_VERIFY_SEED) or the token.
  o.seed = seed < 0 ? seed_from_store_token() : static_cast<uint64_t>(seed);
  try {
    return verify_worker(o);
  } catch (const std::exception& e) {
    return cli::fail("verify", e.what(), cli::kExitFailure);
  }
}

const cli::Registrar kRegistrar({"verify", "GPU results vs the simulator, every bit, all ops and algorithms",
                                 run_verify});

}  // namespace
}  // namespace exactcoll::gpu

// `exactcoll verify --nproc N [--ops …] [--dtypes …] [--iters K] [--seed S] [--contract C]`: every
// op × algorithm of the IPC path on the GPUs, with fresh random and adversarial inputs, compared bit
// for bit with the simulator and with an independent scalar transcription of the contract on the
// same inputs. --contract (canonical or tree) is the communicators', the simulator's and the
// transcription's alike; every op runs the same algorithms and variants under either.
// Each op's cases, algorithms and variants are its GpuOp's (tools/gpu/gpu_op.h); this driver is
// the same for every op, and one job verifies all of them.
//
// Steps: 1. every worker makes the communicators (the main one; a 1 MiB one for the ops that run a
// chunked variant) and rank 0 prints the header; 2. each op in --ops order runs its cases
// (GpuOp::verify: inputs, the simulator's and the contract's outputs, every algorithm in every
// variant, every output bit compared), counting into one ledger; 3. the counts are summed over
// ranks and rank 0 prints one line per (op, dtype, algorithm, variant) and a summary line.
// Exit 0 when nothing differs, 1 when something does, 3 on a runtime failure (a timeout names rank
// and peer).
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "core/registry.h"
#include "cuda_backend/communicator.h"
#include "cuda_backend/nccl_api.h"
#include "tools/cli.h"
#include "tools/contract_flag.h"
#include "tools/gpu/device_util.h"
#include "tools/gpu/gpu_op.h"
#include "tools/inputs/inputs.h"
#include "tools/gpu/tally.h"
#include "tools/gpu/worker.h"

namespace exactcoll::gpu {
namespace {

constexpr const char* kCommand = "verify";

struct VerifyJob {
  std::vector<GpuOp*> ops;  // in the order they run
  VerifySettings settings;
  bool dtypes_given = false;
  int64_t timeout_ms = 10000, buffer_mib = 0;
  bool pdl = true;
};

int verify_worker(const VerifyJob& job) {
  Worker w("verify");
  const int n = w.world_size(), rank = w.rank();
  std::vector<std::shared_ptr<const void>> keep_alive;  // destroyed after the communicators below
  // 1. The communicators.
  ApiCommOptions co;
  co.name = "verify";
  co.buffer_bytes = buffer_bytes_for(job.buffer_mib);
  co.flag_timeout_ms = static_cast<uint64_t>(job.timeout_ms);
  co.programmatic_launch = job.pdl;
  co.contract = job.settings.contract;
  ApiComm comm(w.store(), rank, n, co);
  const exactcoll_comm_properties& p = comm.properties();
  if (const std::string problem = check_comm_contract(comm, job.settings.contract); !problem.empty()) {
    return cli::fail(kCommand, problem, cli::kExitFailure);
  }
  std::unique_ptr<ApiComm> small;
  bool wants_small = false;
  for (const GpuOp* op : job.ops) wants_small = wants_small || op->wants_small_communicator();
  if (wants_small) {
    ApiCommOptions small_options = co;
    small_options.name = "verify_small";
    small_options.buffer_bytes = size_t{1} << 20;
    small_options.use_nccl = false;
    small = std::make_unique<ApiComm>(w.store(), rank, n, small_options);
  }
  {
    std::ostringstream os;
    os << "# exactcoll verify: " << n << " ranks on " << w.device_name() << " (" << p.arch << "), contract "
       << contract_name(static_cast<Contract>(p.contract)) << ", seed " << job.settings.seed << ", iterations "
       << job.settings.iters << ", programmatic launch " << (job.pdl ? "on" : "off") << ", buffers "
       << (co.buffer_bytes >> 20) << " MiB per rank\n";
    os << "# IPC path: " << (p.ipc_ready ? "ready" : "UNAVAILABLE: " + std::string(p.ipc_unavailable_reason))
       << "; NCCL: ";
    if (p.nccl_ready) {
      os << cuda::NcclApi::get().version();
    } else {
      os << "not loaded";
    }
    os << "\n# ops:";
    for (const GpuOp* op : job.ops) os << " " << op->name();
    os << "\n";
    for (const GpuOp* op : job.ops) {
      if (const std::string header = op->verify_header(); !header.empty()) os << "# " << header << "\n";
    }
    print_leader(w, os.str());
  }
  if (!p.ipc_ready) {
    return cli::fail(kCommand, "the IPC path is unavailable: " + std::string(p.ipc_unavailable_reason),
                     cli::kExitFailure);
  }

  // 2. Every op's cases.
  Stream stream;
  VerifyLedger ledger(rank, job.settings.show);
  VerifyContext ctx{w, Comms{&comm, small.get()}, stream.get(), job.settings, ledger, keep_alive};
  const auto started = std::chrono::steady_clock::now();
  for (GpuOp* op : job.ops) {
    op->verify(ctx, job.dtypes_given ? job.settings.dtypes : op->default_verify_dtypes());
  }

  // 3. Sum over ranks; rank 0 prints.
  const Tallies total = sum_tallies(w.all_gather("tallies", serialize_tallies(ledger.tallies())));
  Tally grand;
  std::ostringstream os;
  os << format_tally_table(total, "diff_vs_ref", &grand);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  const std::string contract = contract_name(job.settings.contract);
  os << verify_summary_line("verify " + std::to_string(n) + " ranks, contract " + contract, grand,
                            "every output, all ranks", contract + " contract", seconds);
  print_leader(w, os.str());
  return grand.clean() ? cli::kExitOk : cli::kExitDiffer;
}

int run_verify(int argc, char** argv) {
  std::vector<std::unique_ptr<GpuOp>> all = gpu_ops();
  int64_t nproc = 0, seed = -1;
  std::string ops_text, dtypes_text;
  VerifyJob job;
  std::string contract_text = "canonical";
  cli::ArgParser parser("exactcoll verify --nproc N [--ops …] [--dtypes …] [--iters K] [--seed S] [--contract " +
                            library_contract_names(kOnGpu, "|") + "] [op flags]",
                        "Runs every op and algorithm of the CUDA IPC path (one process per GPU) on random and\n"
                        "adversarial inputs (NaN payloads, ±0, ±inf, subnormals, overflowing sums, 1 element, odd\n"
                        "counts), in staged, registered, CUDA-graph, forced-grid and (fused_rmsnorm) row-chunked\n"
                        "variants, and compares every output bit with the simulator and with the contract's scalar\n"
                        "reference, both under --contract. One job verifies every op in --ops. Exit 0 when nothing\n"
                        "differs, 1 when something does, 3 on a runtime failure (e.g. a peer that never arrived at a\n"
                        "barrier).");
  parser.add_int("nproc", &nproc, "processes, one per GPU");
  parser.mark_required("nproc");
  parser.add_string("ops", &ops_text, "comma list of " + gpu_op_names() + " (" + op_aliases_note() + ")");
  parser.set_default_note("ops", "default: all of them");
  parser.add_string("dtypes", &dtypes_text, "comma list of bf16, fp16, fp32");
  parser.set_default_note("dtypes", "default: bf16,fp16,fp32 for the collectives, bf16,fp16 for fused_rmsnorm");
  parser.add_int("iters", &job.settings.iters, "repetitions with fresh inputs");
  parser.add_int("seed", &seed, "seed of the inputs");
  parser.set_default_note("seed", "default: from the job's store token, printed");
  parser.add_int("timeout-ms", &job.timeout_ms, "bound on every in-kernel flag wait");
  parser.add_int("buffer-mib", &job.buffer_mib,
                 "staging and scratch MiB per rank (larger messages run in chunks: the same bits)");
  parser.set_default_note("buffer-mib", "default: the library's, 128");
  parser.add_int("show", &job.settings.show, "mismatch details printed per rank");
  cli::add_contract_flag(parser, &contract_text, kOnGpu,
                         "the rounding contract of the communicators, the simulator and the scalar reference (every "
                         "op, algorithm and variant runs under it)");
  bool no_pdl = false;
  parser.add_bool("no-pdl", &no_pdl, "launch without programmatic dependent launch");
  for (auto& op : all) op->add_verify_flags(parser);
  if (const auto code = parser.parse(argc, argv)) return *code;

  // Which ops; an op's own flag with that op left out is refused (it would be ignored).
  if (!parser.given("ops")) {
    for (auto& op : all) job.ops.push_back(op.get());
  } else {
    for (const std::string& name : split_list(ops_text)) {
      GpuOp* found = nullptr;
      for (auto& op : all) {
        if (op->name() == canonical_op_name(name)) found = op.get();
      }
      if (found == nullptr) return cli::fail(kCommand, "unknown op '" + name + "' (" + gpu_op_names() + ")");
      if (std::find(job.ops.begin(), job.ops.end(), found) == job.ops.end()) job.ops.push_back(found);
    }
  }
  if (job.ops.empty()) return cli::fail(kCommand, "--ops names no op");
  for (auto& op : all) {
    if (std::find(job.ops.begin(), job.ops.end(), op.get()) != job.ops.end()) continue;
    for (const std::string& flag : op->verify_flag_names()) {
      bool used_by_chosen = false;
      for (const GpuOp* chosen : job.ops) {
        const std::vector<std::string> names = chosen->verify_flag_names();
        used_by_chosen = used_by_chosen || std::find(names.begin(), names.end(), flag) != names.end();
      }
      if (parser.given(flag) && !used_by_chosen) {
        return cli::fail(kCommand, "--" + flag + " applies to " + op->name() + ", which --ops leaves out");
      }
    }
  }
  job.dtypes_given = parser.given("dtypes");
  for (const auto& name : split_list(dtypes_text)) {
    const auto d = parse_dtype(name);
    if (!d) return cli::fail(kCommand, "unknown dtype '" + name + "' (bf16, fp16, fp32)");
    job.settings.dtypes.push_back(*d);
  }
  if (job.dtypes_given && job.settings.dtypes.empty()) return cli::fail(kCommand, "--dtypes names no dtype");
  for (GpuOp* op : job.ops) {
    if (const std::string problem =
            op->check_verify_flags(job.dtypes_given ? job.settings.dtypes : op->default_verify_dtypes());
        !problem.empty()) {
      return cli::fail(kCommand, problem);
    }
  }
  job.pdl = !no_pdl;
  job.settings.contract = cli::library_contract(contract_text);
  if (job.settings.iters < 1 || job.settings.show < 0) {
    return cli::fail(kCommand, "--iters must be positive and --show at least 0");
  }
  if (const std::string problem = cli::check_timeout_ms(job.timeout_ms); !problem.empty()) {
    return cli::fail(kCommand, problem);
  }
  if (const std::string problem = check_buffer_mib(parser, job.buffer_mib); !problem.empty()) {
    return cli::fail(kCommand, problem);
  }
  if (const auto code = relaunch_unless_worker(argc, argv, nproc, parser.given("nproc"), kCommand)) return *code;
  // Every rank needs the same seed: without --seed, a hash of the job's store token (the same in
  // every worker of one job, fresh per job).
  job.settings.seed = seed < 0 ? seed_from_store_token() : static_cast<uint64_t>(seed);
  try {
    return verify_worker(job);
  } catch (const std::exception& e) {
    return cli::fail(kCommand, e.what(), cli::kExitFailure);
  }
}

const cli::Registrar kRegistrar({"verify", "GPU results vs the simulator, every bit, all ops and algorithms",
                                 run_verify});

}  // namespace
}  // namespace exactcoll::gpu

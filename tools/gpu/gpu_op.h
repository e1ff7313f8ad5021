// One op as the GPU commands `exactcoll gpu`, `exactcoll verify` and `exactcoll bench` run it, and
// what their drivers share. Each op is defined once, in one file (tools/gpu/collective_op.cc for all-reduce,
// reduce-scatter and all-gather; tools/gpu/fused_op.cc for the fused all-reduce + residual +
// RMSNorm): its flags and their checks, its inputs (from .npy files or a seed), one call on the
// device, its outputs and its summary line for `gpu`; its cases (inputs, the simulator's and the
// contract's outputs, the algorithms and variants to try) for `verify`. The drivers,
// tools/gpu/gpu_command.cc and tools/gpu/verify_command.cc, are written once over this interface:
// a new op is a new GpuOp and a line in gpu_ops(). `exactcoll bench` (tools/gpu/bench_command.cc)
// is written once over it too: each op gives its sizes, algorithms, one call and its check.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/registry.h"
#include "core/storage.h"
#include "cuda_backend/communicator.h"
#include "tools/gpu/api_comm.h"
#include "tools/cli.h"
#include "tools/gpu/tally.h"

namespace exactcoll::gpu {

class Worker;
using Bytes = std::vector<uint8_t>;

// How one call is made.
struct Variant {
  std::string name = "staged";
  bool registered = false;                 // the input comes from a buffer registered once (no staging copy)
  bool graph = false;                      // the call is captured into a CUDA graph and replayed
  bool small = false;                      // through the second communicator, whose 1 MiB buffers make larger problems
                                           // run as several launches (Comms::small)
  std::optional<cuda::LaunchConfig> grid;  // a forced grid; nullopt: the table's choice
};

// Returns the variants verify runs for one algorithm: staged, registered, graph (registered,
// replayed twice); with `forced_grids` also grid3x64 (staged) and grid<max_blocks>x1024
// (registered); with `chunked` also chunked (staged, through the small communicator).
std::vector<Variant> verify_variants(bool forced_grids, int max_blocks, bool chunked);

// One output array of a call on the device; poisoned before each checked call.
struct DeviceOutput {
  std::string name;  // "out", "residual_out"
  void* device = nullptr;
  size_t count = 0;          // elements
  size_t element_bytes = 2;  // dtype_size of the op's dtype
  uint8_t poison = 0xA5;
  size_t bytes() const { return count * element_bytes; }
};

// The communicators of a worker: the main one, and one with 1 MiB buffers where an op asks for it
// (GpuOp::wants_small_communicator; nullptr otherwise).
struct Comms {
  ApiComm* main = nullptr;
  ApiComm* small = nullptr;
  ApiComm& for_variant(const Variant& v) const { return v.small && small ? *small : *main; }
};

// Enqueues one call of a problem, in variant v, on the stream.
using Enqueue = std::function<CallReport(const Variant& v, cudaStream_t stream)>;

// Runs one call: (1) captures it into a graph once when v.graph; then `replays` times: (2) poisons
// every output (a different byte each replay, so a stale result shows), (3) launches (the graph,
// or an eager call), (4) waits for the stream and checks the communicator (a peer that never
// arrived throws ApiCallError naming it), (5) copies the outputs back and hands them to
// `got(replay, outputs)` in the order of `outputs`. Returns the report of the (first) call.
CallReport run_checked(const Enqueue& enqueue, const Variant& v, const std::vector<DeviceOutput>& outputs, int replays,
                       ApiComm& comm, cudaStream_t stream,
                       const std::function<void(int replay, const std::vector<Bytes>& got)>& got);

// `gpu`'s flags that every op has.
struct GpuSettings {
  DType dtype = DType::kBF16;
  std::string algo = "auto";
  uint64_t seed = 1;
  int64_t blocks = 0, threads = 0;  // 0: the table's choice
  bool registered = false, graph = false;
  int64_t timeout_ms = 10000;
  int64_t buffer_mib = 0;                    // 0: the library's default (cuda::CommunicatorOptions)
  std::string output;                        // the first output's .npy ("": none)
  Contract contract = Contract::kCanonical;  // --contract: the communicator's (ApiCommOptions::contract)
};

// This rank's problem of `gpu <op>` on the device.
class GpuProblem {
 public:
  virtual ~GpuProblem() = default;
  // One call in variant v (from gpu's --registered, --graph, --blocks, --threads).
  virtual CallReport enqueue(const Variant& v, cudaStream_t stream) = 0;
  virtual std::vector<DeviceOutput> outputs() const = 0;
  // The .npy path of each output ("" for none), in the order of outputs().
  virtual std::vector<std::string> output_paths() const = 0;
  // The shape of each output's .npy, every rank's rows stacked: [n, …].
  virtual std::vector<int64_t> output_shape(int ranks) const = 0;
  // The summary line rank 0 prints, from what ran and each output's sha256 (in order).
  virtual std::string summary(int ranks, const CallReport& ran, const GpuSettings& s,
                              const std::vector<std::string>& sha256s) const = 0;
};

// verify's flags that every op has.
struct VerifySettings {
  std::vector<DType> dtypes;  // empty: the op's default_verify_dtypes()
  int64_t iters = 1;
  uint64_t seed = 0;
  int64_t show = 8;  // mismatch details printed per rank
  // --contract: the communicators', the simulator's and the scalar reference's (every bit of every
  // output is compared under it).
  Contract contract = Contract::kCanonical;
};

// verify's per-rank counts and its first mismatch lines (stderr), shared by every op.
class VerifyLedger {
 public:
  VerifyLedger(int rank, int64_t show) : rank_(rank), show_(show) {}

  // Compares every bit of each output (`got[i]`, outputs[i].count elements) with `sim[i]` (the
  // simulator's) and `ref[i]` (the contract's scalar reference), and counts them under the tally
  // key "op dtype algorithm variant". For the first `show` calls that differ, prints
  // "MISMATCH rank R: <what>: …" naming the output and where(index) of the first difference.
  void record(const std::string& key, const std::string& what, DType dtype, const std::vector<DeviceOutput>& outputs,
              const std::vector<Bytes>& got, const std::vector<const Bytes*>& sim, const std::vector<const Bytes*>& ref,
              const std::function<std::string(size_t index)>& where);

  const Tallies& tallies() const { return tallies_; }

 private:
  int rank_;
  int64_t show_, shown_ = 0;
  Tallies tallies_;
};

// What an op's verify() runs with.
struct VerifyContext {
  Worker& worker;
  Comms comms;
  cudaStream_t stream;
  const VerifySettings& settings;
  VerifyLedger& ledger;
  // Buffers an op registers with a communicator go here, so that they outlive it: a communicator
  // keeps its peers' mappings of a registered buffer until it is destroyed (there is no
  // unregister), and a freed buffer whose address comes back in the next op's allocation would be
  // mapped a second time (cudaErrorAlreadyMapped, seen with two ranks sharing a GPU).
  std::vector<std::shared_ptr<const void>>& keep_alive;
};

// ---- `exactcoll bench` ----

// One message size of bench: rows × hidden elements (the collectives' message is their product,
// the fused op's a [rows, hidden] matrix).
struct BenchSize {
  int64_t rows = 1, hidden = 1;
};

// bench's flags that every op has.
struct BenchSettings {
  DType dtype = DType::kBF16;
  uint64_t seed = 1;
  bool check = true;  // false: --no-check
  // --contract: the communicator's and the check's (the simulator's or the scalar reference's
  // outputs under it); NCCL's sums follow no contract.
  Contract contract = Contract::kCanonical;
};

// What one checked call of bench found in this rank's outputs.
struct BenchCheck {
  bool compared = false;         // the output bits were compared with the contract's: `differ` holds
  bool promise_checked = false;  // what the implementation promises was checked: `wrong` holds
  uint64_t wrong = 0;            // elements outside what the implementation promises
  uint64_t differ = 0;           // elements whose bits differ from the contract's
};

// One (size, algorithm) of bench, agreed over ranks.
struct BenchResult {
  BenchSize size;
  uint64_t count = 0, bytes = 0;      // nccl-tests' count (elements) and size (bytes) of the message
  std::string algo;                   // requested
  std::string chosen;                 // what ran, e.g. "one_shot 32x512"
  double graph_us = 0, eager_us = 0;  // the maximum over ranks of each rank's median
  BenchCheck check;                   // summed over ranks (a flag: every rank's)
  bool exact = true;                  // false: NCCL's sums (they follow no contract)
};

// This rank's side of an op in bench: device buffers for the largest size (the input registered
// once, as CUDA-graph users do), and per size the inputs and what the outputs must be.
class BenchProblem {
 public:
  virtual ~BenchProblem() = default;
  // Makes the size's inputs (seeded, so every rank agrees), puts this rank's on the device and,
  // when checking, computes what the outputs must be.
  virtual void prepare(const BenchSize& size) = 0;
  // nccl-tests' count (elements) and size (bytes) of a size's message (all-gather: the gathered
  // output, as nccl-tests).
  virtual uint64_t count_of(const BenchSize& size) const = 0;
  virtual uint64_t bytes_of(const BenchSize& size) const = 0;
  // Returns the call of `algo` (one of GpuOp::bench_algorithms()) on the prepared size: it enqueues
  // one call on its stream. The name is resolved here, once, not in every timed call.
  virtual std::function<CallReport(cudaStream_t)> call_of(const std::string& algo) = 0;
  // The outputs of the prepared size (poisoned before the checked call).
  virtual std::vector<DeviceOutput> outputs() const = 0;
  // Returns this rank's outputs of one call (`got`, in the order of outputs()) against what `algo`
  // promises, given what ran (NCCL's sums promise a bound, not bits).
  virtual BenchCheck check(const std::string& algo, const CallReport& ran, const std::vector<Bytes>& got) = 0;
  // One line for bench's header: what else decides the numbers (auto's table, eps).
  virtual std::string header() const = 0;
  // Whether bench measures auto last, after tune() (the fused op's --write-table).
  virtual bool tunes_auto() const { return false; }
  // Makes auto's table from `measured` (every algorithm but auto at every size, the same on every
  // rank), writes it (rank 0) and uses it for the auto calls that follow.
  virtual void tune(const std::vector<BenchResult>& /*measured*/, Worker& /*worker*/) {}
};

class GpuOp {
 public:
  virtual ~GpuOp() = default;
  virtual std::string name() const = 0;

  // ---- `exactcoll gpu <op>` ----
  // The op's part of the usage line and the command's description.
  virtual std::string gpu_usage() const = 0;
  virtual std::string gpu_description() const = 0;
  // --algo's choices (the first is not the default: "auto" is) and its help.
  virtual std::vector<std::string> gpu_algorithms() const = 0;
  virtual std::string gpu_algorithm_help() const = 0;
  // The op's own flags (inputs, shape, …), stored in the op object.
  virtual void add_gpu_flags(cli::ArgParser& parser) = 0;
  // Returns "" or what is wrong with the flags (given is the parser's). In the parent (before any
  // worker starts; `ranks` is --nproc) it also reads the input files, so bad input exits 2 there.
  virtual std::string check_gpu_flags(const cli::ArgParser& parser, const GpuSettings& s, int64_t ranks,
                                      bool in_parent) = 0;
  // The largest block count of the op's kernels (--blocks' bound, verify's large forced grid).
  virtual int max_blocks() const = 0;
  // Whether the communicator must load NCCL (for --algo nccl or nccl_split).
  virtual bool needs_nccl(const GpuSettings& s) const = 0;
  // Returns this rank's problem, its inputs on the device. Throws npy::NpyError, std::exception.
  virtual std::unique_ptr<GpuProblem> load(const GpuSettings& s, ApiComm& comm, int ranks, int rank) = 0;

  // ---- `exactcoll verify` ----
  virtual std::vector<DType> default_verify_dtypes() const = 0;
  // The op's own verify flags, and their names (a flag of an op that --ops leaves out is refused).
  virtual void add_verify_flags(cli::ArgParser& parser) = 0;
  virtual std::vector<std::string> verify_flag_names() const = 0;
  // Returns "" or what is wrong with them, for these dtypes.
  virtual std::string check_verify_flags(const std::vector<DType>& dtypes) = 0;
  // Whether verify should make the 1 MiB communicator (Comms::small) for this op's chunked variant.
  virtual bool wants_small_communicator() const { return false; }
  // Returns the op's header line for verify ("" for none), e.g. the sizes it covers.
  virtual std::string verify_header() const = 0;
  // Runs every case of the op (every iteration and dtype), recording into ctx.ledger.
  virtual void verify(VerifyContext& ctx, const std::vector<DType>& dtypes) = 0;

  // ---- `exactcoll bench` ----
  // --algos' default: every name bench accepts for the op, in table order.
  virtual std::vector<std::string> bench_algorithms() const = 0;
  // What auto is compared with in the summary, in order (the collectives: nccl).
  virtual std::vector<std::string> bench_baselines() const = 0;
  // --hidden's default; by_bytes: the sizes come from -b/-e/-f (rows = bytes / (hidden x element)).
  virtual std::vector<int64_t> bench_default_hidden(bool by_bytes) const = 0;
  // nccl-tests' redop column ("sum", "none") and busbw = algbw x bus_factor(ranks).
  virtual std::string bench_redop() const = 0;
  virtual double bus_factor(int ranks) const = 0;
  // The op's own bench flags, stored in the op object, and their check (sizes and dtype known).
  virtual void add_bench_flags(cli::ArgParser& /*parser*/) {}
  virtual std::string check_bench_flags(const BenchSettings& s, const std::vector<BenchSize>& sizes) = 0;
  // Sets what the op needs of the communicator: its least buffer bytes for these sizes (bench takes
  // the larger of it and the library's default or --buffer-mib), NCCL for these algorithms. Runs in
  // the worker before the communicator is made.
  virtual void bench_communicator(const BenchSettings& s, const std::vector<BenchSize>& sizes, int ranks,
                                  const std::vector<std::string>& algos, ApiCommOptions* options,
                                  size_t* least_buffer_bytes) const = 0;
  // Returns this rank's bench problem, its buffers sized for every size in `sizes`.
  virtual std::unique_ptr<BenchProblem> bench_load(const BenchSettings& s, ApiComm& comm,
                                                   const std::vector<BenchSize>& sizes, int ranks, int rank) = 0;
};

// Every op of the GPU commands, in the order verify runs them: allreduce, reduce_scatter,
// allgather, fused_rmsnorm. Returns fresh objects (they hold parsed flags). Defined beside the
// drivers (gpu_ops.cc), from each op's own factory:
std::vector<std::unique_ptr<GpuOp>> gpu_ops();
std::vector<std::unique_ptr<GpuOp>> make_collective_ops();  // collective_op.cc
std::unique_ptr<GpuOp> make_fused_rmsnorm_op();             // fused/fused_op.cc
// Their names, as "allreduce, reduce_scatter, allgather, fused_rmsnorm".
std::string gpu_op_names();

// Returns "" or what is wrong with the GPU commands' --blocks (1..max_blocks, 0 = the table's)
// and --threads (a multiple of 32 in 64..1024, 0 = the table's).
std::string check_grid_flags(int64_t blocks, int64_t threads, int max_blocks);

// Returns "" or why `comm` does not fold under `want` (its exactcoll_comm_properties.contract
// says another): the check that --contract reached the communicator before anything is compared.
std::string check_comm_contract(const ApiComm& comm, Contract want);

// Returns the communicator's buffer bytes: --buffer-mib when given (> 0), else the library's default
// (cuda::CommunicatorOptions, 128 MiB): one default for every GPU command.
size_t buffer_bytes_for(int64_t buffer_mib);
// Returns "" or what is wrong with --buffer-mib (1..65536 when given).
std::string check_buffer_mib(const cli::ArgParser& parser, int64_t buffer_mib);

}  // namespace exactcoll::gpu

// All-reduce, reduce-scatter and all-gather as the GPU commands run them (tools/gpu/gpu_op.h).
//
// `gpu <op>`: the conventions of `exactcoll sim`: input [N, …] rank first (bf16/fp16 as '<u2' bit
// patterns, fp32 as '<f4'); output all-reduce [N, …], reduce_scatter [N, count/N], allgather
// [N, N·count]; or a random input of --count elements per rank from --seed.
//
// `verify`, per (iteration, dtype, element count, input pattern), under --contract (canonical or
// tree: the communicators', the simulator's and the scalar transcription's alike):
//   1. every rank makes every rank's input (tools/inputs/inputs.h; seeded, so all ranks agree), and
//      the contract's scalar transcription computes this rank's output;
//   2. for each algorithm (the op's IPC algorithms and auto) the simulator computes the outputs of
//      the algorithm the GPU runs (copy_engine all-gather is a copy: simulated as the SM allgather);
//   3. each variant runs on the GPUs (gpu_op.h verify_variants: staged, registered, graph, and for a
//      named algorithm the forced grids 3x64 and kMaxBlocks x 1024), outputs poisoned first;
//   4. every output bit of this rank is compared with the simulator's and the contract's.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include "cuda_backend/cuda_check.h"
#include "cuda_backend/dispatch_table.h"
#include "sim/reference.h"
#include "tools/gpu/device_util.h"
#include "tools/gpu/gpu_op.h"
#include "tools/inputs/inputs.h"
#include "tools/inputs/rank_inputs.h"
#include "tools/gpu/worker.h"
#include "npy/npy.h"

namespace exactcoll::gpu {
namespace {

using cuda::Algorithm;
using cuda::Op;
using sim::check_sum_within_bound;
using sim::compare_bits;
using sim::contract_output;
using sim::Simulator;

// Per-rank element counts verify tries (reduce_scatter multiplies them by n so that slices are
// odd-sized too).
const std::vector<size_t>& verify_counts() {
  static const std::vector<size_t> counts = {1, 2, 3, 5, 7, 8, 9, 16, 17, 31, 33, 63, 64, 65, 127, 129, 255, 1000, 1023,
                                             4097, 12345, 65543, 262157, 1048579,
                                             // 8 MiB of bf16: only with --max-count 4194319 or more (the device
                                             // scripts' default stops at 1048579)
                                             4194319};
  return counts;
}

// This rank's collective on the device: input (registered when asked) and output.
class CollectiveProblem : public GpuProblem {
 public:
  CollectiveProblem(Op op, const GpuSettings& s, ApiComm& comm, const Bytes& mine, size_t count,
                    std::vector<int64_t> row_shape, int ranks)
      : op_(op),
        dtype_(s.dtype),
        contract_(s.contract),
        algo_(*cuda::parse_algorithm(s.algo)),
        comm_(comm),
        count_(count),
        out_count_(output_count(op, count, ranks)),
        row_shape_(std::move(row_shape)),
        output_path_(s.output),
        input_(count * static_cast<size_t>(dtype_size(s.dtype))),
        output_(out_count_ * static_cast<size_t>(dtype_size(s.dtype))) {
    EXC_CUDA_CHECK(cudaMemcpy(input_.get(), mine.data(), mine.size(), cudaMemcpyHostToDevice));
    if (s.registered) registered_ = comm.register_buffer(input_.get(), input_.bytes());
    if (s.blocks > 0 || s.threads > 0) {
      const cuda::Choice c = comm.backend().choose(op, count, s.dtype, algo_);
      grid_ = cuda::LaunchConfig{s.blocks > 0 ? static_cast<int>(s.blocks) : c.grid.blocks,
                                 s.threads > 0 ? static_cast<int>(s.threads) : c.grid.threads};
    }
  }

  CallReport enqueue(const Variant& v, cudaStream_t stream) override {
    return comm_.collective(op_, input_.get(), output_.get(), count_, dtype_, algo_, stream,
                            v.registered ? registered_ : -1, v.grid ? v.grid : grid_);
  }

  std::vector<DeviceOutput> outputs() const override {
    return {{"out", output_.get(), out_count_, static_cast<size_t>(dtype_size(dtype_)), 0xA5}};
  }
  std::vector<std::string> output_paths() const override { return {output_path_}; }
  std::vector<int64_t> output_shape(int ranks) const override {
    std::vector<int64_t> shape = {ranks};
    if (op_ == Op::kAllReduce) {
      shape.insert(shape.end(), row_shape_.begin(), row_shape_.end());
    } else {
      shape.push_back(static_cast<int64_t>(out_count_));
    }
    return shape;
  }
  std::string summary(int ranks, const CallReport& ran, const GpuSettings& s,
                      const std::vector<std::string>& sha256s) const override {
    std::ostringstream os;
    os << "gpu " << op_name(op_) << ": " << ranks << " ranks, " << dtype_name(dtype_) << ", " << count_
       << " elements per rank, contract " << contract_name(contract_) << ", algo " << ran.algo;
    if (ran.grid.blocks > 0) os << " (" << ran.grid.blocks << "x" << ran.grid.threads << ")";
    if (algo_ != Algorithm::kNccl && ran.algo != "nccl") os << (ran.staged ? ", staged" : ", registered");
    os << (s.graph ? ", CUDA graph" : "");
    if (!ran.exact) os << ", NOT bit-exact (" << ran.inexact_note << ")";
    if (!output_path_.empty()) os << ", output " << output_path_ << " " << npy::shape_text(output_shape(ranks));
    os << ", sha256 " << sha256s[0] << "\n";
    return os.str();
  }

 private:
  Op op_;
  DType dtype_;
  Contract contract_;
  Algorithm algo_;
  ApiComm& comm_;
  size_t count_, out_count_;
  std::vector<int64_t> row_shape_;
  std::string output_path_;
  DeviceBuffer input_, output_;
  int registered_ = -1;  // the C API's id of input_, when --registered
  std::optional<cuda::LaunchConfig> grid_;
};

// The collectives' per-rank input elements for a bench size of rows × hidden elements:
// all-reduce the message; reduce-scatter the largest multiple of the ranks in it; all-gather each
// rank's share of the gathered message (at least one element).
size_t bench_input_count(Op op, const BenchSize& size, int ranks) {
  const uint64_t total = static_cast<uint64_t>(size.rows) * static_cast<uint64_t>(size.hidden);
  uint64_t in = total;
  if (op == Op::kReduceScatter) in = total - total % static_cast<uint64_t>(ranks);
  if (op == Op::kAllGather) in = total / static_cast<uint64_t>(ranks);
  return static_cast<size_t>(std::max<uint64_t>(in, 1));
}

// This rank's collective in `bench`: the input registered once, sized for the largest message;
// per size seeded random inputs of every rank and the simulator's outputs under --contract.
class CollectiveBenchProblem : public BenchProblem {
 public:
  CollectiveBenchProblem(Op op, const BenchSettings& s, ApiComm& comm, int ranks, int rank, size_t max_in,
                         size_t max_out)
      : op_(op),
        s_(s),
        comm_(comm),
        ranks_(ranks),
        rank_(rank),
        input_(max_in),
        output_(max_out),
        registered_(comm.register_buffer(input_.get(), max_in)),
        simulator_(ranks, s.contract) {}

  uint64_t count_of(const BenchSize& size) const override {
    const size_t in = bench_input_count(op_, size, ranks_);
    return op_ == Op::kAllGather ? output_count(op_, in, ranks_) : in;
  }
  uint64_t bytes_of(const BenchSize& size) const override {
    return count_of(size) * static_cast<uint64_t>(dtype_size(s_.dtype));
  }

  void prepare(const BenchSize& size) override {
    count_ = bench_input_count(op_, size, ranks_);
    out_count_ = output_count(op_, count_, ranks_);
    inputs_ = make_inputs(s_.dtype, count_, ranks_, s_.seed + static_cast<uint64_t>(size.rows), Pattern::kRandom);
    if (s_.check) {
      const Algorithm sim_algo = op_ == Op::kAllReduce ? Algorithm::kOneShot : Algorithm::kDirect;
      want_ = simulator_.run(op_, sim_algo, s_.dtype, inputs_, count_, 8)[static_cast<size_t>(rank_)];
    }
    EXC_CUDA_CHECK(cudaMemcpy(input_.get(), inputs_[static_cast<size_t>(rank_)].data(),
                              count_ * static_cast<size_t>(dtype_size(s_.dtype)), cudaMemcpyHostToDevice));
  }

  std::function<CallReport(cudaStream_t)> call_of(const std::string& algo) override {
    const Algorithm a = *cuda::parse_algorithm(algo);
    return [this, a](cudaStream_t stream) {
      return comm_.collective(op_, input_.get(), output_.get(), count_, s_.dtype, a, stream, registered_);
    };
  }

  std::vector<DeviceOutput> outputs() const override {
    return {{"out", output_.get(), out_count_, static_cast<size_t>(dtype_size(s_.dtype)), 0xA5}};
  }

  std::string header() const override {
    const char* table = std::getenv("EXACTCOLL_TABLE");
    return std::string("auto's table: ") + (table != nullptr && *table != '\0'
                                                ? std::string(table) + " (--table or $EXACTCOLL_TABLE)"
                                                : "the built-in one");
  }

  BenchCheck check(const std::string&, const CallReport& ran, const std::vector<Bytes>& got) override {
    BenchCheck c;
    if (!s_.check) return c;
    c.compared = c.promise_checked = true;
    c.differ = compare_bits(s_.dtype, got[0].data(), want_.data(), out_count_).mismatches;
    // What each implementation promises: exactcoll the contract's bits; an inexact sum (NCCL's)
    // only the sum bound; an all-gather, whoever runs it, the bits it was given.
    c.wrong = ran.exact || op_ == Op::kAllGather
                  ? c.differ
                  : check_sum_within_bound(op_, s_.dtype, inputs_, count_, rank_, got[0].data()).outside;
    return c;
  }

 private:
  Op op_;
  BenchSettings s_;
  ApiComm& comm_;
  int ranks_, rank_;
  DeviceBuffer input_, output_;
  int registered_;  // the C API's id of input_
  Simulator simulator_;
  size_t count_ = 0, out_count_ = 0;
  std::vector<Bytes> inputs_;
  Bytes want_;
};

class CollectiveOp : public GpuOp {
 public:
  explicit CollectiveOp(Op op) : op_(op) {}

  std::string name() const override { return op_name(op_); }

  // ---- gpu ----
  std::string gpu_usage() const override { return "[--input in.npy | --count C [--seed S]] [--output out.npy]"; }
  std::string gpu_description() const override {
    return "Runs one collective on N GPUs (one process each) with the conventions of `exactcoll sim`:\n"
           "in.npy is [N, …] (rank first; bf16/fp16 as uint16 bit patterns '<u2', fp32 as '<f4'); the\n"
           "output is all-reduce [N, …], reduce_scatter [N, count/N], allgather [N, N·count]. The summary\n"
           "line ends with the sha256 of the output bytes. --algo nccl gives NCCL's result (not bit-exact).";
  }
  std::vector<std::string> gpu_algorithms() const override { return algorithm_name_list(kOnGpu, op_); }
  std::string gpu_algorithm_help() const override {
    if (op_ != Op::kAllReduce) {
      return "algorithm; auto = the tuned table's choice for the size and GPU count (cuda_backend/tuning/, "
             "EXACTCOLL_TABLE); every IPC algorithm gives the same bits";
    }
    return "algorithm; auto = the tuned table's fastest for the size and GPU count (cuda_backend/tuning/, "
           "EXACTCOLL_TABLE), or without a row one_shot below 512 KiB (1 MiB on 2 GPUs) and two_shot above; "
           "every IPC algorithm gives the same bits";
  }
  void add_gpu_flags(cli::ArgParser& parser) override {
    parser.add_string("input", &input_path_, "input .npy [N, …]");
    parser.add_int("count", &count_, "elements per rank of random input (without --input)");
    parser.set_default_note("count", "required without --input");
  }
  std::string check_gpu_flags(const cli::ArgParser& parser, const GpuSettings&, int64_t, bool) override {
    if (input_path_.empty() == !parser.given("count")) return "give either --input FILE or --count C (with --seed S)";
    if (input_path_.empty() && count_ < 1) return "--count must be at least 1";
    if (parser.given("seed") && !input_path_.empty()) return "--seed applies to random inputs (--count)";
    return "";
  }
  int max_blocks() const override { return kMaxBlocks; }
  // NCCL loaded as the library's default does (--algo nccl, and the fallback of an input that fits
  // no buffer); ranks sharing one GPU leave it out by themselves.
  bool needs_nccl(const GpuSettings&) const override { return true; }

  std::unique_ptr<GpuProblem> load(const GpuSettings& s, ApiComm& comm, int n, int rank) override {
    const size_t elem = static_cast<size_t>(dtype_size(s.dtype));
    Bytes mine;
    std::vector<int64_t> row_shape;
    size_t count = 0;
    if (!input_path_.empty()) {
      RankInputs file;
      if (const std::string problem = read_rank_inputs(input_path_, s.dtype, n, "--nproc", &file); !problem.empty()) {
        throw std::invalid_argument(problem);
      }
      row_shape.assign(file.shape.begin() + 1, file.shape.end());
      count = file.count;
      const auto first = file.data.begin() + static_cast<std::ptrdiff_t>(count * elem * static_cast<size_t>(rank));
      mine.assign(first, first + static_cast<std::ptrdiff_t>(count * elem));
    } else {
      count = static_cast<size_t>(count_);
      row_shape = {count_};
      mine = make_input(s.dtype, count, rank, s.seed, Pattern::kRandom);
    }
    if (count == 0) throw std::invalid_argument("the input has no elements per rank");
    if (op_ == Op::kReduceScatter && count % static_cast<size_t>(n) != 0) {
      throw std::invalid_argument("reduce_scatter needs a count divisible by the ranks: " + std::to_string(count) +
                                  " elements over " + std::to_string(n) + " ranks");
    }
    return std::make_unique<CollectiveProblem>(op_, s, comm, mine, count, row_shape, n);
  }

  // ---- verify ----
  std::vector<DType> default_verify_dtypes() const override { return {DType::kBF16, DType::kFP16, DType::kFP32}; }
  void add_verify_flags(cli::ArgParser& parser) override {
    // One flag object for the three collectives: the first one registers it (the parser refuses a
    // flag added twice), the others read the same values through shared_.
    if (shared_->registered) return;
    shared_->registered = true;
    parser.add_string("patterns", &shared_->patterns_text,
                      "collectives: comma list of input patterns (random, random_bits, specials, overflow, subnormal, "
                      "cancel)");
    parser.add_int("max-count", &shared_->max_count, "collectives: largest element count per rank tried");
  }
  std::vector<std::string> verify_flag_names() const override { return {"patterns", "max-count"}; }
  std::string check_verify_flags(const std::vector<DType>&) override {
    patterns_.clear();
    for (const auto& s : split_list(shared_->patterns_text)) {
      const auto p = parse_pattern(s);
      if (!p) return "unknown pattern '" + s + "' (random, random_bits, specials, overflow, subnormal, cancel)";
      patterns_.push_back(*p);
    }
    if (patterns_.empty()) return "--patterns names no pattern";
    if (shared_->max_count < 1) return "--max-count must be positive";
    return "";
  }
  std::string verify_header() const override { return ""; }

  void verify(VerifyContext& ctx, const std::vector<DType>& dtypes) override {
    const int n = ctx.worker.world_size(), rank = ctx.worker.rank();
    ApiComm& comm = *ctx.comms.main;
    // 1. Buffers for the largest case: the input registered once (the registered variants).
    size_t max_in = 0, max_out = 0;
    for (size_t c : verify_counts()) {
      if (static_cast<int64_t>(c) > shared_->max_count) continue;
      const size_t count = op_ == Op::kReduceScatter ? c * static_cast<size_t>(n) : c;
      max_in = std::max(max_in, count * 4);
      max_out = std::max(max_out, output_count(op_, count, n) * 4);
    }
    if (max_in == 0) return;
    const auto input_buffer = std::make_shared<DeviceBuffer>(max_in);
    ctx.keep_alive.push_back(input_buffer);  // registered: it must outlive the communicator
    const DeviceBuffer& input = *input_buffer;
    DeviceBuffer output(max_out);
    const int registered = comm.register_buffer(input.get(), max_in);
    const Contract contract = ctx.settings.contract;
    Simulator simulator(n, contract);
    for (int64_t iter = 0; iter < ctx.settings.iters; ++iter) {
      for (DType dtype : dtypes) {
        const size_t elem = static_cast<size_t>(dtype_size(dtype));
        size_t case_index = 0;
        for (size_t c : verify_counts()) {
          if (static_cast<int64_t>(c) > shared_->max_count) continue;
          const size_t count = op_ == Op::kReduceScatter ? c * static_cast<size_t>(n) : c;
          const size_t out_count = output_count(op_, count, n);
          for (Pattern pattern : patterns_) {
            // Large counts: the random patterns only (the simulator's time grows with the count).
            if (c > 4097 && pattern != Pattern::kRandom && pattern != Pattern::kRandomBits) continue;
            const uint64_t case_seed =
                mix_seed(mix_seed(mix_seed(ctx.settings.seed, static_cast<uint64_t>(iter)),
                                  static_cast<uint64_t>(op_) * 16 + static_cast<uint64_t>(dtype)),
                         case_index++);
            // 1. Inputs of every rank; this rank's goes to the GPU.
            const std::vector<Bytes> inputs = make_inputs(dtype, count, n, case_seed, pattern);
            const Bytes by_contract = contract_output(op_, dtype, inputs, count, rank, contract);
            EXC_CUDA_CHECK(cudaMemcpy(input.get(), inputs[static_cast<size_t>(rank)].data(), count * elem,
                                      cudaMemcpyHostToDevice));
            const std::vector<DeviceOutput> outs = {{"out", output.get(), out_count, elem, 0xA5}};
            std::vector<Algorithm> algos = cuda::ipc_algorithms(op_);
            algos.push_back(Algorithm::kAuto);
            std::map<Algorithm, Bytes> by_sim;  // per resolved algorithm
            for (Algorithm requested : algos) {
              const cuda::Choice choice = comm.backend().choose(op_, count, dtype, requested);
              // 2. The simulator, running the algorithm that the GPU runs.
              if (by_sim.count(choice.algo) == 0) {
                by_sim[choice.algo] = simulator.run(op_, choice.algo, dtype, inputs, count,
                                                    std::min(choice.grid.blocks, 8))[static_cast<size_t>(rank)];
              }
              const Bytes& want = by_sim[choice.algo];
              const std::string label = requested == Algorithm::kAuto ? "auto" : cuda::algorithm_name(requested);
              // 3. The variants.
              const bool forced_grids = choice.algo != Algorithm::kCopyEngine && requested != Algorithm::kAuto;
              for (const Variant& v : verify_variants(forced_grids, max_blocks(), false)) {
                const Enqueue enqueue = [&](const Variant& var, cudaStream_t stream) {
                  return comm.collective(op_, input.get(), output.get(), count, dtype, requested, stream,
                                         var.registered ? registered : -1, var.grid);
                };
                const std::string what = std::string(op_name(op_)) + " " + dtype_name(dtype) + " " + label + " (" +
                                         cuda::algorithm_name(choice.algo) + ") " + v.name + " count " +
                                         std::to_string(count) + " pattern " + pattern_name(pattern) + " contract " +
                                         contract_name(contract);
                // 4. Every bit, against the simulator and the contract.
                run_checked(
                    enqueue, v, outs, v.graph ? 2 : 1, comm, ctx.stream, [&](int, const std::vector<Bytes>& got) {
                      ctx.ledger.record(
                          std::string(op_name(op_)) + " " + dtype_name(dtype) + " " + label + " " + v.name, what, dtype,
                          outs, got, {&want}, {&by_contract}, [](size_t i) { return std::to_string(i); });
                    });
              }
            }
          }
        }
      }
    }
  }

  // ---- bench ----
  std::vector<std::string> bench_algorithms() const override { return gpu_algorithms(); }
  std::vector<std::string> bench_baselines() const override { return {"nccl"}; }
  std::vector<int64_t> bench_default_hidden(bool by_bytes) const override {
    return {by_bytes ? int64_t{1} : int64_t{8192}};
  }
  std::string bench_redop() const override { return op_ == Op::kAllGather ? "none" : "sum"; }
  double bus_factor(int ranks) const override {
    if (ranks <= 1) return 1;
    return op_ == Op::kAllReduce ? 2.0 * (ranks - 1) / ranks : static_cast<double>(ranks - 1) / ranks;
  }
  void add_bench_flags(cli::ArgParser& parser) override {
    parser.add_string("table", &table_path_, "dispatch table file for auto (cuda_backend/tuning/ format)");
    parser.set_default_note("table", "default: the built-in one, or $EXACTCOLL_TABLE");
  }
  // The table is parsed here (bad input exits 2 before any worker starts) and reaches the
  // communicator as a user's would: through $EXACTCOLL_TABLE (bench_communicator).
  std::string check_bench_flags(const BenchSettings&, const std::vector<BenchSize>&) override {
    if (table_path_.empty()) return "";
    std::ifstream file(cli::resolve_path(table_path_));
    if (!file) return "cannot open --table " + table_path_;
    std::stringstream text;
    text << file.rdbuf();
    try {
      (void)cuda::DispatchTable::parse(text.str(), table_path_);
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  }
  void bench_communicator(const BenchSettings& s, const std::vector<BenchSize>& sizes, int ranks,
                          const std::vector<std::string>&, ApiCommOptions*, size_t* least_buffer_bytes) const override {
    // NCCL as the library's default loads it (--algos nccl, and the fallback of an input that fits
    // no buffer). The buffers hold at least the largest input, so that it never needs that fallback.
    if (!table_path_.empty()) setenv("EXACTCOLL_TABLE", cli::resolve_path(table_path_).c_str(), 1);
    *least_buffer_bytes = 0;
    for (const BenchSize& size : sizes) {
      *least_buffer_bytes =
          std::max(*least_buffer_bytes, bench_input_count(op_, size, ranks) * static_cast<size_t>(dtype_size(s.dtype)));
    }
  }
  std::unique_ptr<BenchProblem> bench_load(const BenchSettings& s, ApiComm& comm, const std::vector<BenchSize>& sizes,
                                           int ranks, int rank) override {
    size_t max_in = 0, max_out = 0;
    const size_t elem = static_cast<size_t>(dtype_size(s.dtype));
    for (const BenchSize& size : sizes) {
      const size_t in = bench_input_count(op_, size, ranks);
      max_in = std::max(max_in, in * elem);
      max_out = std::max(max_out, output_count(op_, in, ranks) * elem);
    }
    return std::make_unique<CollectiveBenchProblem>(op_, s, comm, ranks, rank, max_in, max_out);
  }

 private:
  // verify's flags, one copy for the three collective ops.
  struct SharedFlags {
    bool registered = false;
    std::string patterns_text = "random,random_bits,specials,overflow,subnormal,cancel";
    int64_t max_count = 1 << 20;
  };

  Op op_;
  std::shared_ptr<SharedFlags> shared_ = std::make_shared<SharedFlags>();
  std::vector<Pattern> patterns_;
  // gpu's flags.
  std::string input_path_;
  int64_t count_ = 0;
  // bench's flags.
  std::string table_path_;

 public:
  // The three collectives read verify's flags from one object (make_collective_ops).
  void share_flags_with(const CollectiveOp& first) { shared_ = first.shared_; }
};

}  // namespace

std::vector<std::unique_ptr<GpuOp>> make_collective_ops() {
  auto all_reduce = std::make_unique<CollectiveOp>(Op::kAllReduce);
  auto reduce_scatter = std::make_unique<CollectiveOp>(Op::kReduceScatter);
  auto all_gather = std::make_unique<CollectiveOp>(Op::kAllGather);
  reduce_scatter->share_flags_with(*all_reduce);
  all_gather->share_flags_with(*all_reduce);
  std::vector<std::unique_ptr<GpuOp>> ops;
  ops.push_back(std::move(all_reduce));
  ops.push_back(std::move(reduce_scatter));
  ops.push_back(std::move(all_gather));
  return ops;
}

}  // namespace exactcoll::gpu

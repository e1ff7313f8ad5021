// The fused all-reduce + residual add + RMSNorm as the GPU commands run it (tools/gpu/gpu_op.h).
//
// `gpu fused_rmsnorm`: the flags and .npy conventions of `exactcoll sim fused_rmsnorm`: x.npy
// [N, rows, H] (rank r's partial sums at [r]), r.npy [rows, H], w.npy [H]; bf16/fp16 as '<u2' bit
// patterns, fp32 as '<f4'; outputs [N, rows, H] (every rank's result); or random inputs (--rows,
// --hidden, --seed, --specials). The summary ends with the sha256 of each output.
//
// `verify`, per (iteration, dtype, H, rows) with rows * H <= --max-elements, under --contract
// (canonical or tree: the all-reduce's, in the communicators, the simulator and the reference alike):
//   1. every rank makes every rank's inputs (tools/inputs/fused_inputs.h: NaN payloads,
//      infinities, overflowing sums, subnormals and -0; seeded, so all ranks agree);
//   2. the scalar reference computes the contract's outputs; the simulator runs the kernel each
//      GPU algorithm launches, register kernels included (above --sim-all-max-elements one_stage
//      only: every algorithm's bits are the contract's, and the simulator's own tests hold its
//      algorithms equal);
//   3. each algorithm runs in verify_variants' variants: staged, registered, graph, and for a named
//      algorithm forced grids (3x64, 64x1024) and chunked (through the 1 MiB communicator, so that
//      larger problems run as several launches over row chunks); both outputs are poisoned first.
//      push_one_stage never stages (staged and registered differ only in what the caller passes);
//      its calls and the unfused path's push all-reduces share the communicator's call counter and
//      receive halves, back to back with other row counts and grids;
//   4. every bit of both outputs of this rank is compared with the simulator's and the reference's.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <ctime>
#include <map>
#include <sstream>

#include "cuda_backend/cuda_check.h"
#include "cuda_backend/fused/fused_rmsnorm.h"
#include "cuda_backend/tsv.h"
#include "sim/fused/reference.h"
#include "sim/reference.h"
#include "sim/world.h"
#include "tools/gpu/device_util.h"
#include "tools/inputs/fused_inputs.h"
#include "tools/gpu/fused_reference.h"
#include "tools/gpu/gpu_op.h"
#include "tools/inputs/inputs.h"
#include "tools/gpu/worker.h"
#include "npy/npy.h"

namespace exactcoll::gpu {
namespace {

using cuda::fused::FusedAlgorithm;
using sim::compare_bits;

// The fused kernels' largest block count (the forced-grid variant's and --blocks' bound).
constexpr int kMaxFusedBlocks = 64;

// The simulator's run of the kernel a GPU algorithm launches (the GPU's push_one_stage is the
// register kernel the simulator names push_one_stage_reg).
std::optional<FusedAlgorithm> sim_algo(FusedAlgorithm a) {
  switch (a) {
    case FusedAlgorithm::kOneStage: return FusedAlgorithm::kOneStage;
    case FusedAlgorithm::kOneStageReg: return FusedAlgorithm::kOneStageReg;
    case FusedAlgorithm::kGatherNorm: return FusedAlgorithm::kGatherNorm;
    case FusedAlgorithm::kPushOneStage: return FusedAlgorithm::kPushOneStageReg;
    case FusedAlgorithm::kLamportOneStage: return FusedAlgorithm::kLamportOneStage;
    case FusedAlgorithm::kLamportTwoStage: return FusedAlgorithm::kLamportTwoStage;
    case FusedAlgorithm::kTwoStage: return FusedAlgorithm::kTwoStage;
    case FusedAlgorithm::kUnfused: return FusedAlgorithm::kUnfused;
    case FusedAlgorithm::kPushOneStageReg:  // the simulator's name, not a GPU algorithm
    case FusedAlgorithm::kAuto:
    case FusedAlgorithm::kNcclSplit: return std::nullopt;
  }
  return std::nullopt;
}

// The fused op's device buffers: x (registered when asked), residual, weight and both outputs.
struct FusedDeviceBuffers {
  FusedDeviceBuffers(size_t bytes, size_t weight_bytes)
      : x(bytes), residual(bytes), weight(weight_bytes), residual_out(bytes), out(bytes) {}
  cuda::fused::FusedRmsNormBuffers view() const {
    return {x.get(), residual.get(), weight.get(), residual_out.get(), out.get()};
  }
  std::vector<DeviceOutput> outputs(size_t count, size_t elem) const {
    return {{"out", out.get(), count, elem, 0x5A}, {"residual_out", residual_out.get(), count, elem, 0xA5}};
  }
  DeviceBuffer x, residual, weight, residual_out, out;
};

class FusedProblem : public GpuProblem {
 public:
  FusedProblem(const GpuSettings& s, ApiComm& comm, const FusedInputs& in, const Bytes& mine, float eps,
               std::string output, std::string residual_output)
      : s_(s),
        algo_(*cuda::fused::parse_fused_algorithm(s.algo)),
        comm_(comm),
        shape_{in.rows, in.hidden, eps, s.dtype},
        count_(in.count()),
        buffers_(in.count() * static_cast<size_t>(dtype_size(s.dtype)), in.weight.size()),
        output_(std::move(output)),
        residual_output_(std::move(residual_output)) {
    const size_t bytes = buffers_.x.bytes();
    EXC_CUDA_CHECK(cudaMemcpy(buffers_.x.get(), mine.data(), bytes, cudaMemcpyHostToDevice));
    EXC_CUDA_CHECK(cudaMemcpy(buffers_.residual.get(), in.residual.data(), bytes, cudaMemcpyHostToDevice));
    EXC_CUDA_CHECK(cudaMemcpy(buffers_.weight.get(), in.weight.data(), in.weight.size(), cudaMemcpyHostToDevice));
    if (s.registered) registered_ = comm.register_buffer(buffers_.x.get(), bytes);
    if (s.blocks > 0 || s.threads > 0) {
      const cuda::fused::FusedChoice c = comm.fused_backend().choose(shape_, algo_);
      grid_ = cuda::LaunchConfig{s.blocks > 0 ? static_cast<int>(s.blocks) : c.grid.blocks,
                                 s.threads > 0 ? static_cast<int>(s.threads) : c.grid.threads};
    }
  }

  CallReport enqueue(const Variant& v, cudaStream_t stream) override {
    return comm_.fused(buffers_.view(), shape_, algo_, stream, v.registered ? registered_ : -1,
                       v.grid ? v.grid : grid_);
  }
  std::vector<DeviceOutput> outputs() const override {
    return buffers_.outputs(count_, static_cast<size_t>(dtype_size(s_.dtype)));
  }
  std::vector<std::string> output_paths() const override { return {output_, residual_output_}; }
  std::vector<int64_t> output_shape(int ranks) const override { return {ranks, shape_.rows, shape_.hidden}; }
  std::string summary(int ranks, const CallReport& ran, const GpuSettings& s,
                      const std::vector<std::string>& sha256s) const override {
    std::ostringstream os;
    os << "gpu fused_rmsnorm: " << dtype_name(s.dtype) << ", " << ranks << " ranks, " << shape_.rows << " rows, H "
       << shape_.hidden << ", contract " << contract_name(s.contract) << ", " << ran.algo;
    if (!ran.detail.empty()) os << " (" << ran.detail << ")";
    os << " " << ran.grid.blocks << "x" << ran.grid.threads << (ran.staged ? ", staged" : ", registered")
       << (s.graph ? ", CUDA graph" : "");
    if (!ran.exact) os << ", NOT bit-exact (" << ran.inexact_note << ")";
    os << ": out sha256 " << sha256s[0] << " residual_out sha256 " << sha256s[1] << "\n";
    return os.str();
  }

 private:
  GpuSettings s_;
  FusedAlgorithm algo_;
  ApiComm& comm_;
  cuda::fused::FusedRmsNormShape shape_;
  size_t count_;
  FusedDeviceBuffers buffers_;
  std::string output_, residual_output_;
  int registered_ = -1;  // the C API's id of x, when --registered
  std::optional<cuda::LaunchConfig> grid_;
};

// bench's columns beyond the fused algorithms: the split path's two parts alone.
constexpr const char* kSplitAllReduce = "allreduce";  // the project's all-reduce (auto) of x
constexpr const char* kSplitNorm = "norm";            // the separate residual + RMSNorm kernel

// This rank's fused op in `bench`: buffers for the largest size, x registered once; per size its
// inputs and the reference's outputs of the checked rows (every row up to kCheckedRows, else
// kCheckedRows rows spread evenly: the scalar reference is slow).
class FusedBenchProblem : public BenchProblem {
 public:
  static constexpr int kCheckedRows = 256;

  FusedBenchProblem(const BenchSettings& s, ApiComm& comm, int ranks, int rank, size_t max_count, size_t max_hidden,
                    float eps, std::string table_path, std::string machine)
      : s_(s),
        comm_(comm),
        ranks_(ranks),
        rank_(rank),
        eps_(eps),
        table_path_(std::move(table_path)),
        machine_(std::move(machine)),
        buffers_(max_count * elem(), max_hidden * elem()),
        registered_(comm.register_buffer(buffers_.x.get(), buffers_.x.bytes())) {}

  uint64_t count_of(const BenchSize& size) const override { return static_cast<uint64_t>(size.rows * size.hidden); }
  uint64_t bytes_of(const BenchSize& size) const override { return count_of(size) * elem(); }

  void prepare(const BenchSize& size) override {
    const uint64_t seed = s_.seed * 7919 + static_cast<uint64_t>(size.hidden * 131 + size.rows);
    const int rows = static_cast<int>(size.rows), hidden = static_cast<int>(size.hidden);
    const FusedInputs in = make_fused_inputs(s_.dtype, ranks_, rows, hidden, seed, false, rank_);
    shape_ = {rows, hidden, eps_, s_.dtype};
    count_ = in.count();
    checked_rows_.clear();
    const int checked = std::min(rows, kCheckedRows);
    for (int k = 0; k < checked; ++k)
      checked_rows_.push_back(static_cast<int>(static_cast<int64_t>(k) * rows / checked));
    if (s_.check) {
      want_ = reference_fused(make_fused_rows(s_.dtype, ranks_, hidden, seed, false, checked_rows_), eps_, s_.contract);
    }
    const size_t bytes = count_ * elem();
    EXC_CUDA_CHECK(
        cudaMemcpy(buffers_.x.get(), in.x[static_cast<size_t>(rank_)].data(), bytes, cudaMemcpyHostToDevice));
    EXC_CUDA_CHECK(cudaMemcpy(buffers_.residual.get(), in.residual.data(), bytes, cudaMemcpyHostToDevice));
    EXC_CUDA_CHECK(cudaMemcpy(buffers_.weight.get(), in.weight.data(), in.weight.size(), cudaMemcpyHostToDevice));
  }

  std::function<CallReport(cudaStream_t)> call_of(const std::string& algo) override {
    if (algo == kSplitAllReduce) {
      return [this](cudaStream_t stream) {
        return comm_.collective(cuda::Op::kAllReduce, buffers_.x.get(), buffers_.out.get(), count_, s_.dtype,
                                cuda::Algorithm::kAuto, stream, registered_);
      };
    }
    if (algo == kSplitNorm) {
      // The backend's, not exactcoll_add_rmsnorm: it launches as the communicator does (--no-pdl),
      // as the unfused path's norm does, so that allreduce + norm compares with unfused.
      return [this](cudaStream_t stream) {
        const cuda::LaunchConfig grid =
            comm_.fused_backend().residual_rmsnorm(buffers_.out.get(), buffers_.residual.get(), buffers_.weight.get(),
                                                   buffers_.residual_out.get(), buffers_.out.get(), shape_, stream);
        return CallReport{kSplitNorm, "", grid, false, true, ""};
      };
    }
    const FusedAlgorithm a = *cuda::fused::parse_fused_algorithm(algo);
    return [this, a](cudaStream_t stream) { return comm_.fused(buffers_.view(), shape_, a, stream, registered_); };
  }

  std::vector<DeviceOutput> outputs() const override { return buffers_.outputs(count_, elem()); }

  BenchCheck check(const std::string& algo, const CallReport& ran, const std::vector<Bytes>& got) override {
    BenchCheck c;
    // The split's parts alone compute no output of the op.
    if (!s_.check || algo == kSplitAllReduce || algo == kSplitNorm) return c;
    const size_t row_bytes = static_cast<size_t>(shape_.hidden) * elem();
    const size_t hidden = static_cast<size_t>(shape_.hidden);
    for (size_t k = 0; k < checked_rows_.size(); ++k) {
      const size_t at = static_cast<size_t>(checked_rows_[k]) * row_bytes;
      c.differ += compare_bits(s_.dtype, got[0].data() + at, want_.out.data() + k * row_bytes, hidden).mismatches;
      c.differ +=
          compare_bits(s_.dtype, got[1].data() + at, want_.residual_out.data() + k * row_bytes, hidden).mismatches;
    }
    c.compared = true;
    // Every algorithm but nccl_split promises the contract's bits; NCCL's sums promise nothing
    // that bench checks here (its #!=contract is shown, not judged).
    c.promise_checked = ran.exact;
    c.wrong = ran.exact ? c.differ : 0;
    return c;
  }

  std::string header() const override {
    std::ostringstream os;
    os << "eps " << eps_ << "; auto's table: ";
    const char* table = std::getenv("EXACTCOLL_FUSED_TABLE");
    if (!table_path_.empty()) {
      os << "measured in this run, after every other algorithm (--write-table " << table_path_ << ")";
    } else if (table != nullptr && *table != '\0') {
      os << table << " ($EXACTCOLL_FUSED_TABLE)";
    } else {
      os << "the built-in one";
    }
    return os.str();
  }

  bool tunes_auto() const override { return !table_path_.empty(); }

  void tune(const std::vector<BenchResult>& measured, Worker& w) override {
    const std::string measured_on = cuda::measured_on_text(machine_, w.device_name(), ranks_, std::time(nullptr));
    std::vector<cuda::fused::FusedTableRow> rows;
    for (const BenchResult& r : measured) {
      // The algorithms auto chooses among (the registry's picked_by_auto): every exact one.
      const auto algo = cuda::fused::parse_fused_algorithm(r.algo);
      const std::vector<FusedAlgorithm> table_algorithms = cuda::fused::fused_ipc_algorithms();
      if (!algo || std::find(table_algorithms.begin(), table_algorithms.end(), *algo) == table_algorithms.end()) {
        continue;
      }
      const int rows_of = static_cast<int>(r.size.rows), hidden = static_cast<int>(r.size.hidden);
      cuda::fused::FusedTableRow row;
      row.arch = comm_.properties().arch;
      row.world_size = ranks_;
      row.row_bytes = static_cast<uint64_t>(r.size.hidden) * elem();
      row.rows = rows_of;
      row.algo = *algo;
      row.grid = *algo == FusedAlgorithm::kUnfused
                     ? cuda::fused::residual_rmsnorm_grid(rows_of, hidden, s_.dtype)
                     : cuda::fused::default_fused_grid(*algo, rows_of, hidden, s_.dtype, ranks_);
      row.time_us = r.graph_us;
      row.measured_on = measured_on;
      rows.push_back(row);
    }
    cuda::fused::FusedTable table(rows);
    if (w.leader()) {
      const std::string text = table.to_text(
          {"exactcoll fused all-reduce + residual + RMSNorm table: measured by `exactcoll bench --op fused_rmsnorm "
           "--write-table` on " +
           std::to_string(ranks_) + " x " + w.device_name() + ", " + dtype_name(s_.dtype) +
           ", CUDA graph, max over ranks of the median per-op time (us)."});
      npy::write_file_atomic(cli::resolve_path(table_path_), text.data(), text.size());
    }
    comm_.fused_backend().set_table(table);  // a measured table: not in the C API
  }

 private:
  size_t elem() const { return static_cast<size_t>(dtype_size(s_.dtype)); }

  BenchSettings s_;
  ApiComm& comm_;
  int ranks_, rank_;
  float eps_;
  std::string table_path_;
  std::string machine_;  // --machine: measured_on's machine in the written table ("": the GPU's name)
  FusedDeviceBuffers buffers_;
  int registered_;  // the C API's id of x
  cuda::fused::FusedRmsNormShape shape_{};
  size_t count_ = 0;
  std::vector<int> checked_rows_;
  FusedOutputs want_;
};

class FusedRmsNormOp : public GpuOp {
 public:
  std::string name() const override { return "fused_rmsnorm"; }

  // ---- gpu ----
  std::string gpu_usage() const override {
    return "(--input x.npy --residual r.npy --weight w.npy | --rows R --hidden H [--seed S] [--specials]) [--eps E] "
           "[--output out.npy] [--residual-output ro.npy]";
  }
  std::string gpu_description() const override {
    return "Fused all-reduce + residual add + RMSNorm on N GPUs (one process each), with the conventions of\n"
           "`exactcoll sim fused_rmsnorm`: x.npy is [N, rows, H] (rank r's partial sums at [r]), r.npy [rows, H],\n"
           "w.npy [H]; bf16/fp16 as '<u2' bit patterns, fp32 as '<f4'. Outputs are [N, rows, H]. Every algorithm\n"
           "but nccl_split gives the bits of --contract (canonical or tree: the all-reduce's; the residual add\n"
           "and RMSNorm are canonical under both), the simulator's; the alternative contracts are simulator-only.\n"
           "The summary ends with the sha256 of each output, comparable with the sim's.";
  }
  std::vector<std::string> gpu_algorithms() const override { return fused_algorithm_name_list(kOnGpu); }
  std::string gpu_algorithm_help() const override {
    return "algorithm; auto = the fused table's choice (cuda_backend/fused/); nccl_split = NCCL's all-reduce and "
           "the separate norm kernel (not bit-exact)";
  }
  void add_gpu_flags(cli::ArgParser& parser) override { add_fused_input_flags(parser, &in_); }
  std::string check_gpu_flags(const cli::ArgParser& parser, const GpuSettings& s, int64_t ranks,
                              bool in_parent) override {
    if (const std::string problem = exactcoll::fused::check_eps(in_.eps); !problem.empty()) return problem;
    const bool files = parser.given("input") || parser.given("residual") || parser.given("weight");
    const bool random = parser.given("rows") || parser.given("hidden");
    if (files == random) return "give either --input, --residual and --weight, or --rows and --hidden (with --seed)";
    if (files && (in_.input.empty() || in_.residual.empty() || in_.weight.empty())) {
      return "--input, --residual and --weight go together";
    }
    if (files && (parser.given("seed") || in_.specials)) return "--seed and --specials apply to random inputs (--rows)";
    if (!s.output.empty() && s.output == in_.residual_output)
      return "--output and --residual-output name the same file";
    if (random) {
      const int pack = pack_elements(s.dtype);
      if (in_.rows < 1 || in_.rows > (1 << 24)) return "--rows must be 1..16777216";
      if (in_.hidden < 1 || in_.hidden > (1 << 24) || in_.hidden % pack != 0) {
        return std::string("--hidden must be a positive multiple of the ") + dtype_name(s.dtype) + " pack (" +
               std::to_string(pack) + " elements), at most 16777216";
      }
    }
    // Bad input files exit 2 here, before any worker starts (workers read them again).
    if (files && in_parent) {
      FusedInputs in;
      Bytes unused;
      if (const std::string problem = load_inputs(s, static_cast<int>(ranks), -1, &in, &unused); !problem.empty()) {
        return problem;
      }
    }
    return "";
  }
  int max_blocks() const override { return kMaxFusedBlocks; }
  bool needs_nccl(const GpuSettings& s) const override { return s.algo == "nccl_split"; }

  std::unique_ptr<GpuProblem> load(const GpuSettings& s, ApiComm& comm, int n, int rank) override {
    FusedInputs in;
    Bytes mine;
    if (const std::string problem = load_inputs(s, n, rank, &in, &mine); !problem.empty()) {
      throw std::invalid_argument(problem);
    }
    return std::make_unique<FusedProblem>(s, comm, in, mine, static_cast<float>(in_.eps), s.output,
                                          in_.residual_output);
  }

  // ---- verify ----
  std::vector<DType> default_verify_dtypes() const override { return {DType::kBF16, DType::kFP16}; }
  void add_verify_flags(cli::ArgParser& parser) override {
    parser.add_string("hidden", &hidden_text_, "fused_rmsnorm: comma list of H");
    parser.add_string("rows", &rows_text_, "fused_rmsnorm: comma list of row counts");
    parser.add_string("algos", &algos_text_,
                      "fused_rmsnorm: comma list of one_stage, one_stage_reg, push_one_stage, lamport_one_stage, "
                      "lamport_two_stage, two_stage, gather_norm, unfused, auto");
    parser.add_int("max-elements", &max_elements_, "fused_rmsnorm: skip (H, rows) with rows * H above this");
    parser.add_int("sim-all-max-elements", &sim_all_max_elements_,
                   "fused_rmsnorm: simulate each GPU algorithm itself up to this rows * H (one_stage above)");
    parser.add_double("eps", &in_.eps, "fused_rmsnorm: RMSNorm epsilon");
  }
  std::vector<std::string> verify_flag_names() const override {
    return {"hidden", "rows", "algos", "max-elements", "sim-all-max-elements", "eps"};
  }
  std::string check_verify_flags(const std::vector<DType>& dtypes) override {
    algos_.clear();
    for (const auto& s : split_list(algos_text_)) {
      const auto a = cuda::fused::parse_fused_algorithm(s);
      if (!a || *a == FusedAlgorithm::kNcclSplit) {
        return "unknown algorithm '" + s +
               "' (one_stage, one_stage_reg, push_one_stage, lamport_one_stage, lamport_two_stage, two_stage, "
               "gather_norm, unfused, auto)";
      }
      algos_.push_back(*a);
    }
    if (algos_.empty()) return "--algos names no algorithm";
    if (!parse_counts(hidden_text_, &hidden_list_)) return "--hidden wants positive numbers like 2880,4096";
    if (!parse_counts(rows_text_, &rows_list_)) return "--rows wants positive numbers like 1,2,3";
    for (int64_t h : hidden_list_) {
      for (DType d : dtypes) {
        if (h % pack_elements(d) != 0) {
          return "H " + std::to_string(h) + " is not a multiple of the " + dtype_name(d) + " pack";
        }
      }
    }
    if (max_elements_ < 1 || sim_all_max_elements_ < 0) {
      return "--max-elements must be positive and --sim-all-max-elements at least 0";
    }
    return exactcoll::fused::check_eps(in_.eps);
  }
  bool wants_small_communicator() const override { return true; }
  std::string verify_header() const override {
    return "fused_rmsnorm: rows * H <= " + std::to_string(max_elements_) + ", simulated per algorithm up to " +
           std::to_string(sim_all_max_elements_);
  }

  void verify(VerifyContext& ctx, const std::vector<DType>& dtypes) override {
    const int n = ctx.worker.world_size(), rank = ctx.worker.rank();
    const float eps = static_cast<float>(in_.eps);
    const Contract contract = ctx.settings.contract;
    // 1. Buffers for the largest problem; x registered once (the chunked variant stages).
    size_t max_count = 0, max_hidden = 0;
    for (int64_t h : hidden_list_) {
      for (int64_t r : rows_list_) {
        if (r * h <= max_elements_) max_count = std::max(max_count, static_cast<size_t>(r * h));
      }
      max_hidden = std::max(max_hidden, static_cast<size_t>(h));
    }
    if (max_count == 0) return;
    const auto buffers_kept = std::make_shared<const FusedDeviceBuffers>(max_count * 4, max_hidden * 4);
    ctx.keep_alive.push_back(buffers_kept);  // x is registered: it must outlive the communicator
    const FusedDeviceBuffers& buffers = *buffers_kept;
    const int registered = ctx.comms.main->register_buffer(buffers.x.get(), buffers.x.bytes());
    sim::WorldOptions world_options;
    world_options.ranks = n;
    sim::World world(world_options);
    for (int64_t iter = 0; iter < ctx.settings.iters; ++iter) {
      for (DType dtype : dtypes) {
        const size_t elem = static_cast<size_t>(dtype_size(dtype));
        for (int64_t hidden : hidden_list_) {
          for (int64_t rows : rows_list_) {
            if (rows * hidden > max_elements_) continue;
            // 1. Inputs; this rank's go to the GPU.
            const uint64_t case_seed = mix_seed(
                mix_seed(mix_seed(ctx.settings.seed, static_cast<uint64_t>(iter)), static_cast<uint64_t>(dtype)),
                static_cast<uint64_t>(hidden) * 100003 + static_cast<uint64_t>(rows));
            const FusedInputs in =
                make_fused_inputs(dtype, n, static_cast<int>(rows), static_cast<int>(hidden), case_seed, true);
            const size_t count = in.count(), bytes = count * elem;
            EXC_CUDA_CHECK(
                cudaMemcpy(buffers.x.get(), in.x[static_cast<size_t>(rank)].data(), bytes, cudaMemcpyHostToDevice));
            EXC_CUDA_CHECK(cudaMemcpy(buffers.residual.get(), in.residual.data(), bytes, cudaMemcpyHostToDevice));
            EXC_CUDA_CHECK(
                cudaMemcpy(buffers.weight.get(), in.weight.data(), in.weight.size(), cudaMemcpyHostToDevice));
            const std::vector<DeviceOutput> outs = buffers.outputs(count, elem);
            // 2. The reference and the simulator.
            const FusedOutputs by_reference = reference_fused(in, eps, contract);
            std::map<FusedAlgorithm, FusedOutputs> by_sim;
            auto simulated = [&](FusedAlgorithm a) -> const FusedOutputs& {
              auto it = by_sim.find(a);
              if (it == by_sim.end()) {
                it = by_sim.emplace(a, simulate_fused(world, a, in, eps, 4, contract)[static_cast<size_t>(rank)]).first;
              }
              return it->second;
            };
            const cuda::fused::FusedRmsNormShape shape{static_cast<int>(rows), static_cast<int>(hidden), eps, dtype};
            for (FusedAlgorithm requested : algos_) {
              const cuda::fused::FusedChoice choice = ctx.comms.main->fused_backend().choose(shape, requested);
              const FusedAlgorithm sim_choice = count <= static_cast<size_t>(sim_all_max_elements_)
                                                    ? sim_algo(choice.algo).value_or(FusedAlgorithm::kOneStage)
                                                    : FusedAlgorithm::kOneStage;
              const FusedOutputs& want = simulated(sim_choice);
              const std::string label = cuda::fused::fused_algorithm_name(requested);
              // 3. The variants.
              const bool named = requested != FusedAlgorithm::kAuto;
              for (const Variant& v :
                   verify_variants(named, max_blocks(), named && requested != FusedAlgorithm::kUnfused)) {
                ApiComm& comm = ctx.comms.for_variant(v);
                const Enqueue enqueue = [&](const Variant& var, cudaStream_t stream) {
                  return comm.fused(buffers.view(), shape, requested, stream, var.registered ? registered : -1,
                                    var.grid);
                };
                const std::string what = "fused_rmsnorm " + std::string(dtype_name(dtype)) + " " + label + " (" +
                                         cuda::fused::fused_algorithm_name(choice.algo) + ") " + v.name + " rows " +
                                         std::to_string(rows) + " H " + std::to_string(hidden) + " contract " +
                                         contract_name(contract);
                // 4. Every bit of both outputs, against the simulator and the reference.
                run_checked(enqueue, v, outs, v.graph ? 2 : 1, ctx.comms.for_variant(v), ctx.stream,
                            [&](int, const std::vector<Bytes>& got) {
                              ctx.ledger.record(
                                  "fused_rmsnorm " + std::string(dtype_name(dtype)) + " " + label + " " + v.name, what,
                                  dtype, outs, got, {&want.out, &want.residual_out},
                                  {&by_reference.out, &by_reference.residual_out}, [hidden](size_t i) {
                                    return "row " + std::to_string(i / static_cast<size_t>(hidden)) + " column " +
                                           std::to_string(i % static_cast<size_t>(hidden));
                                  });
                            });
              }
            }
          }
        }
      }
    }
  }

  // ---- bench ----
  std::vector<std::string> bench_algorithms() const override {
    std::vector<std::string> names = fused_algorithm_name_list(kOnGpu);
    names.insert(names.end(), {kSplitAllReduce, kSplitNorm});
    return names;
  }
  // The split paths: the project's all-reduce + the separate norm kernel, and NCCL's + the same.
  std::vector<std::string> bench_baselines() const override { return {"unfused", "nccl_split"}; }
  std::vector<int64_t> bench_default_hidden(bool) const override { return {4096, 8192}; }
  std::string bench_redop() const override { return "sum"; }
  double bus_factor(int ranks) const override { return ranks <= 1 ? 1 : 2.0 * (ranks - 1) / ranks; }
  void add_bench_flags(cli::ArgParser& parser) override {
    parser.add_double("eps", &in_.eps, "RMSNorm epsilon");
    parser.add_string("write-table", &write_table_,
                      "after every other algorithm, write auto's table made from this run's times to FILE, and "
                      "measure auto with it");
    parser.add_string("machine", &machine_,
                      "with --write-table: the machine in the rows' measured_on column, e.g. nvidia-h100-x4");
    parser.set_default_note("machine", "default: the GPU's name with '-' for spaces and -x<nproc>");
  }
  std::string check_bench_flags(const BenchSettings& s, const std::vector<BenchSize>& sizes) override {
    if (const std::string problem = exactcoll::fused::check_eps(in_.eps); !problem.empty()) return problem;
    if (!cuda::is_measured_on_text(machine_)) return "--machine must hold no tab or line break";
    for (const BenchSize& size : sizes) {
      if (size.hidden % pack_elements(s.dtype) != 0 || size.hidden > (1 << 24) || size.rows > (1 << 24)) {
        return "H " + std::to_string(size.hidden) + " must be a multiple of the " + dtype_name(s.dtype) + " pack (" +
               std::to_string(pack_elements(s.dtype)) + " elements), and H and rows at most 16777216";
      }
    }
    return "";
  }
  void bench_communicator(const BenchSettings& s, const std::vector<BenchSize>& sizes, int ranks,
                          const std::vector<std::string>& algos, ApiCommOptions* options,
                          size_t* least_buffer_bytes) const override {
    // Room for every algorithm's largest problem in one launch: two_stage's 2 x rows x H, and
    // push_one_stage's (and push_one_shot's, in unfused) 2 x n x rows x H.
    options->use_nccl = std::find(algos.begin(), algos.end(), "nccl_split") != algos.end();
    *least_buffer_bytes = 0;
    for (const BenchSize& size : sizes) {
      *least_buffer_bytes =
          std::max(*least_buffer_bytes, 2 * static_cast<size_t>(std::max(ranks, 1)) *
                                            static_cast<size_t>(size.rows * size.hidden * dtype_size(s.dtype)));
    }
  }
  std::unique_ptr<BenchProblem> bench_load(const BenchSettings& s, ApiComm& comm, const std::vector<BenchSize>& sizes,
                                           int ranks, int rank) override {
    size_t max_count = 0, max_hidden = 0;
    for (const BenchSize& size : sizes) {
      max_count = std::max(max_count, static_cast<size_t>(size.rows * size.hidden));
      max_hidden = std::max(max_hidden, static_cast<size_t>(size.hidden));
    }
    return std::make_unique<FusedBenchProblem>(s, comm, ranks, rank, max_count, max_hidden, static_cast<float>(in_.eps),
                                               write_table_, machine_);
  }

 private:
  // This rank's problem: from the files, or made from the seed (rank -1: check the files only).
  // Returns an error message or "".
  std::string load_inputs(const GpuSettings& s, int ranks, int rank, FusedInputs* in, Bytes* mine) const {
    if (in_.input.empty()) {
      *in = make_fused_inputs(s.dtype, ranks, static_cast<int>(in_.rows), static_cast<int>(in_.hidden), s.seed,
                              in_.specials, rank);
      if (rank >= 0) *mine = in->x[static_cast<size_t>(rank)];
      return "";
    }
    if (const std::string problem = read_fused_files(in_, s.dtype, ranks, "--nproc", rank, in); !problem.empty()) {
      return problem;
    }
    if (rank >= 0) *mine = std::move(in->x[static_cast<size_t>(rank)]);
    return "";
  }

  // gpu's flags (in_.eps is verify's and bench's --eps too).
  FusedInputFlags in_;
  // bench's --write-table and --machine.
  std::string write_table_, machine_;
  // verify's flags.
  std::string hidden_text_ = "2880,4096,5120,7168,8192,16384", rows_text_ = "1,2,3,7,16,64,257,1024,4096",
              algos_text_ =
                  "one_stage,one_stage_reg,push_one_stage,lamport_one_stage,lamport_two_stage,two_stage,gather_norm,"
                  "unfused,auto";
  int64_t max_elements_ = int64_t{1} << 22, sim_all_max_elements_ = int64_t{1} << 20;
  std::vector<FusedAlgorithm> algos_;
  std::vector<int64_t> hidden_list_, rows_list_;
};

}  // namespace

std::unique_ptr<GpuOp> make_fused_rmsnorm_op() { return std::make_unique<FusedRmsNormOp>(); }

}  // namespace exactcoll::gpu

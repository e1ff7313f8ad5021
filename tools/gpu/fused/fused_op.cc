// The fused all-reduce + residual add + RMSNorm as the GPU commands run it (tools/gpu/gpu_op.h).
//
// `gpu fused_rmsnorm`: the flags and .npy conventions of `exactcoll sim fused_rmsnorm`: x.npy
// [N, rows, H] (rank r's partial sums at [r]), r.npy [rows, H], w.npy [H]; bf16/fp16 as '<u2' bit
// patterns, fp32 as '<f4'; outputs [N, rows, H] (every rank's result); or random inputs (--rows,
// --hidden, --seed, --specials). The summary ends with the sha256 of each output.
//
// `verify`, per (iteration, dtype, H, rows) with rows * H <= --max-elements:
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
#include <map>
#include <sstream>

#include "cuda_backend/cuda_check.h"
#include "cuda_backend/fused/fused_rmsnorm.h"
#include "sim/fused/reference.h"
#include "sim/world.h"
#include "tools/gpu/device_util.h"
#include "tools/inputs/fused_inputs.h"
#include "tools/gpu/fused/fused_reference.h"
#include "tools/gpu/gpu_op.h"
#include "tools/inputs/inputs.h"
#include "tools/gpu/worker.h"
#include "npy/npy.h"

namespace exactcoll::gpu {
namespace {

using cuda::fused::FusedAlgorithm;

// The fused kernels' largest block count (the forced-grid variant's and --blocks' bound).
constexpr int kMaxFusedBlocks = 64;

// The simulator's run of the kernel a GPU algorithm launches (the GPU's push_one_stage is the
// register kernel the simulator names push_one_stage_reg).
std::optional<FusedAlgo> sim_algo(FusedAlgorithm a) {
  switch (a) {
    case FusedAlgorithm::kOneStage: return FusedAlgo::kOneStage;
    case FusedAlgorithm::kOneStageReg: return FusedAlgo::kOneStageReg;
    case FusedAlgorithm::kGatherNorm: return FusedAlgo::kGatherNorm;
    case FusedAlgorithm::kPushOneStage: return FusedAlgo::kPushOneStageReg;
    case FusedAlgorithm::kLamportOneStage: return FusedAlgo::kLamportOneStage;
    case FusedAlgorithm::kTwoStage: return FusedAlgo::kTwoStage;
    case FusedAlgorithm::kUnfused: return FusedAlgo::kUnfused;
    default: return std::nullopt;
  }
}

// A call's report from the fused host API's.
CallReport report_of(const cuda::fused::FusedCallInfo& info) {
  CallReport r;
  r.algo = cuda::fused::fused_algorithm_name(info.algo);
  r.detail = info.allreduce.empty() ? "" : "all-reduce " + info.allreduce;
  r.grid = info.grid;
  r.staged = info.staged;
  r.exact = info.exact;
  r.inexact_note = "NCCL's sums follow no contract";
  return r;
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
  FusedProblem(const GpuSettings& s, cuda::Communicator& comm, const FusedInputs& in, const Bytes& mine, float eps,
               std::string output, std::string residual_output)
      : s_(s),
        algo_(*cuda::fused::parse_fused_algorithm(s.algo)),
        comm_(comm),
        fused_(comm),
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
      const cuda::fused::FusedChoice c = fused_.choose(shape_, algo_);
      grid_ = cuda::LaunchConfig{s.blocks > 0 ? static_cast<int>(s.blocks) : c.grid.blocks,
                                 s.threads > 0 ? static_cast<int>(s.threads) : c.grid.threads};
    }
  }

  CallReport enqueue(const Variant& v, cudaStream_t stream) override {
    return report_of(fused_.run(buffers_.view(), shape_, algo_, stream, v.registered ? &registered_ : nullptr,
                                v.grid ? v.grid : grid_));
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
       << shape_.hidden << ", contract canonical, " << ran.algo;
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
  cuda::Communicator& comm_;
  cuda::fused::FusedRmsNorm fused_;
  cuda::fused::FusedRmsNormShape shape_;
  size_t count_;
  FusedDeviceBuffers buffers_;
  std::string output_, residual_output_;
  cuda::RegisteredBuffer registered_;
  std::optional<cuda::LaunchConfig> grid_;
};

class FusedRmsNormOp : public GpuOp {
 public:
  std::string name() const override { return "fused_rmsnorm"; }

  // ---- gpu ----
  std::string gpu_usage() const override {
    return "(--input x.npy --residual r.npy --weight w.npy | --rows R --hidden H [--seed S] [--specials]) [--eps E] "
           "[--output out.npy] [--residual-output ro.npy] [--contract canonical]";
  }
  std::string gpu_description() const override {
    return "Fused all-reduce + residual add + RMSNorm on N GPUs (one process each), with the conventions of\n"
           "`exactcoll sim fused_rmsnorm`: x.npy is [N, rows, H] (rank r's partial sums at [r]), r.npy [rows, H],\n"
           "w.npy [H]; bf16/fp16 as '<u2' bit patterns, fp32 as '<f4'. Outputs are [N, rows, H]. Every algorithm\n"
           "but nccl_split gives the canonical contract's bits (the simulator's); the alternative contracts are\n"
           "simulator-only. The summary ends with the sha256 of each output, comparable with the sim's.";
  }
  std::vector<std::string> gpu_algorithms() const override {
    return {"one_stage",   "one_stage_reg", "push_one_stage", "lamport_one_stage", "two_stage",
            "gather_norm", "unfused",       "auto",           "nccl_split"};
  }
  std::string gpu_algorithm_help() const override {
    return "algorithm; auto = the fused table's choice (cuda_backend/fused/); nccl_split = NCCL's all-reduce and "
           "the separate norm kernel (not bit-exact)";
  }
  void add_gpu_flags(cli::ArgParser& parser) override {
    add_fused_input_flags(parser, &in_);
    parser.add_choice("contract", &contract_, {"canonical"}, "rounding contract (the GPU has the canonical one only)");
  }
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

  std::unique_ptr<GpuProblem> load(const GpuSettings& s, cuda::Communicator& comm, int n, int rank) override {
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
                      "two_stage, gather_norm, unfused, auto");
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
               "' (one_stage, one_stage_reg, push_one_stage, lamport_one_stage, two_stage, gather_norm, unfused, auto)";
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
    cuda::fused::FusedRmsNorm fused(*ctx.comms.main), small_fused(*ctx.comms.small);
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
    const cuda::RegisteredBuffer registered = ctx.comms.main->register_buffer(buffers.x.get(), buffers.x.bytes());
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
            const FusedOutputs by_reference = reference_fused(in, eps);
            std::map<FusedAlgo, FusedOutputs> by_sim;
            auto simulated = [&](FusedAlgo a) -> const FusedOutputs& {
              auto it = by_sim.find(a);
              if (it == by_sim.end()) {
                it = by_sim.emplace(a, simulate_fused(world, a, in, eps, 4)[static_cast<size_t>(rank)]).first;
              }
              return it->second;
            };
            const cuda::fused::FusedRmsNormShape shape{static_cast<int>(rows), static_cast<int>(hidden), eps, dtype};
            for (FusedAlgorithm requested : algos_) {
              const cuda::fused::FusedChoice choice = fused.choose(shape, requested);
              const FusedAlgo sim_choice = count <= static_cast<size_t>(sim_all_max_elements_)
                                               ? sim_algo(choice.algo).value_or(FusedAlgo::kOneStage)
                                               : FusedAlgo::kOneStage;
              const FusedOutputs& want = simulated(sim_choice);
              const std::string label = cuda::fused::fused_algorithm_name(requested);
              // 3. The variants.
              const bool named = requested != FusedAlgorithm::kAuto;
              for (const Variant& v :
                   verify_variants(named, max_blocks(), named && requested != FusedAlgorithm::kUnfused)) {
                cuda::fused::FusedRmsNorm& f = v.small ? small_fused : fused;
                const Enqueue enqueue = [&](const Variant& var, cudaStream_t stream) {
                  return report_of(f.run(buffers.view(), shape, requested, stream,
                                         var.registered ? &registered : nullptr, var.grid));
                };
                const std::string what = "fused_rmsnorm " + std::string(dtype_name(dtype)) + " " + label + " (" +
                                         cuda::fused::fused_algorithm_name(choice.algo) + ") " + v.name + " rows " +
                                         std::to_string(rows) + " H " + std::to_string(hidden);
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
    npy::NpyArray x, residual, weight;
    try {
      x = npy::read_npy(cli::resolve_path(in_.input));
      residual = npy::read_npy(cli::resolve_path(in_.residual));
      weight = npy::read_npy(cli::resolve_path(in_.weight));
    } catch (const npy::NpyError& e) {
      return e.what();
    }
    if (const std::string problem = check_fused_arrays(s.dtype, ranks, "--nproc", {in_.input, x},
                                                       {in_.residual, residual}, {in_.weight, weight});
        !problem.empty()) {
      return problem;
    }
    in->ranks = ranks, in->rows = static_cast<int>(x.shape[1]), in->hidden = static_cast<int>(x.shape[2]);
    in->dtype = s.dtype;
    const size_t bytes = in->count() * static_cast<size_t>(dtype_size(s.dtype));
    if (rank >= 0) {
      mine->assign(x.data.begin() + static_cast<std::ptrdiff_t>(bytes * static_cast<size_t>(rank)),
                   x.data.begin() + static_cast<std::ptrdiff_t>(bytes * static_cast<size_t>(rank + 1)));
    }
    in->residual = std::move(residual.data);
    in->weight = std::move(weight.data);
    return "";
  }

  // gpu's flags (in_.eps is verify's --eps too).
  FusedInputFlags in_;
  std::string contract_ = "canonical";
  // verify's flags.
  std::string hidden_text_ = "2880,4096,5120,7168,8192,16384", rows_text_ = "1,2,3,7,16,64,257,1024,4096",
              algos_text_ =
                  "one_stage,one_stage_reg,push_one_stage,lamport_one_stage,two_stage,gather_norm,unfused,auto";
  int64_t max_elements_ = int64_t{1} << 22, sim_all_max_elements_ = int64_t{1} << 20;
  std::vector<FusedAlgorithm> algos_;
  std::vector<int64_t> hidden_list_, rows_list_;
};

}  // namespace

std::unique_ptr<GpuOp> make_fused_rmsnorm_op() { return std::make_unique<FusedRmsNormOp>(); }

}  // namespace exactcoll::gpu

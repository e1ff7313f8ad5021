// The C API's simulator functions (exactcoll.h, "the simulator"): the same algorithm templates on
// CPU threads, host arrays in, the contract's bits out, traces on request.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "capi/api_support.h"
#include "capi/enum_names.h"
#include "core/contract.h"
#include "core/multinode.h"
#include "core/multinode_layout.h"
#include "core/registry.h"
#include "core/signal.h"
#include "exactcoll/exactcoll.h"
#include "npy/npy.h"
#include "sim/collectives.h"
#include "sim/fused/fused_sim.h"
#include "sim/fused/reference.h"
#include "sim/multinode/multinode_sim.h"
#include "sim/trace_files.h"
#include "sim/world.h"

using namespace exactcoll;
using namespace exactcoll::capi;

namespace {

// The options as the simulator takes them, plus the trace files to write afterwards.
struct SimRun {
  sim::WorldOptions world;
  int blocks = 1;
  int threads = 0;  // options->threads: the fused op's threads per block (0: the algorithm's default)
  Contract contract = Contract::kCanonical;  // the collectives' (options->contract)
  std::string trace_path, chrome_trace_path;
  void (*progress)(void*, uint64_t, uint64_t) = nullptr;  // options->progress, with its user data
  void* progress_user_data = nullptr;
};

// Refuses a contract the simulated kernels do not fold under (the emulations are the fused
// reference's).
void run_contract_check(Contract c) {
  if (!exactcoll::info(c).library_contract) {
    bad_argument(std::string("the simulated kernels fold under the library's contracts (") + library_contract_names() +
                 "), not " + contract_name(c));
  }
}

// The fused op's shape and eps, as both fused entry points take them.
void check_fused_shape(DType type, int64_t rows, int64_t hidden, float eps) {
  if (rows < 0 || rows > (int64_t{1} << 24)) bad_argument("rows must be 0..16777216, got " + std::to_string(rows));
  const int pack = pack_elements(type);
  if (hidden <= 0 || hidden > (int64_t{1} << 24) || hidden % pack != 0) {
    bad_argument("hidden size " + std::to_string(hidden) + " is not a positive multiple of the " + dtype_name(type) +
                 " pack (" + std::to_string(pack) + " elements) up to 16777216");
  }
  if (!std::isfinite(eps) || eps < 0.0f) bad_argument("eps must be finite and >= 0, got " + std::to_string(eps));
}

void require_fused_buffers(const void* x, const void* residual, const void* weight, const void* residual_out,
                           const void* out) {
  require(x, "x");
  require(residual, "residual");
  require(weight, "weight");
  require(residual_out, "residual_out");
  require(out, "out");
}

// Every rank's slices of the fused op's buffers (x, residual_out and out hold rank r's rows at r x
// rank_bytes; residual and weight are shared) into a simulator's io (one node's or across nodes').
template <class Io>
void fill_fused_io(Io* io, size_t ranks, size_t rank_bytes, const void* x, const void* residual, const void* weight,
                   void* residual_out, void* out) {
  for (size_t r = 0; r < ranks; ++r) {
    io->x.push_back(static_cast<const char*>(x) + r * rank_bytes);
    io->residual.push_back(residual);
    io->weight.push_back(weight);
    io->residual_out.push_back(static_cast<char*>(residual_out) + r * rank_bytes);
    io->out.push_back(static_cast<char*>(out) + r * rank_bytes);
  }
}

// The struct as first published (before `contract`).
constexpr size_t kFirstSimOptionsSize = offsetof(exactcoll_sim_options, contract);

// The caller's options (NULL: the defaults), as this library's struct: an older caller's struct
// ends sooner, and its missing fields keep their defaults.
exactcoll_sim_options sim_options(const exactcoll_sim_options* given) {
  exactcoll_sim_options o;
  exactcoll_sim_options_init(&o);
  if (given != nullptr) {
    require_struct_size(given->struct_size, kFirstSimOptionsSize, "exactcoll_sim_options");
    std::memcpy(static_cast<void*>(&o), given, std::min(given->struct_size, sizeof o));
    o.struct_size = sizeof o;
  }
  return o;
}

// exactcoll_sim_multinode_options and _stats as first published.
constexpr size_t kFirstMultiNodeOptionsSize = sizeof(exactcoll_sim_multinode_options);
constexpr size_t kFirstMultiNodeStatsSize = sizeof(exactcoll_sim_multinode_stats);

SimRun sim_run(const exactcoll_sim_options* given, int ranks) {
  const exactcoll_sim_options o = sim_options(given);
  if (ranks < 1 || ranks > kMaxRanks) {
    bad_argument("ranks must be 1.." + std::to_string(kMaxRanks) + ", got " + std::to_string(ranks));
  }
  if (o.blocks < 1 || o.blocks > kMaxBlocks) {
    bad_argument("blocks must be 1.." + std::to_string(kMaxBlocks) + ", got " + std::to_string(o.blocks));
  }
  if (o.threads < 0 || o.threads > contract::kMaxLanes) {
    bad_argument("threads must be 1.." + std::to_string(contract::kMaxLanes) +
                 " (or 0: the algorithm's default), got " + std::to_string(o.threads));
  }
  if (o.seeded_schedule != 0 && o.seeded_schedule != 1) bad_argument("seeded_schedule must be 0 or 1");
  if (o.timeout_ms < 1) bad_argument("timeout_ms must be >= 1, got " + std::to_string(o.timeout_ms));
  // Checked before the array is touched: a count past the bound must never become a pointer.
  if (o.num_trace_elements > EXACTCOLL_MAX_TRACE_ELEMENTS) {
    bad_argument("num_trace_elements is " + std::to_string(o.num_trace_elements) + "; at most " +
                 std::to_string(EXACTCOLL_MAX_TRACE_ELEMENTS) + " elements are traced (EXACTCOLL_MAX_TRACE_ELEMENTS)");
  }
  if (o.num_trace_elements > 0 && o.trace_elements == nullptr) bad_argument("trace_elements is NULL");
  if (o.max_steps < 1) bad_argument("max_steps must be >= 1, got 0");
  if (o.fail_rank != -1) {
    if (o.fail_rank < 0 || o.fail_rank >= ranks) {
      bad_argument("fail_rank must be -1 (none) or a rank, 0.." + std::to_string(ranks - 1) + ", got " +
                   std::to_string(o.fail_rank));
    }
    if (o.fail_at_step < 1) bad_argument("fail_at_step must be >= 1 with fail_rank, got 0");
  }
  checked_name(kContractNames, o.contract, "contract");
  run_contract_check(static_cast<Contract>(o.contract));
  SimRun run;
  run.contract = static_cast<Contract>(o.contract);  // the registry's values are the C values
  run.blocks = o.blocks;
  run.threads = o.threads;
  run.world.ranks = ranks;
  run.world.schedule = o.seeded_schedule ? sim::Schedule::kSeeded : sim::Schedule::kThreads;
  run.world.schedule_seed = o.schedule_seed;
  run.world.wait_timeout = std::chrono::milliseconds(o.timeout_ms);
  run.world.max_steps = o.max_steps;
  run.world.fail_rank = o.fail_rank;
  run.world.fail_at_step = o.fail_rank == -1 ? 0 : o.fail_at_step;
  run.progress = o.progress;
  run.progress_user_data = o.progress_user_data;
  run.world.trace_elements.assign(o.trace_elements, o.trace_elements + o.num_trace_elements);
  if (o.trace_path != nullptr) run.trace_path = o.trace_path;
  if (o.chrome_trace_path != nullptr) run.chrome_trace_path = o.chrome_trace_path;
  run.world.trace = !run.trace_path.empty() || !run.chrome_trace_path.empty() || !run.world.trace_elements.empty();
  return run;
}

void check_trace_elements(const SimRun& run, uint64_t limit, const char* what) {
  for (const uint64_t i : run.world.trace_elements) {
    if (i >= limit) {
      bad_argument("trace element " + std::to_string(i) + " is past the " + std::to_string(limit) + " " + what);
    }
  }
}

// Calls run.progress (when given) with world's progress about every 100 ms from a thread of its
// own, from construction until destruction (which joins the thread: no call after it).
class ProgressReporter {
 public:
  ProgressReporter(const sim::World& world, const SimRun& run) {
    if (run.progress == nullptr) return;
    thread_ = std::thread([this, &world, report = run.progress, user_data = run.progress_user_data] {
      std::unique_lock<std::mutex> lock(mutex_);
      while (!stop_.wait_for(lock, std::chrono::milliseconds(100), [this] { return stopping_; })) {
        const auto [done, total] = world.progress();
        report(user_data, done, total);
      }
    });
  }
  ~ProgressReporter() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    stop_.notify_all();
    thread_.join();
  }
  ProgressReporter(const ProgressReporter&) = delete;
  ProgressReporter& operator=(const ProgressReporter&) = delete;

 private:
  std::mutex mutex_;
  std::condition_variable stop_;
  bool stopping_ = false;
  std::thread thread_;
};

// Fault injection after a run that completed: "" when none was asked for or it fired, else why it
// never did (the run ended before the failing rank's fail_at_step-th step).
std::string unreached_fault(const sim::World& world) {
  const sim::WorldOptions& o = world.options();
  if (o.fail_rank < 0 || world.rank_dead(o.fail_rank)) return "";
  return "fail_at_step " + std::to_string(o.fail_at_step) + " was never reached: rank " + std::to_string(o.fail_rank) +
         " took " + std::to_string(world.fault_steps()) + " synchronization steps in this run";
}

// Runs execute() (which runs the world, reporting its progress to run.progress) and writes the
// requested traces, also after a failed run, so that the trace shows how far it got; then reports
// the failure, if any (a fault asked for but never reached: INVALID_ARGUMENT).
template <class Execute>
void run_and_trace(sim::World& world, const SimRun& run, Execute execute) {
  std::string failure;
  exactcoll_status failure_status = EXACTCOLL_OK;
  try {
    ProgressReporter reporter(world, run);
    execute();
  } catch (const sim::SimError& e) {
    failure = e.what();
    failure_status = status_of(e);
  }
  if (failure.empty()) {
    failure = unreached_fault(world);
    failure_status = EXACTCOLL_ERROR_INVALID_ARGUMENT;
  }
  const std::string trace_problem = sim::write_trace_files(world, run.trace_path, run.chrome_trace_path);
  if (!failure.empty()) fail(failure_status, failure);
  if (!trace_problem.empty()) bad_argument("cannot write the trace: " + trace_problem);
}

// bytes = a * b * c, or INVALID_ARGUMENT when that overflows size_t.
size_t product(size_t a, size_t b, size_t c, const char* what) {
  const size_t limit = std::numeric_limits<size_t>::max();
  if ((b != 0 && a > limit / b) || (c != 0 && a * b > limit / c)) bad_argument(std::string(what) + " is too large");
  return a * b * c;
}

void fill_info(exactcoll_call_info* info, int algo, int allreduce_algo, int blocks) {
  if (info == nullptr) return;
  require_struct_size(info->struct_size, sizeof(exactcoll_call_info), "exactcoll_call_info");
  exactcoll_call_info_init(info);
  info->algo = algo;
  info->allreduce_algo = allreduce_algo;
  info->exact = 1;
  info->staged = 1;  // the simulator copies every rank's input into its symmetric heap
  info->launches = 1;
  info->blocks = blocks;
  info->threads = 1;
}

// The simulator's algorithm for a C algo value on op; INVALID_ARGUMENT for GPU-only algorithms.
sim::Algorithm sim_algorithm(sim::Op op, int algo) {
  const std::string name = checked_name(kAlgoNames, algo, "algo");
  const auto a = static_cast<sim::Algorithm>(algo);  // the registry's values are the C values
  if (a != sim::Algorithm::kAuto && !implements(a, op)) {
    bad_argument(std::string(op_name(op)) + " has no algorithm " + name + " (" + algorithm_names(kOnSimulator, op) +
                 ")");
  }
  if ((info(a).runs_on & kOnSimulator) == 0) {
    bad_argument(name + " runs on GPUs only" +
                 (info(a).exact
                      ? std::string(" (the simulator gives its bits through ") + algorithm_names(kOnSimulator, op) + ")"
                      : std::string(" (and its sums follow no contract)")));
  }
  return a;
}

template <class T>
void reference_rows(fused::Contract contract, int ranks, int rows, int hidden, float eps, const void* x,
                    const void* residual, const void* weight, void* residual_out, void* out) {
  fused::FusedProblem<T> problem;
  problem.ranks = ranks;
  problem.rows = rows;
  problem.hidden = hidden;
  problem.eps = eps;
  problem.x = static_cast<const T*>(x);
  problem.residual = static_cast<const T*>(residual);
  problem.weight = static_cast<const T*>(weight);
  fused::fused_reference<T>(contract, problem, static_cast<T*>(residual_out), static_cast<T*>(out));
}

}  // namespace

extern "C" {

void exactcoll_sim_options_init(exactcoll_sim_options* options) {
  if (options == nullptr) return;
  *options = exactcoll_sim_options{};
  options->struct_size = sizeof(exactcoll_sim_options);
  options->blocks = 1;
  options->seeded_schedule = 0;
  options->schedule_seed = 1;
  options->timeout_ms = 20000;
  options->max_steps = sim::WorldOptions{}.max_steps;
  options->fail_rank = -1;
}

int exactcoll_sim_collective(int op, int algo, int dtype, int ranks, size_t count, const void* inputs, void* outputs,
                             const exactcoll_sim_options* options, exactcoll_call_info* info) {
  return guarded("exactcoll_sim_collective", [&] {
    checked_name(kOpNames, op, "op");
    const DType type = to_dtype(dtype);
    const SimRun run = sim_run(options, ranks);
    if (run.threads > 1) {
      bad_argument("threads is the fused op's; the collectives run one thread per block (threads 0 or 1), got " +
                   std::to_string(run.threads));
    }
    sim::CollectiveSpec spec;
    spec.op = static_cast<sim::Op>(op);  // the registry's values are the C values
    spec.algorithm = sim_algorithm(spec.op, algo);
    spec.dtype = type;
    spec.count = count;
    spec.blocks = run.blocks;
    spec.contract = run.contract;
    const int resolved = static_cast<int>(sim::resolve_algorithm(spec));
    if (count == 0) {
      fill_info(info, resolved, -1, run.blocks);
      return;
    }
    require(inputs, "inputs");
    require(outputs, "outputs");
    if (const std::string problem = sim::check_spec(spec, ranks); !problem.empty()) bad_argument(problem);
    const size_t elem = static_cast<size_t>(dtype_size(type));
    const size_t n = static_cast<size_t>(ranks);
    const size_t out_count = sim::output_count(spec.op, count, ranks);
    product(count, elem, n, "ranks x count");
    product(out_count, elem, n, "ranks x the output count");
    // Traced element indices are per-rank input indices (docs/design.md section 7).
    check_trace_elements(run, count, "input elements per rank");

    sim::World world(run.world);
    std::vector<const void*> in(n);
    std::vector<void*> out(n);
    for (size_t r = 0; r < n; ++r) {
      in[r] = static_cast<const char*>(inputs) + r * count * elem;
      out[r] = static_cast<char*>(outputs) + r * out_count * elem;
    }
    sim::enqueue_collective(world, spec, in, out);
    run_and_trace(world, run, [&] { world.run(); });
    fill_info(info, resolved, -1, run.blocks);
  });
}

int exactcoll_sim_fused_add_rmsnorm(int algo, int contract, int dtype, int ranks, int64_t rows, int64_t hidden,
                                    float eps, const void* x, const void* residual, const void* weight,
                                    void* residual_out, void* out, const exactcoll_sim_options* options,
                                    exactcoll_call_info* info) {
  return guarded("exactcoll_sim_fused_add_rmsnorm", [&] {
    const std::string algo_name = checked_name(kFusedAlgoNames, algo, "fused algo");
    const std::string contract_name = checked_name(kContractNames, contract, "contract");
    const DType type = to_dtype(dtype);
    const SimRun run = sim_run(options, ranks);
    check_fused_shape(type, rows, hidden, eps);

    // 1. The algorithm: the simulator runs every one but nccl_split (push_one_stage as core's kernel,
    //    one_stage_reg and gather_norm as the GPU's, on blocks of the tree's lanes); auto stands for
    //    one_stage (same bits).
    fused::FusedSpec spec;
    spec.dtype = type;
    spec.rows = static_cast<int>(rows);
    spec.hidden = static_cast<int>(hidden);
    spec.eps = eps;
    spec.blocks = run.blocks;
    spec.threads = run.threads;  // checked with the algorithm by check_fused_spec
    int ran = EXACTCOLL_FUSED_ONE_STAGE;
    const auto requested = static_cast<FusedAlgorithm>(algo);  // the registry's values are the C values
    if ((exactcoll::info(requested).runs_on & kOnSimulator) == 0) {
      bad_argument(algo_name + " runs on GPUs only; the simulator runs " + fused_algorithm_names(kOnSimulator) +
                   " (every one gives the same bits)");
    }
    if (requested == FusedAlgorithm::kAuto) {
      spec.algo = FusedAlgorithm::kOneStage;
    } else {
      spec.algo = requested;
      ran = algo;
    }
    const int allreduce_algo = spec.algo == FusedAlgorithm::kUnfused ? EXACTCOLL_ALGO_ONE_SHOT : -1;
    const auto fused_contract = static_cast<fused::Contract>(contract);  // the registry's values are the C values
    // The library's contracts run the algorithms on the simulated world; the emulations are the
    // scalar reference's.
    const bool simulated = exactcoll::info(fused_contract).library_contract;
    if (!simulated && (requested != FusedAlgorithm::kAuto || run.blocks != 1 || run.threads != 0 ||
                       run.world.schedule != sim::Schedule::kThreads || run.world.trace || run.world.fail_rank != -1)) {
      bad_argument("the " + contract_name +
                   " contract is computed by the scalar reference: algo must be auto, and "
                   "blocks, threads, seeded schedules, traces and fault injection apply to the library's contracts (" +
                   library_contract_names() + ") only");
    }
    if (simulated) run_contract_check(fused_contract);
    spec.contract = simulated ? fused_contract : fused::Contract::kCanonical;
    if (rows == 0) {
      fill_info(info, ran, allreduce_algo, run.blocks);
      return;
    }
    require_fused_buffers(x, residual, weight, residual_out, out);
    const size_t elem = static_cast<size_t>(dtype_size(type));
    const size_t count = static_cast<size_t>(rows) * static_cast<size_t>(hidden);
    const size_t n = static_cast<size_t>(ranks);
    product(count, elem, n, "ranks x rows x hidden");
    check_trace_elements(run, count, "elements of a rank's [rows, hidden]");

    // 2. Canonical: the algorithm on the simulated world. Otherwise the alternative contract's
    //    reference, once, copied to every rank (every rank gets the same bits under each).
    if (simulated) {
      if (const std::string problem = fused::check_fused_spec(spec, ranks, run.world.schedule); !problem.empty()) {
        bad_argument(problem);
      }
      sim::World world(run.world);
      fused::FusedIo io;
      fill_fused_io(&io, n, count * elem, x, residual, weight, residual_out, out);
      run_and_trace(world, run, [&] { fused::run_fused(world, spec, io); });
    } else {
      with_storage_type(type, [&](auto tag) {
        reference_rows<decltype(tag)>(fused_contract, ranks, spec.rows, spec.hidden, eps, x, residual, weight,
                                      residual_out, out);
      });
      for (size_t r = 1; r < n; ++r) {
        std::memcpy(static_cast<char*>(residual_out) + r * count * elem, residual_out, count * elem);
        std::memcpy(static_cast<char*>(out) + r * count * elem, out, count * elem);
      }
    }
    fill_info(info, ran, allreduce_algo, run.blocks);
  });
}

void exactcoll_sim_multinode_options_init(exactcoll_sim_multinode_options* options) {
  if (options == nullptr) return;
  *options = exactcoll_sim_multinode_options{};
  options->struct_size = sizeof(exactcoll_sim_multinode_options);
  options->chunk_elements = multinode::kDefaultChunkElements;
}

void exactcoll_sim_multinode_stats_init(exactcoll_sim_multinode_stats* stats) {
  if (stats == nullptr) return;
  *stats = exactcoll_sim_multinode_stats{};
  stats->struct_size = sizeof(exactcoll_sim_multinode_stats);
}

}  // extern "C"

namespace {

// What exactcoll_sim_multinode_collective and _fused_add_rmsnorm check alike: the layout, the
// stats and info structs, exactcoll_sim_options without what a one-node world offers and the
// network of nodes does not (refused, not ignored), and the multi-node options.
struct MultiNodeRun {
  SimRun run;
  exactcoll_sim_multinode_options m;
  multinode::NodeLayout layout;
};

MultiNodeRun multinode_run(int nodes, int ranks_per_node, const exactcoll_sim_options* options,
                           const exactcoll_sim_multinode_options* multinode_options,
                           const exactcoll_sim_multinode_stats* stats, const exactcoll_call_info* info,
                           const char* threads_note) {
  if (nodes < 1 || nodes > 1024) bad_argument("nodes must be 1..1024, got " + std::to_string(nodes));
  if (ranks_per_node < 1 || ranks_per_node > kMaxRanks) {
    bad_argument("ranks_per_node must be 1.." + std::to_string(kMaxRanks) + ", got " + std::to_string(ranks_per_node));
  }
  if (stats != nullptr)
    require_struct_size(stats->struct_size, kFirstMultiNodeStatsSize, "exactcoll_sim_multinode_stats");
  if (info != nullptr) require_struct_size(info->struct_size, sizeof(exactcoll_call_info), "exactcoll_call_info");
  const exactcoll_sim_options given = sim_options(options);
  if (given.fail_rank != -1) {
    bad_argument("fail_rank must be -1: the multi-node simulator kills no rank, got " +
                 std::to_string(given.fail_rank));
  }
  if (given.chrome_trace_path != nullptr) {
    bad_argument("chrome_trace_path must be NULL: the multi-node simulator writes the JSON-lines trace only");
  }
  MultiNodeRun r{sim_run(&given, ranks_per_node), {}, {}};
  if (r.run.threads > 1) bad_argument(std::string(threads_note) + std::to_string(r.run.threads));
  exactcoll_sim_multinode_options_init(&r.m);
  if (multinode_options != nullptr) {
    // The struct as first published is this one; an older caller's shorter struct (once fields
    // are added) keeps the defaults of the fields it lacks.
    require_struct_size(multinode_options->struct_size, kFirstMultiNodeOptionsSize, "exactcoll_sim_multinode_options");
    std::memcpy(static_cast<void*>(&r.m), multinode_options, std::min(multinode_options->struct_size, sizeof r.m));
    r.m.struct_size = sizeof r.m;
  }
  r.layout.nodes = nodes;
  r.layout.local_ranks = ranks_per_node;
  return r;
}

// Refuses a contract that does not run across nodes (the registry's kOnMultiNode).
void multinode_contract_check(Contract c) {
  if ((exactcoll::info(c).runs_on & kOnMultiNode) == 0) {
    bad_argument(std::string("contract ") + contract_name(c) +
                 " runs on one node only (across nodes: " + library_contract_names(kOnMultiNode) + ")");
  }
}

// The stats and info of a multi-node run (exchange: info's note).
void fill_multinode(const MultiNodeRun& r, const multinode::MultiNodeTrace& trace, const char* exchange,
                    exactcoll_sim_multinode_stats* stats, exactcoll_call_info* info) {
  if (stats != nullptr) {
    stats->messages = trace.messages;
    stats->cross_node_bytes = trace.cross_node_bytes;
  }
  if (info != nullptr) {
    exactcoll_call_info_init(info);
    info->algo = -1;
    info->allreduce_algo = -1;
    info->exact = 1;
    info->staged = 1;  // the simulator copies every rank's input into its node's symmetric heap
    info->launches = 1;
    info->blocks = r.run.blocks;
    info->threads = 1;
    std::snprintf(info->note, sizeof info->note, "%s", exchange);
  }
}

// The network's options of a run.
multinode::NetworkOptions network_options(const MultiNodeRun& r) {
  multinode::NetworkOptions net;
  net.layout = r.layout;
  net.schedule = r.run.world.schedule;
  net.seed = r.run.world.schedule_seed;
  net.timeout = r.run.world.wait_timeout;
  net.max_steps = r.run.world.max_steps;
  net.trace = !r.run.trace_path.empty();
  return net;
}

// Runs body (the simulator, filling *trace), writes the trace also after a failed run (it shows how
// far the run got), fills the stats and info, then reports the failure, if any.
template <class Body>
void run_multinode_traced(const MultiNodeRun& r, const char* exchange, exactcoll_sim_multinode_stats* stats,
                          exactcoll_call_info* info, multinode::MultiNodeTrace* trace, Body body) {
  std::string failure;
  exactcoll_status failure_status = EXACTCOLL_OK;
  try {
    body();
  } catch (const sim::SimError& e) {
    failure = e.what();
    failure_status = status_of(e);
  }
  std::string trace_problem;
  if (!r.run.trace_path.empty()) {
    try {
      npy::OutputFiles files({r.run.trace_path});
      files.write(r.run.trace_path, trace->json_lines.data(), trace->json_lines.size());
      files.commit();
    } catch (const npy::NpyError& e) {
      trace_problem = e.what();
    }
  }
  fill_multinode(r, *trace, exchange, stats, info);
  if (!failure.empty()) fail(failure_status, failure);
  if (!trace_problem.empty()) bad_argument("cannot write the trace: " + trace_problem);
}

}  // namespace

extern "C" {

int exactcoll_sim_multinode_collective(int op, int dtype, int nodes, int ranks_per_node, size_t count,
                                       const void* inputs, void* outputs, const exactcoll_sim_options* options,
                                       const exactcoll_sim_multinode_options* multinode_options,
                                       exactcoll_sim_multinode_stats* stats, exactcoll_call_info* info) {
  return guarded("exactcoll_sim_multinode_collective", [&] {
    checked_name(kOpNames, op, "op");
    const DType type = to_dtype(dtype);
    const MultiNodeRun r =
        multinode_run(nodes, ranks_per_node, options, multinode_options, stats, info,
                      "threads is the fused op's; the collectives run one thread per block (threads 0 or 1), got ");
    const SimRun& run = r.run;
    multinode_contract_check(run.contract);
    multinode::MultiNodeSpec spec;
    spec.op = static_cast<Op>(op);  // the registry's values are the C values
    spec.dtype = type;
    spec.count = count;
    spec.blocks = run.blocks;
    spec.chunk_elements = r.m.chunk_elements;
    spec.contract = run.contract;
    const int n = r.layout.world_size();
    // count 0 runs nothing; the rest of the spec is checked as for a count of one element per rank.
    multinode::MultiNodeSpec checked = spec;
    if (count == 0) checked.count = static_cast<size_t>(n);
    if (const std::string problem = multinode::check_multinode_spec(checked, r.layout); !problem.empty()) {
      bad_argument(problem);
    }
    const char* exchange = spec.op == Op::kAllGather          ? "direct_exchange"
                           : spec.contract != Contract::kTree ? "carry_chain"
                           : spec.op == Op::kAllReduce        ? "tree_doubling"
                                                              : "tree_halving";
    if (count == 0) {
      fill_multinode(r, {}, exchange, stats, info);
      return;
    }
    require(inputs, "inputs");
    require(outputs, "outputs");
    const size_t elem = static_cast<size_t>(dtype_size(type));
    const size_t out_count = multinode::output_count(spec.op, count, n);
    product(count, elem, static_cast<size_t>(n), "ranks x count");
    product(out_count, elem, static_cast<size_t>(n), "ranks x the output count");
    // Traced element indices are per-rank input indices (docs/design.md section 7).
    check_trace_elements(run, count, "input elements per rank");

    const multinode::NetworkOptions net = network_options(r);
    std::vector<const void*> in(static_cast<size_t>(n));
    std::vector<void*> out(static_cast<size_t>(n));
    for (size_t i = 0; i < in.size(); ++i) {
      in[i] = static_cast<const char*>(inputs) + i * count * elem;
      out[i] = static_cast<char*>(outputs) + i * out_count * elem;
    }
    multinode::MultiNodeTrace trace;
    run_multinode_traced(r, exchange, stats, info, &trace,
                         [&] { multinode::run_multinode(net, spec, in, out, &trace, run.world.trace_elements); });
  });
}

int exactcoll_sim_multinode_fused_add_rmsnorm(int contract, int dtype, int nodes, int ranks_per_node, int64_t rows,
                                              int64_t hidden, float eps, const void* x, const void* residual,
                                              const void* weight, void* residual_out, void* out,
                                              const exactcoll_sim_options* options,
                                              const exactcoll_sim_multinode_options* multinode_options,
                                              exactcoll_sim_multinode_stats* stats, exactcoll_call_info* info) {
  return guarded("exactcoll_sim_multinode_fused_add_rmsnorm", [&] {
    // The contract is the argument, as for exactcoll_sim_fused_add_rmsnorm (options->contract is
    // not read); across nodes only the library's contracts that run there (the emulations are the
    // one-node reference's).
    checked_name(kContractNames, contract, "contract");
    const auto c = static_cast<Contract>(contract);  // the registry's values are the C values
    multinode_contract_check(c);
    const DType type = to_dtype(dtype);
    exactcoll_sim_options without_contract = sim_options(options);  // its contract is not this call's
    without_contract.contract = EXACTCOLL_CONTRACT_CANONICAL;
    const MultiNodeRun r = multinode_run(
        nodes, ranks_per_node, &without_contract, multinode_options, stats, info,
        "threads must be 0 or 1: the fused op across nodes runs one thread per block (its RMSNorm is local), got ");
    const SimRun& run = r.run;
    check_fused_shape(type, rows, hidden, eps);
    // The multi-node fused op records no element: refused rather than accepted and ignored.
    if (!run.world.trace_elements.empty()) {
      bad_argument("trace_elements must be empty: the fused op across nodes traces messages and node kernels only");
    }
    multinode::MultiNodeFusedSpec spec;
    spec.dtype = type;
    spec.rows = static_cast<int>(rows);
    spec.hidden = static_cast<int>(hidden);
    spec.eps = eps;
    spec.blocks = run.blocks;
    spec.chunk_elements = r.m.chunk_elements;
    spec.contract = c;
    // rows 0 runs nothing; the rest of the spec is checked as for one row.
    multinode::MultiNodeFusedSpec checked = spec;
    if (rows == 0) checked.rows = 1;
    if (const std::string problem = multinode::check_multinode_fused_spec(checked, r.layout); !problem.empty()) {
      bad_argument(problem);
    }
    const char* exchange = c == Contract::kTree ? "tree_doubling" : "carry_chain";
    if (rows == 0) {
      fill_multinode(r, {}, exchange, stats, info);
      return;
    }
    require_fused_buffers(x, residual, weight, residual_out, out);
    const size_t elem = static_cast<size_t>(dtype_size(type));
    const size_t count = static_cast<size_t>(rows) * static_cast<size_t>(hidden);
    const size_t n = static_cast<size_t>(r.layout.world_size());
    product(count, elem, n, "ranks x rows x hidden");

    const multinode::NetworkOptions net = network_options(r);
    multinode::MultiNodeFusedIo io;
    fill_fused_io(&io, n, count * elem, x, residual, weight, residual_out, out);
    multinode::MultiNodeTrace trace;
    run_multinode_traced(r, exchange, stats, info, &trace,
                         [&] { multinode::run_multinode_fused(net, spec, io, &trace); });
  });
}

}  // extern "C"

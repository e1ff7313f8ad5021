#include "tools/overlap/sim_overlap_command.h"

#include <cmath>
#include <cstdio>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "sim/overlap/inputs.h"
#include "sim/overlap/matmul.h"
#include "sim/overlap/overlap_sim.h"
#include "core/overlap_plan.h"
#include "sim/world.h"
#include "tools/cli.h"
#include "tools/sim/sim_subcommands.h"
#include "tools/progress/progress.h"
#include "tools/sha256/sha256.h"
#include "tools/sim/sim_flags.h"

namespace exactcoll::tools {
namespace {

constexpr const char* kCommand = "sim overlap";
constexpr int kSampledElements = 256;

using Bytes = std::vector<uint8_t>;
using overlap::OverlapShape;
using overlap::Pattern;

struct Call {
  std::vector<Bytes> shards, lhs, rhs, gathered, products;
  overlap::OverlapIo io() {
    overlap::OverlapIo out;
    for (size_t r = 0; r < shards.size(); ++r) {
      out.shards.push_back(shards[r].data());
      if (!lhs.empty()) out.lhs.push_back(lhs[r].data());
      out.rhs.push_back(rhs[r].data());
      out.gathered.push_back(gathered[r].data());
      out.products.push_back(products[r].data());
    }
    return out;
  }
};

Call make_call(const OverlapShape& shape, int ranks, uint64_t seed) {
  const size_t esize = static_cast<size_t>(dtype_size(shape.dtype));
  const size_t shard = shape.shard_elements(ranks);
  Call c;
  const Bytes b = overlap::finite_values(shape.dtype, shape.k * shape.n, overlap::rhs_seed(seed));
  for (int r = 0; r < ranks; ++r) {
    c.shards.push_back(overlap::finite_values(shape.dtype, shard, overlap::shard_seed(seed, r)));
    if (shape.pattern == Pattern::kPrefetch) {
      c.lhs.push_back(overlap::finite_values(shape.dtype, shape.m * shape.k, overlap::lhs_seed(seed, r)));
    }
    c.rhs.push_back(b);
    c.gathered.emplace_back(shard * static_cast<size_t>(ranks) * esize, 0xA5);  // poisoned: unwritten bytes show
    c.products.emplace_back(shape.m * shape.n * esize, 0xA5);
  }
  return c;
}

// Returns max over sampled (i, j) of |C - ref| / max(|ref|, rms of the sampled refs).
double sampled_relative_error(const OverlapShape& shape, const void* a, const void* b, const void* c, uint64_t seed) {
  sim::Xoshiro256 g(seed ^ 0x5EED5EEDull);
  std::vector<double> refs, errors;
  for (int s = 0; s < kSampledElements; ++s) {
    const size_t i = g.below(shape.m), j = g.below(shape.n);
    const double ref = overlap::dot_reference(shape.dtype, a, i, shape.k, b, shape.n, j);
    refs.push_back(ref);
    errors.push_back(std::fabs(overlap::element_value(shape.dtype, c, i * shape.n + j) - ref));
  }
  double rms = 0;
  for (double r : refs) rms += r * r;
  rms = std::sqrt(rms / static_cast<double>(refs.size()));
  double worst = 0;
  for (size_t s = 0; s < refs.size(); ++s) {
    const double e = errors[s] / std::max(std::fabs(refs[s]), rms);
    worst = std::isnan(e) ? INFINITY : std::max(worst, e);
  }
  return worst;
}

std::string digest_of(const std::vector<Bytes>& per_rank) {
  Sha256 h;
  for (const Bytes& b : per_rank) h.update(b.data(), b.size());
  return h.hex_digest();
}

// What `sim overlap` was asked for: the flags' values (make_parser), then what check_flags
// resolves them to.
struct Request {
  SimFlags flags;
  std::string pattern_text = "ag_matmul", products_text = "per_shard";
  int64_t m = 256, k = 128, n = 192, gather_count = 4096, seed = 1, comm_streams = 2, calls = 1;
  bool print_plan = false, no_check = false;
  // Resolved by check_flags.
  sim::WorldOptions options;
  OverlapShape shape;
  int ranks = 0;
};

// The command's flags, bound to q's fields.
cli::ArgParser make_parser(Request* q) {
  cli::ArgParser parser(
      "exactcoll sim overlap --ranks N [--pattern ag_matmul|prefetch] [--products per_shard|merged|pairs] "
      "[--dtype bf16|fp16|fp32] [--m M --k K --n N] [--gather-count C] [--seed S] [--comm-streams S] [--calls K] "
      "[--plan] [--no-check] [--schedule threads|seeded] [--schedule-seed K] [--trace FILE] [--chrome-trace FILE]",
      "Runs the all-gather + matmul overlap schedule on simulated ranks. ag_matmul: C = allgather(A) @ B, A [m, k] "
      "sharded by rows, the local shard multiplied first while peers' shards are pulled (get protocol) in the order "
      "rank+1, rank+2, ... on alternating comm streams; the peers' rows in one product per shard (per_shard), in one "
      "product per contiguous row block of C (merged: the shards after the local one, then those before it), or in "
      "products of at most two shards (pairs); each product waits for every shard it covers. prefetch: an all-gather "
      "of --gather-count elements per rank beside an unrelated product X [m, k] @ W [k, n]. Products: Eigen, float "
      "accumulation, one rounding. Checks every rank's gathered A bit for bit against the shards, C bit for bit "
      "against the unpipelined schedule with the same row blocks, and sampled elements of C against float64. Traces "
      "show every step per rank (pid) and stream (block 0.. = comm streams, the last block = compute).");
  WorldFlagSet set;
  set.element_traces = false;  // the schedules copy and multiply, fold nothing
  add_world_flags(parser, &q->flags, set);
  parser.add_choice("pattern", &q->pattern_text, {"ag_matmul", "prefetch"}, "which schedule");
  parser.add_choice("products", &q->products_text, {"per_shard", "merged", "pairs"},
                    "ag_matmul: how the peers' rows are grouped into products");
  parser.add_int("m", &q->m, "rows of A (ag_matmul: all shards together; a multiple of --ranks) or of X (prefetch)");
  parser.add_int("k", &q->k, "inner dimension");
  parser.add_int("n", &q->n, "columns of B and C");
  parser.add_int("gather-count", &q->gather_count, "prefetch: elements per rank all-gathered");
  parser.add_int("seed", &q->seed, "seed of the random operands (values uniform in [-2, 2))");
  parser.add_int("comm-streams", &q->comm_streams, "communication streams (pulls alternate over them)");
  parser.add_int("calls", &q->calls, "consecutive calls, each with fresh operands (seed, seed+1, ...)");
  parser.add_bool("plan", &q->print_plan, "print every rank's plan (streams and their operations)");
  parser.add_bool("no-check", &q->no_check, "skip the checks (bits vs shards and unpipelined, float64 samples)");
  return parser;
}

// Checks the parsed flags (the shape against the ranks, the memory every call needs) and resolves
// q's remaining fields. Returns nullopt to go on, or the exit code to return now (the message
// printed).
std::optional<int> check_flags(const cli::ArgParser& parser, Request* q) {
  const int64_t m = q->m, k = q->k, n = q->n, gather_count = q->gather_count, seed = q->seed,
                comm_streams = q->comm_streams, calls = q->calls;
  sim::WorldOptions& options = q->options;
  OverlapShape& shape = q->shape;
  if (std::string problem = world_options(q->flags, parser, &options); !problem.empty())
    return cli::fail(kCommand, problem);
  overlap::parse_pattern(q->pattern_text, &shape.pattern);
  overlap::parse_grouping(q->products_text, &shape.grouping);
  shape.dtype = *parse_dtype(q->flags.dtype);
  if (m < 1 || k < 1 || n < 1) return cli::fail(kCommand, "--m, --k and --n must be at least 1");
  if (gather_count < 1) return cli::fail(kCommand, "--gather-count must be at least 1");
  if (seed < 0) return cli::fail(kCommand, "--seed must be >= 0");
  if (comm_streams < 1 || comm_streams > 8) return cli::fail(kCommand, "--comm-streams must be 1..8");
  if (calls < 1 || calls > 1000) return cli::fail(kCommand, "--calls must be 1..1000");
  shape.m = static_cast<size_t>(m);
  shape.k = static_cast<size_t>(k);
  shape.n = static_cast<size_t>(n);
  shape.gather_count = static_cast<size_t>(gather_count);
  const int ranks = options.ranks;
  q->ranks = ranks;
  if (std::string problem = overlap::check_shape(shape, ranks); !problem.empty()) return cli::fail(kCommand, problem);
  {
    // Every call's operands and results (shards, X, B, gathered A, C per rank), twice for the
    // world's heaps and the unpipelined check. Dimensions are bounded first, so that the products
    // below cannot overflow.
    constexpr int64_t kMaxDimension = int64_t{1} << 31;
    if (m > kMaxDimension || k > kMaxDimension || n > kMaxDimension || gather_count > kMaxDimension) {
      return cli::fail(kCommand, "--m, --k, --n and --gather-count must be at most 2^31");
    }
    using Wide = unsigned __int128;
    const Wide mk = Wide(m) * Wide(k), kn = Wide(k) * Wide(n), mn = Wide(m) * Wide(n);
    const Wide per_call = Wide(dtype_size(shape.dtype)) * (mk + Wide(ranks) * (2 * mk + kn + mn + Wide(gather_count)));
    const Wide bytes = 2 * per_call * Wide(calls);
    if (std::string problem = cli::check_memory(bytes > UINT64_MAX ? UINT64_MAX : static_cast<uint64_t>(bytes),
                                                "the operands and results of " + std::to_string(calls) + " call(s)");
        !problem.empty()) {
      return cli::fail(kCommand, problem);
    }
  }
  return std::nullopt;
}

// Step 1 of run: the pipelined schedule, q.calls calls on one world, into *work; the traces
// written (a failed run's too). Returns nullopt to go on, or the exit code to return now (the
// message printed).
std::optional<int> run_calls(const Request& q, npy::OutputFiles* files, std::vector<Call>* work_out) {
  const OverlapShape& shape = q.shape;
  const sim::WorldOptions& options = q.options;
  std::vector<Call>& work = *work_out;
  for (int64_t c = 0; c < q.calls; ++c) work.push_back(make_call(shape, q.ranks, static_cast<uint64_t>(q.seed + c)));
  std::optional<sim::World> world;
  std::string failure;
  int failure_code = cli::kExitFailure;
  try {
    world.emplace(options);
    overlap::OverlapSim ov(*world, static_cast<int>(q.comm_streams));
    for (Call& c : work) ov.enqueue(shape, c.io());
    ProgressBar bar("sim overlap", [&world] { return world->progress(); });
    world->run();
    failure = unreached_fault(options, *world);
    if (!failure.empty()) failure_code = cli::kExitUsage;
  } catch (const sim::SimError& e) {
    failure = e.what();
  }
  // The traces show what happened, a failed run's too.
  try {
    if (world) write_traces(q.flags, *world, *files);
    files->commit();
  } catch (const npy::NpyError& e) {
    return cli::fail(kCommand, e.what(), cli::kExitFailure);
  }
  if (!failure.empty()) return cli::fail(kCommand, failure, failure_code);
  return std::nullopt;
}

// Step 2 of run: every call's gathered A against the shards and C against the unpipelined
// schedule (bit for bit, differences named on stderr), rank 0's C against float64 on sampled
// elements. Returns the summary's check line; *ok: everything held.
std::string check_calls(const Request& q, const std::vector<Call>& work, bool* ok) {
  const OverlapShape& shape = q.shape;
  const int ranks = q.ranks;
  std::ostringstream out;
  double worst = 0;
  int gather_bad = 0, product_bad = 0;
  for (size_t c = 0; c < work.size(); ++c) {
    Call ref = work[c];
    sim::WorldOptions ref_options;
    ref_options.ranks = ranks;
    sim::World ref_world(ref_options);
    overlap::run_unpipelined(ref_world, shape, ref.io());
    Bytes expected;
    for (const Bytes& s : work[c].shards) expected.insert(expected.end(), s.begin(), s.end());
    for (int r = 0; r < ranks; ++r) {
      const size_t i = static_cast<size_t>(r);
      if (work[c].gathered[i] != expected) {
        ++gather_bad;
        std::cerr << "exactcoll sim overlap: call " << c << ", rank " << r << ": gathered A differs from the shards\n";
      }
      if (work[c].products[i] != ref.products[i]) {
        ++product_bad;
        std::cerr << "exactcoll sim overlap: call " << c << ", rank " << r
                  << ": C differs from the unpipelined schedule\n";
      }
    }
    const void* a = shape.pattern == Pattern::kAgMatmul ? static_cast<const void*>(expected.data())
                                                        : static_cast<const void*>(work[c].lhs[0].data());
    worst = std::max(worst, sampled_relative_error(shape, a, work[c].rhs[0].data(), work[c].products[0].data(),
                                                   static_cast<uint64_t>(q.seed) + c));
  }
  const double tolerance = shape.dtype == DType::kBF16 ? 1e-2 : shape.dtype == DType::kFP16 ? 2e-3 : 1e-5;
  const bool close = worst <= tolerance;
  *ok = gather_bad == 0 && product_bad == 0 && close;
  char err[32];
  std::snprintf(err, sizeof err, "%.3g", worst);
  out << "check: gathered A " << (gather_bad == 0 ? "identical to the shards" : "DIFFERS from the shards")
      << " on every rank and call (bitwise); C "
      << (product_bad == 0 ? "identical to the unpipelined schedule" : "DIFFERS from the unpipelined schedule")
      << " (bitwise); rank 0's C vs float64 on " << kSampledElements
      << " sampled elements per call: max relative error " << err << (close ? " (within " : " (OVER ") << tolerance
      << ")\n";
  return out.str();
}

int run(int argc, char** argv) {
  Request q;
  cli::ArgParser parser = make_parser(&q);
  if (auto code = parser.parse(argc, argv)) return *code;
  if (auto code = check_flags(parser, &q)) return *code;
  const OverlapShape& shape = q.shape;
  const int ranks = q.ranks;

  if (q.print_plan) {
    for (int r = 0; r < ranks; ++r) {
      std::cout << "rank " << r << ":\n"
                << overlap::plan_text(
                       overlap::make_plan(shape.pattern, r, ranks, static_cast<int>(q.comm_streams), shape.grouping));
    }
  }

  // The traces, reserved before any work (an unwritable path is bad input).
  const auto files = reserve_outputs(kCommand, trace_paths(q.flags));
  if (!files) return cli::kExitUsage;

  // 1. The pipelined schedule, `calls` calls on one world.
  std::vector<Call> work;
  if (auto code = run_calls(q, files.get(), &work)) return *code;

  // 2. Checks and the summary.
  std::ostringstream out;
  out << "sim overlap " << overlap::pattern_name(shape.pattern) << " " << q.flags.dtype << ": " << ranks
      << " ranks, m=" << q.m << " k=" << q.k << " n=" << q.n;
  if (shape.pattern == Pattern::kAgMatmul) out << ", products " << overlap::grouping_name(shape.grouping);
  if (shape.pattern == Pattern::kPrefetch) out << ", all-gather of " << q.gather_count << " elements per rank";
  out << ", " << q.comm_streams << " comm streams, " << schedule_note(q.options) << ", " << q.calls << " call(s)\n";
  bool ok = true;
  if (!q.no_check) out << check_calls(q, work, &ok);
  const Call& last = work.back();
  out << "last call: gathered A sha256 " << digest_of(last.gathered) << ", C sha256 " << digest_of(last.products)
      << "\n";
  std::cout << out.str();
  return ok ? cli::kExitOk : cli::kExitDiffer;
}

}  // namespace

int sim_overlap_main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    return cli::fail(kCommand, e.what(), cli::kExitFailure);
  }
}

namespace {

const cli::SimSubcommandRegistrar kRegistrar(
    {"overlap", "all-gather + matmul overlap: pipelined AG->matmul (get protocol) or a prefetch beside a product",
     sim_overlap_main});

}  // namespace
}  // namespace exactcoll::tools

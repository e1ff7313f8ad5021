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

int run(int argc, char** argv) {
  SimFlags flags;
  std::string pattern_text = "ag_matmul", products_text = "per_shard";
  int64_t m = 256, k = 128, n = 192, gather_count = 4096, seed = 1, comm_streams = 2, calls = 1;
  bool print_plan = false, no_check = false;
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
  add_world_flags(parser, &flags, set);
  parser.add_choice("pattern", &pattern_text, {"ag_matmul", "prefetch"}, "which schedule");
  parser.add_choice("products", &products_text, {"per_shard", "merged", "pairs"},
                    "ag_matmul: how the peers' rows are grouped into products");
  parser.add_int("m", &m, "rows of A (ag_matmul: all shards together; a multiple of --ranks) or of X (prefetch)");
  parser.add_int("k", &k, "inner dimension");
  parser.add_int("n", &n, "columns of B and C");
  parser.add_int("gather-count", &gather_count, "prefetch: elements per rank all-gathered");
  parser.add_int("seed", &seed, "seed of the random operands (values uniform in [-2, 2))");
  parser.add_int("comm-streams", &comm_streams, "communication streams (pulls alternate over them)");
  parser.add_int("calls", &calls, "consecutive calls, each with fresh operands (seed, seed+1, ...)");
  parser.add_bool("plan", &print_plan, "print every rank's plan (streams and their operations)");
  parser.add_bool("no-check", &no_check, "skip the checks (bits vs shards and unpipelined, float64 samples)");
  if (auto code = parser.parse(argc, argv)) return *code;

  sim::WorldOptions options;
  if (std::string problem = world_options(flags, parser, &options); !problem.empty())
    return cli::fail(kCommand, problem);
  OverlapShape shape;
  overlap::parse_pattern(pattern_text, &shape.pattern);
  overlap::parse_grouping(products_text, &shape.grouping);
  shape.dtype = *parse_dtype(flags.dtype);
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

  if (print_plan) {
    for (int r = 0; r < ranks; ++r) {
      std::cout << "rank " << r << ":\n"
                << overlap::plan_text(
                       overlap::make_plan(shape.pattern, r, ranks, static_cast<int>(comm_streams), shape.grouping));
    }
  }

  // The traces, reserved before any work (an unwritable path is bad input).
  const auto files = reserve_outputs(kCommand, trace_paths(flags));
  if (!files) return cli::kExitUsage;

  // 1. The pipelined schedule, `calls` calls on one world.
  std::vector<Call> work;
  for (int64_t c = 0; c < calls; ++c) work.push_back(make_call(shape, ranks, static_cast<uint64_t>(seed + c)));
  std::optional<sim::World> world;
  std::string failure;
  int failure_code = cli::kExitFailure;
  try {
    world.emplace(options);
    overlap::OverlapSim ov(*world, static_cast<int>(comm_streams));
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
    if (world) write_traces(flags, *world, *files);
    files->commit();
  } catch (const npy::NpyError& e) {
    return cli::fail(kCommand, e.what(), cli::kExitFailure);
  }
  if (!failure.empty()) return cli::fail(kCommand, failure, failure_code);

  // 2. Checks and the summary.
  std::ostringstream out;
  out << "sim overlap " << overlap::pattern_name(shape.pattern) << " " << flags.dtype << ": " << ranks
      << " ranks, m=" << m << " k=" << k << " n=" << n;
  if (shape.pattern == Pattern::kAgMatmul) out << ", products " << overlap::grouping_name(shape.grouping);
  if (shape.pattern == Pattern::kPrefetch) out << ", all-gather of " << gather_count << " elements per rank";
  out << ", " << comm_streams << " comm streams, " << schedule_note(options) << ", " << calls << " call(s)\n";
  bool ok = true;
  if (!no_check) {
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
          std::cerr << "exactcoll sim overlap: call " << c << ", rank " << r
                    << ": gathered A differs from the shards\n";
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
                                                     static_cast<uint64_t>(seed) + c));
    }
    const double tolerance = shape.dtype == DType::kBF16 ? 1e-2 : shape.dtype == DType::kFP16 ? 2e-3 : 1e-5;
    const bool close = worst <= tolerance;
    ok = gather_bad == 0 && product_bad == 0 && close;
    char err[32];
    std::snprintf(err, sizeof err, "%.3g", worst);
    out << "check: gathered A " << (gather_bad == 0 ? "identical to the shards" : "DIFFERS from the shards")
        << " on every rank and call (bitwise); C "
        << (product_bad == 0 ? "identical to the unpipelined schedule" : "DIFFERS from the unpipelined schedule")
        << " (bitwise); rank 0's C vs float64 on " << kSampledElements
        << " sampled elements per call: max relative error " << err << (close ? " (within " : " (OVER ") << tolerance
        << ")\n";
  }
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

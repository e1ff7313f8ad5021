// `exactcoll sim-bench`: how fast the simulator is, against the machine's memcpy.
//
//   exactcoll sim-bench [--ranks 8] [--mib 16] [--dtype bf16] [--algo auto] [--blocks 1]
//       [--schedule threads] [--iters 5]
//
// Times an all-reduce of --ranks ranks x --mib MiB each (the staging copy of every input
// included, as a GPU run without registered buffers does) and one memcpy of all input plus output
// bytes (ranks x MiB x 2) on the same machine; prints the medians and their ratio. The issue's
// target: ratio <= 4 for bf16, 8 ranks x 16 MiB, threads scheduler (docs/benchmarks.md).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "core/storage.h"
#include "sim/collectives.h"
#include "sim/prng.h"
#include "sim/world.h"
#include "tools/cli.h"
#include "tools/sha256/sha256.h"
#include "tools/sim/sim_flags.h"
#include "tools/stats/median.h"

namespace exactcoll::tools {
namespace {

using stats::median;

// Moderate finite values of random sign, exponent and mantissa (no NaN or inf: their sums are
// no cheaper or dearer, but a benchmark of NaNs would be a strange benchmark).
void fill_random(DType d, uint64_t seed, std::vector<uint8_t>* bytes) {
  sim::Xoshiro256 g(seed);
  if (d == DType::kFP32) {
    for (size_t i = 0; i + 4 <= bytes->size(); i += 4) {
      const uint64_t r = g.next();
      const uint32_t v = static_cast<uint32_t>(r & 0x807FFFFFu) | static_cast<uint32_t>(120 + (r >> 40) % 16) << 23;
      std::memcpy(bytes->data() + i, &v, 4);
    }
    return;
  }
  const int mant = d == DType::kBF16 ? 7 : 10;
  const uint32_t bias = d == DType::kBF16 ? 127 : 15;
  for (size_t i = 0; i + 2 <= bytes->size(); i += 2) {
    const uint64_t r = g.next();
    const uint32_t e = bias - 8 + static_cast<uint32_t>((r >> 32) % 16);
    const uint16_t v = static_cast<uint16_t>((r & 0x8000u) | (e << mant) | (r & ((1u << mant) - 1)));
    std::memcpy(bytes->data() + i, &v, 2);
  }
}

int sim_bench_main(int argc, char** argv) {
  const std::string command = "sim-bench";
  SimFlags f;
  f.ranks = 8;
  int64_t mib = 16, iters = 5, blocks = 1;
  std::string algo_text = "auto";
  cli::ArgParser parser(
      "exactcoll sim-bench [--ranks 8] [--mib 16] [--dtype bf16] [--algo auto] [--blocks 1] "
      "[--iters 5]",
      "Times a simulated all-reduce of --ranks x --mib MiB (threads scheduler) against one memcpy\n"
      "of all input plus output bytes; prints the medians and their ratio.");
  WorldFlagSet set;
  set.traces = false;  // a timing run writes no trace, and a killed rank would only end it
  set.faults = false;
  add_world_flags(parser, &f, set);
  parser.add_int("mib", &mib, "MiB of input per rank");
  parser.add_choice("algo", &algo_text, algorithm_name_list(kOnSimulator, Op::kAllReduce), "all-reduce algorithm");
  parser.add_int("blocks", &blocks, "blocks per rank");
  parser.add_int("iters", &iters, "timed iterations (after one warm-up)");
  if (auto code = parser.parse(argc, argv)) return *code;
  sim::WorldOptions options;
  std::string problem = world_options(f, parser, &options);
  if (!problem.empty()) return cli::fail(command, problem);
  if (mib < 1 || mib > 4096) return cli::fail(command, "--mib must be 1..4096");
  if (iters < 1 || iters > 1000) return cli::fail(command, "--iters must be 1..1000");
  const DType dtype = *parse_dtype(f.dtype);
  const size_t esize = static_cast<size_t>(dtype_size(dtype));
  const int n = options.ranks;
  const size_t bytes_per_rank = static_cast<size_t>(mib) << 20;

  sim::CollectiveSpec spec;
  spec.dtype = dtype;
  spec.count = bytes_per_rank / esize;
  spec.blocks = static_cast<int>(blocks);
  if (!sim::parse_algorithm(algo_text, &spec.algorithm)) return cli::fail(command, "unknown --algo " + algo_text);
  problem = sim::check_spec(spec, n);
  if (problem.empty()) {
    // Inputs, outputs, the world's input staging and scratch, and the memcpy's source and destination.
    const uint64_t bytes = static_cast<uint64_t>(n) * (7 * bytes_per_rank + sim::scratch_bytes(spec, n));
    problem =
        cli::check_memory(bytes, "the buffers of " + std::to_string(n) + " ranks x " + std::to_string(mib) + " MiB");
  }
  if (!problem.empty()) return cli::fail(command, problem);

  // 1. Inputs and outputs, touched once so that page faults are not timed.
  std::vector<std::vector<uint8_t>> in(n, std::vector<uint8_t>(bytes_per_rank));
  std::vector<std::vector<uint8_t>> out(n, std::vector<uint8_t>(bytes_per_rank, 0));
  for (int r = 0; r < n; ++r) fill_random(dtype, 1000 + static_cast<uint64_t>(r), &in[r]);
  std::vector<const void*> inputs;
  std::vector<void*> outputs;
  for (int r = 0; r < n; ++r) {
    inputs.push_back(in[r].data());
    outputs.push_back(out[r].data());
  }

  // 2. The all-reduce: one warm-up (sizes the heaps, exchanges handles), then timed runs.
  std::cerr << "sim-bench: " << n << " ranks x " << mib << " MiB " << f.dtype << ", " << algo_text << ", " << blocks
            << (blocks == 1 ? " block" : " blocks") << ": 1 warm-up and " << iters
            << " timed all-reduces, then as many memcpys" << std::endl;
  std::optional<sim::World> world;
  std::vector<double> sim_ms;
  for (int64_t i = 0; i <= iters; ++i) {
    const auto start = std::chrono::steady_clock::now();
    try {
      if (!world) world.emplace(options);
      sim::enqueue_collective(*world, spec, inputs, outputs);
      world->run();
    } catch (const sim::SimError& e) {
      return cli::fail(command, e.what(), cli::kExitFailure);
    }

    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (i > 0) sim_ms.push_back(ms);
  }
  if (const std::string fault = unreached_fault(options, *world); !fault.empty()) return cli::fail(command, fault);
  for (int r = 1; r < n; ++r) {
    if (out[r] != out[0]) return cli::fail(command, "ranks 0 and " + std::to_string(r) + " differ", cli::kExitFailure);
  }

  // 3. One memcpy of all input plus output bytes.
  const size_t copy_bytes = 2 * static_cast<size_t>(n) * bytes_per_rank;
  std::vector<uint8_t> src(copy_bytes, 1), dst(copy_bytes, 0);
  std::vector<double> copy_ms;
  for (int64_t i = 0; i <= iters; ++i) {
    const auto start = std::chrono::steady_clock::now();
    std::memcpy(dst.data(), src.data(), copy_bytes);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (i > 0) copy_ms.push_back(ms);
    src[static_cast<size_t>(i) % copy_bytes] ^= dst[copy_bytes - 1];  // keep the copy observable
  }

  const double sim_median = median(sim_ms), copy_median = median(copy_ms);
  const std::string algo = sim::algorithm_name(sim::resolve_algorithm(spec));
  std::printf(
      "sim-bench: allreduce %s, %d ranks x %lld MiB (%zu elements per rank), %s%s, %d block%s, %s, %lld "
      "iterations\n",
      f.dtype.c_str(), n, static_cast<long long>(mib), spec.count, algo.c_str(),
      spec.algorithm == sim::Algorithm::kAuto ? " (auto)" : "", spec.blocks, spec.blocks == 1 ? "" : "s",
      schedule_note(options).c_str(), static_cast<long long>(iters));
  std::printf("  simulated all-reduce       median %9.2f ms  min %9.2f ms\n", sim_median,
              *std::min_element(sim_ms.begin(), sim_ms.end()));
  std::printf("  memcpy of %5zu MiB         median %9.2f ms  min %9.2f ms  (%.1f GB/s; all input plus output bytes)\n",
              copy_bytes >> 20, copy_median, *std::min_element(copy_ms.begin(), copy_ms.end()),
              static_cast<double>(copy_bytes) / copy_median / 1e6);
  std::printf("  ratio (all-reduce / memcpy) %.2f   (target <= 4)\n", sim_median / copy_median);
  std::printf("  output sha256 (rank 0) %s\n", sha256_hex(out[0].data(), out[0].size()).c_str());
  return cli::kExitOk;
}

const cli::Registrar kSimBench({"sim-bench", "time the simulator's all-reduce against memcpy", sim_bench_main});

}  // namespace
}  // namespace exactcoll::tools

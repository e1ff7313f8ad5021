// core/fused_rmsnorm_kernels.h's gather_norm, one_stage_reg, push_one_stage_reg and lamport_one_stage_reg on the
// simulator
// (sim/fused/fused_sim.h: blocks of several threads, sim/block_threads.h): every rank's residual_out
// and out against the scalar reference (sim/fused/reference.h) bit for bit, on the register path
// (threads == the RMSNorm tree's lanes; 1 and 2 packs a thread) and on core's path (other thread
// counts, and 4 packs a thread), for bf16, fp16 and fp32, world sizes 1, 2, 3, 4 and 8, rows fewer
// and more than ranks x blocks, under the threads scheduler and seeded schedules (which also draw
// the order of a block's threads). Inputs carry NaN payloads, infinities, overflowing sums,
// subnormal rows and (every third seed) a NaN, inf and -0 weight (tools/inputs/fused_inputs.h).
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/contract.h"
#include "core/fused_rmsnorm.h"
#include "core/fused_rmsnorm_kernels.h"
#include "sim/fused/fused_sim.h"
#include "sim/fused/reference.h"
#include "sim/world.h"
#include "tools/inputs/fused_inputs.h"

namespace exactcoll::fused {
namespace {

constexpr FusedAlgorithm kKernels[] = {FusedAlgorithm::kGatherNorm, FusedAlgorithm::kOneStageReg,
                                       FusedAlgorithm::kPushOneStageReg};
constexpr DType kDtypes[] = {DType::kBF16, DType::kFP16, DType::kFP32};

int pack_of(DType dtype) { return 16 / dtype_size(dtype); }

// Every rank's outputs, as bytes.
struct Outputs {
  std::vector<std::vector<uint8_t>> residual_out, out;
};

// The contract's outputs (the same on every rank) by the scalar reference.
template <class T>
void reference_typed(const gpu::FusedInputs& in, float eps, std::vector<uint8_t>* ro, std::vector<uint8_t>* out) {
  const size_t count = in.count();
  std::vector<T> x(count * static_cast<size_t>(in.ranks)), residual(count), weight(static_cast<size_t>(in.hidden));
  std::vector<T> r(count), y(count);
  for (int k = 0; k < in.ranks; ++k) std::memcpy(x.data() + k * count, in.x[k].data(), count * sizeof(T));
  std::memcpy(residual.data(), in.residual.data(), count * sizeof(T));
  std::memcpy(weight.data(), in.weight.data(), weight.size() * sizeof(T));
  FusedProblem<T> p;
  p.ranks = in.ranks, p.rows = in.rows, p.hidden = in.hidden, p.eps = eps;
  p.x = x.data(), p.residual = residual.data(), p.weight = weight.data();
  fused_reference<T>(Contract::kCanonical, p, r.data(), y.data());
  ro->assign(reinterpret_cast<const uint8_t*>(r.data()),
             reinterpret_cast<const uint8_t*>(r.data()) + count * sizeof(T));
  out->assign(reinterpret_cast<const uint8_t*>(y.data()),
              reinterpret_cast<const uint8_t*>(y.data()) + count * sizeof(T));
}

// Returns "" when got equals want bit for bit, else how many elements differ and the first one.
std::string compare(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want, int elem) {
  if (got.size() != want.size()) return "sizes differ";
  size_t differing = 0, first = 0;
  for (size_t i = 0; i < got.size(); i += static_cast<size_t>(elem)) {
    if (std::memcmp(got.data() + i, want.data() + i, static_cast<size_t>(elem)) != 0 && differing++ == 0) first = i;
  }
  if (differing == 0) return "";
  auto bits = [elem](const uint8_t* p) {
    uint32_t v = 0;
    std::memcpy(&v, p, static_cast<size_t>(elem));
    char buf[16];
    std::snprintf(buf, sizeof buf, elem == 2 ? "0x%04x" : "0x%08x", v);
    return std::string(buf);
  };
  return std::to_string(differing) + " elements differ, the first at " + std::to_string(first / elem) + ": got " +
         bits(got.data() + first) + ", want " + bits(want.data() + first);
}

struct Case {
  FusedAlgorithm algo;
  DType dtype;
  int ranks, rows, hidden, blocks, threads;  // threads 0: the default (the register path where it fits)
  sim::Schedule schedule = sim::Schedule::kThreads;
  uint64_t schedule_seed = 1;
  uint64_t input_seed = 1;

  std::string what() const {
    FusedSpec s = spec();
    return std::string(fused_algorithm_name(algo)) + " " + dtype_name(dtype) + " ranks=" + std::to_string(ranks) +
           " rows=" + std::to_string(rows) + " H=" + std::to_string(hidden) + " blocks=" + std::to_string(blocks) +
           " threads=" + std::to_string(fused_threads(s)) +
           (fused_register_path(s) ? " (register path)" : " (core path)") + " " + sim::schedule_name(schedule) +
           " seed " + std::to_string(schedule_seed);
  }
  FusedSpec spec() const {
    FusedSpec s;
    s.algo = algo;
    s.dtype = dtype;
    s.rows = rows;
    s.hidden = hidden;
    s.blocks = blocks;
    s.threads = threads;
    return s;
  }
};

// Runs c on a fresh world; returns every rank's outputs.
Outputs run_case(const Case& c, const gpu::FusedInputs& in) {
  sim::WorldOptions options;
  options.ranks = c.ranks;
  options.schedule = c.schedule;
  options.schedule_seed = c.schedule_seed;
  sim::World world(options);
  const size_t bytes = in.count() * static_cast<size_t>(dtype_size(c.dtype));
  Outputs o;
  FusedIo io;
  for (int r = 0; r < c.ranks; ++r) {
    o.residual_out.emplace_back(bytes);
    o.out.emplace_back(bytes);
  }
  for (int r = 0; r < c.ranks; ++r) {
    io.x.push_back(in.x[r].data());
    io.residual.push_back(in.residual.data());
    io.weight.push_back(in.weight.data());
    io.residual_out.push_back(o.residual_out[r].data());
    io.out.push_back(o.out[r].data());
  }
  run_fused(world, c.spec(), io);
  return o;
}

// Runs c and checks every rank's both outputs against the reference.
void check(const Case& c) {
  const gpu::FusedInputs in = gpu::make_fused_inputs(c.dtype, c.ranks, c.rows, c.hidden, c.input_seed, true);
  const float eps = 1e-6f;
  std::vector<uint8_t> want_ro, want_out;
  switch (c.dtype) {
    case DType::kBF16: reference_typed<bf16>(in, eps, &want_ro, &want_out); break;
    case DType::kFP16: reference_typed<fp16>(in, eps, &want_ro, &want_out); break;
    case DType::kFP32: reference_typed<float>(in, eps, &want_ro, &want_out); break;
  }
  const Outputs got = run_case(c, in);
  for (int r = 0; r < c.ranks; ++r) {
    EXPECT_EQ(compare(got.residual_out[r], want_ro, dtype_size(c.dtype)), "")
        << c.what() << ", rank " << r << " residual_out";
    EXPECT_EQ(compare(got.out[r], want_out, dtype_size(c.dtype)), "") << c.what() << ", rank " << r << " out";
  }
}

// Every kernel x dtype x world size, on the register path (the default threads: the tree's lanes,
// one pack a thread) and on core's path (4 threads, and 64 where the tree has 32 lanes: the GPU's
// default grid there), rows fewer and more than ranks x blocks, 1 and 3 blocks.
TEST(FusedKernelsSim, ThreadsScheduleMatchesTheReference) {
  uint64_t seed = 100;
  for (FusedAlgorithm algo : kKernels) {
    for (DType dtype : kDtypes) {
      const int P = pack_of(dtype);
      for (int ranks : {1, 2, 3, 4, 8}) {
        for (int hidden : {5 * P, 40 * P}) {  // lanes 32 (one group) and 64 (two groups)
          std::vector<int> thread_counts = {0, 4};
          if (hidden == 5 * P) thread_counts.push_back(64);
          for (int threads : thread_counts) {
            check({algo, dtype, ranks, ranks == 1 ? 3 : 2, hidden, 1, threads, sim::Schedule::kThreads, 1, ++seed});
            check({algo, dtype, ranks, 7, hidden, 3, threads, sim::Schedule::kThreads, 1, ++seed});
          }
        }
      }
    }
  }
}

// Rows of more than 1024 packs: the tree has 1024 lanes; 2 packs a thread is the register path's
// widest, 4 packs a thread (more than 2048 packs) takes core's path with 1024 threads.
TEST(FusedKernelsSim, WideRowsTakeTheRegisterPathUpTo2048Packs) {
  uint64_t seed = 500;
  for (FusedAlgorithm algo : kKernels) {
    for (DType dtype : {DType::kBF16, DType::kFP32}) {
      const int P = pack_of(dtype);
      for (int packs : {1500, 2056}) {
        const Case c{algo, dtype, 2, 2, packs * P, 1, 0, sim::Schedule::kThreads, 1, ++seed};
        EXPECT_EQ(fused_register_path(c.spec()), packs <= 2048) << c.what();
        EXPECT_EQ(fused_threads(c.spec()), 1024);
        check(c);
      }
    }
  }
}

// Seeded schedules: the flags' interleavings and the order of every block's threads drawn from the
// seed; register path and core's path; 2, 3 and 4 ranks, 2 blocks.
TEST(FusedKernelsSim, SeededSchedulesMatchTheReference) {
  uint64_t input_seed = 900;
  for (FusedAlgorithm algo : kKernels) {
    for (DType dtype : kDtypes) {
      const int P = pack_of(dtype);
      for (int ranks : {2, 3, 4}) {
        for (int threads : {0, 3}) {
          for (uint64_t s = 1; s <= 4; ++s) {
            check({algo, dtype, ranks, 5, 5 * P, 2, threads, sim::Schedule::kSeeded, s * 7919 + ranks, ++input_seed});
          }
        }
      }
    }
  }
}

// fused_rmsnorm_lamport_reg (the GPU's lamport_one_stage and lamport_two_stage kernels) on blocks
// of threads, each algorithm: the register
// path with one lane a thread (threads == the tree's lanes: 32 and 64, so several warps' groups)
// and core's path with several threads (half the lanes; 3), every dtype and world size, 1 row on 3
// blocks (the first blocks only push) and 7 rows on 3 blocks (shares that cut rows), under the
// threads scheduler; then seeded schedules, which draw the order of every block's threads too. The
// GPU runs a block of `lanes` threads as one block or as a thread-block cluster of lanes / threads
// blocks (cuda_backend/fused, ClusterRowCtx): core's templates see one block either way. The
// simulator's default for the Lamport kernels is one thread (fused_threads), so these name the threads.
TEST(FusedKernelsSim, LamportKernelsOnBlocksOfThreadsMatchTheReference) {
  uint64_t seed = 1300;
  for (FusedAlgorithm algo : {FusedAlgorithm::kLamportOneStage, FusedAlgorithm::kLamportTwoStage}) {
    for (DType dtype : kDtypes) {
      const int P = pack_of(dtype);
      for (int ranks : {1, 2, 3, 4, 8}) {
        for (int hidden : {5 * P, 40 * P}) {
          const int lanes = hidden / P <= 32 ? 32 : 64;
          for (int threads : {lanes, lanes / 2, 3}) {
            const Case one{algo, dtype, ranks, 1, hidden, 3, threads};
            EXPECT_EQ(fused_register_path(one.spec()), threads == lanes) << one.what();
            check({algo, dtype, ranks, 1, hidden, 3, threads, sim::Schedule::kThreads, 1, ++seed});
            check({algo, dtype, ranks, 7, hidden, 3, threads, sim::Schedule::kThreads, 1, ++seed});
          }
        }
      }
    }
    for (DType dtype : {DType::kBF16, DType::kFP32}) {
      const int P = pack_of(dtype);
      const Case wide{algo, dtype, 2, 2, 1500 * P, 2, 1024, sim::Schedule::kThreads, 1, ++seed};
      EXPECT_FALSE(fused_register_path(wide.spec())) << wide.what();  // more packs than lanes: core's path
      check(wide);
      // The GPU's shape at H 8192 bf16 (4096 fp32): 1024 packs, 1024 lanes, one block of 1024 threads.
      // (The GPU may run it on a thread-block cluster instead, which core's templates see as this
      // block; the cluster's own exchange runs only on a GPU, under `exactcoll verify`.)
      const Case full{algo, dtype, 2, 2, 1024 * P, 2, 1024, sim::Schedule::kThreads, 1, ++seed};
      EXPECT_TRUE(fused_register_path(full.spec())) << full.what();
      check(full);
      for (int ranks : {2, 3, 4}) {
        for (int threads : {32, 3}) {  // 5 packs, 32 lanes: one lane a thread, and core's path
          for (uint64_t s = 1; s <= 4; ++s) {
            check({algo, dtype, ranks, 5, 5 * P, 2, threads, sim::Schedule::kSeeded, s * 7919 + ranks, ++seed});
          }
        }
        for (uint64_t s = 1; s <= 4; ++s) {  // 40 packs, 64 lanes on 64 threads: two warps' groups
          check({algo, dtype, ranks, 5, 40 * P, 2, 64, sim::Schedule::kSeeded, s * 7919 + ranks, ++seed});
        }
      }
    }
  }
}

// The simulator's context takes the register path: run_register_path calls its body for a block of
// exactly the tree's lanes and at most 2 packs a thread, and not otherwise.
TEST(FusedKernelsSim, TheSimulatorsContextHasTheRegisterPath) {
  sim::WorldOptions options;
  options.ranks = 2;
  sim::World world(options);
  auto taken = [&](int hidden, int threads) {
    std::vector<int> held(2, -1);
    sim::Launch launch;
    launch.name = "register_path_probe";
    world.enqueue<bf16>(launch, [&held, hidden, threads](auto& ctx) {
      FusedBlockOptions block;
      block.threads = threads;
      with_fused_ctx(ctx, block, [&](auto& fctx) {
        contract::RmsNormTree tree;
        contract::make_rmsnorm_tree<bf16>(hidden, &tree);
        int packs = 0;
        const bool ran = run_register_path(fctx, tree, [&](auto k) { packs = decltype(k)::value; });
        if (fctx.thread() == 0) held[static_cast<size_t>(fctx.rank())] = ran ? packs : 0;
      });
    });
    world.run();
    EXPECT_EQ(held[0], held[1]);
    return held[0];
  };
  EXPECT_EQ(taken(40 * 8, 64), 1);      // 40 packs, 64 lanes: one pack a thread
  EXPECT_EQ(taken(1500 * 8, 1024), 2);  // 1500 packs, 1024 lanes: two
  EXPECT_EQ(taken(40 * 8, 32), 0);      // not the tree's lanes
  EXPECT_EQ(taken(40 * 8, 1), 0);
  EXPECT_EQ(taken(2056 * 8, 1024), 0);  // four packs a thread: core's path
}

// The simulator's context has the register hook that fused_rmsnorm_lamport_reg asks for
// (without it the kernel would quietly run core's path, with the same bits), and it gives the
// tree's sum: lane t of a 64-lane tree on 64 threads, lane l's partial l + 1.
TEST(FusedKernelsSim, TheSimulatorsContextHasTheLamportRegisterHook) {
  sim::WorldOptions options;
  options.ranks = 1;
  sim::World world(options);
  float got = -1.0f;
  bool hook = false;
  sim::Launch launch;
  launch.name = "lane_partials_probe";
  world.enqueue<bf16>(launch, [&](auto& ctx) {
    FusedBlockOptions block;
    block.threads = 64;
    with_fused_ctx(ctx, block, [&](auto& fctx) {
      contract::RmsNormTree tree;
      contract::make_rmsnorm_tree<bf16>(64 * 8, &tree);  // 64 packs, 64 lanes
      if constexpr (requires { fctx.sum_lane_partials(tree, 0.0f); }) {
        const int t = fctx.thread();
        const float ss = fctx.sum_lane_partials(tree, static_cast<float>(t + 1));
        if (t == 0) {
          hook = true;
          got = ss;
        }
      }
    });
  });
  world.run();
  EXPECT_TRUE(hook);
  contract::RmsNormTree tree;
  contract::make_rmsnorm_tree<bf16>(64 * 8, &tree);
  EXPECT_EQ(got, contract::combine_lane_partials(tree, [](int l) { return static_cast<float>(l + 1); }));
}

// The comparison above catches one flipped bit in any output element.
TEST(FusedKernelsSim, OneFlippedOutputBitIsCaught) {
  const Case c{FusedAlgorithm::kGatherNorm, DType::kBF16, 3, 4, 64, 2, 0};
  const gpu::FusedInputs in = gpu::make_fused_inputs(c.dtype, c.ranks, c.rows, c.hidden, 7, true);
  std::vector<uint8_t> want_ro, want_out;
  reference_typed<bf16>(in, 1e-6f, &want_ro, &want_out);
  const Outputs got = run_case(c, in);
  ASSERT_EQ(compare(got.out[2], want_out, 2), "");
  for (size_t byte : {size_t{0}, size_t{77}, want_out.size() - 1}) {
    for (int bit : {0, 7}) {
      std::vector<uint8_t> flipped = got.out[2];
      flipped[byte] ^= static_cast<uint8_t>(1u << bit);
      EXPECT_NE(compare(flipped, want_out, 2).find("1 elements differ, the first at " + std::to_string(byte / 2)),
                std::string::npos)
          << "byte " << byte << " bit " << bit;
    }
  }
}

// What the kernels cannot take is a clear error before anything runs, never an abort.
TEST(FusedKernelsSim, InvalidSpecsAreClearErrors) {
  for (FusedAlgorithm algo : kKernels) {
    for (DType dtype : kDtypes) {
      FusedSpec spec;
      spec.algo = algo;
      spec.dtype = dtype;
      spec.rows = 2;
      spec.hidden = pack_of(dtype) * 5 + 2;  // not a multiple of the pack: no algorithm takes it
      const std::string problem = check_fused_spec(spec, 2);
      EXPECT_NE(problem.find("is not a positive multiple of the " + std::string(dtype_name(dtype)) + " pack"),
                std::string::npos)
          << problem;
      sim::WorldOptions options;
      options.ranks = 2;
      sim::World world(options);
      std::vector<uint8_t> buffer(4096);
      FusedIo io;
      for (int r = 0; r < 2; ++r) {
        io.x.push_back(buffer.data());
        io.residual.push_back(buffer.data());
        io.weight.push_back(buffer.data());
        io.residual_out.push_back(buffer.data());
        io.out.push_back(buffer.data());
      }
      EXPECT_THROW(run_fused(world, spec, io), std::invalid_argument) << fused_algorithm_name(algo);
      spec.hidden = pack_of(dtype) * 5;
      spec.threads = 1025;
      EXPECT_NE(check_fused_spec(spec, 2).find("threads must be 1..1024"), std::string::npos);
      spec.threads = 0;
      EXPECT_EQ(check_fused_spec(spec, 2), "");
    }
  }
  // The Lamport kernels run on blocks of threads too (their polls follow the block's sync after every push).
  for (FusedAlgorithm algo : {FusedAlgorithm::kLamportOneStage, FusedAlgorithm::kLamportTwoStage}) {
    FusedSpec lamport;
    lamport.algo = algo;
    lamport.hidden = 64;
    lamport.threads = 4;
    EXPECT_EQ(check_fused_spec(lamport, 2), "") << fused_algorithm_name(algo);
  }
  // Seeded: every thread of every block of a launch alive at once (fiber stacks) is bounded.
  FusedSpec wide;
  wide.algo = FusedAlgorithm::kOneStageReg;
  wide.hidden = 8192;  // 1024 lanes
  wide.blocks = 4;
  EXPECT_EQ(check_fused_spec(wide, 4, sim::Schedule::kThreads), "");
  EXPECT_EQ(check_fused_spec(wide, 4, sim::Schedule::kSeeded), "");  // 16384 threads
  wide.blocks = 5;
  const std::string problem = check_fused_spec(wide, 4, sim::Schedule::kSeeded);
  EXPECT_NE(problem.find("would hold 20480 simulated threads at once (4 ranks x 5 blocks x 1024 threads)"),
            std::string::npos)
      << problem;
  sim::WorldOptions options;
  options.ranks = 4;
  options.schedule = sim::Schedule::kSeeded;
  sim::World world(options);
  FusedIo io;
  EXPECT_THROW(run_fused(world, wide, io), std::invalid_argument);
}

}  // namespace
}  // namespace exactcoll::fused

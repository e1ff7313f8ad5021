// The fused op on the simulator (sim/fused/fused_sim.h): every algorithm, both schedulers, against
// the scalar reference bit for bit, on every rank.
#include "sim/fused/fused_sim.h"

#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "sim/fused/random.h"
#include "sim/fused/reference.h"
#include "sim/world.h"
#include "tests/sim/fused/random_case.h"

namespace exactcoll::fused {
namespace {

// Runs spec on a fresh world and checks every rank's outputs against the reference.
template <class T>
void check(const Case<T>& c, FusedAlgorithm algo, int blocks, sim::Schedule schedule, uint64_t schedule_seed,
           bool two_shot = false) {
  sim::WorldOptions options;
  options.ranks = c.ranks;
  options.schedule = schedule;
  options.schedule_seed = schedule_seed;
  sim::World world(options);
  FusedSpec spec;
  spec.algo = algo;
  spec.dtype = dtype_of<T>();
  spec.rows = c.rows;
  spec.hidden = c.hidden;
  spec.blocks = blocks;
  spec.unfused_two_shot = two_shot;
  const size_t count = c.count();
  std::vector<std::vector<T>> ro(c.ranks, std::vector<T>(count)), out(c.ranks, std::vector<T>(count));
  FusedIo io;
  for (int r = 0; r < c.ranks; ++r) {
    io.x.push_back(c.x.data() + r * count);
    io.residual.push_back(c.residual.data());
    io.weight.push_back(c.weight.data());
    io.residual_out.push_back(ro[r].data());
    io.out.push_back(out[r].data());
  }
  run_fused(world, spec, io);
  FusedProblem<T> p;
  p.ranks = c.ranks, p.rows = c.rows, p.hidden = c.hidden, p.eps = spec.eps;
  p.x = c.x.data(), p.residual = c.residual.data(), p.weight = c.weight.data();
  std::vector<T> ref_ro(count), ref_out(count);
  fused_reference<T>(Contract::kCanonical, p, ref_ro.data(), ref_out.data());
  const std::string what = std::string(Storage<T>::kName) + " " + fused_algorithm_name(algo) +
                           " ranks=" + std::to_string(c.ranks) + " rows=" + std::to_string(c.rows) +
                           " H=" + std::to_string(c.hidden) + " blocks=" + std::to_string(blocks) + " " +
                           sim::schedule_name(schedule) + " seed " + std::to_string(schedule_seed);
  for (int r = 0; r < c.ranks; ++r) {
    EXPECT_EQ(std::memcmp(ro[r].data(), ref_ro.data(), count * sizeof(T)), 0)
        << what << " rank " << r << " residual_out";
    EXPECT_EQ(std::memcmp(out[r].data(), ref_out.data(), count * sizeof(T)), 0) << what << " rank " << r << " out";
  }
}

// Every algorithm the simulator runs (the registry's); gather_norm, one_stage_reg and
// push_one_stage_reg on blocks of the tree's lanes (their register path;
// tests/sim/fused/fused_kernels_sim_test.cc covers them in depth).
constexpr auto kAlgos = kFusedAlgorithmsOnSimulator;

TEST(FusedSim, ThreadsSchedulerEveryAlgorithmDtypeAndWorldSize) {
  uint64_t seed = 1;
  for (int ranks : {1, 2, 3, 4, 5, 8}) {
    const Case<bf16> b(ranks, 5, 256, ++seed);
    const Case<fp16> h(ranks, 3, 128, ++seed);
    const Case<float> f(ranks, 3, 132, ++seed);
    for (FusedAlgorithm algo : kAlgos) {
      check(b, algo, 2, sim::Schedule::kThreads, 0);
      check(h, algo, 1, sim::Schedule::kThreads, 0);
      check(f, algo, 3, sim::Schedule::kThreads, 0);
    }
  }
  check(Case<bf16>(4, 6, 512, 99), FusedAlgorithm::kUnfused, 2, sim::Schedule::kThreads, 0, true);
}

TEST(FusedSim, AiterShapeOnTheSimulator) {
  for (int rows : {1, 7, 16}) {
    const Case<bf16> c(4, rows, 4096, 4096 + rows);
    for (FusedAlgorithm algo : kAlgos) check(c, algo, 4, sim::Schedule::kThreads, 0);
  }
}

TEST(FusedSim, SeededSchedulesGiveTheSameBits) {
  const Case<bf16> c(3, 5, 64, 7);
  for (uint64_t s = 1; s <= 20; ++s) {
    for (FusedAlgorithm algo : kAlgos) check(c, algo, 2, sim::Schedule::kSeeded, s);
  }
}

TEST(FusedSim, BadSpecIsRejected) {
  sim::WorldOptions options;
  options.ranks = 2;
  sim::World world(options);
  FusedSpec spec;
  spec.hidden = 100;  // not a multiple of 8
  EXPECT_NE(check_fused_spec(spec, 2).find("not a positive multiple"), std::string::npos);
  FusedIo io;
  EXPECT_THROW(run_fused(world, spec, io), std::invalid_argument);
  spec.hidden = 64;
  EXPECT_THROW(run_fused(world, spec, io), std::invalid_argument);  // no buffers
  spec.blocks = 0;
  EXPECT_NE(check_fused_spec(spec, 2), "");
  spec.blocks = 1;
  spec.rows = 0;
  EXPECT_NE(check_fused_spec(spec, 2), "");
  spec.rows = 1;
  EXPECT_NE(check_fused_spec(spec, 17), "");
  EXPECT_EQ(check_fused_spec(spec, 16), "");
}

}  // namespace
}  // namespace exactcoll::fused

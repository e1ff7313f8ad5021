#include <chrono>
#include <cstdio>
#include "sim/world.h"
#include "tools/gpu/fused/fused_inputs.h"
#include "tools/gpu/fused/fused_reference.h"
using namespace exactcoll;
int main() {
  auto t0 = std::chrono::steady_clock::now();
  auto lap = [&](const char* what) { auto t = std::chrono::steady_clock::now(); std::printf("%s %.3f s\n", what, std::chrono::duration<double>(t - t0).count()); t0 = t; };
  const int n = 4, rows = 1024, H = 4096;
  gpu::FusedInputs in = gpu::make_fused_inputs(DType::kBF16, n, rows, H, 3, true);
  lap("inputs 4M elems x4");
  auto ref = gpu::reference_fused(in, 1e-6f);
  lap("reference");
  sim::WorldOptions wo; wo.ranks = n; sim::World world(wo);
  auto s1 = gpu::simulate_fused(world, FusedAlgo::kOneStage, in, 1e-6f, 4);
  lap("sim one_stage");
  auto s2 = gpu::simulate_fused(world, FusedAlgo::kTwoStage, in, 1e-6f, 4);
  lap("sim two_stage");
  auto s3 = gpu::simulate_fused(world, FusedAlgo::kUnfused, in, 1e-6f, 4);
  lap("sim unfused");
  std::printf("equal %d %d %d\n", s1[2].out == ref.out, s2[1].residual_out == ref.residual_out, s3[3].out == ref.out);
}

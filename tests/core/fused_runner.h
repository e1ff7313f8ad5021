// Runs core/fused_rmsnorm.h's algorithms on the test ThreadWorld and returns every rank's outputs.
#pragma once

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "core/collectives.h"
#include "core/fused_rmsnorm.h"
#include "core/push.h"
#include "sim/fused/random.h"
#include "sim/fused/reference.h"
#include "tests/core/thread_world.h"

namespace exactcoll::testing_world {

// A random problem: x [n, rows, H] ~ N(0, x_scale), residual ~ N(0, 1), weight ~ 1 + N(0, 0.1).
template <class T>
struct RandomProblem {
  int ranks, rows, hidden;
  float eps = 1e-6f;
  std::vector<T> x, residual, weight;

  RandomProblem(int ranks_, int rows_, int hidden_, uint64_t seed, float x_scale = 1.0f)
      : ranks(ranks_), rows(rows_), hidden(hidden_) {
    fused::SplitMix64 rng(seed);
    const size_t count = static_cast<size_t>(rows) * hidden;
    x.resize(count * ranks);
    residual.resize(count);
    weight.resize(hidden);
    for (auto& v : x) v = round_to<T>(rng.normal() * x_scale);
    for (auto& v : residual) v = round_to<T>(rng.normal());
    for (auto& v : weight) v = round_to<T>(1.0f + 0.1f * rng.normal());
  }
  size_t count() const { return static_cast<size_t>(rows) * hidden; }
  fused::FusedProblem<T> view() const {
    fused::FusedProblem<T> p;
    p.ranks = ranks, p.rows = rows, p.hidden = hidden, p.eps = eps;
    p.x = x.data(), p.residual = residual.data(), p.weight = weight.data();
    return p;
  }
};

template <class T>
struct RankOutputs {
  std::vector<std::vector<T>> residual_out, out;  // [rank][rows * H]
};

// Runs algo (one_stage, two_stage, push_one_stage, lamport_one_stage, lamport_two_stage, or unfused = all-reduce
// `unfused_allreduce` + residual_add_step + rmsnorm_step as three launches) with `blocks` blocks of `threads` threads
// per rank. The scratch fits two_stage's rows and push_one_stage's receive halves.
template <class T>
RankOutputs<T> run_algo(FusedAlgorithm algo, const RandomProblem<T>& p, int blocks, int threads,
                        bool unfused_two_shot = false) {
  const size_t count = p.count();
  const size_t scratch = std::max(fused_two_stage_scratch_elements(p.rows, p.hidden) + count + 64,
                                  push_scratch_elements(count, Storage<T>::kPack, p.ranks));
  ThreadWorld<T> world(p.ranks, blocks, threads, count, scratch, count);
  if (algo == FusedAlgorithm::kLamportOneStage) world.add_lamport(lamport_region_bytes(count, sizeof(T), p.ranks));
  if (algo == FusedAlgorithm::kLamportTwoStage) {
    world.add_lamport(lamport_two_stage_region_bytes(p.rows, p.hidden, sizeof(T), p.ranks));
  }
  std::vector<AlignedBuffer<T>> residual, weight, residual_out, out;
  for (int r = 0; r < p.ranks; ++r) {
    std::memcpy(world.inputs[r].data(), p.x.data() + r * count, count * sizeof(T));
    residual.emplace_back(count);
    weight.emplace_back(p.hidden);
    residual_out.emplace_back(count);
    out.emplace_back(count);
    std::memcpy(residual[r].data(), p.residual.data(), count * sizeof(T));
    std::memcpy(weight[r].data(), p.weight.data(), p.hidden * sizeof(T));
  }
  auto args_of = [&](int r) {
    FusedRmsNormArgs<T> a;
    a.residual = residual[r].data();
    a.weight = weight[r].data();
    a.residual_out = residual_out[r].data();
    a.out = out[r].data();
    a.rows = p.rows;
    a.hidden = p.hidden;
    a.eps = p.eps;
    return a;
  };
  using Ctx = typename ThreadWorld<T>::Ctx;
  if (algo == FusedAlgorithm::kUnfused) {
    world.run([&](Ctx& ctx) {
      dispatch_world_size(p.ranks, [&](auto n) {
        if (unfused_two_shot) {
          allreduce_two_shot<T, decltype(n)::value>(ctx, count);
        } else {
          allreduce_one_shot<T, decltype(n)::value>(ctx, count);
        }
      });
    });
    world.run([&](Ctx& ctx) {
      residual_add_step<T>(ctx, ctx.output(), residual[ctx.rank()].data(), residual_out[ctx.rank()].data(), count);
    });
    world.run([&](Ctx& ctx) {
      rmsnorm_step<T>(ctx, residual_out[ctx.rank()].data(), weight[ctx.rank()].data(), out[ctx.rank()].data(), p.rows,
                      p.hidden, p.eps);
    });
  } else {
    world.run([&](Ctx& ctx) {
      const FusedRmsNormArgs<T> a = args_of(ctx.rank());
      dispatch_fused_world_size(p.ranks, [&](auto n) {
        if (algo == FusedAlgorithm::kOneStage) {
          fused_rmsnorm_one_stage<T, decltype(n)::value>(ctx, a);
        } else if (algo == FusedAlgorithm::kPushOneStage) {
          fused_rmsnorm_push_one_stage<T, decltype(n)::value>(ctx, a);
        } else if (algo == FusedAlgorithm::kLamportOneStage) {
          fused_rmsnorm_lamport<T, decltype(n)::value>(ctx, a);
        } else if (algo == FusedAlgorithm::kLamportTwoStage) {
          fused_rmsnorm_lamport<T, decltype(n)::value, LamportProtocol, LamportFused::kTwoStage>(ctx, a);
        } else {
          fused_rmsnorm_two_stage<T, decltype(n)::value>(ctx, a);
        }
      });
    });
  }
  RankOutputs<T> o;
  for (int r = 0; r < p.ranks; ++r) {
    o.residual_out.emplace_back(residual_out[r].data(), residual_out[r].data() + count);
    o.out.emplace_back(out[r].data(), out[r].data() + count);
  }
  return o;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Returns the number of elements whose bits differ.
template <class T>
size_t count_differing(const std::vector<T>& a, const std::vector<T>& b) {
  size_t d = 0;
  for (size_t i = 0; i < a.size(); ++i) d += std::memcmp(&a[i], &b[i], sizeof(T)) != 0;
  return d;
}

}  // namespace exactcoll::testing_world

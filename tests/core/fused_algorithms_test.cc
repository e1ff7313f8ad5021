// core/fused_rmsnorm_kernels.h on the CPU test world (tests/core/thread_world.h: every
// (rank, block, thread) a std::thread, real flags and block barriers): gather_norm, one_stage_reg,
// push_one_stage_reg (register path and core fallback), the split path's residual + RMSNorm rows
// and the in-kernel input staging give the contract's bits (the scalar reference of
// sim/fused/reference.h) on every rank, for several world sizes, grids, shapes and adversarial
// values. The GPU runs the same templates (exactcoll verify).
#include "core/fused_rmsnorm_kernels.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include <gtest/gtest.h>

#include "core/collectives.h"
#include "core/contract.h"
#include "core/fused_rmsnorm.h"
#include "core/push.h"
#include "sim/fused/random.h"
#include "sim/fused/reference.h"
#include "tests/core/thread_world.h"

namespace exactcoll::fused_kernels_test {
namespace {

using testing_world::AlignedBuffer;
using testing_world::ThreadWorld;

// A problem with values that stress the contract: normal values, plus (when `specials`) a NaN with
// a payload, infinities of both signs, -0, values whose sum overflows and subnormals, placed in
// different rows so that most rows stay finite and their bits stay meaningful.
template <class T>
struct Problem {
  int ranks, rows, hidden;
  float eps = 1e-5f;
  std::vector<T> x, residual, weight;

  Problem(int ranks_, int rows_, int hidden_, uint64_t seed, bool specials)
      : ranks(ranks_), rows(rows_), hidden(hidden_) {
    fused::SplitMix64 rng(seed);
    x.resize(static_cast<size_t>(ranks) * count());
    residual.resize(count());
    weight.resize(static_cast<size_t>(hidden));
    for (auto& v : x) v = round_to<T>(rng.normal() * 4.0f);
    for (auto& v : residual) v = round_to<T>(rng.normal());
    for (auto& v : weight) v = round_to<T>(1.0f + 0.1f * rng.normal());
    if (!specials) return;
    const float inf = bits_to_float(0x7F800000u);
    for (int row = 0; row < rows; ++row) {
      const size_t at = static_cast<size_t>(row) * hidden + rng.next() % static_cast<uint64_t>(hidden);
      const int rank = static_cast<int>(rng.next() % static_cast<uint64_t>(ranks));
      T* xr = x.data() + static_cast<size_t>(rank) * count();
      switch (row % 6) {
        case 1: xr[at] = nan_with_payload(); break;
        case 2: residual[at] = round_to<T>(row % 12 == 2 ? inf : -inf); break;
        case 3:  // the largest finite value on every rank: the fold overflows (fp16, bf16) or not (fp32)
          for (int r = 0; r < ranks; ++r) x[static_cast<size_t>(r) * count() + at] = largest();
          break;
        case 4:  // a row of zeros of both signs and subnormals: ss is tiny, eps dominates
          for (int j = 0; j < hidden; ++j) {
            const size_t i = static_cast<size_t>(row) * hidden + j;
            for (int r = 0; r < ranks; ++r) x[static_cast<size_t>(r) * count() + i] = tiny(rng.next());
            residual[i] = tiny(rng.next());
          }
          break;
        default: break;
      }
    }
  }
  size_t count() const { return static_cast<size_t>(rows) * hidden; }

  static T nan_with_payload() {
    if constexpr (std::is_same_v<T, float>)
      return bits_to_float(0xFFC00123u);
    else
      return T{0xFF81};
  }
  static T largest() {
    if constexpr (std::is_same_v<T, float>)
      return bits_to_float(0x7F7FFFFFu);
    else if constexpr (std::is_same_v<T, bf16>)
      return T{0x7F7F};
    else
      return T{0x7BFF};
  }
  // -0, +0 or a subnormal of either sign.
  static T tiny(uint64_t r) {
    const uint32_t sign = (r & 1) ? 1u : 0u;
    const uint32_t m = static_cast<uint32_t>((r >> 1) % 4);
    if constexpr (std::is_same_v<T, float>)
      return bits_to_float((sign << 31) | m);
    else
      return T{static_cast<uint16_t>((sign << 15) | m)};
  }

  // The contract's outputs (the same on every rank).
  void expected(std::vector<T>* ro, std::vector<T>* out) const {
    fused::FusedProblem<T> p;
    p.ranks = ranks, p.rows = rows, p.hidden = hidden, p.eps = eps;
    p.x = x.data(), p.residual = residual.data(), p.weight = weight.data();
    ro->resize(count());
    out->resize(count());
    fused::fused_reference<T>(fused::Contract::kCanonical, p, ro->data(), out->data());
  }
};

template <class T>
size_t differing(const T* got, const std::vector<T>& want) {
  size_t d = 0;
  for (size_t i = 0; i < want.size(); ++i) d += std::memcmp(got + i, &want[i], sizeof(T)) != 0;
  return d;
}

// Fills a buffer with a NaN pattern that no algorithm writes (0x7FC1 / 0x7FC00001 are never
// produced: NaN results are canonical), so any element left unwritten or read unstaged shows.
template <class T>
void poison(T* p, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<T, float>)
      p[i] = bits_to_float(0x7FC00001u);
    else
      p[i] = T{0x7FC1};
  }
}

enum class Run {
  kGatherNorm,
  kGatherNormStaged,
  kOneStageStaged,
  kTwoStageStaged,
  kOneStageReg,
  kGatherNormReg,
  kPushOneStageReg
};

// The test world's context plus the register path's sum_lane_partials (core/fused_rmsnorm_kernels.h): each
// thread stores its lane partial into its (rank, block)'s shared array, sync_block, and every
// thread computes the two butterflies of contract::sum_squares over the array. Two arrays
// alternate, as on the GPU.
template <class T>
struct RegCtx : ThreadWorld<T>::Ctx {
  float* shared = nullptr;  // 2 * kMaxLanes floats of this (rank, block)
  uint32_t calls = 0;
  float sum_lane_partials(const contract::RmsNormTree& tree, float partial) {
    float* values = shared + (calls++ & 1u) * contract::kMaxLanes;
    values[this->thread()] = partial;
    this->sync_block();
    float groups[contract::kWarp] = {};
    for (int g = 0; g < tree.groups; ++g) {
      float lanes[contract::kWarp];
      for (int l = 0; l < contract::kWarp; ++l) lanes[l] = values[g * contract::kWarp + l];
      contract::butterfly32(lanes);
      groups[g] = lanes[0];
    }
    contract::butterfly32(groups);
    return groups[0];
  }
};

// push_one_stage's promise that peers never read this rank's x (so the GPU reads it from the
// caller's pointer, unstaged): a context whose input(p) is poison for every p but its own rank.
template <class Base>
struct OwnInputOnly : Base {
  using T = typename Base::value_type;
  const T* poisoned = nullptr;
  const T* input(int peer) const { return peer == this->rank() ? Base::input(peer) : poisoned; }
};

// Runs one algorithm on a fresh world; returns the number of differing elements over all ranks
// and both outputs.
template <class T>
size_t run_and_count(const Problem<T>& p, Run run, int blocks, int threads) {
  const size_t count = p.count();
  const size_t scratch = std::max(fused_two_stage_scratch_elements(p.rows, p.hidden) + 16,
                                  push_scratch_elements(count, Storage<T>::kPack, p.ranks));
  AlignedBuffer<T> poisoned_x(count);
  poison(poisoned_x.data(), count);
  ThreadWorld<T> world(p.ranks, blocks, threads, count, scratch, count);
  std::vector<AlignedBuffer<T>> xs, residual, weight, ro, out;
  for (int r = 0; r < p.ranks; ++r) {
    xs.emplace_back(count);
    residual.emplace_back(count);
    weight.emplace_back(p.hidden);
    ro.emplace_back(count);
    out.emplace_back(count);
    std::memcpy(xs[r].data(), p.x.data() + r * count, count * sizeof(T));
    std::memcpy(residual[r].data(), p.residual.data(), count * sizeof(T));
    std::memcpy(weight[r].data(), p.weight.data(), p.hidden * sizeof(T));
    poison(ro[r].data(), count);
    poison(out[r].data(), count);
    poison(world.scratches[r].data(), scratch);
    if (run == Run::kGatherNorm || run == Run::kGatherNormReg || run == Run::kPushOneStageReg) {
      std::memcpy(world.inputs[r].data(), xs[r].data(), count * sizeof(T));
    } else {
      poison(world.inputs[r].data(), count);  // the kernel stages what its blocks read
    }
  }
  using Ctx = typename ThreadWorld<T>::Ctx;
  std::vector<std::vector<float>> shared(static_cast<size_t>(p.ranks * blocks),
                                         std::vector<float>(2 * contract::kMaxLanes));
  world.run([&](Ctx& base_ctx) {
    RegCtx<T> reg_ctx;
    static_cast<Ctx&>(reg_ctx) = base_ctx;
    reg_ctx.shared = shared[static_cast<size_t>(base_ctx.rank() * blocks + base_ctx.block())].data();
    const bool reg = run == Run::kOneStageReg || run == Run::kGatherNormReg || run == Run::kPushOneStageReg;
    auto body = [&](auto& ctx) {
      const int r = ctx.rank();
      FusedRmsNormArgs<T> a;
      a.residual = residual[r].data();
      a.weight = weight[r].data();
      a.residual_out = ro[r].data();
      a.out = out[r].data();
      a.rows = p.rows;
      a.hidden = p.hidden;
      a.eps = p.eps;
      const FusedKernelKind kind = run == Run::kOneStageStaged    ? FusedKernelKind::kOneStage
                                   : run == Run::kTwoStageStaged  ? FusedKernelKind::kTwoStage
                                   : run == Run::kOneStageReg     ? FusedKernelKind::kOneStageReg
                                   : run == Run::kPushOneStageReg ? FusedKernelKind::kPushOneStage
                                                                  : FusedKernelKind::kGatherNorm;
      const bool staged = run == Run::kGatherNormStaged || run == Run::kOneStageStaged || run == Run::kTwoStageStaged ||
                          run == Run::kOneStageReg;
      if (staged) stage_fused_input<T>(ctx, kind, xs[r].data(), world.inputs[r].data(), p.rows, p.hidden);
      dispatch_fused_world_size(p.ranks, [&](auto n) {
        constexpr int kRanks = decltype(n)::value;
        if (kind == FusedKernelKind::kOneStage) {
          fused_rmsnorm_one_stage<T, kRanks>(ctx, a);
        } else if (kind == FusedKernelKind::kTwoStage) {
          fused_rmsnorm_two_stage<T, kRanks>(ctx, a);
        } else if (kind == FusedKernelKind::kOneStageReg) {
          fused_rmsnorm_one_stage_reg<T, kRanks>(ctx, a);
        } else if (kind == FusedKernelKind::kPushOneStage) {
          fused_rmsnorm_push_one_stage_reg<T, kRanks>(ctx, a);
        } else {
          fused_rmsnorm_gather_norm<T, kRanks>(ctx, a);
        }
      });
    };
    if (run == Run::kPushOneStageReg) {
      OwnInputOnly<RegCtx<T>> own_ctx;
      static_cast<RegCtx<T>&>(own_ctx) = reg_ctx;
      own_ctx.poisoned = poisoned_x.data();
      body(own_ctx);
    } else if (reg) {
      body(reg_ctx);
    } else {
      body(base_ctx);
    }
  });
  std::vector<T> want_ro, want_out;
  p.expected(&want_ro, &want_out);
  size_t d = 0;
  for (int r = 0; r < p.ranks; ++r) d += differing(ro[r].data(), want_ro) + differing(out[r].data(), want_out);
  return d;
}

template <class T>
class FusedAlgorithmsTest : public ::testing::Test {};
using StorageTypes = ::testing::Types<bf16, fp16, float>;
TYPED_TEST_SUITE(FusedAlgorithmsTest, StorageTypes);

// gather_norm: world sizes 1..4, rows fewer than, equal to and more than ranks * blocks, H with
// one partial group of lanes and several groups, blocks 1..3, threads 1 (a thread owns many
// packs: the plain copy path) and 8 (the held-register path).
TYPED_TEST(FusedAlgorithmsTest, GatherNormMatchesTheContract) {
  using T = TypeParam;
  constexpr int P = Storage<T>::kPack;
  uint64_t seed = 11;
  for (int ranks : {1, 2, 3, 4}) {
    for (int rows : {1, 2, 5, 9}) {
      for (int hidden : {P, 5 * P, 40 * P}) {
        for (int blocks : {1, 3}) {
          for (int threads : {1, 8}) {
            if (ranks * blocks * threads > 96) continue;
            const Problem<T> p(ranks, rows, hidden, ++seed, true);
            EXPECT_EQ(run_and_count(p, Run::kGatherNorm, blocks, threads), 0u)
                << "ranks " << ranks << " rows " << rows << " H " << hidden << " blocks " << blocks << " threads "
                << threads;
          }
        }
      }
    }
  }
}

// The staged variants: every row each block reads is staged by that block on every rank before
// its first barrier; a row staged by the wrong block (or not at all) would be read as the poison.
TYPED_TEST(FusedAlgorithmsTest, StagedInputsGiveTheContract) {
  using T = TypeParam;
  constexpr int P = Storage<T>::kPack;
  uint64_t seed = 101;
  for (Run run : {Run::kGatherNormStaged, Run::kOneStageStaged, Run::kTwoStageStaged}) {
    for (int ranks : {2, 3}) {
      for (int rows : {1, 4, 7}) {
        for (int blocks : {1, 2, 4}) {
          const Problem<T> p(ranks, rows, 3 * P, ++seed, true);
          EXPECT_EQ(run_and_count(p, run, blocks, 4), 0u)
              << "run " << static_cast<int>(run) << " ranks " << ranks << " rows " << rows << " blocks " << blocks;
        }
      }
    }
  }
}

// The split path's second kernel, with s = the contract's all-reduce and s aliasing out (as the
// host API runs it), several grids.
TYPED_TEST(FusedAlgorithmsTest, ResidualRmsNormRowsMatchTheContract) {
  using T = TypeParam;
  constexpr int P = Storage<T>::kPack;
  uint64_t seed = 1001;
  for (int rows : {1, 3, 8}) {
    for (int hidden : {P, 7 * P, 64 * P}) {
      for (int blocks : {1, 2, 5}) {
        for (int threads : {1, 4}) {
          const Problem<T> p(3, rows, hidden, ++seed, true);
          const size_t count = p.count();
          ThreadWorld<T> world(1, blocks, threads, 16, 16, 16);
          AlignedBuffer<T> residual(count), weight(hidden), ro(count), out(count);
          for (size_t i = 0; i < count; ++i) {
            out.data()[i] = contract::fold<T>(3, [&](int r) { return p.x[r * count + i]; });
          }
          std::memcpy(residual.data(), p.residual.data(), count * sizeof(T));
          std::memcpy(weight.data(), p.weight.data(), hidden * sizeof(T));
          poison(ro.data(), count);
          using Ctx = typename ThreadWorld<T>::Ctx;
          world.run([&](Ctx& ctx) {
            residual_rmsnorm_rows<T>(ctx, out.data(), residual.data(), weight.data(), ro.data(), out.data(), rows,
                                     hidden, p.eps);
          });
          std::vector<T> want_ro, want_out;
          p.expected(&want_ro, &want_out);
          EXPECT_EQ(differing(ro.data(), want_ro), 0u) << "rows " << rows << " H " << hidden << " blocks " << blocks;
          EXPECT_EQ(differing(out.data(), want_out), 0u) << "rows " << rows << " H " << hidden << " blocks " << blocks;
        }
      }
    }
  }
}

// The split path's kernel on the register path (threads == the tree's lanes, the RegCtx's
// sum_lane_partials): rows held in registers, the next row's loads before this row's reduction,
// several rows a block (fewer blocks than rows), s aliasing out; 1 and 2 packs a thread, and 4
// (beyond the register path: the memory path) at 1024 threads.
TYPED_TEST(FusedAlgorithmsTest, ResidualRmsNormRegisterPathMatchesTheContract) {
  using T = TypeParam;
  constexpr int P = Storage<T>::kPack;
  uint64_t seed = 3001;
  auto check = [&](int rows, int hidden, int blocks, int threads) {
    const Problem<T> p(2, rows, hidden, ++seed, true);
    const size_t count = p.count();
    ThreadWorld<T> world(1, blocks, threads, 16, 16, 16);
    AlignedBuffer<T> residual(count), weight(hidden), ro(count), out(count);
    for (size_t i = 0; i < count; ++i) out.data()[i] = contract::fold<T>(2, [&](int r) { return p.x[r * count + i]; });
    std::memcpy(residual.data(), p.residual.data(), count * sizeof(T));
    std::memcpy(weight.data(), p.weight.data(), hidden * sizeof(T));
    poison(ro.data(), count);
    std::vector<std::vector<float>> shared(static_cast<size_t>(blocks), std::vector<float>(2 * contract::kMaxLanes));
    using Ctx = typename ThreadWorld<T>::Ctx;
    world.run([&](Ctx& base_ctx) {
      RegCtx<T> ctx;
      static_cast<Ctx&>(ctx) = base_ctx;
      ctx.shared = shared[static_cast<size_t>(base_ctx.block())].data();
      residual_rmsnorm_rows<T>(ctx, out.data(), residual.data(), weight.data(), ro.data(), out.data(), rows, hidden,
                               p.eps);
    });
    std::vector<T> want_ro, want_out;
    p.expected(&want_ro, &want_out);
    EXPECT_EQ(differing(ro.data(), want_ro), 0u) << "rows " << rows << " H " << hidden << " blocks " << blocks;
    EXPECT_EQ(differing(out.data(), want_out), 0u) << "rows " << rows << " H " << hidden << " blocks " << blocks;
  };
  for (int rows : {1, 2, 5, 9}) {
    for (int hidden : {5 * P, 32 * P, 40 * P, 70 * P}) {
      const int lanes = 32 * ((hidden / P + 31) / 32);
      for (int blocks : {1, 2, 3}) check(rows, hidden, blocks, lanes);
    }
  }
  for (int packs : {1500, 2056}) check(3, packs * P, 2, 1024);  // 2 packs a thread; 4 (the memory path)
}

// The register path (threads == the tree's lanes): one_stage_reg and gather_norm hold each row in
// registers and take the lane partials from them. Lanes 32 and 64 (one and two groups), and rows
// that hold 2 packs a thread and 4 (beyond the register path: the memory path), 1024 threads a block, in a few
// cases (2048 std::threads).
TYPED_TEST(FusedAlgorithmsTest, RegisterPathMatchesTheContract) {
  using T = TypeParam;
  constexpr int P = Storage<T>::kPack;
  uint64_t seed = 5001;
  for (Run run : {Run::kOneStageReg, Run::kGatherNormReg}) {
    for (int ranks : {1, 2, 3}) {
      for (int rows : {1, 4, 7}) {
        for (int hidden : {5 * P, 40 * P}) {
          const int lanes = hidden / P <= 32 ? 32 : 64;
          for (int blocks : {1, 2}) {
            const Problem<T> p(ranks, rows, hidden, ++seed, true);
            EXPECT_EQ(run_and_count(p, run, blocks, lanes), 0u)
                << "run " << static_cast<int>(run) << " ranks " << ranks << " rows " << rows << " H " << hidden
                << " blocks " << blocks;
          }
        }
      }
    }
  }
  for (Run run : {Run::kOneStageReg, Run::kGatherNormReg}) {
    for (int packs : {1500, 2056}) {  // 2 packs a thread (register path); 4 (the memory path)
      const Problem<T> p(2, 3, packs * P, ++seed, true);
      EXPECT_EQ(run_and_count(p, run, 1, 1024), 0u) << "run " << static_cast<int>(run) << " packs " << packs;
    }
  }
}

// push_one_stage_reg: the register path (threads == the tree's lanes, 1 or 2 packs a thread) and
// core's fallback (other thread counts; 4 packs a thread), world sizes 1..4, rows fewer than,
// equal to and more than the blocks, blocks 1..3. Peers' x is poison (OwnInputOnly): only this
// rank's own x and the copies pushed into its scratch are read.
TYPED_TEST(FusedAlgorithmsTest, PushOneStageMatchesTheContract) {
  using T = TypeParam;
  constexpr int P = Storage<T>::kPack;
  uint64_t seed = 7001;
  for (int ranks : {1, 2, 3, 4}) {
    for (int rows : {1, 4, 7}) {
      for (int hidden : {5 * P, 40 * P, 72 * P}) {
        const int lanes = 32 * ((hidden / P + 31) / 32);  // the tree's lanes (at most 1024 packs here)
        for (int blocks : {1, 3}) {
          for (int threads : {lanes, 4}) {
            if (ranks * blocks * threads > 512) continue;  // std::threads per run
            const Problem<T> p(ranks, rows, hidden, ++seed, true);
            EXPECT_EQ(run_and_count(p, Run::kPushOneStageReg, blocks, threads), 0u)
                << "ranks " << ranks << " rows " << rows << " H " << hidden << " blocks " << blocks << " threads "
                << threads << (threads == lanes && hidden / P <= 2 * lanes ? " (register path)" : " (core path)");
          }
        }
      }
    }
  }
  for (int packs : {1500, 2056}) {  // 2 packs a thread (register path); 4 (core's path)
    const Problem<T> p(2, 3, packs * P, ++seed, true);
    EXPECT_EQ(run_and_count(p, Run::kPushOneStageReg, 2, 1024), 0u) << "packs " << packs;
  }
}

// The comparison can fail: one flipped bit in an input changes the outputs.
TEST(FusedAlgorithmsCheck, AFlippedInputBitIsCaught) {
  Problem<bf16> p(2, 3, 64, 7, false);
  std::vector<bf16> want_ro, want_out;
  p.expected(&want_ro, &want_out);
  p.x[5].bits ^= 1;
  std::vector<bf16> got_ro, got_out;
  p.expected(&got_ro, &got_out);
  EXPECT_GT(differing(got_ro.data(), want_ro) + differing(got_out.data(), want_out), 0u);
}

}  // namespace
}  // namespace exactcoll::fused_kernels_test

// fold_range and copy_range with packs grouped per thread (Ctx::kPacksInFlight, what the GPU
// context sets) give the same bytes as without grouping and as the scalar contract, on CPU: every
// element written once (outputs poisoned first), for every rank count, thread count, block split,
// shift and odd range. The GPU runs the grouped path; the simulator runs the ungrouped one.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/collectives.h"
#include "core/contract.h"
#include "tools/gpu/inputs.h"

namespace exactcoll {
namespace {

// A host context for one (block, thread) at a time; kGrouped selects kPacksInFlight = 8.
template <class T, bool kGrouped>
struct LoopCtx {
  using value_type = T;
  static constexpr bool kTraceSteps = false;
  static constexpr bool kTraceElements = false;
  int n = 1, t = 0, nt = 1;
  std::vector<const T*> inputs;
  int world_size() const { return n; }
  int thread() const { return t; }
  int num_threads() const { return nt; }
  const T* input(int r) const { return inputs[static_cast<size_t>(r)]; }
  Pack<T> load(const Pack<T>* p) const { return *p; }
  void store(Pack<T>* p, const Pack<T>& x) const { *p = x; }
};
template <class T>
struct GroupedCtx : LoopCtx<T, true> {
  static constexpr int kPacksInFlight = 8;
};

template <class T, int kRanks, class Ctx>
void fold_all(Ctx ctx, size_t begin, size_t end, int blocks, T* dst0, T* dst1, size_t shift) {
  for (int b = 0; b < blocks; ++b) {
    const BlockShare share = block_share(begin, end, Storage<T>::kPack, b, blocks);
    for (ctx.t = 0; ctx.t < ctx.nt; ++ctx.t) fold_range<T, kRanks>(ctx, share, dst0, dst1, shift);
  }
}

template <class T, int kRanks>
void check_fold(int n, size_t count, int threads, int blocks, size_t begin) {
  const DType dtype = sizeof(T) == 4 ? DType::kFP32 : std::is_same_v<T, bf16> ? DType::kBF16 : DType::kFP16;
  const auto raw = gpu::make_inputs(dtype, count, n, count * 31 + static_cast<size_t>(threads), gpu::Pattern::kRandomBits);
  std::vector<const T*> in;
  for (const auto& r : raw) in.push_back(reinterpret_cast<const T*>(r.data()));
  const size_t shift = begin;  // reduce-scatter style: output index = element - begin
  const size_t out_n = count - begin;
  std::vector<T> plain(out_n), grouped(out_n), grouped2(out_n);
  std::memset(plain.data(), 0xA5, out_n * sizeof(T));
  std::memset(grouped.data(), 0x5A, out_n * sizeof(T));
  std::memset(grouped2.data(), 0x3C, out_n * sizeof(T));
  LoopCtx<T, false> a;
  a.n = n;
  a.nt = threads;
  a.inputs = in;
  GroupedCtx<T> g;
  g.n = n;
  g.nt = threads;
  g.inputs = in;
  fold_all<T, kRanks>(a, begin, count, blocks, plain.data(), static_cast<T*>(nullptr), shift);
  fold_all<T, kRanks>(g, begin, count, blocks, grouped.data(), grouped2.data(), shift);
  ASSERT_EQ(std::memcmp(plain.data(), grouped.data(), out_n * sizeof(T)), 0)
      << "n=" << n << " count=" << count << " threads=" << threads << " blocks=" << blocks;
  ASSERT_EQ(std::memcmp(grouped.data(), grouped2.data(), out_n * sizeof(T)), 0);
  for (size_t j = 0; j < out_n; ++j) {
    const T want = contract::fold<T>(n, [&](int r) { return in[static_cast<size_t>(r)][begin + j]; });
    ASSERT_EQ(Storage<T>::bits(grouped[j]), Storage<T>::bits(want)) << "element " << begin + j;
  }
}

TEST(GroupedLoops, FoldRangeMatchesUngroupedAndContract) {
  for (size_t count : {size_t{1}, size_t{8}, size_t{17}, size_t{1000}, size_t{4099}, size_t{65543}}) {
    for (int threads : {1, 3, 32, 64}) {
      for (int blocks : {1, 3, 7}) {
        for (size_t begin : {size_t{0}, size_t{5}}) {
          if (begin >= count) continue;
          check_fold<bf16, 2>(2, count, threads, blocks, begin);
          check_fold<fp16, 3>(3, count, threads, blocks, begin);
          check_fold<float, 4>(4, count, threads, blocks, begin);
          check_fold<bf16, 8>(8, count, threads, blocks, begin);
          check_fold<bf16, 0>(5, count, threads, blocks, begin);  // run-time n: never grouped
        }
      }
    }
  }
}

TEST(GroupedLoops, CopyRangeMatchesUngrouped) {
  for (size_t count : {size_t{1}, size_t{9}, size_t{1000}, size_t{65543}}) {
    for (int threads : {1, 5, 64}) {
      for (int blocks : {1, 4}) {
        const auto raw = gpu::make_input(DType::kBF16, count, 0, count, gpu::Pattern::kRandomBits);
        const bf16* src = reinterpret_cast<const bf16*>(raw.data());
        for (size_t offset : {size_t{0}, size_t{3}, size_t{8}}) {
          std::vector<bf16> plain(count + offset), grouped(count + offset);
          std::memset(plain.data(), 0xA5, plain.size() * 2);
          std::memset(grouped.data(), 0xA5, grouped.size() * 2);
          LoopCtx<bf16, false> a;
          a.nt = threads;
          GroupedCtx<bf16> g;
          g.nt = threads;
          for (int b = 0; b < blocks; ++b) {
            const BlockShare share = block_share(0, count, 8, b, blocks);
            for (a.t = 0; a.t < threads; ++a.t) copy_range<bf16>(a, share, src, plain.data(), offset);
            for (g.t = 0; g.t < threads; ++g.t) copy_range<bf16>(g, share, src, grouped.data(), offset);
          }
          ASSERT_EQ(std::memcmp(plain.data(), grouped.data(), plain.size() * 2), 0);
          ASSERT_EQ(std::memcmp(grouped.data() + offset, src, count * 2), 0);
        }
      }
    }
  }
}

TEST(GroupedLoops, GroupSizesFollowTheContext) {
  using Plain = LoopCtx<bf16, false>;
  EXPECT_EQ(packs_in_flight<Plain>(), 1);
  EXPECT_EQ(packs_in_flight<GroupedCtx<bf16>>(), 8);
}

}  // namespace
}  // namespace exactcoll

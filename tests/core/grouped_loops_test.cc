// fold_range and copy_range with packs grouped per thread (Ctx::kPacksInFlight, what the GPU
// context sets) give the same bytes as without grouping and as the scalar contract, on CPU: every
// element written once (outputs poisoned first), for every rank count, thread count, block split,
// shift and odd range. The GPU runs the grouped path; the simulator runs the ungrouped one.
#include <gtest/gtest.h>

#include <atomic>
#include <barrier>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "core/collectives.h"
#include "core/contract.h"
#include "core/push.h"
#include "tools/inputs/inputs.h"

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
  const auto raw =
      gpu::make_inputs(dtype, count, n, count * 31 + static_cast<size_t>(threads), gpu::Pattern::kRandomBits);
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

TEST(GroupedLoops, CopyRangesMatchesOneCopyRangePerSource) {
  // Three sources with shares of different sizes (one empty), heads, tails and offsets.
  const auto raw = gpu::make_input(DType::kBF16, 3000, 0, 9, gpu::Pattern::kRandomBits);
  const bf16* base = reinterpret_cast<const bf16*>(raw.data());
  for (int threads : {1, 7, 32}) {
    for (int blocks : {1, 3}) {
      for (int b = 0; b < blocks; ++b) {
        const BlockShare shares[3] = {block_share(3, 1000, 8, b, blocks), block_share(1000, 1000, 8, b, blocks),
                                      block_share(1001, 2999, 8, b, blocks)};
        const bf16* const sources[3] = {base, base + 8, base + 16};
        const size_t offsets[3] = {5000, 0, 8000};
        std::vector<bf16> plain(12000), grouped(12000);
        std::memset(plain.data(), 0xA5, plain.size() * 2);
        std::memset(grouped.data(), 0xA5, grouped.size() * 2);
        LoopCtx<bf16, false> a;
        a.nt = threads;
        GroupedCtx<bf16> g;
        g.nt = threads;
        for (a.t = 0; a.t < threads; ++a.t) {
          for (int q = 0; q < 3; ++q) copy_range<bf16>(a, shares[q], sources[q], plain.data(), offsets[q]);
        }
        for (g.t = 0; g.t < threads; ++g.t) copy_ranges<bf16, 3, 2>(g, shares, sources, grouped.data(), offsets);
        ASSERT_EQ(std::memcmp(plain.data(), grouped.data(), plain.size() * 2), 0) << threads << " threads, block " << b;
      }
    }
  }
}

// The whole algorithms with the GPU's grouping (kPacksInFlight = 8) on CPU threads: every (rank,
// block, thread) a std::thread, atomics for flags. Outputs against the scalar contract.
template <class T>
struct MiniWorld {
  int ranks, blocks, threads;
  std::vector<std::vector<Pack<T>>> inputs, scratches, outputs;
  std::vector<SignalBuffer> signals;
  std::vector<std::unique_ptr<std::barrier<>>> bars;
  MiniWorld(int r, int b, int t, size_t elems, size_t out_elems) : ranks(r), blocks(b), threads(t), signals(r) {
    const size_t packs = elems / Storage<T>::kPack + 1, out_packs = out_elems / Storage<T>::kPack + 1;
    inputs.assign(r, std::vector<Pack<T>>(packs));
    scratches.assign(r, std::vector<Pack<T>>(2 * static_cast<size_t>(r) * packs));  // push_one_shot's 2 x n slots
    outputs.assign(r, std::vector<Pack<T>>(out_packs));
    std::memset(signals.data(), 0, sizeof(SignalBuffer) * signals.size());
    for (int i = 0; i < r * b; ++i) bars.push_back(std::make_unique<std::barrier<>>(t));
  }
  struct Ctx {
    using value_type = T;
    static constexpr bool kTraceSteps = false;
    static constexpr bool kTraceElements = false;
    static constexpr int kPacksInFlight = 8;
    MiniWorld* w;
    int r, b, t;
    int rank() const { return r; }
    int world_size() const { return w->ranks; }
    int block() const { return b; }
    int num_blocks() const { return w->blocks; }
    int thread() const { return t; }
    int num_threads() const { return w->threads; }
    const T* input(int p) const { return reinterpret_cast<const T*>(w->inputs[p].data()); }
    T* scratch(int p) const { return reinterpret_cast<T*>(w->scratches[p].data()); }
    size_t scratch_elements() const { return w->scratches[0].size() * Storage<T>::kPack; }
    T* output() const { return reinterpret_cast<T*>(w->outputs[r].data()); }
    SignalBuffer* signals(int p) const { return &w->signals[p]; }
    void signal(uint32_t* flag, uint32_t v, int, int) {
      std::atomic_ref<uint32_t>(*flag).store(v, std::memory_order_release);
    }
    void wait(const uint32_t* flag, uint32_t v, int, int) {
      std::atomic_ref<uint32_t> a(*const_cast<uint32_t*>(flag));
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (a.load(std::memory_order_acquire) != v) {
        ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "flag never arrived";
        std::this_thread::yield();
      }
    }
    void sync_block() { w->bars[r * w->blocks + b]->arrive_and_wait(); }
    Pack<T> load(const Pack<T>* p) const { return *p; }
    void store(Pack<T>* p, const Pack<T>& x) const { *p = x; }
  };
  void run(const std::function<void(Ctx&)>& body) {
    std::vector<std::thread> all;
    for (int r = 0; r < ranks; ++r)
      for (int b = 0; b < blocks; ++b)
        for (int t = 0; t < threads; ++t)
          all.emplace_back([this, &body, r, b, t] {
            Ctx c{this, r, b, t};
            body(c);
          });
    for (auto& th : all) th.join();
  }
};

template <class T, int kRanks>
void check_algorithms(size_t c, int blocks, int threads) {
  const DType dtype = sizeof(T) == 4 ? DType::kFP32 : std::is_same_v<T, bf16> ? DType::kBF16 : DType::kFP16;
  const int n = kRanks;
  for (int algo = 0; algo < 6; ++algo) {  // one_shot, two_shot, reduce_scatter, allgather, push_one_shot, push_two_shot
    const size_t count = algo == 2 ? c * n : c;
    const size_t out_count = algo == 2 ? c : algo == 3 ? c * n : c;
    MiniWorld<T> w(n, blocks, threads, count, out_count);
    const auto raw = gpu::make_inputs(dtype, count, n, count + static_cast<size_t>(algo), gpu::Pattern::kSpecials);
    for (int r = 0; r < n; ++r) std::memcpy(w.inputs[r].data(), raw[r].data(), raw[r].size());
    for (int r = 0; r < n; ++r) std::memset(w.outputs[r].data(), 0xA5, w.outputs[r].size() * sizeof(Pack<T>));
    w.run([&](typename MiniWorld<T>::Ctx& ctx) {
      if (algo == 0) allreduce_one_shot<T, kRanks>(ctx, count);
      if (algo == 1) allreduce_two_shot<T, kRanks>(ctx, count);
      if (algo == 2) reduce_scatter<T, kRanks>(ctx, count);
      if (algo == 3) allgather<T, kRanks>(ctx, count);
      if (algo == 4) allreduce_push_one_shot<T, kRanks>(ctx, count);
      if (algo == 5) allreduce_push_two_shot<T, kRanks>(ctx, count);
    });
    for (int r = 0; r < n; ++r) {
      const T* out = reinterpret_cast<const T*>(w.outputs[r].data());
      const T* in[kRanks];
      for (int p = 0; p < n; ++p) in[p] = reinterpret_cast<const T*>(raw[p].data());
      for (size_t j = 0; j < out_count; ++j) {
        T want;
        if (algo == 3) {
          want = in[j / c][j % c];
        } else {
          const size_t i = algo == 2 ? c * static_cast<size_t>(r) + j : j;
          want = contract::fold<T>(n, [&](int p) { return in[p][i]; });
        }
        ASSERT_EQ(Storage<T>::bits(out[j]), Storage<T>::bits(want))
            << "algorithm " << algo << " n=" << n << " count=" << count << " rank " << r << " element " << j;
      }
    }
  }
}

TEST(GroupedLoops, WholeAlgorithmsWithTheGpuGroupingEqualTheContract) {
  for (size_t c : {size_t{1}, size_t{9}, size_t{1003}}) {
    for (int blocks : {1, 3}) {
      for (int threads : {1, 3}) {
        check_algorithms<bf16, 1>(c, blocks, threads);
        check_algorithms<bf16, 2>(c, blocks, threads);
        check_algorithms<float, 3>(c, blocks, threads);
        check_algorithms<bf16, 4>(c, blocks, threads);
        check_algorithms<fp16, 5>(c, blocks, threads);  // two_shot's gather: the per-peer loop (> 4 ranks)
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

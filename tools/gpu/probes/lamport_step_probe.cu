// lamport_step_probe: where a small Lamport all-reduce's time goes, step by step, measured
// on exactcoll's own kernel (cuda_backend/kernels.cuh) in one process, without the communicator.
//   1. per op: collective_kernel<bf16, n, kLamportOneShot> (and kLamportTwoShot) in a CUDA graph of 20 launches with
//      programmatic dependent launch, as `exactcoll bench` times it (each timed replay behind an
//      untimed one, median of 25), on 1 GPU (world of 1: no peer) and on GPUs 0 and 1 (world of 2,
//      the peer's region reached through peer access, one graph per GPU).
//   2. steps: the same algorithm, its steps called one by one (stepped_lamport_kernel) with a
//      clock64 stamp after each by thread 0 of block 0: past griddepcontrol.wait, begun (the call
//      number and the block's sync), pushed, cleared, folded, ended. Medians over the
//      timed replays' launches 1..19 (launch 0 follows the previous replay through a full dependency, not a
//      programmatic one). Variants (Options): the L2 prefetches before the wait (collective_kernel's in the
//      thirteenth session; prefetch_first_lines below), with a peer's line too,
//      the parameter block read before the wait, weak stores, every push stored thrice, and two calls in one launch
//      (the second finds the instructions, the parameters and the call number's lines cached).
//   3. traced: the production algorithms themselves (allreduce_lamport_one_shot, allreduce_lamport_two_shot)
//      under StampCtx, which declares the algorithms' trace steps and stamps clock64 where each begins
//      (thread 0 of block 0 of every rank), with variants: lamport_two_shot's peers at once (LamportProtocol's
//      kPushPeersAtOnce, kGatherPeersAtOnce), a 512-thread launch bound, no stamps, and collective_kernel's
//      former opening of lamport_two_shot's kernel (its input table and views: 0.4-0.7 us on 4 GPUs).
//   4. where: a world of 1 with 2 MiB slots; worlds of 2 with the communicator's default slots
//      (1 MiB) and with 64 KiB slots (every buffer within 768 KiB: whether the region's pages
//      matter); a world of 4 on GPUs 0-3 with 1 MiB slots (LAMPORT_STEP_PROBE_WORLDS="4").
//   LAMPORT_STEP_PROBE_PRODUCTION=1 runs the production kernels alone (lamport_one_shot's and
//   lamport_two_shot's collective_kernel), e.g. to time builds of other trees side by side;
//   LAMPORT_STEP_PROBE_ONLY=TEXT the variants whose label holds TEXT (case-sensitive; e.g.
//   "lamport_two_shot"). A selection that measures nothing in the worlds run exits 2.
// Results: docs/benchmarks.md, "What a small Lamport all-reduce's kernel spends", "The Lamport
// prologue on 4 GPUs" and "lamport_two_shot step by step" (issue 26).
//
// Standalone (no Bazel target, as launch_floor_probe), built from the repository root:
//   nvcc -O3 -std=c++20 -I. -DEXACTCOLL_HAS_CUDA=1 --expt-relaxed-constexpr
//        -gencode arch=compute_90,code=sm_90 -o lamport_step_probe tools/gpu/probes/lamport_step_probe.cu
//        -Xcompiler -static-libgcc -cudart static
// Every wait is bounded: the kernels' polls give up after kTimeoutNs and record it (DeviceError);
// the probe then names the rank and exits 1. No NVLink multicast of any kind is used.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "cuda_backend/kernels.cuh"

constexpr const char* kProbeName = "lamport_step_probe";
#include "probe_util.h"  // CHECK, visible_gpus_or_exit, launch_config

namespace {

using exactcoll::bf16;
using exactcoll::cuda::DeviceCtx;
using exactcoll::cuda::DeviceError;
using exactcoll::cuda::KernelArgs;
using exactcoll::cuda::KernelKind;

constexpr int kOpsPerGraph = 20;
constexpr int kTimedReplays = 25;
constexpr uint64_t kTimeoutNs = 2'000'000'000ull;
// Stamps per launch: the kernel's entry, past its wait, then per call: begun (begin_lamport_call,
// its sync included), pushed, cleared, folded, ended (end_lamport_call); two calls at most.
constexpr int kStepsPerPass = 5;
constexpr int kMaxPasses = 2;
constexpr int kPoints = 2 + kStepsPerPass * kMaxPasses;
const char* const kPointNames[kPoints] = {"entry", "waited", "begun",   "pushed",   "cleared", "folded",
                                          "ended", "begun2", "pushed2", "cleared2", "folded2", "ended2"};
// The traced kernels' points (traced_lamport_kernel): the step that ends at each, lamport_two_shot
// on 4 ranks having the most (begun, 3 pushes, cleared, folded and pushed, 3 gathers, ended).
static_assert(kPoints >= 2 + 1 + 3 + 1 + 1 + 3, "lamport_two_shot's traced points on 4 ranks");

// One launch's stamps: clock64 cycles at each point (thread 0 of block 0; %globaltimer advances in
// 256-ns steps on H200, too coarsely for these).
struct Stamps {
  long long cycles[kPoints];
};

__device__ __forceinline__ void stamp(Stamps* s, int point) {
  if (blockIdx.x == 0 && threadIdx.x == 0) s->cycles[point] = clock64();
}

// Reads one word of every 64 bytes of the kernel's parameters and keeps the sum live: every line of
// the parameter block is in the constant cache before the loads that need the previous kernel.
__device__ __forceinline__ void warm_kernel_args(const KernelArgs& args) {
  const auto* words = reinterpret_cast<const unsigned long long*>(&args);
  unsigned long long sum = 0;
#pragma unroll
  for (size_t i = 0; i < sizeof(KernelArgs) / 8; i += 8) sum += words[i];
  asm volatile("" ::"l"(sum));
}

// How a variant's Lamport stores go out: kVolatile as DeviceCtx; kWeak as weak 16-byte stores
// (st.global); kThrice each pushed pack stored three times into the same place (the same bits), so
// that a world of 2 issues the remote stores a world of 4 does (three a pack).
enum class Stores { kVolatile, kWeak, kThrice };

// DeviceCtx whose lamport_store follows kStores (core/lamport.h calls the context's, so the
// algorithm is unchanged).
template <int kRanks, Stores kStores>
class StoreCtx : public DeviceCtx<bf16, kRanks> {
  using Base = DeviceCtx<bf16, kRanks>;

 public:
  using Base::Base;
  __device__ __forceinline__ void lamport_store(exactcoll::Pack<bf16>* p, const exactcoll::Pack<bf16>& x,
                                                int peer) const {
    if constexpr (kStores == Stores::kWeak) {
      uint4 b;
      __builtin_memcpy(&b, &x, sizeof b);
      asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(b.x), "r"(b.y), "r"(b.z), "r"(b.w)
                   : "memory");
    } else {
      Base::lamport_store(p, x, peer);
      if (kStores == Stores::kThrice && peer != this->rank()) {
        Base::lamport_store(p, x, peer);
        Base::lamport_store(p, x, peer);
      }
    }
  }
};

// DeviceCtx that declares the algorithms' trace steps (Ctx::kTraceSteps) and, instead of recording
// them as the simulator does, stamps clock64 where each step begins (thread 0 of block 0 of every
// rank). core/lamport.h calls trace_step_begin just before a step's work, so the production
// algorithm (allreduce_lamport_one_shot, allreduce_lamport_two_shot) is timed step by step without a
// copy of its steps here; the accesses it would trace are dropped.
template <int kRanks, bool kStamps = true, bool kGlobalInput = false>
class StampCtx : public DeviceCtx<bf16, kRanks> {
  using Base = DeviceCtx<bf16, kRanks>;

 public:
  static constexpr bool kTraceSteps = true;
  __device__ __forceinline__ const bf16* input(int peer) const {
    const bf16* p = Base::input(peer);
    if constexpr (kGlobalInput) __builtin_assume(__isGlobal(p));
    return p;
  }
  __device__ __forceinline__ StampCtx(const KernelArgs& args, volatile int* aborted, const void** views, Stamps* stamps)
      : Base(args, aborted, views), stamps_(stamps) {}
  __device__ __forceinline__ void trace_step_begin(const char*) { stamp_next(); }
  __device__ __forceinline__ void trace_step_end() {}
  __device__ __forceinline__ void trace_access(exactcoll::Access, int, exactcoll::Buffer, size_t, size_t) {}
  // The next point (the algorithm's steps begin at point 2; the caller stamps its end).
  __device__ __forceinline__ void stamp_next() {
    if (kStamps && next_ < kPoints) stamp(stamps_, next_);
    ++next_;
  }
  // The kernel's end: stamped whether or not the steps are (the "to the end" point then spans them all).
  __device__ __forceinline__ void stamp_end() {
    if (next_ < kPoints) stamp(stamps_, next_);
  }

 private:
  Stamps* stamps_;
  int next_ = 2;
};

// What a variant of the stepped kernel changes.
//   warm: warm_kernel_args before the wait;
//   prefetch: before the wait, the thirteenth session's prefetches (prefetch_first_lines);
//   prefetch_peer: before the wait, also the thread's line of the next peer's region (over NVLink;
//     in a world of 1 its own region);
//   passes: calls a launch (2: the second call finds the instructions, the parameters and the call
//     number's lines cached; the block syncs between them). Not the protocol production keeps: the
//     first call's clear and the peer's writes of call k+2 into that buffer are ordered by a kernel
//     boundary there (cuda_backend/device_ctx.cuh, lamport_store), here only by time (microseconds:
//     this rank's second push, the peer's poll and the end of its launch come between). A lost race
//     would show as a poll that gives up (exit 1), never as data; it never did.
//   stores: how lamport_store stores.
//   push_at_once, gather_at_once (traced lamport_two_shot): LamportProtocol::kPushPeersAtOnce and
//     kGatherPeersAtOnce set (core/lamport.h, for_peer_slices_at_once);
//   max_threads: the traced kernel's launch bound (collective_kernel's is 1 024: 64 registers);
//   no_stamps, collective_prologue: what separates the traced kernel from collective_kernel.
struct Options {
  bool warm = false, prefetch = false, prefetch_peer = false;
  int passes = 1;
  Stores stores = Stores::kVolatile;
  bool push_at_once = false, gather_at_once = false;
  int max_threads = 1024;            // the traced kernel's launch bound (512: 128 registers a thread)
  bool no_stamps = false;            // the traced kernel with its stamps off (only the end's)
  bool collective_prologue = false;  // the traced kernel opens as collective_kernel (its input table, its views)
  bool global_input = false;         // ctx.input()'s pointer declared global (__isGlobal assumed)
};

// The variants: the production kernels (collective_kernel; since the fourteenth session without the
// prefetches), then stepped_lamport_kernel's.
struct Variant {
  const char* label;
  bool production;
  Options o;
  KernelKind kind = KernelKind::kLamportOneShot;  // the production or traced kernel's
  bool traced = false;                            // traced_lamport_kernel (production false)
};
constexpr Variant kVariants[] = {
    {"lamport_one_shot (production)", true, {}},
    {"lamport_two_shot (production)", true, {}, KernelKind::kLamportTwoShot},
    {"lamport_one_shot, traced", false, {}, KernelKind::kLamportOneShot, true},
    {"lamport_two_shot, traced", false, {}, KernelKind::kLamportTwoShot, true},
    {"lamport_two_shot, traced, push at once", false, {.push_at_once = true}, KernelKind::kLamportTwoShot, true},
    {"lamport_two_shot, traced, gather at once", false, {.gather_at_once = true}, KernelKind::kLamportTwoShot, true},
    {"lamport_two_shot, traced, both at once",
     false,
     {.push_at_once = true, .gather_at_once = true},
     KernelKind::kLamportTwoShot,
     true},
    {"lamport_two_shot, traced, no stamps", false, {.no_stamps = true}, KernelKind::kLamportTwoShot, true},
    {"lamport_two_shot, traced, collective prologue",
     false,
     {.collective_prologue = true},
     KernelKind::kLamportTwoShot,
     true},
    {"lamport_two_shot, traced, collective prologue, global input",
     false,
     {.collective_prologue = true, .global_input = true},
     KernelKind::kLamportTwoShot,
     true},
    {"lamport_two_shot, traced, bound 512", false, {.max_threads = 512}, KernelKind::kLamportTwoShot, true},
    {"lamport_two_shot, traced, push at once, bound 512",
     false,
     {.push_at_once = true, .max_threads = 512},
     KernelKind::kLamportTwoShot,
     true},
    {"lamport_two_shot, traced, gather at once, bound 512",
     false,
     {.gather_at_once = true, .max_threads = 512},
     KernelKind::kLamportTwoShot,
     true},
    {"lamport_two_shot, traced, both at once, bound 512",
     false,
     {.push_at_once = true, .gather_at_once = true, .max_threads = 512},
     KernelKind::kLamportTwoShot,
     true},
    {"lamport_two_shot (production, again)", true, {}, KernelKind::kLamportTwoShot},
    {"stepped", false, {}},
    {"stepped, prefetch", false, {.prefetch = true}},
    {"stepped, prefetch + peer's line", false, {.prefetch = true, .prefetch_peer = true}},
    {"stepped, warm parameters", false, {.warm = true}},
    {"stepped, weak stores", false, {.stores = Stores::kWeak}},
    {"stepped, pushes thrice", false, {.stores = Stores::kThrice}},
    {"stepped, two calls a launch", false, {.passes = 2}},
};
constexpr size_t kVariantCount = sizeof(kVariants) / sizeof(kVariants[0]);

// Whether LAMPORT_STEP_PROBE_ONLY's text (`only`; empty: every variant) selects variant v.
bool label_selected(const Variant& v, const std::string& only) {
  return std::string(v.label).find(only) != std::string::npos;
}

// A hint that brings p's line into this GPU's L2 (nothing into the thread, nothing into L1).
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// The "prefetch" variant: what collective_kernel prefetched before griddepcontrol.wait in the
// thirteenth session (docs/benchmarks.md, "What a small Lamport all-reduce's kernel spends"; taken
// out in the fourteenth, "The Lamport prologue on 4 GPUs"): thread 0 the block's call-number slot,
// and a thread whose first pack `first` ((block x threads + thread) x pack) is below the count, that
// element of the input, the output and this rank's Lamport region. Prefetching is L2 only, the
// point of coherence of this GPU's memory, so nothing the previous kernel writes after it is missed.
__device__ __forceinline__ void prefetch_first_lines(const KernelArgs& args, size_t first) {
  if (threadIdx.x == 0) prefetch_l2(&args.signals[args.rank]->lamport_calls[blockIdx.x]);
  if (first >= args.count) return;
  prefetch_l2(static_cast<const bf16*>(args.inputs[args.rank]) + first);
  prefetch_l2(static_cast<bf16*>(args.output) + first);
  if ((first + exactcoll::Storage<bf16>::kPack) * sizeof(bf16) <= args.lamport_bytes) {
    prefetch_l2(static_cast<const bf16*>(args.lamport[args.rank]) + first);
  }
}

// allreduce_lamport_one_shot's steps (core/lamport.h), called one by one with a stamp after each:
// the same calls in the same order, so the same bits. kVariant: its row of kVariants.
template <int kRanks, size_t kVariant>
__global__ void __launch_bounds__(1024)
    stepped_lamport_kernel(const __grid_constant__ KernelArgs args, Stamps* stamps) {
  using exactcoll::LamportProtocol;
  constexpr Options kO = kVariants[kVariant].o;
  constexpr int P = exactcoll::Storage<bf16>::kPack;
  stamp(stamps, 0);
  if constexpr (kO.warm) warm_kernel_args(args);
  const size_t first = (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) * P;
  if constexpr (kO.prefetch) prefetch_first_lines(args, first);
  if constexpr (kO.prefetch_peer) {
    if (first < args.count)
      prefetch_l2(static_cast<const bf16*>(args.lamport[(args.rank + 1) % args.world_size]) + first);
  }
  exactcoll::cuda::enter_after_previous_grid();
  stamp(stamps, 1);
  __shared__ int aborted;
  __shared__ const void* views[exactcoll::kMaxRanks];
  if (threadIdx.x == 0) aborted = 0;
  StoreCtx<kRanks, kO.stores> ctx(args, &aborted, views);
  const size_t count = args.count;
  for (int pass = 0; pass < kO.passes; ++pass) {
    const int base = 2 + pass * kStepsPerPass;
    if (pass > 0) ctx.sync_block();
    const size_t padded = (count + P - 1) / P * P;
    const exactcoll::BlockShare share = exactcoll::block_share(0, padded, P, ctx.block(), ctx.num_blocks());
    const bf16* mine = ctx.input(ctx.rank());
    const exactcoll::LamportCall<bf16> c = exactcoll::begin_lamport_call<bf16, LamportProtocol>(ctx);
    stamp(stamps, base);
    exactcoll::lamport_push<bf16, kRanks, LamportProtocol>(ctx, "push", c, share, mine, count);
    stamp(stamps, base + 1);
    exactcoll::lamport_clear_previous<bf16, kRanks, LamportProtocol>(ctx, c);
    stamp(stamps, base + 2);
    bf16* const out = ctx.output();
    exactcoll::for_share(
        ctx, share, P,
        [&](size_t i) {
          exactcoll::lamport_output_pack(ctx, out, i, count,
                                         exactcoll::lamport_fold_message_pack<bf16, kRanks>(ctx, c, mine, count, i));
        },
        [](size_t) {});
    stamp(stamps, base + 3);
    exactcoll::end_lamport_call(ctx, c, exactcoll::lamport_message_bytes(count, sizeof(bf16)));
    stamp(stamps, base + 4);
  }
}

// The production algorithm of kKind (core/lamport.h) under StampCtx, as collective_kernel runs it
// for a Lamport kind: the same calls, so the same bits; a stamp where each step begins and at the end.
// LamportProtocol with the at-once choices of Options o.
template <bool kPush, bool kGather>
struct AtOnceProtocol : exactcoll::LamportProtocol {
  static constexpr bool kPushPeersAtOnce = kPush;
  static constexpr bool kGatherPeersAtOnce = kGather;
};

template <int kRanks, size_t kVariant>
__global__ void __launch_bounds__(kVariants[kVariant].o.max_threads)
    traced_lamport_kernel(const __grid_constant__ KernelArgs args, Stamps* stamps) {
  constexpr Options kO = kVariants[kVariant].o;
  constexpr KernelKind kKind = kVariants[kVariant].kind;
  using Protocol = AtOnceProtocol<kO.push_at_once, kO.gather_at_once>;
  stamp(stamps, 0);
  const void* own_from_table = kO.collective_prologue ? exactcoll::cuda::own_input_table_entry(args) : nullptr;
  exactcoll::cuda::enter_after_previous_grid();
  stamp(stamps, 1);
  __shared__ int aborted;
  __shared__ const void* views[exactcoll::kMaxRanks];
  if (threadIdx.x == 0) aborted = 0;
  StampCtx<kRanks, !kO.no_stamps, kO.global_input> ctx(args, &aborted, views, stamps);
  if constexpr (kO.collective_prologue) exactcoll::cuda::open_input_views(ctx, args, own_from_table);
  if constexpr (kKind == KernelKind::kLamportOneShot) {
    exactcoll::allreduce_lamport_one_shot<bf16, kRanks, Protocol>(ctx, args.count);
  } else {
    exactcoll::allreduce_lamport_two_shot<bf16, kRanks, Protocol>(ctx, args.count);
  }
  ctx.stamp_end();
}

// The names of a traced kernel's points: the step that ends at each.
std::vector<std::string> traced_point_names(KernelKind kind, int n, const Options& o) {
  std::vector<std::string> names = {"entry", "waited", "begun"};
  // The last step has no trace of its own after it: its point is the kernel's end, so it includes
  // end_lamport_call (the block's sync and the call number's stores).
  if (kind == KernelKind::kLamportOneShot) {
    for (const char* step : {"pushed", "cleared", "folded_and_ended"}) names.emplace_back(step);
    return names;
  }
  // With the peers at once the steps' traces all come first, back to back, so the last of them
  // carries the whole push (gather).
  for (int k = 1; k < n; ++k) {
    names.push_back(o.push_at_once ? (k + 1 == n ? "pushed_every_slice_at_once" : "(trace)")
                                   : "pushed_slice_to_peer+" + std::to_string(k));
  }
  names.emplace_back("cleared");
  names.emplace_back("folded_and_pushed");
  for (int k = 1; k < n; ++k) {
    names.push_back((o.gather_at_once ? (k + 1 == n ? std::string("gathered_every_slice_at_once") : "(trace)")
                                      : "gathered_from_peer+" + std::to_string(k)) +
                    (k + 1 == n ? "_and_ended" : ""));
  }
  return names;
}

// Rank r's input element i: a small integer that depends on both, so an output element folded from
// the wrong element or rank, or never written (outputs are cleared before each variant), differs
// from the sum check_world expects. Every sum on up to 8 ranks is at most 4 x 8 + 28 = 60: exact.
int input_value(int rank, size_t i) { return static_cast<int>(i % 5) + rank; }

// A small integer (|v| <= 256) as bf16: its float's high 16 bits (the low 16 are zero).
uint16_t small_integer_bf16(int v) {
  const float f = static_cast<float>(v);
  uint32_t bits = 0;
  std::memcpy(&bits, &f, sizeof bits);
  return static_cast<uint16_t>(bits >> 16);
}

// One rank's buffers on its GPU.
struct Rank {
  int gpu = 0;
  exactcoll::SignalBuffer* signals = nullptr;
  void* lamport = nullptr;
  size_t lamport_bytes = 0;
  DeviceError* error = nullptr;
  bf16* input = nullptr;
  bf16* output = nullptr;
  Stamps* stamps = nullptr;  // kOpsPerGraph rows
  cudaStream_t stream = nullptr;
};

// The Lamport region of a world of n whose buffers have slots of slot_bytes.
size_t region_bytes(int n, size_t slot_bytes) {
  return exactcoll::kLamportBuffers * static_cast<size_t>(n) * slot_bytes;
}

std::vector<Rank> make_world(int n, size_t max_count, size_t slot_bytes) {
  std::vector<Rank> ranks(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    Rank& k = ranks[static_cast<size_t>(r)];
    k.gpu = r;
    CHECK(cudaSetDevice(r));
    for (int p = 0; p < n; ++p) {
      if (p == r) continue;
      const cudaError_t e = cudaDeviceEnablePeerAccess(p, 0);
      if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) CHECK(e);
      (void)cudaGetLastError();
    }
    CHECK(cudaMalloc(&k.signals, sizeof(exactcoll::SignalBuffer)));
    CHECK(cudaMemset(k.signals, 0, sizeof(exactcoll::SignalBuffer)));
    k.lamport_bytes = region_bytes(n, slot_bytes);
    CHECK(cudaMalloc(&k.lamport, k.lamport_bytes));
    CHECK(cudaMemset(k.lamport, 0xFF, k.lamport_bytes));
    CHECK(cudaMalloc(&k.error, sizeof(DeviceError)));
    CHECK(cudaMemset(k.error, 0, sizeof(DeviceError)));
    CHECK(cudaMalloc(&k.input, max_count * sizeof(bf16)));
    CHECK(cudaMalloc(&k.output, max_count * sizeof(bf16)));
    std::vector<uint16_t> values(max_count);
    for (size_t i = 0; i < max_count; ++i) values[i] = small_integer_bf16(input_value(r, i));
    CHECK(cudaMemcpy(k.input, values.data(), max_count * sizeof(bf16), cudaMemcpyHostToDevice));
    CHECK(cudaMalloc(&k.stamps, kOpsPerGraph * sizeof(Stamps)));
    CHECK(cudaStreamCreateWithFlags(&k.stream, cudaStreamNonBlocking));
    CHECK(cudaDeviceSynchronize());
  }
  return ranks;
}

void free_world(std::vector<Rank>& ranks) {
  for (Rank& k : ranks) {
    CHECK(cudaSetDevice(k.gpu));
    CHECK(cudaFree(k.signals));
    CHECK(cudaFree(k.lamport));
    CHECK(cudaFree(k.error));
    CHECK(cudaFree(k.input));
    CHECK(cudaFree(k.output));
    CHECK(cudaFree(k.stamps));
    CHECK(cudaStreamDestroy(k.stream));
  }
  CHECK(cudaSetDevice(0));
}

KernelArgs args_of(const std::vector<Rank>& ranks, int r, size_t count) {
  KernelArgs a;
  std::memset(&a, 0, sizeof a);
  const int n = static_cast<int>(ranks.size());
  for (int p = 0; p < n; ++p) {
    a.inputs[p] = ranks[static_cast<size_t>(p)].input;
    a.signals[p] = ranks[static_cast<size_t>(p)].signals;
    a.lamport[p] = ranks[static_cast<size_t>(p)].lamport;
  }
  a.output = ranks[static_cast<size_t>(r)].output;
  a.error = ranks[static_cast<size_t>(r)].error;
  a.count = count;
  a.lamport_bytes = ranks[static_cast<size_t>(r)].lamport_bytes;
  a.timeout_ns = kTimeoutNs;
  a.rank = r;
  a.world_size = n;
  a.contract = static_cast<int32_t>(exactcoll::Contract::kCanonical);
  return a;
}

// Launches variant kVariants[I] (20 of them make a graph).
template <int kRanks, size_t I>
void launch_variant(const cudaLaunchConfig_t& config, const KernelArgs& args, Stamps* stamps) {
  if constexpr (kVariants[I].production) {
    CHECK(cudaLaunchKernelEx(
        &config, exactcoll::cuda::collective_kernel<bf16, kRanks, kVariants[I].kind, exactcoll::Contract::kCanonical>,
        args));
  } else if constexpr (kVariants[I].traced) {
    CHECK(cudaLaunchKernelEx(&config, traced_lamport_kernel<kRanks, I>, args, stamps));
  } else {
    CHECK(cudaLaunchKernelEx(&config, stepped_lamport_kernel<kRanks, I>, args, stamps));
  }
}

template <int kRanks, size_t... I>
void launch_indexed(size_t v, const cudaLaunchConfig_t& config, const KernelArgs& args, Stamps* stamps,
                    std::index_sequence<I...>) {
  ((v == I ? launch_variant<kRanks, I>(config, args, stamps) : void()), ...);
}

template <int kRanks>
void launch(size_t v, const KernelArgs& args, Stamps* stamps, int blocks, int threads, cudaStream_t stream) {
  cudaLaunchAttribute attribute;
  const cudaLaunchConfig_t config = launch_config(blocks, threads, stream, /*programmatic=*/true, &attribute);
  launch_indexed<kRanks>(v, config, args, stamps, std::make_index_sequence<kVariantCount>{});
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Checks every rank's error record and output (element i: the sum over ranks r of input_value(r,
// i)); exits 1 naming what failed.
void check_world(const std::vector<Rank>& ranks, size_t count, const char* what) {
  const int n = static_cast<int>(ranks.size());
  auto expected_at = [&](size_t i) {
    int sum = 0;
    for (int r = 0; r < n; ++r) sum += input_value(r, i);
    return small_integer_bf16(sum);
  };
  for (const Rank& k : ranks) {
    CHECK(cudaSetDevice(k.gpu));
    DeviceError e;
    CHECK(cudaMemcpy(&e, k.error, sizeof e, cudaMemcpyDeviceToHost));
    if (e.claimed != 0) {
      std::fprintf(stderr, "%s: %s: rank %d block %d gave up waiting for peer %d (kind %u)\n", kProbeName, what, e.rank,
                   e.block, e.peer, e.kind);
      std::exit(1);
    }
    std::vector<uint16_t> out(count);
    CHECK(cudaMemcpy(out.data(), k.output, count * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < count; ++i) {
      if (out[i] != expected_at(i)) {
        std::fprintf(stderr, "%s: %s: GPU %d output[%zu] = 0x%04x, expected 0x%04x\n", kProbeName, what, k.gpu, i,
                     out[i], expected_at(i));
        std::exit(1);
      }
    }
  }
  CHECK(cudaSetDevice(0));
}

// Times variant v on the world (one graph per rank, replayed together); prints the per-op µs and,
// for the stamped kernel, the steps' medians.
template <int kRanks>
void measure(std::vector<Rank>& ranks, size_t variant, size_t count, int blocks, int threads) {
  const Variant& v = kVariants[variant];
  const char* label = v.label;
  const int n = static_cast<int>(ranks.size());
  std::vector<cudaGraphExec_t> exec(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    Rank& k = ranks[static_cast<size_t>(r)];
    CHECK(cudaSetDevice(k.gpu));
    CHECK(cudaMemset(k.output, 0, count * sizeof(bf16)));  // an element no launch writes fails the check
    const KernelArgs args = args_of(ranks, r, count);
    CHECK(cudaStreamBeginCapture(k.stream, cudaStreamCaptureModeThreadLocal));
    for (int op = 0; op < kOpsPerGraph; ++op) launch<kRanks>(variant, args, k.stamps + op, blocks, threads, k.stream);
    cudaGraph_t graph;
    CHECK(cudaStreamEndCapture(k.stream, &graph));
    CHECK(cudaGraphInstantiate(&exec[static_cast<size_t>(r)], graph, 0));
    CHECK(cudaGraphDestroy(graph));
  }
  CHECK(cudaSetDevice(0));
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  std::vector<double> per_op_us;
  // The points' names; the stepped kernels' stamps are read from GPU 0, the traced ones' from every rank.
  std::vector<std::string> names;
  if (v.traced && !v.o.no_stamps) {
    names = traced_point_names(v.kind, n, v.o);
    if (names.size() > static_cast<size_t>(kPoints)) {
      std::fprintf(stderr, "%s: %s on %d ranks has %zu points, more than the %d stamped\n", kProbeName, v.label, n,
                   names.size(), kPoints);
      std::exit(1);
    }
  } else if (!v.production) {
    names.assign(kPointNames, kPointNames + 2 + kStepsPerPass * v.o.passes);
  }
  const int points = static_cast<int>(names.size());
  const int stamped_ranks = v.traced ? n : 1;
  // step_cycles[rank][point]: cycles from the previous point, one entry a launch.
  std::vector<std::vector<std::vector<double>>> step_cycles(static_cast<size_t>(stamped_ranks),
                                                            std::vector<std::vector<double>>(kPoints));
  std::vector<Stamps> host(kOpsPerGraph);
  for (int replay = -2; replay < kTimedReplays; ++replay) {
    for (int r = 0; r < n; ++r) {  // the untimed lead
      CHECK(cudaSetDevice(ranks[static_cast<size_t>(r)].gpu));
      CHECK(cudaGraphLaunch(exec[static_cast<size_t>(r)], ranks[static_cast<size_t>(r)].stream));
    }
    CHECK(cudaSetDevice(0));
    CHECK(cudaEventRecord(start, ranks[0].stream));
    for (int r = 0; r < n; ++r) {
      CHECK(cudaSetDevice(ranks[static_cast<size_t>(r)].gpu));
      CHECK(cudaGraphLaunch(exec[static_cast<size_t>(r)], ranks[static_cast<size_t>(r)].stream));
    }
    CHECK(cudaSetDevice(0));
    CHECK(cudaEventRecord(stop, ranks[0].stream));
    for (const Rank& k : ranks) {
      CHECK(cudaSetDevice(k.gpu));
      CHECK(cudaStreamSynchronize(k.stream));
    }
    CHECK(cudaSetDevice(0));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (replay < 0) continue;
    per_op_us.push_back(ms * 1000.0 / kOpsPerGraph);
    if (points == 0) continue;
    for (int r = 0; r < stamped_ranks; ++r) {
      CHECK(cudaSetDevice(ranks[static_cast<size_t>(r)].gpu));
      CHECK(cudaMemcpy(host.data(), ranks[static_cast<size_t>(r)].stamps, kOpsPerGraph * sizeof(Stamps),
                       cudaMemcpyDeviceToHost));
      for (int op = 1; op < kOpsPerGraph; ++op) {  // launch 0: no programmatic launch
        const Stamps& s = host[static_cast<size_t>(op)];
        for (int p = 1; p < points; ++p) {
          step_cycles[static_cast<size_t>(r)][static_cast<size_t>(p)].push_back(
              static_cast<double>(s.cycles[p] - s.cycles[p - 1]));
        }
      }
    }
    CHECK(cudaSetDevice(0));
  }
  check_world(ranks, count, label);
  std::printf("%-34s %-5d %9zu %6d %7d %9.2f\n", label, n, count * sizeof(bf16), blocks, threads, median(per_op_us));
  for (int r = 0; points > 0 && r < stamped_ranks; ++r) {
    std::printf("    to each point from the previous one (GPU %d, block 0, thread 0; median cycles):", r);
    for (int p = 1; p < points; ++p) {
      std::printf(" %s %.0f", names[static_cast<size_t>(p)].c_str(),
                  median(step_cycles[static_cast<size_t>(r)][static_cast<size_t>(p)]));
    }
    std::printf("\n");
  }
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  for (int r = 0; r < n; ++r) {
    CHECK(cudaSetDevice(ranks[static_cast<size_t>(r)].gpu));
    CHECK(cudaGraphExecDestroy(exec[static_cast<size_t>(r)]));
  }
  CHECK(cudaSetDevice(0));
}

// Every shape whose message fits a slot of slot_bytes, on a world of kRanks, with the variants
// selected (production_only, only). Returns how many it measured.
template <int kRanks>
size_t run_world(size_t slot_bytes, bool production_only, const std::string& only) {
  struct Shape {
    size_t bytes;
    int blocks, threads;
  };
  const Shape shapes[] = {{16384, 4, 256},    {16384, 8, 256},    {65536, 16, 256},   {262144, 64, 256},
                          {524288, 32, 512},  {524288, 64, 256},  {524288, 128, 256}, {1048576, 64, 256},
                          {1048576, 64, 512}, {1048576, 128, 256}};
  std::printf("-- a world of %d, Lamport slots of %zu KiB (region %zu KiB)\n", kRanks, slot_bytes >> 10,
              region_bytes(kRanks, slot_bytes) >> 10);
  size_t max_count = 0;
  for (const Shape& s : shapes) max_count = std::max(max_count, s.bytes / sizeof(bf16));
  std::vector<Rank> ranks = make_world(kRanks, max_count, slot_bytes);
  size_t measured = 0;
  for (const Shape& s : shapes) {
    if (s.bytes > slot_bytes) continue;
    for (size_t v = 0; v < kVariantCount; ++v) {
      if (production_only && !kVariants[v].production) continue;
      if (!label_selected(kVariants[v], only)) continue;
      if (kRanks == 1 && kVariants[v].kind == KernelKind::kLamportTwoShot) continue;  // no peer to shoot to
      measure<kRanks>(ranks, v, s.bytes / sizeof(bf16), s.blocks, s.threads);
      ++measured;
    }
  }
  free_world(ranks);
  return measured;
}

}  // namespace

int main() {
  // LAMPORT_STEP_PROBE_WORLDS: the worlds to run (default "1 2"; 4 needs GPUs 0-3 to reach each
  // other); LAMPORT_STEP_PROBE_PRODUCTION=1: the production kernels only (no stepped variants).
  const char* worlds_env = std::getenv("LAMPORT_STEP_PROBE_WORLDS");
  const std::string worlds = worlds_env != nullptr ? worlds_env : "1 2";
  if (worlds.find_first_not_of("124 ,") != std::string::npos || worlds.find_first_of("124") == std::string::npos) {
    std::fprintf(stderr, "%s: LAMPORT_STEP_PROBE_WORLDS=\"%s\": give worlds among 1, 2 and 4, e.g. \"1 2\" or \"4\"\n",
                 kProbeName, worlds.c_str());
    return 2;
  }
  const char* production_env = std::getenv("LAMPORT_STEP_PROBE_PRODUCTION");
  if (production_env != nullptr && std::strcmp(production_env, "0") != 0 && std::strcmp(production_env, "1") != 0) {
    std::fprintf(stderr, "%s: LAMPORT_STEP_PROBE_PRODUCTION=\"%s\": give 1 (production kernels only) or 0\n",
                 kProbeName, production_env);
    return 2;
  }
  const bool production_only = production_env != nullptr && std::strcmp(production_env, "1") == 0;
  const char* only_env = std::getenv("LAMPORT_STEP_PROBE_ONLY");
  const std::string only = only_env != nullptr ? only_env : "";
  if (std::none_of(std::begin(kVariants), std::end(kVariants),
                   [&](const Variant& v) { return label_selected(v, only); })) {
    std::fprintf(stderr, "%s: LAMPORT_STEP_PROBE_ONLY=\"%s\" is in no variant's label (e.g. \"lamport_two_shot\")\n",
                 kProbeName, only.c_str());
    return 2;
  }
  cudaDeviceProp prop;
  const int gpus = visible_gpus_or_exit(&prop);
  int clock_khz = 0;
  CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  std::printf("lamport_step_probe on %s (%d GPUs visible, SM clock %d MHz), KernelArgs %zu bytes\n", prop.name, gpus,
              clock_khz / 1000, sizeof(KernelArgs));
  std::printf("us per op: graph of %d launches, median of %d replays each behind an untimed one\n", kOpsPerGraph,
              kTimedReplays);
  std::printf("%-34s %-5s %9s %6s %7s %9s\n", "kernel", "ranks", "bytes", "blocks", "threads", "us/op");
  auto reachable = [&](int n) {
    if (gpus < n) return false;
    for (int a = 0; a < n; ++a) {
      for (int b = 0; b < n; ++b) {
        int can = 1;
        if (a != b) CHECK(cudaDeviceCanAccessPeer(&can, a, b));
        if (!can) return false;
      }
    }
    return true;
  };
  size_t measured = 0;  // over the worlds that ran
  bool world_ran = false;
  if (worlds.find('1') != std::string::npos) {
    measured += run_world<1>(size_t{2} << 20, production_only, only);
    world_ran = true;
  }
  if (worlds.find('2') != std::string::npos) {
    if (reachable(2)) {
      measured += run_world<2>(size_t{1} << 20, production_only, only);   // the communicator's default (1 MiB slots)
      measured += run_world<2>(size_t{64} << 10, production_only, only);  // every buffer's slots within 768 KiB
      world_ran = true;
    } else {
      std::printf("GPUs 0 and 1 cannot reach each other (or one GPU): the world of 2 skipped\n");
    }
  }
  if (worlds.find('4') != std::string::npos) {
    if (reachable(4)) {
      measured += run_world<4>(size_t{1} << 20, production_only, only);
      world_ran = true;
    } else {
      std::printf("fewer than 4 GPUs, or GPUs 0-3 cannot all reach each other: the world of 4 skipped\n");
    }
  }
  if (world_ran && measured == 0) {  // e.g. only lamport_two_shot's variants in a world of 1
    std::fprintf(stderr, "%s: no variant selected (LAMPORT_STEP_PROBE_ONLY, _PRODUCTION) runs in the worlds run (%s)\n",
                 kProbeName, worlds.c_str());
    return 2;
  }
  return 0;
}

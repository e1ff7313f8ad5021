// The device execution context: what core/collectives.h's algorithm templates see when they run as
// a CUDA kernel (the Ctx concept is documented at the top of that header).
//
// - Ranks are processes (one GPU each); blocks and threads are the launch's.
// - Peers' buffers are plain device pointers opened through CUDA IPC (KernelArgs).
// - signal(): st.release.sys.global.u32 into the peer's flag (NVLink store). Release at system
//   scope after the block's __syncthreads makes every write the block made before the barrier
//   visible to the peer that acquires the flag.
// - wait(): ld.acquire.sys.global.u32 polling of this rank's own flag (local memory), bounded by
//   %globaltimer: after timeout_ns the first thread that gives up records who never arrived in the
//   DeviceError buffer, marks the block aborted (shared memory) so that the block's other waits
//   give up at once, and returns; the host reads the record after the launch. A wait that finds
//   the record already claimed (by another block, or by an earlier launch on this rank) gives up
//   at once too, so a dead peer costs one timeout, not one per queued kernel.
// - load()/store(): one 16-byte access (uint4).
#pragma once

#include <cstdint>

#include "core/collectives.h"
#include "core/contract.h"
#include "core/lamport.h"
#include "core/signal.h"
#include "core/storage.h"
#include "cuda_backend/kernel_args.h"

namespace exactcoll::cuda {

__device__ __forceinline__ void store_release_sys(uint32_t* flag, uint32_t value) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(flag), "r"(value) : "memory");
}

__device__ __forceinline__ uint32_t load_acquire_sys(const uint32_t* flag) {
  uint32_t value;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(value) : "l"(flag) : "memory");
  return value;
}

// A pointer stored for another GPU (or read from one) with no ordering of its own: a release or
// acquire of the same thread orders it (the eager input rows ride on the barrier's flags).
__device__ __forceinline__ void store_relaxed_sys_u64(const void** slot, const void* value) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(slot), "l"(reinterpret_cast<unsigned long long>(value))
               : "memory");
}
__device__ __forceinline__ const void* load_relaxed_sys_u64(const void* const* slot) {
  unsigned long long v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(slot) : "memory");
  return reinterpret_cast<const void*>(v);
}

// The RMSNorm tree's two steps on the GPU (contract::sum_squares), shared by the device contexts'
// row_sum_squares and the register paths' sum_lane_partials (cuda_backend/fused):
//   warp_butterfly(v): the 32-lane xor butterfly of contract::add (off 16, 8, 4, 2, 1: a[l] = a[l] +
//     a[l ^ off]) by shuffles over the calling warp; every lane returns the group's value (after an
//     xor butterfly all lanes hold the same bits: add is commutative);
//   combine_group_values(tree, values, lane): once lane 0 of each group's warp stored its value in
//     values[g], pads values to 32 with 0.0f, __syncthreads, and the second butterfly in every warp:
//     every thread returns ss. Called by every thread of the block.
__device__ __forceinline__ float warp_butterfly(float v) {
  for (int off = contract::kWarp / 2; off >= 1; off /= 2) v = contract::add(v, __shfl_xor_sync(0xFFFFFFFFu, v, off));
  return v;
}
__device__ __forceinline__ float combine_group_values(const contract::RmsNormTree& tree, float* values, int lane) {
  if (static_cast<int>(threadIdx.x) < contract::kWarp && static_cast<int>(threadIdx.x) >= tree.groups) {
    values[threadIdx.x] = 0.0f;
  }
  __syncthreads();
  return warp_butterfly(values[lane]);
}

__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Ctx for storage type T. kRanks > 0 makes world_size() a compile-time constant (the hot loops
// unroll over ranks); 0 reads it from the arguments. kFold: the contract the folds follow
// (core/collectives.h, fold_contract), a compile-time choice so each contract's kernel has only
// its own fold.
template <class T, int kRanks, Contract kFold = Contract::kCanonical>
class DeviceCtx {
 public:
  using value_type = T;
  static constexpr Contract kContract = kFold;
  static constexpr bool kTraceSteps = false;
  static constexpr bool kTraceElements = false;
  // Loads in flight per thread before the first fold or store (core/collectives.h,
  // packs_in_flight): one_shot on 2 ranks folds 4 packs per iteration, copies take 4 at a time.
  static constexpr int kPacksInFlight = 8;

  // aborted: a block-shared word, 0 at launch (set once any wait of the block times out). views: a
  // block-shared array of kMaxRanks pointers, for the launches that take their inputs' addresses
  // from the graph input table or the eager input rows (null for kernels that never do).
  __device__ __forceinline__ DeviceCtx(const KernelArgs& args, volatile int* aborted, const void** views = nullptr)
      : args_(args), aborted_(aborted), views_(views) {}

  __device__ __forceinline__ int rank() const { return args_.rank; }
  __device__ __forceinline__ int world_size() const { return kRanks > 0 ? kRanks : args_.world_size; }
  __device__ __forceinline__ int block() const { return static_cast<int>(blockIdx.x); }
  __device__ __forceinline__ int num_blocks() const { return static_cast<int>(gridDim.x); }
  __device__ __forceinline__ int thread() const { return static_cast<int>(threadIdx.x); }
  __device__ __forceinline__ int num_threads() const { return static_cast<int>(blockDim.x); }

  // Rank peer's input: inputs[peer], or, after read_inputs_from_table or publish_input_views,
  // the block's views (filled once per launch, so the hot loops read shared memory, not a table).
  __device__ __forceinline__ const T* input(int peer) const {
    if (views_mode_) return static_cast<const T*>(views_[peer]);
    return static_cast<const T*>(args_.inputs[peer]);
  }
  // A call captured in place whose row is filled (KernelArgs::input_table): every input from it.
  // The host fills rows between replays only, hence the non-coherent load. Preconditions: views.
  __device__ __forceinline__ void read_inputs_from_table() {
    const int t = thread();
    if (t < world_size()) {
      views_[t] =
          reinterpret_cast<const void*>(__ldg(reinterpret_cast<const unsigned long long*>(args_.input_table) + t));
    }
    sync_block();
    views_mode_ = true;
  }
  // Eager in place (KernelArgs::publish_views): thread t < n stores this rank's input as rank t
  // addresses it into t's input_rows[block][rank], before the same thread signals t at the first
  // barrier (block_barrier: the release orders it); barrier_passed then reads the peers' entries.
  // Preconditions: views; called before the first barrier.
  __device__ __forceinline__ void publish_input_views() {
    const int t = thread();
    if (t < world_size() && t != rank()) {
      store_relaxed_sys_u64(&args_.signals[t]->input_rows[block()][rank()], args_.input_views[t]);
    }
    rows_pending_ = true;
    views_mode_ = true;
  }
  // Called by block_barrier once the block is past a barrier: after the first one of an eager
  // launch, every peer's input address (its row entry, null: its staging buffer) into the views.
  // A block whose wait gave up (aborted, the same for the whole block after the barrier's last
  // sync) never saw the peer's row of this launch: an older row may name memory since unmapped, so
  // it reads the staging buffers, always mapped (its result is garbage either way; check() throws).
  __device__ __forceinline__ void barrier_passed() {
    if (!rows_pending_) return;
    rows_pending_ = false;
    const int t = thread();
    if (t < world_size()) {
      const void* row = t == rank() || *aborted_ != 0
                            ? nullptr
                            : load_relaxed_sys_u64(&args_.signals[rank()]->input_rows[block()][t]);
      views_[t] = row != nullptr ? row : args_.inputs[t];
    }
    sync_block();
  }
  __device__ __forceinline__ T* scratch(int peer) const { return static_cast<T*>(args_.scratch[peer]); }
  __device__ __forceinline__ size_t scratch_elements() const { return args_.scratch_bytes / sizeof(T); }
  __device__ __forceinline__ T* output() const { return static_cast<T*>(args_.output); }
  __device__ __forceinline__ SignalBuffer* signals(int peer) const { return args_.signals[peer]; }

  __device__ __forceinline__ void signal(uint32_t* flag, uint32_t value, int /*peer*/, int /*set*/) const {
    store_release_sys(flag, value);
  }

  // Returns once *flag == value, or after timeout_ns with the error recorded (see the top).
  __device__ void wait(const uint32_t* flag, uint32_t value, int peer, int set) const {
    if (load_acquire_sys(flag) == value) return;
    if (*aborted_) return;
    if (error_recorded()) {  // an earlier wait (this launch or an earlier one) gave up: fail fast
      *aborted_ = 1;
      return;
    }
    const uint64_t start = global_timer_ns();
    for (uint32_t spins = 1;; ++spins) {
      const uint32_t seen = load_acquire_sys(flag);
      if (seen == value) return;
      if ((spins & 255u) == 0) {
        if (*aborted_) return;   // another wait of this block already gave up
        if (error_recorded()) {  // another block of this rank gave up
          *aborted_ = 1;
          return;
        }
        const uint64_t waited = global_timer_ns() - start;
        if (waited > args_.timeout_ns) {
          *aborted_ = 1;
          record_error(kErrorFlagTimeout, peer, set, value, seen, waited);
          return;
        }
      }
    }
  }

  __device__ __forceinline__ void sync_block() const { __syncthreads(); }

  __device__ __forceinline__ Pack<T> load(const Pack<T>* p) const {
    const uint4 bits = *reinterpret_cast<const uint4*>(p);
    Pack<T> out;
    static_assert(sizeof(Pack<T>) == sizeof(uint4));
    __builtin_memcpy(&out, &bits, sizeof bits);
    return out;
  }

  // One st.global.v4 through the intrinsic: with a plain uint4 assignment nvcc 13.0 split the
  // push algorithms' remainder-loop stores into four st.global.u32 (four NVLink writes instead of
  // one; push_one_shot on 4 GPUs took 10.1 us instead of 9.1 at 512 KB), once the slot offset came
  // from run-time scratch arithmetic.
  __device__ __forceinline__ void store(Pack<T>* p, const Pack<T>& x) const {
    uint4 bits;
    __builtin_memcpy(&bits, &x, sizeof bits);
    __stwb(reinterpret_cast<uint4*>(p), bits);
  }

  // Whether some wait on this rank already gave up and recorded it (args_.error stays claimed
  // until the host has read it and the communicator is unusable): every later wait, in this
  // launch or a later one, then gives up at once. Without this, a dead peer costs every queued
  // kernel its own full timeout (a graph of 20 all-reduces: 20 x timeout before the host sees it).
  __device__ __forceinline__ bool error_recorded() const {
    return *reinterpret_cast<const volatile uint32_t*>(&args_.error->claimed) != 0u;
  }

  // ---- core/lamport.h's primitives ----
  __device__ __forceinline__ unsigned char* lamport(int peer) const {
    return static_cast<unsigned char*>(args_.lamport[peer]);
  }
  __device__ __forceinline__ size_t lamport_bytes() const { return args_.lamport_bytes; }

  // One volatile 16-byte store (never merged or cached; a concurrent poll may see it element by
  // element). The clear of call k and the peers' writes of call k+2 into the same buffer are
  // ordered by this rank's kernel boundary: its call k+1 push, which a peer must see before
  // writing call k+2, is issued only after griddepcontrol.wait saw call k's kernel complete.
  __device__ __forceinline__ void lamport_store(Pack<T>* p, const Pack<T>& x, int /*peer*/) const {
    uint4 b;
    __builtin_memcpy(&b, &x, sizeof b);
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(b.x), "r"(b.y), "r"(b.z), "r"(b.w)
                 : "memory");
  }

  // Volatile 16-byte loads of this rank's own region until no element is the sentinel, bounded by
  // timeout_ns as wait() is (the first thread to give up records the peer that never wrote).
  // After a first miss the error record is read before the next load. (The twelfth session sent the
  // next load out with that read, to save a round trip; it was part of the prologue that cost 4 GPUs
  // more than it gave 2: core/lamport.h, begin_lamport_call.)
  __device__ Pack<T> lamport_poll(const Pack<T>* p, int peer, const LamportPoll& where) const {
    Pack<T> x = lamport_load(p);
    if (lamport_arrived(x) || *aborted_) return x;
    if (error_recorded()) {  // as wait(): an earlier give-up on this rank ends this poll at once
      *aborted_ = 1;
      return x;
    }
    const uint64_t start = global_timer_ns();
    for (uint32_t spins = 1;; ++spins) {
      x = lamport_load(p);
      if (lamport_arrived(x)) return x;
      if ((spins & 255u) == 0) {
        if (*aborted_) return x;
        if (error_recorded()) {
          *aborted_ = 1;
          return x;
        }
        const uint64_t waited = global_timer_ns() - start;
        if (waited > args_.timeout_ns) {
          *aborted_ = 1;
          record_error(kErrorLamportTimeout, peer, where.buffer, where.call, static_cast<uint32_t>(where.element),
                       waited);
          return x;
        }
      }
    }
  }

  // One volatile 16-byte load of this rank's own region, whatever it finds (core/lamport.h's
  // lamport_fold_pack issues every peer's first load with it before polling any).
  __device__ __forceinline__ Pack<T> lamport_peek(const Pack<T>* p) const { return lamport_load(p); }

  // Spins until done() returns true, for at most timeout_scale x the flag timeout: on giving up
  // records an error of `kind` (peer, set and expected as the kind defines them; observed 0), sets
  // the block's aborted flag and returns false. For waits on this GPU that no peer's give-up ends
  // (cuda_backend/fused's cluster exchange: every block of a cluster sends, whatever its polls saw).
  template <class Done>
  __device__ bool spin_until(Done done, uint32_t kind, int peer, int set, uint32_t expected,
                             uint64_t timeout_scale) const {
    if (done()) return true;
    const uint64_t start = global_timer_ns();
    for (uint32_t spins = 1;; ++spins) {
      if (done()) return true;
      if ((spins & 255u) == 0) {
        const uint64_t waited = global_timer_ns() - start;
        if (waited / timeout_scale > args_.timeout_ns) {
          *aborted_ = 1;
          record_error(kind, peer, set, expected, 0, waited);
          return false;
        }
      }
    }
  }

  // Whether some wait of this block gave up (after sync_block, every thread agrees).
  __device__ __forceinline__ bool aborted() const { return *aborted_ != 0; }

  // ---- core/fused_rmsnorm.h's row_sum_squares hook (added for cuda_backend/fused) ----
  // Returns, to every thread of the block, ss = contract::sum_squares(tree, row): the same tree,
  // computed in parallel. Steps:
  //   1. warp w takes the groups of 32 lanes w, w + warps, ...: lane l's partial is
  //      contract::lane_sum_squares(tree, l, row); a 32-lane xor butterfly of contract::add
  //      (off 16, 8, 4, 2, 1: a[l] = a[l] + a[l ^ off]) by shuffles; lane 0 stores the group value;
  //   2. the group values are padded with 0.0f to 32 and __syncthreads makes them visible;
  //   3. every warp runs the second butterfly over the 32 values, so every thread holds the
  //      result (after an xor butterfly all lanes hold the same bits: add is commutative).
  // The group values alternate between two shared arrays per call, so one __syncthreads per call
  // suffices: call k+2 reuses call k's array only after every thread passed call k+1's sync.
  // Preconditions: every thread of the block calls it with the same tree (blockDim.x a multiple
  // of 32); row(j) readable by every thread.
  template <class Row>
  __device__ float row_sum_squares(const contract::RmsNormTree& tree, Row row) {
    __shared__ float group_values[2][contract::kWarp];
    float* values = group_values[sum_squares_calls_++ & 1u];
    const int lane = static_cast<int>(threadIdx.x) % contract::kWarp;
    const int warp = static_cast<int>(threadIdx.x) / contract::kWarp;
    const int warps = static_cast<int>(blockDim.x) / contract::kWarp;
    for (int g = warp; g < tree.groups; g += warps) {
      const float v = warp_butterfly(contract::lane_sum_squares(tree, g * contract::kWarp + lane, row));
      if (lane == 0) values[g] = v;
    }
    return combine_group_values(tree, values, lane);
  }

 private:
  __device__ __forceinline__ Pack<T> lamport_load(const Pack<T>* p) const {
    uint4 b;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(b.x), "=r"(b.y), "=r"(b.z), "=r"(b.w)
                 : "l"(p)
                 : "memory");
    Pack<T> out;
    __builtin_memcpy(&out, &b, sizeof b);
    return out;
  }

  __device__ void record_error(uint32_t kind, int peer, int set, uint32_t expected, uint32_t observed,
                               uint64_t waited) const {
    DeviceError* e = args_.error;
    if (atomicCAS(&e->claimed, 0u, 1u) != 0u) return;  // the first error is the one reported
    e->kind = kind;
    e->rank = args_.rank;
    e->block = static_cast<int32_t>(blockIdx.x);
    e->peer = peer;
    e->set = set;
    e->expected = expected;
    e->observed = observed;
    e->waited_ns = waited;
    __threadfence();
  }

  const KernelArgs& args_;
  volatile int* aborted_;
  const void** views_ = nullptr;    // block-shared: every rank's input (views_mode_)
  bool views_mode_ = false;         // input() reads views_ (read_inputs_from_table, publish_input_views)
  bool rows_pending_ = false;       // publish_input_views ran; barrier_passed has not read the rows yet
  uint32_t sum_squares_calls_ = 0;  // row_sum_squares: which of its two shared arrays is next
};

}  // namespace exactcoll::cuda

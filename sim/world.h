// The simulated world: N ranks (1..16) in one process, each with its own symmetric heap (signal
// buffer, input staging, scratch, and any extra buffers a kernel needs), peers' buffers opened
// through the handle-exchange protocol (core/handle_exchange.h) over an in-process store
// (sim/local_store.h), and two schedulers for the simulated (rank, block) threads.
//
// A kernel is any callable `kernel(ctx)` that is run once by every (rank, block) of a launch, with
// ctx a SimCtx<T, kTrace> (the execution-context concept of core/collectives.h). A generic lambda
// works: `[count](auto& ctx) { allreduce_one_shot<bf16>(ctx, count); }`. Launches run in stream
// order per rank: rank r's launch k+1 (its input staging included) starts only after all of rank
// r's blocks finished launch k — as on a GPU stream — while different ranks interleave freely.
//
// Schedulers:
//   threads  one OS thread per rank runs its launches and, within a launch, its blocks in order.
//            That is legal because barriers pair only equal block indices (block b of every rank
//            reaches barrier k before any block b+1 needs to), so kernels must not make a block
//            wait for a later block of its own rank. Flag waits spin briefly, then sleep on a
//            futex, and time out (WorldOptions::wait_timeout) with an error naming the rank,
//            block, flag set, peer and epoch.
//   seeded   every simulated thread (rank stream, and (rank, block) per launch) is a fiber; one runs
//            at a time, and a PRNG seeded from WorldOptions::schedule_seed picks the next runnable
//            one at every flag signal, flag wait and launch start. A thread waiting for a flag is
//            runnable only once the flag holds the awaited value. No runnable thread while some
//            are unfinished is a deadlock, reported with every waiter's flag and epoch; more than
//            max_steps scheduling steps is reported as a livelock. Both messages end with
//            "reproduce with --schedule-seed N".
//
// Example:
//   World world({.ranks = 4, .schedule = Schedule::kSeeded, .schedule_seed = 7});
//   Launch launch{.name = "allreduce_one_shot", .blocks = 2, .inputs = in, .input_bytes = n * 2,
//                 .outputs = out, .output_bytes = n * 2};
//   world.enqueue<bf16>(launch, [n](auto& ctx) { allreduce_one_shot<bf16>(ctx, n); });
//   world.run();  // throws SimError on deadlock, livelock or timeout
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/collectives.h"
#include "core/handle_exchange.h"
#include "core/lamport.h"
#include "core/signal.h"
#include "sim/local_store.h"
#include "sim/trace.h"

namespace exactcoll::sim {

// Returns now + timeout on the steady clock, or the clock's last instant when that sum would
// overflow (a timeout of "forever", e.g. std::chrono::milliseconds::max()).
template <class Rep, class Period>
std::chrono::steady_clock::time_point deadline_after(std::chrono::duration<Rep, Period> timeout) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point now = Clock::now();
  const auto room = std::chrono::duration_cast<std::chrono::duration<Rep, Period>>(Clock::time_point::max() - now);
  return timeout >= room ? Clock::time_point::max() : now + std::chrono::duration_cast<Clock::duration>(timeout);
}

enum class Schedule { kThreads, kSeeded };
const char* schedule_name(Schedule s);

// kRankDied: the rank stopped by fault injection (WorldOptions::fail_rank) did not finish, while
// its peers did (their waits never needed it again).
enum class SimFailure { kDeadlock, kLivelock, kTimeout, kError, kRankDied };

// A run that did not complete: what went wrong, naming the ranks, blocks, flags and epochs.
class SimError : public std::runtime_error {
 public:
  SimError(SimFailure kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  SimFailure kind() const { return kind_; }

 private:
  SimFailure kind_;
};

struct WorldOptions {
  int ranks = 1;
  Schedule schedule = Schedule::kThreads;
  uint64_t schedule_seed = 1;                     // seeded scheduler
  std::chrono::milliseconds wait_timeout{20000};  // threads scheduler: one flag wait
  // Every wait of the handle exchange (over the in-process store) when buffers are new or grown.
  // Separate from wait_timeout, as on GPUs (store timeout vs kernel wait bound): a short flag-wait
  // bound must not fail the exchange while 16 threads start on 2 cores.
  std::chrono::milliseconds store_timeout{20000};
  uint64_t max_steps = 100'000'000;      // seeded scheduler: livelock bound
  bool trace = false;                    // record steps, signals and waits
  std::vector<uint64_t> trace_elements;  // also record these elements' folds and roundings
  // Fault injection: what a dead rank looks like to its peers. Rank fail_rank (-1: none) stops at
  // its fail_at_step-th synchronization step — a flag signal or wait of any of its blocks, counted
  // from 1 over the world's runs — before doing it: it signals, writes and reads nothing more, as
  // a killed process. Step 0: it never joins the world's first handle exchange. Its peers then
  // wait for it until every live rank waits and none can move again (a deadlock, under either
  // scheduler) or, threads, until their timeout (wait_timeout; store_timeout for step 0), whichever
  // comes first; run() throws SimError naming it, or kRankDied when they finished without it.
  int fail_rank = -1;
  uint64_t fail_at_step = 0;
};

// Thrown inside the failing rank's simulated threads when fault injection stops it; the
// schedulers end those threads quietly (a dead rank reports nothing) and run() says what happened.
// Not a std::exception, so that no handler of real errors mistakes it for one.
struct RankDied {};

// Broken variants of the eager-in-place protocol (Launch::publish_views), which exist only so that
// tests can prove the seeded exploration catches them (tests/sim/eager_views_exploration_test.cc);
// the GPU has none of them.
enum class ViewsFault {
  kNone,
  kPublishAfterFirstBarrier,    // the rows are stored once the block is past its first barrier,
                                // after the signal its peers wait for
  kReadRowsBeforeFirstBarrier,  // the block reads its row right after publishing, before the
                                // first barrier
  kSkipPublish,                 // the block stores nothing: its peers read the row an earlier
                                // launch left there
};

// One launch: a kernel over `blocks` blocks on every rank.
struct Launch {
  std::string name;                 // e.g. "allreduce_one_shot" (traces)
  int blocks = 1;                   // 1..kMaxBlocks
  std::vector<const void*> inputs;  // per rank, copied into its input buffer first (or empty; a
                                    // null entry: that rank's input buffer is left as it is)
  size_t input_bytes = 0;           // bytes copied per rank
  size_t scratch_bytes = 0;         // scratch each rank needs
  size_t lamport_bytes = 0;         // Lamport region each rank needs (core/lamport.h; filled with
                                    // 0xFF when created or grown, never between launches)
  std::vector<void*> outputs;       // per rank: ctx.output() (or empty)
  size_t output_bytes = 0;          // bytes per rank (a misaligned output is staged and copied out)
  // In place: the kernel writes its result over this rank's own input buffer (ctx.output() ==
  // ctx.input(rank)), as the GPU runs the push algorithms' in-place calls; outputs then receive a
  // copy when the launch finishes. Preconditions: output_bytes <= input_bytes.
  bool output_is_input = false;
  std::function<void(int rank)> before;  // optional staging of extra buffers, in stream order
  // Eager in place, as the GPU's KernelArgs::publish_views (docs/design.md section 9). In a
  // publishing launch block b of rank r, before anything else (before its first barrier's
  // signal), stores input_views[r][p] into peer p's SignalBuffer::input_rows[b][r] for every p != r;
  // once past its first barrier it reads its own row: peer p's input is input_rows[b][p], or p's
  // input buffer where that entry is null (p staged). input_views[r][p]: rank r's input as rank p
  // addresses it (one process here: the same address for every p), or null when rank r staged
  // (its inputs[r] copied into its input buffer); input_views[r][r]: where rank r reads its own
  // input (the GPU's KernelArgs::inputs[rank]: its input in place, or null: its input buffer).
  // Preconditions: one entry per rank when publish_views; empty otherwise.
  bool publish_views = false;
  std::vector<std::array<const void*, kMaxRanks>> input_views;
  // Tests only: a broken variant of that protocol, done by rank views_fault_rank's blocks (-1:
  // every rank's). Preconditions: publish_views when not kNone.
  ViewsFault views_fault = ViewsFault::kNone;
  int views_fault_rank = -1;
};

// Every peer's symmetric buffers as one rank sees them (opened through the handle exchange).
struct PeerTable {
  std::array<SignalBuffer*, kMaxRanks> signals{};
  std::array<void*, kMaxRanks> input{};
  std::array<void*, kMaxRanks> scratch{};
  size_t scratch_bytes = 0;  // of every rank's scratch (the heaps grow alike)
  std::array<void*, kMaxRanks> lamport{};
  size_t lamport_bytes = 0;                         // of every rank's Lamport region
  std::vector<std::array<void*, kMaxRanks>> extra;  // extra[buffer id][peer]
};

class Executor;

// What one (rank, block) of one launch runs with.
struct BlockEnv {
  int rank = 0;
  int world_size = 1;
  int block = 0;
  int num_blocks = 1;
  uint32_t launch = 0;
  const PeerTable* peers = nullptr;
  void* output = nullptr;
  Executor* executor = nullptr;
  Tracer* tracer = nullptr;
  // A launch that publishes its input views (Launch::publish_views): this rank's input_views, and
  // the broken variant this block does (tests); null and kNone otherwise.
  const std::array<const void*, kMaxRanks>* input_views = nullptr;
  ViewsFault views_fault = ViewsFault::kNone;
  // Where this world sits in a traced element's tree (core/collectives.h): the whole tree for a
  // world of its own; a node's subtree, its ranks numbered globally, in a multi-node job.
  TreeTraceScope tree_trace_scope;
};

// The scheduler's side of the flags (threads or seeded).
class Executor {
 public:
  virtual ~Executor() = default;
  virtual void signal(const BlockEnv& env, uint32_t* flag, uint32_t value, int peer, int set) = 0;
  virtual void wait(const BlockEnv& env, const uint32_t* flag, uint32_t value, int peer, int set) = 0;
  // Trace time: scheduling steps (seeded) or nanoseconds since the run started (threads).
  virtual uint64_t now() const = 0;
  // Lamport accesses (core/lamport.h). lamport_point: before every Lamport store, peek and poll (a
  // scheduling point under the seeded scheduler; a fault-injection step). lamport_wait: returns
  // once the `bytes`-wide word at `word` no longer holds `sentinel`; bounded, the error naming
  // the peer that never wrote. The defaults (for executors that run no Lamport kernel) do nothing
  // and spin for at most 20 s.
  virtual void lamport_point(const BlockEnv& env) { (void)env; }
  // Before every store and load of an eager input row (Launch::publish_views): a scheduling point
  // under the seeded scheduler (not a fault-injection step); nothing by default.
  virtual void memory_point(const BlockEnv& env) { (void)env; }
  virtual void lamport_wait(const BlockEnv& env, const void* word, int bytes, uint32_t sentinel, int peer,
                            const LamportPoll& where);
};

// Loads the `bytes`-wide (2 or 4) word at p with acquire (Lamport polls) / stores with release.
uint32_t lamport_load_word(const void* p, int bytes);
void lamport_store_word(void* p, int bytes, uint32_t value);
// "peer 2's slot of Lamport buffer 1 (call 7), element 16" for reports.
std::string lamport_poll_text(const LamportPoll& where, int peer);
// Throws SimError (kError) for a 16-byte pack access at p that is not 16-byte aligned, naming the
// rank, block, access ("load from" / "store to") and which of the rank's buffers p lies in.
[[noreturn]] void throw_misaligned_pack(const BlockEnv& env, const void* p, const char* access);

// The simulator's execution context (core/collectives.h): one simulated thread per block, folding
// under kFold (canonical or tree): traced elements record fold and round events under canonical,
// tree_node and round events under tree.
template <class T, bool kTrace, Contract kFold = Contract::kCanonical>
class SimCtx {
 public:
  using value_type = T;
  static constexpr Contract kContract = kFold;
  static constexpr bool kTraceSteps = kTrace;
  static constexpr bool kTraceElements = kTrace;

  explicit SimCtx(const BlockEnv& env) : env_(env) {}

  int rank() const { return env_.rank; }
  int world_size() const { return env_.world_size; }
  int block() const { return env_.block; }
  int num_blocks() const { return env_.num_blocks; }
  int thread() const { return 0; }
  int num_threads() const { return 1; }

  // Peer's input: its input buffer, or, in a launch that publishes its views, the block's views
  // (read from the rows once past the first barrier: barrier_passed).
  const T* input(int peer) const {
    if (views_mode_) return static_cast<const T*>(views_[peer]);
    return static_cast<const T*>(env_.peers->input[peer]);
  }
  // Eager in place (Launch::publish_views), as the GPU's DeviceCtx::publish_input_views: stores
  // this rank's input as each peer p addresses it (null: staged) into p's input_rows[block][rank],
  // each store a relaxed atomic after a scheduling point; the first barrier's release signal
  // orders them. The world calls it before the kernel, as the GPU's collective_kernel does.
  // Preconditions: env().input_views; called before the first barrier.
  void publish_input_views() {
    views_mode_ = true;
    rows_pending_ = true;
    switch (env_.views_fault) {
      case ViewsFault::kSkipPublish: return;
      case ViewsFault::kPublishAfterFirstBarrier: return;  // barrier_passed publishes
      case ViewsFault::kReadRowsBeforeFirstBarrier:
        store_rows();
        read_rows();
        return;
      case ViewsFault::kNone: store_rows(); return;
    }
  }
  // Called by block_barrier once the block is past a barrier (core/signal.h): after the first one
  // of a publishing launch, every peer's entry of this block's row into the views (null: the
  // peer's input buffer; this rank's own: input_views[rank], or its input buffer when null), as
  // the GPU's DeviceCtx::barrier_passed. Later barriers: nothing.
  void barrier_passed() {
    if (!rows_pending_) return;
    if (env_.views_fault == ViewsFault::kPublishAfterFirstBarrier) store_rows();
    read_rows();
  }
  T* scratch(int peer) const { return static_cast<T*>(env_.peers->scratch[peer]); }
  size_t scratch_elements() const { return env_.peers->scratch_bytes / sizeof(T); }
  T* output() const { return static_cast<T*>(env_.output); }
  SignalBuffer* signals(int peer) const { return env_.peers->signals[peer]; }
  // The Lamport region of `peer` (core/lamport.h).
  unsigned char* lamport(int peer) const { return static_cast<unsigned char*>(env_.peers->lamport[peer]); }
  size_t lamport_bytes() const { return env_.peers->lamport_bytes; }
  // Element by element, each a release store (a concurrent poll may see part of a pack, as on the
  // GPU); a scheduling point first.
  void lamport_store(Pack<T>* dst, const Pack<T>& x, int peer) {
    (void)peer;
    env_.executor->lamport_point(env_);
    unsigned char* d = reinterpret_cast<unsigned char*>(dst);
    for (int e = 0; e < Storage<T>::kPack; ++e) {
      lamport_store_word(d + e * sizeof(T), static_cast<int>(sizeof(T)), Storage<T>::bits(x.v[e]));
    }
  }
  // The pack at s, an acquire load per element; *missing = the first element still holding the
  // sentinel, or -1.
  static Pack<T> lamport_load_pack(const unsigned char* s, int* missing) {
    Pack<T> x;
    for (int e = 0; e < Storage<T>::kPack; ++e) {
      const uint32_t bits = lamport_load_word(s + e * sizeof(T), static_cast<int>(sizeof(T)));
      if constexpr (sizeof(T) == 4) {
        x.v[e] = bits_to_float(bits);
      } else {
        x.v[e] = T{static_cast<uint16_t>(bits)};
      }
      if (*missing < 0 && bits == lamport_sentinel_bits<T>()) *missing = e;
    }
    return x;
  }
  // Acquire loads element by element until none is the sentinel; the executor bounds the wait.
  Pack<T> lamport_poll(const Pack<T>* src, int peer, const LamportPoll& where) {
    env_.executor->lamport_point(env_);
    const unsigned char* s = reinterpret_cast<const unsigned char*>(src);
    while (true) {
      int missing = -1;
      const Pack<T> x = lamport_load_pack(s, &missing);
      if (missing < 0) return x;
      LamportPoll at = where;
      at.element += static_cast<size_t>(missing);
      env_.executor->lamport_wait(env_, s + missing * sizeof(T), static_cast<int>(sizeof(T)),
                                  lamport_sentinel_bits<T>(), peer, at);
    }
  }
  // One acquire load of the pack, element by element, whatever it finds (the sentinel too); a
  // scheduling point first, so a seed decides what an early look sees.
  Pack<T> lamport_peek(const Pack<T>* src) {
    env_.executor->lamport_point(env_);
    int missing = -1;
    return lamport_load_pack(reinterpret_cast<const unsigned char*>(src), &missing);
  }
  // Extra symmetric buffer `id` (World::add_buffer) of `peer`.
  void* buffer(int id, int peer) const { return env_.peers->extra[id][peer]; }
  const BlockEnv& env() const { return env_; }

  void signal(uint32_t* flag, uint32_t value, int peer, int set) {
    env_.executor->signal(env_, flag, value, peer, set);
  }
  void wait(const uint32_t* flag, uint32_t value, int peer, int set) {
    env_.executor->wait(env_, flag, value, peer, set);
  }
  void sync_block() {}

  // 16-byte accesses through memcpy: GCC 12 at -O3 merges core's put_pack branches (an aligned
  // `*p = x` and an element-wise store for a misaligned destination) into ONE store that keeps
  // the aligned form — a movaps to a misaligned all-gather destination, observed as a SIGSEGV.
  // A memcpy store carries no alignment promise, so the merged store is movups (same speed).
  // Each also checks what the GPU requires of a 16-byte access: an address that is a multiple of
  // 16. A misaligned one faults there (cudaErrorMisalignedAddress) while memcpy would not, so the
  // simulator refuses it with the same verdict instead of hiding the bug.
  Pack<T> load(const Pack<T>* p) const {
    require_pack_aligned(p, "load from");
    Pack<T> x;
    std::memcpy(static_cast<void*>(&x), static_cast<const void*>(p), sizeof x);
    return x;
  }
  void store(Pack<T>* p, const Pack<T>& x) const {
    require_pack_aligned(p, "store to");
    std::memcpy(static_cast<void*>(p), static_cast<const void*>(&x), sizeof x);
  }

  // ---- trace hooks (compiled only when kTrace) ----
  void trace_step_begin(const char* name) {
    pending_ = TraceEvent{};
    pending_.kind = TraceEvent::Kind::kStep;
    pending_.step = name;
  }
  void trace_access(Access access, int peer, Buffer buffer, size_t begin, size_t end) {
    pending_.accesses.push_back({access, peer, buffer, begin, end});
  }
  void trace_step_end() {
    if (env_.tracer == nullptr) return;
    stamp(pending_);
    env_.tracer->add(std::move(pending_));
    pending_ = TraceEvent{};
  }
  bool trace_element(size_t index) const { return env_.tracer != nullptr && env_.tracer->element_traced(index); }
  void trace_fold(size_t index, int input_rank, float acc_before, float x, float acc_after) {
    TraceEvent e;
    e.kind = TraceEvent::Kind::kFold;
    e.index = index;
    e.input_rank = input_rank;
    e.acc_before = acc_before;
    e.x = x;
    e.acc_after = acc_after;
    stamp(e);
    env_.tracer->add(std::move(e));
  }
  void trace_round(size_t index, float acc, uint32_t stored_bits) {
    TraceEvent e;
    e.kind = TraceEvent::Kind::kRound;
    e.index = index;
    e.acc_before = acc;
    set_stored(e, stored_bits);
    stamp(e);
    env_.tracer->add(std::move(e));
  }
  // Where this world's tree sits in the element's tree (core/collectives.h's concept).
  TreeTraceScope tree_trace_scope() const { return env_.tree_trace_scope; }
  // One internal node of a traced element's tree: ranks left_rank.. and right_rank.. (the first of
  // each subtree), their values, the fp32 sum and the node rounded to storage.
  void trace_tree_node(size_t index, int left_rank, int right_rank, float left, float right, float sum,
                       uint32_t stored_bits) {
    TraceEvent e;
    e.kind = TraceEvent::Kind::kTreeNode;
    e.index = index;
    e.left_rank = left_rank;
    e.input_rank = right_rank;
    e.acc_before = left;
    e.x = right;
    e.acc_after = sum;
    set_stored(e, stored_bits);
    stamp(e);
    env_.tracer->add(std::move(e));
  }

 private:
  void store_rows() {
    const int me = rank(), b = block();
    for (int p = 0; p < world_size(); ++p) {
      if (p == me) continue;
      env_.executor->memory_point(env_);
      std::atomic_ref<const void*>(signals(p)->input_rows[b][me])
          .store((*env_.input_views)[p], std::memory_order_relaxed);
    }
  }
  void read_rows() {
    const int me = rank(), b = block();
    env_.executor->memory_point(env_);
    for (int p = 0; p < world_size(); ++p) {
      const void* row =
          p == me ? (*env_.input_views)[me]
                  : std::atomic_ref<const void*>(signals(me)->input_rows[b][p]).load(std::memory_order_relaxed);
      views_[p] = row != nullptr ? row : env_.peers->input[p];
    }
    rows_pending_ = false;
  }
  void require_pack_aligned(const void* p, const char* access) const {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) throw_misaligned_pack(env_, p, access);
  }
  void stamp(TraceEvent& e) const {
    e.t = env_.executor->now();
    e.launch = env_.launch;
    e.rank = env_.rank;
    e.block = env_.block;
  }
  // The stored result of a round or tree_node event: its bits, width and value.
  static void set_stored(TraceEvent& e, uint32_t stored_bits) {
    e.stored_bits = stored_bits;
    e.storage_bytes = static_cast<int>(sizeof(T));
    T stored;
    if constexpr (sizeof(T) == 2) {
      stored = T{static_cast<uint16_t>(stored_bits)};
    } else {
      stored = bits_to_float(stored_bits);
    }
    e.stored_value = to_float(stored);
  }
  const BlockEnv& env_;
  TraceEvent pending_;
  std::array<const void*, kMaxRanks> views_{};  // every rank's input (views_mode_)
  bool views_mode_ = false;                     // input() reads views_ (publish_input_views)
  bool rows_pending_ = false;                   // published; barrier_passed has not read the row yet
};

class World {
 public:
  // Creates the ranks' heaps (signal buffers zeroed) and exchanges their handles.
  // Throws std::invalid_argument for ranks outside 1..kMaxRanks.
  explicit World(WorldOptions options);
  ~World();
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  int ranks() const { return options_.ranks; }
  const WorldOptions& options() const { return options_; }
  // The seed of the next seeded run (explorations reuse one world over many schedules).
  void set_schedule_seed(uint64_t seed) { options_.schedule_seed = seed; }

  // Adds an extra symmetric buffer of `bytes` (zeroed) to every rank; returns its id for
  // SimCtx::buffer(id, peer). Its handles are exchanged before the next run.
  int add_buffer(const std::string& name, size_t bytes);
  // This process's address of rank's extra buffer `id` (for staging from the host side).
  void* local_buffer(int id, int rank) const;
  // Rank's input and scratch buffers (host side).
  void* local_input(int rank) const;
  void* local_scratch(int rank) const;
  void* local_lamport(int rank) const;
  SignalBuffer* local_signals(int rank) const;

  // Queues a launch of kernel; nothing runs until run(). T is the storage type of the SimCtx and
  // kFold the contract its folds follow.
  template <class T, Contract kFold = Contract::kCanonical, class Kernel>
  void enqueue(Launch launch, Kernel kernel) {
    QueuedLaunch q;
    q.launch = std::move(launch);
    q.run_block = [kernel](const BlockEnv& env, bool traced) {
      // A publishing launch stores its rows before the kernel's first barrier (the GPU's
      // collective_kernel: publish_input_views, then the algorithm).
      if (traced) {
        SimCtx<T, true, kFold> ctx(env);
        if (env.input_views != nullptr) ctx.publish_input_views();
        kernel(ctx);
      } else {
        SimCtx<T, false, kFold> ctx(env);
        if (env.input_views != nullptr) ctx.publish_input_views();
        kernel(ctx);
      }
    };
    queue_.push_back(std::move(q));
  }

  // Runs every queued launch under the scheduler and empties the queue. Throws SimError on a
  // deadlock, livelock, wait timeout or an exception in a kernel (the world is then spent: a later
  // run() throws std::logic_error); std::invalid_argument for a malformed launch (blocks outside
  // 1..kMaxBlocks, inputs or outputs not one per rank).
  void run();

  // The trace of every run so far (null unless options.trace).
  const Tracer* tracer() const { return tracer_.get(); }
  // Progress of the current run: (finished units, total units), readable from any thread.
  std::pair<uint64_t, uint64_t> progress() const { return {progress_done_.load(), progress_total_.load()}; }
  // Exchanges every rank's buffer handles (collective over the in-process store, one thread per
  // rank). run() calls it when a buffer was added or grown; calling it again is a cache hit.
  // Throws SimError (kTimeout) when a rank's exchange times out, naming the rank that never
  // published its handles.
  void sync_handles();
  // Handle-exchange statistics of rank's exchanger (tests).
  const HandleExchangeStats& exchange_stats(int rank) const;
  // Scheduling steps taken by the last seeded run.
  uint64_t last_steps() const { return last_steps_; }

  // ---- internals shared with the executors (sim/world.cc) ----
  struct QueuedLaunch {
    Launch launch;
    std::function<void(const BlockEnv&, bool)> run_block;
    std::vector<void*> kernel_outputs;  // per rank: the user's output, or the staged one
  };
  void stage(int rank, uint32_t k, Executor* executor);  // stream step before launch k's blocks
  void finish(int rank, uint32_t k);                     // stream step after launch k's blocks
  BlockEnv block_env(int rank, int block, uint32_t k, Executor* executor);
  void run_block(int rank, int block, uint32_t k, Executor* executor);
  size_t queue_size() const { return queue_.size(); }
  const QueuedLaunch& queued(uint32_t k) const { return queue_[k]; }
  void note_progress() { progress_done_.fetch_add(1, std::memory_order_relaxed); }
  Tracer* mutable_tracer() { return tracer_.get(); }
  uint32_t launch_id(uint32_t k) const { return launch_base_ + k; }
  // Fault injection, called by the schedulers: at every synchronization step of `rank` (counts
  // it; throws RankDied when it is the failing rank's last), and where a rank's thread starts
  // work (throws RankDied when the rank died already).
  void fault_step(int rank);
  void fault_check(int rank) const;
  bool rank_dead(int rank) const { return rank == options_.fail_rank && fault_fired_.load(); }
  bool fault_fired() const { return fault_fired_.load(); }
  // Synchronization steps the failing rank has taken so far (fault injection).
  uint64_t fault_steps() const { return fault_steps_.load(); }

 private:
  struct Region {
    std::string name;
    size_t bytes = 0;
    std::byte* data = nullptr;  // 64-byte aligned
    uint64_t generation = 0;
  };
  struct Heap {
    Region signals, input, scratch, output;  // output: staging for misaligned user outputs (local)
    Region lamport;                          // 0xFF-filled when (re)allocated
    std::vector<Region> extra;
  };
  void allocate(Region& region, int rank, size_t bytes);
  void release_heaps();
  void grow(Region& region, int rank, size_t bytes);
  std::vector<ExportedBuffer> exports(int rank) const;
  void* open_handle(int peer, const ExportedBuffer& buffer);
  void validate(const QueuedLaunch& q) const;
  // What run() adds to a failure when fault injection stopped a rank.
  std::string fault_note() const;

  WorldOptions options_;
  uint64_t world_id_;
  std::vector<Heap> heaps_;
  std::vector<std::string> extra_names_;
  LocalStore store_;
  std::vector<std::unique_ptr<HandleExchange>> exchangers_;
  std::vector<PeerTable> peers_;
  bool handles_dirty_ = true;
  std::vector<QueuedLaunch> queue_;
  std::unique_ptr<Tracer> tracer_;
  std::vector<std::string> launch_names_;
  uint32_t launch_base_ = 0;  // launch ids continue across runs (traces)
  std::atomic<uint64_t> progress_done_{0};
  std::atomic<uint64_t> progress_total_{0};
  uint64_t last_steps_ = 0;
  uint64_t next_generation_ = 1;
  bool failed_ = false;
  std::atomic<uint64_t> fault_steps_{0};  // steps the failing rank has taken
  std::atomic<bool> fault_fired_{false};  // it died
};

}  // namespace exactcoll::sim

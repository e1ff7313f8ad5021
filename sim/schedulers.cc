#include "sim/schedulers.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <ctime>
#include <system_error>
#include <thread>

#include "sim/flag_trace.h"

namespace exactcoll::sim {
namespace {

void futex_wait(const uint32_t* word, uint32_t expected, std::chrono::nanoseconds timeout) {
  timespec ts;
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1'000'000'000);
  ts.tv_nsec = static_cast<long>(timeout.count() % 1'000'000'000);
  syscall(SYS_futex, word, FUTEX_WAIT_PRIVATE, expected, &ts, nullptr, 0);
}

void futex_wake_all(const uint32_t* word) {
  syscall(SYS_futex, word, FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

std::string where(const BlockEnv& env, const World& world) {
  const auto& q = world.queued(env.launch - world.launch_id(0));
  return "rank " + std::to_string(env.rank) + " block " + std::to_string(env.block) + " (launch " +
         std::to_string(env.launch) + " '" + q.launch.name + "')";
}

// The threads scheduler's report of a stall after a rank died: what this wait waits for, and who
// never came.
SimError stalled(const std::string& this_wait, const std::string& missing) {
  return SimError(SimFailure::kDeadlock, this_wait +
                                             ", and every other live rank waits too, on flags or Lamport words no "
                                             "live rank will write (a deadlock): " +
                                             missing);
}

}  // namespace

// ---- threads ------------------------------------------------------------------------------------

ThreadsScheduler::ThreadsScheduler(World& world, std::chrono::milliseconds timeout)
    : world_(world),
      timeout_(timeout),
      start_(std::chrono::steady_clock::now()),
      checked_(std::make_unique<std::atomic<uint64_t>[]>(static_cast<size_t>(world.ranks()))) {
  for (int r = 0; r < world.ranks(); ++r) checked_[r].store(kNotWaiting);
}

ThreadsScheduler::Stall::Stall(ThreadsScheduler* s, int rank) : s_(s), rank_(rank) {
  s_->blocked_.fetch_add(1);
  s_->activity_.fetch_add(1);
}

ThreadsScheduler::Stall::~Stall() {
  s_->checked_[rank_].store(kNotWaiting);
  s_->blocked_.fetch_sub(1);
}

void ThreadsScheduler::Stall::before_check() { s_->checked_[rank_].store(s_->activity_.load()); }

bool ThreadsScheduler::Stall::no_live_rank_can_move() const {
  // Only after a fault: a healthy protocol never stalls, and its waits keep their own bound.
  if (!s_->world_.fault_fired()) return false;
  const uint64_t activity = s_->activity_.load();
  if (s_->blocked_.load() != s_->running_.load()) return false;
  for (int r = 0; r < s_->world_.ranks(); ++r) {
    const uint64_t seen = s_->checked_[r].load();
    if (seen != kExited && seen != activity) return false;
  }
  return s_->activity_.load() == activity;  // nobody entered a wait or ended meanwhile
}

void ThreadsScheduler::thread_exited(int rank) {
  checked_[rank].store(kExited);
  running_.fetch_sub(1);
  activity_.fetch_add(1);
}

uint64_t ThreadsScheduler::now() const {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start_).count());
}

void ThreadsScheduler::signal(const BlockEnv& env, uint32_t* flag, uint32_t value, int peer, int set) {
  world_.fault_step(env.rank);
  // seq_cst store and load pair with the waiter's sleepers_ increment and flag re-check: either
  // the waiter sees the value, or this sees the sleeper and wakes it (release/acquire included).
  std::atomic_ref<uint32_t>(*flag).store(value, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) futex_wake_all(flag);
  trace_flag(env, TraceEvent::Kind::kSignal, now(), 0, peer, set, value);
}

void ThreadsScheduler::wait(const BlockEnv& env, const uint32_t* flag, uint32_t value, int peer, int set) {
  world_.fault_step(env.rank);
  std::atomic_ref<uint32_t> word(*const_cast<uint32_t*>(flag));
  const uint64_t since = env.tracer ? now() : 0;
  // 1. A short spin: the peer is often just behind.
  for (int i = 0; i < 128; ++i) {
    if (word.load(std::memory_order_acquire) == value) {
      trace_flag(env, TraceEvent::Kind::kWait, now(), since, peer, set, value);
      return;
    }
    cpu_relax();
  }
  // 2. Sleep on the flag in slices (so that an abort or a stall elsewhere is noticed), up to the
  //    timeout.
  const auto deadline = deadline_after(timeout_);
  Stall stall(this, env.rank);
  while (true) {
    stall.before_check();  // then the check: the activity load orders it after what was written
    const uint32_t seen = word.load(std::memory_order_acquire);
    if (seen == value) break;
    if (aborted_.load(std::memory_order_relaxed)) {
      // Another wait timed out first; say where this one stood, so that the report shows the
      // whole chain (the first timeout may be a live rank stuck behind the one that failed).
      std::lock_guard<std::mutex> lock(error_mutex_);
      other_waits_ += "\n  " + where(env, world_) + " waits for flag set " + std::to_string(set) + " from peer " +
                      std::to_string(peer) + " to hold epoch " + std::to_string(value) + " (it holds " +
                      std::to_string(seen) + ")";
      throw Aborted{};
    }
    if (stall.no_live_rank_can_move()) {
      throw stalled(where(env, world_) + " waits for flag set " + std::to_string(set) + " from peer " +
                        std::to_string(peer) + " to hold epoch " + std::to_string(value) + " (it holds " +
                        std::to_string(seen) + ")",
                    "rank " + std::to_string(peer) + " block " + std::to_string(env.block) + " never arrived");
    }
    const auto left = deadline - std::chrono::steady_clock::now();
    if (left <= std::chrono::nanoseconds(0)) {
      throw SimError(SimFailure::kTimeout,
                     where(env, world_) + " waited " + std::to_string(timeout_.count()) + " ms for flag set " +
                         std::to_string(set) + " from peer " + std::to_string(peer) + " to hold epoch " +
                         std::to_string(value) + " (it holds " + std::to_string(seen) + "): rank " +
                         std::to_string(peer) + " block " + std::to_string(env.block) + " never arrived");
    }
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t again = word.load(std::memory_order_seq_cst);
    if (again != value) {
      futex_wait(flag, again, std::min<std::chrono::nanoseconds>(left, std::chrono::milliseconds(20)));
    }
    sleepers_.fetch_sub(1, std::memory_order_seq_cst);
  }
  trace_flag(env, TraceEvent::Kind::kWait, now(), since, peer, set, value);
}

void ThreadsScheduler::lamport_point(const BlockEnv& env) { world_.fault_step(env.rank); }

void ThreadsScheduler::lamport_wait(const BlockEnv& env, const void* word, int bytes, uint32_t sentinel, int peer,
                                    const LamportPoll& at) {
  for (int i = 0; i < 128; ++i) {
    if (lamport_load_word(word, bytes) != sentinel) return;
    cpu_relax();
  }
  // No futex on a 16-bit word: short sleeps, up to the timeout (the same bound as a flag wait).
  const auto deadline = deadline_after(timeout_);
  Stall stall(this, env.rank);
  while (true) {
    stall.before_check();
    if (lamport_load_word(word, bytes) != sentinel) break;
    if (aborted_.load(std::memory_order_relaxed)) {
      std::lock_guard<std::mutex> lock(error_mutex_);
      other_waits_ += "\n  " + where(env, world_) + " polls " + lamport_poll_text(at, peer) + " (still the sentinel)";
      throw Aborted{};
    }
    if (stall.no_live_rank_can_move()) {
      throw stalled(where(env, world_) + " polls " + lamport_poll_text(at, peer) + " (still the sentinel)",
                    "rank " + std::to_string(peer) + " never wrote it");
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      throw SimError(SimFailure::kTimeout, where(env, world_) + " polled " + lamport_poll_text(at, peer) + " for " +
                                               std::to_string(timeout_.count()) +
                                               " ms: it still holds the sentinel; rank " + std::to_string(peer) +
                                               " never wrote it");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void ThreadsScheduler::run() {
  const int n = world_.ranks();
  const uint32_t launches = static_cast<uint32_t>(world_.queue_size());
  std::vector<std::thread> threads;
  running_.store(n);  // before any thread starts: a rank not yet started is not waiting
  try {
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([this, r, launches] {
        struct Exit {
          ThreadsScheduler* s;
          int rank;
          ~Exit() { s->thread_exited(rank); }
        } exit{this, r};
        try {
          for (uint32_t k = 0; k < launches; ++k) {
            world_.stage(r, k, this);
            const int blocks = world_.queued(k).launch.blocks;
            for (int b = 0; b < blocks; ++b) world_.run_block(r, b, k, this);
            world_.finish(r, k);
          }
        } catch (const RankDied&) {
          // Fault injection stopped this rank: like a killed process it reports nothing; its peers'
          // waits for it time out and name it.
        } catch (const Aborted&) {
          // Another rank failed first; its error is the one reported.
        } catch (const SimError& e) {
          // A timeout of its own: the first is the error, the others join the report.
          std::lock_guard<std::mutex> lock(error_mutex_);
          if (!first_error_) {
            first_error_ = std::current_exception();
          } else {
            other_waits_ += "\n  " + std::string(e.what());
          }
          aborted_.store(true);
        } catch (...) {
          std::lock_guard<std::mutex> lock(error_mutex_);
          if (!first_error_) first_error_ = std::current_exception();
          aborted_.store(true);
        }
      });
    }
  } catch (const std::system_error& e) {
    // A rank's thread could not start (e.g. out of memory): stop the started ones and join them
    // (a joinable std::thread must never be destroyed).
    aborted_.store(true);
    for (auto& t : threads) t.join();
    throw SimError(SimFailure::kError, std::string("could not start a thread for every rank: ") + e.what());
  }
  for (auto& t : threads) t.join();
  if (first_error_) {
    try {
      std::rethrow_exception(first_error_);
    } catch (const SimError& e) {
      if (other_waits_.empty()) throw;
      throw SimError(e.kind(), e.what() + std::string("\nthe other waits at that moment:") + other_waits_);
    } catch (const std::exception& e) {
      throw SimError(SimFailure::kError, std::string("a kernel failed: ") + e.what());
    }
  }
}

// ---- seeded -------------------------------------------------------------------------------------

SeededScheduler::SeededScheduler(World& world, uint64_t seed, uint64_t max_steps)
    : world_(world), seed_(seed), max_steps_(max_steps), rng_(seed), blocks_done_(world.ranks(), 0) {}

SeededScheduler::~SeededScheduler() = default;

void SeededScheduler::block_on(const uint32_t* word, uint32_t value, int peer, int set) {
  SimThread* self = current_;
  self->wait_word = word;
  self->wait_value = value;
  self->wait_peer = peer;
  self->wait_set = set;
  self->fiber->yield();
}

void SeededScheduler::signal(const BlockEnv& env, uint32_t* flag, uint32_t value, int peer, int set) {
  world_.fault_step(env.rank);
  current_->fiber->yield();      // a scheduling point: others may run before the store lands
  world_.fault_check(env.rank);  // another block of this rank may have died meanwhile
  std::atomic_ref<uint32_t>(*flag).store(value, std::memory_order_release);
  trace_flag(env, TraceEvent::Kind::kSignal, steps_, 0, peer, set, value);
}

void SeededScheduler::wait(const BlockEnv& env, const uint32_t* flag, uint32_t value, int peer, int set) {
  world_.fault_step(env.rank);
  const uint64_t since = steps_;
  block_on(flag, value, peer, set);  // resumed once *flag == value, or to unwind a dead rank
  world_.fault_check(env.rank);
  trace_flag(env, TraceEvent::Kind::kWait, steps_, since, peer, set, value);
}

void SeededScheduler::lamport_point(const BlockEnv& env) {
  world_.fault_step(env.rank);
  current_->fiber->yield();  // a scheduling point: others may run before this store or load
  world_.fault_check(env.rank);
}

void SeededScheduler::memory_point(const BlockEnv& env) {
  current_->fiber->yield();  // a scheduling point: others may run before this row store or load
  world_.fault_check(env.rank);
}

void SeededScheduler::lamport_wait(const BlockEnv& env, const void* word, int bytes, uint32_t sentinel, int peer,
                                   const LamportPoll& where) {
  SimThread* self = current_;
  self->poll_word = word;
  self->poll_bytes = bytes;
  self->poll_sentinel = sentinel;
  self->poll_peer = peer;
  self->poll_where = where;
  self->fiber->yield();  // resumed once the word is no longer the sentinel, or to unwind a dead rank
  self->poll_word = nullptr;
  world_.fault_check(env.rank);
}

// Rank r's stream: launch k's staging starts after all of its blocks of launch k-1 finished.
void SeededScheduler::stream(int rank) {
  const uint32_t launches = static_cast<uint32_t>(world_.queue_size());
  for (uint32_t k = 0; k < launches; ++k) {
    if (k > 0) {
      block_on(&blocks_done_[rank], static_cast<uint32_t>(world_.queued(k - 1).launch.blocks), -1, -1);
      world_.fault_check(rank);
      world_.finish(rank, k - 1);
    }
    blocks_done_[rank] = 0;
    world_.stage(rank, k, this);
    const int blocks = world_.queued(k).launch.blocks;
    for (int b = 0; b < blocks; ++b) {
      auto t = std::make_unique<SimThread>();
      t->rank = rank;
      t->block = b;
      t->launch = k;
      t->fiber = std::make_unique<Fiber>(stacks_, [this, rank, b, k] {
        world_.run_block(rank, b, k, this);
        ++blocks_done_[rank];
      });
      threads_.push_back(std::move(t));
    }
  }
  if (launches > 0) {
    block_on(&blocks_done_[rank], static_cast<uint32_t>(world_.queued(launches - 1).launch.blocks), -1, -1);
    world_.fault_check(rank);
    world_.finish(rank, launches - 1);
  }
}

std::string SeededScheduler::deadlock_report() const {
  std::string out;
  for (const auto& t : threads_) {
    if (t->fiber->finished()) continue;
    if (t->block < 0) continue;  // streams only wait for their blocks
    const auto& q = world_.queued(t->launch);
    if (t->poll_word != nullptr) {
      out += "\n  rank " + std::to_string(t->rank) + " block " + std::to_string(t->block) + " (launch " +
             std::to_string(world_.launch_id(t->launch)) + " '" + q.launch.name + "') polls " +
             lamport_poll_text(t->poll_where, t->poll_peer) + ": it still holds the sentinel; rank " +
             std::to_string(t->poll_peer) + " never wrote it";
      continue;
    }
    out += "\n  rank " + std::to_string(t->rank) + " block " + std::to_string(t->block) + " (launch " +
           std::to_string(world_.launch_id(t->launch)) + " '" + q.launch.name + "') waits for flag set " +
           std::to_string(t->wait_set) + ", block " + std::to_string(t->block) + ", from peer " +
           std::to_string(t->wait_peer) + " to hold epoch " + std::to_string(t->wait_value) + " (it holds " +
           std::to_string(t->wait_word ? *t->wait_word : 0) + ")";
  }
  return out;
}

void SeededScheduler::run() {
  const int n = world_.ranks();
  for (int r = 0; r < n; ++r) {
    auto t = std::make_unique<SimThread>();
    t->rank = r;
    t->fiber = std::make_unique<Fiber>(stacks_, [this, r] { stream(r); });
    threads_.push_back(std::move(t));
  }
  const std::string reproduce = "reproduce with --schedule-seed " + std::to_string(seed_);
  std::vector<SimThread*> runnable;
  while (true) {
    // 1. Who can run: not finished, and not waiting for a value that is not there yet. A thread
    //    of a rank that fault injection stopped runs too: it unwinds (RankDied) at once.
    runnable.clear();
    bool unfinished = false;
    for (const auto& t : threads_) {
      if (t->fiber->finished()) continue;
      unfinished = true;
      const bool polled = t->poll_word == nullptr || lamport_load_word(t->poll_word, t->poll_bytes) != t->poll_sentinel;
      if ((polled && (t->wait_word == nullptr || *t->wait_word == t->wait_value)) || world_.rank_dead(t->rank)) {
        runnable.push_back(t.get());
      }
    }
    if (!unfinished) break;
    if (runnable.empty()) {
      throw SimError(SimFailure::kDeadlock, "deadlock after " + std::to_string(steps_) +
                                                " scheduling steps (seeded schedule, seed " + std::to_string(seed_) +
                                                "): every simulated thread waits:" + deadlock_report() + "\n" +
                                                reproduce);
    }
    if (steps_ >= max_steps_) {
      throw SimError(SimFailure::kLivelock, "no completion within " + std::to_string(max_steps_) +
                                                " scheduling steps (seeded schedule, seed " + std::to_string(seed_) +
                                                "): livelock?\n" + reproduce);
    }
    // 2. The PRNG picks one; it runs until its next scheduling point.
    SimThread* next = runnable[rng_.below(runnable.size())];
    next->wait_word = nullptr;
    current_ = next;
    ++steps_;
    next->fiber->resume();
    current_ = nullptr;
    // 3. Finished: drop it, or stop on its error.
    if (next->fiber->finished()) {
      if (std::exception_ptr error = next->fiber->error()) {
        try {
          std::rethrow_exception(error);
        } catch (const RankDied&) {
          // A thread of the stopped rank has unwound; it reports nothing.
        } catch (const SimError&) {
          throw;
        } catch (const std::exception& e) {
          throw SimError(SimFailure::kError, "rank " + std::to_string(next->rank) + " block " +
                                                 std::to_string(next->block) + " failed: " + e.what() + "\n" +
                                                 reproduce);
        }
      }
      for (size_t i = 0; i < threads_.size(); ++i) {
        if (threads_[i].get() == next) {
          threads_.erase(threads_.begin() + static_cast<std::ptrdiff_t>(i));
          break;
        }
      }
    }
  }
}

}  // namespace exactcoll::sim

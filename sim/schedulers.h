// The two schedulers of the simulated world (sim/world.h explains them); internal to sim/.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "sim/fiber.h"
#include "sim/prng.h"
#include "sim/world.h"

namespace exactcoll::sim {

// threads: one OS thread per rank runs its launches, and each launch's blocks, in order. Flag waits
// spin briefly, then sleep on a futex; each is bounded by `timeout`. Once fault injection has
// killed a rank, a wait also ends as soon as no live rank can move again (Stall below): every live
// rank waits, each having seen its wait unmet after the last thing any rank did. Its peers then
// report a deadlock at once instead of sleeping out a timeout the user may have set to days.
class ThreadsScheduler final : public Executor {
 public:
  ThreadsScheduler(World& world, std::chrono::milliseconds timeout);
  // Runs every queued launch. Throws the first failure (SimError) after all threads stopped.
  void run();

  void signal(const BlockEnv& env, uint32_t* flag, uint32_t value, int peer, int set) override;
  void wait(const BlockEnv& env, const uint32_t* flag, uint32_t value, int peer, int set) override;
  uint64_t now() const override;
  void lamport_point(const BlockEnv& env) override;
  void lamport_wait(const BlockEnv& env, const void* word, int bytes, uint32_t sentinel, int peer,
                    const LamportPoll& where) override;

 private:
  struct Aborted {};  // thrown in a rank thread after another rank failed
  // A rank thread's stay in a wait's sleeping loop, for stall detection. Every entry and every
  // thread exit bumps activity_ (whatever a rank wrote before it waits or ends happened before
  // that bump); a waiter records, before each check of its condition, the activity it saw.
  // Sound: a waiter can only be released by a write after its check, and the writer is then either
  // still running (blocked_ < running_) or has bumped activity_ since (its record is stale).
  class Stall {
   public:
    Stall(ThreadsScheduler* s, int rank);  // enters the wait: blocked_ + 1, activity_ + 1
    ~Stall();                              // leaves it: blocked_ - 1
    // Records the activity seen before a check of the wait's condition (call, then check).
    void before_check();
    // Returns true when a rank died by fault injection and no live rank can move again.
    bool no_live_rank_can_move() const;

   private:
    ThreadsScheduler* s_;
    int rank_;
  };
  void thread_exited(int rank);
  static constexpr uint64_t kNotWaiting = ~uint64_t{0};
  static constexpr uint64_t kExited = ~uint64_t{0} - 1;
  World& world_;
  std::chrono::milliseconds timeout_;
  std::chrono::steady_clock::time_point start_;
  std::atomic<bool> aborted_{false};
  std::atomic<int> sleepers_{0};
  std::atomic<uint64_t> activity_{0};
  std::atomic<int> running_{0};                       // rank threads not yet ended
  std::atomic<int> blocked_{0};                       // of those, the ones inside a wait's sleeping loop
  std::unique_ptr<std::atomic<uint64_t>[]> checked_;  // per rank: activity seen at its last check
  std::mutex error_mutex_;
  std::exception_ptr first_error_;
  std::string other_waits_;  // where the other ranks waited when the first error stopped them
};

// seeded: fibers, one running at a time, the next picked by a PRNG at every signal, wait and launch
// start. Deadlock and livelock are reported with "reproduce with --schedule-seed N".
class SeededScheduler final : public Executor {
 public:
  SeededScheduler(World& world, uint64_t seed, uint64_t max_steps);
  ~SeededScheduler() override;
  void run();
  uint64_t steps() const { return steps_; }

  void signal(const BlockEnv& env, uint32_t* flag, uint32_t value, int peer, int set) override;
  void wait(const BlockEnv& env, const uint32_t* flag, uint32_t value, int peer, int set) override;
  uint64_t now() const override { return steps_; }
  void lamport_point(const BlockEnv& env) override;
  void memory_point(const BlockEnv& env) override;
  void lamport_wait(const BlockEnv& env, const void* word, int bytes, uint32_t sentinel, int peer,
                    const LamportPoll& where) override;

 private:
  struct SimThread {
    std::unique_ptr<Fiber> fiber;
    int rank = 0;
    int block = -1;  // -1: the rank's stream
    uint32_t launch = 0;
    // Runnable iff wait_word == nullptr or *wait_word == wait_value.
    const uint32_t* wait_word = nullptr;
    uint32_t wait_value = 0;
    int wait_peer = -1, wait_set = -1;  // flag waits only
    // A Lamport poll: runnable iff the poll_bytes-wide word at poll_word is not poll_sentinel.
    const void* poll_word = nullptr;
    int poll_bytes = 0;
    uint32_t poll_sentinel = 0;
    int poll_peer = -1;
    LamportPoll poll_where;
  };
  void block_on(const uint32_t* word, uint32_t value, int peer, int set);
  void stream(int rank);
  std::string deadlock_report() const;

  World& world_;
  uint64_t seed_;
  uint64_t max_steps_;
  Xoshiro256 rng_;
  StackPool stacks_;
  std::vector<std::unique_ptr<SimThread>> threads_;
  SimThread* current_ = nullptr;
  uint64_t steps_ = 0;
  std::vector<uint32_t> blocks_done_;  // per rank, of its current launch
};

}  // namespace exactcoll::sim

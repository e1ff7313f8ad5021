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
// spin briefly, then sleep on a futex; each is bounded by `timeout`.
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
  World& world_;
  std::chrono::milliseconds timeout_;
  std::chrono::steady_clock::time_point start_;
  std::atomic<bool> aborted_{false};
  std::atomic<int> sleepers_{0};
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

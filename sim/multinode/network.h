// The simulated multi-node job: every rank's host program runs on its own simulated thread, node
// kernels run inline on that thread through sim::SimCtx (one node = one IPC world), and messages
// between ranks go through a simulated network with NCCL's point-to-point rules.
//
// The network. A Transfer group (core/multinode.h) posts its sends and receives together and
// returns when all of them are complete. Between two ranks the k-th send from a to b meets the k-th
// receive on b from a (per-pair FIFO); the payload, chunk and size must agree, else the run fails
// naming both ranks. A send completes when its message has been delivered into the matching
// receive (rendezvous, as NCCL's sends of large messages: a schedule in which two ranks each wait
// for the other to receive first deadlocks here as it would on the GPUs).
//
// Schedules:
//   threads  one OS thread per rank; a message is delivered as soon as both ends are posted; every
//            wait (a flag of a node kernel, a group) is bounded by `timeout` and its error names the
//            waiting rank, its node and what never arrived.
//   seeded   one fiber per rank, one running at a time. Every delivery is a scheduling step of its
//            own: at each step the PRNG (seeded from `seed`) picks among the runnable ranks and the
//            deliverable messages (the head of any rank pair whose receive is posted), so the order
//            in which messages cross node boundaries, relative to each other and to every node's
//            kernels, is explored seed by seed. No runnable rank and no deliverable message while
//            some rank is unfinished is a deadlock, reported with what every rank waits for and
//            "reproduce with --schedule-seed N".
//
// Faults (tests): `drop` names messages that are lost on the wire (the send completes, nothing
// arrives), so that a test can watch the receiver's bounded wait name it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/multinode.h"
#include "core/multinode_layout.h"
#include "sim/fiber.h"
#include "sim/prng.h"
#include "sim/trace.h"
#include "sim/world.h"

namespace exactcoll::multinode {

// A message lost on the wire: the `index`-th (0-based) message from rank `from` to rank `to`.
struct DroppedMessage {
  int from = 0, to = 0;
  int index = 0;
};

struct NetworkOptions {
  NodeLayout layout;
  sim::Schedule schedule = sim::Schedule::kThreads;
  uint64_t seed = 1;                         // seeded
  std::chrono::milliseconds timeout{20000};  // threads: one wait
  uint64_t max_steps = 100'000'000;          // seeded: livelock bound
  bool trace = false;
  std::vector<DroppedMessage> drop;
};

// One rank's view of a message, as the trace shows it.
struct MessageRecord {
  uint64_t t_sent = 0, t_delivered = 0;
  int from = 0, to = 0;
  Payload payload = Payload::kCarry;
  uint32_t chunk = 0;
  size_t bytes = 0;
  bool dropped = false;
};

class Network final : public sim::Executor {
 public:
  explicit Network(NetworkOptions options);
  ~Network() override;
  Network(const Network&) = delete;
  Network& operator=(const Network&) = delete;

  const NodeLayout& layout() const { return options_.layout; }

  // Runs body(rank) for every global rank under the schedule and returns when all finished.
  // Throws sim::SimError (deadlock, livelock, timeout, or an exception in a body, named).
  void run(const std::function<void(int rank)>& body);

  // From inside rank's body: posts the group and returns when every transfer in it is complete.
  void group(int rank, const Transfer* transfers, int count);

  // sim::Executor, for the node kernels (env.rank is the local rank; the calling simulated thread
  // is the rank's own).
  void signal(const sim::BlockEnv& env, uint32_t* flag, uint32_t value, int peer, int set) override;
  void wait(const sim::BlockEnv& env, const uint32_t* flag, uint32_t value, int peer, int set) override;
  uint64_t now() const override;

  // Every message of the run so far, in posting order (trace).
  std::vector<MessageRecord> messages() const;
  // Scheduling steps of the seeded run.
  uint64_t steps() const { return steps_; }

 private:
  struct Posted {
    Transfer transfer;
    int owner = 0;         // the rank that posted it
    uint64_t record = 0;   // index into records_ (sends)
    bool* done = nullptr;  // set when complete
  };
  struct Waiter;  // one rank's simulated thread (seeded)
  std::string where(int rank) const;
  std::string describe(const Transfer& t) const;
  // Seeded: yields the current fiber until ready() holds; `what` describes the wait for reports.
  void block_until(std::function<bool()> ready, std::function<std::string()> what);
  // Threads: waits (bounded) until ready() holds; the error names rank and what.
  void wait_bounded(int rank, const std::function<bool()>& ready, const std::function<std::string()>& what);
  void deliver(Posted& send, Posted& receive);                 // under mutex_ (threads) or in the scheduler
  std::vector<std::pair<int, int>> deliverable_pairs() const;  // (from, to) with both heads posted
  void deliver_pair(int from, int to);
  int current_rank() const;

  NetworkOptions options_;
  int ranks_;
  // Per ordered pair (from * n + to): posted sends and receives not yet matched, in order.
  std::vector<std::deque<Posted>> sends_, receives_;
  std::vector<int> sent_count_;  // per pair: messages posted so far (for `drop`)
  std::vector<MessageRecord> records_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<std::function<std::string()>> waiting_;  // threads: per rank, what it waits for now
  std::atomic<bool> aborted_{false};
  std::chrono::steady_clock::time_point start_;
  // Seeded.
  sim::StackPool stacks_;
  std::vector<std::unique_ptr<Waiter>> waiters_;
  int current_ = -1;
  uint64_t steps_ = 0;
};

}  // namespace exactcoll::multinode

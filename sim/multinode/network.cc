#include "sim/multinode/network.h"

#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>

#include "sim/flag_trace.h"

namespace exactcoll::multinode {
namespace {

// A rank thread stops here after another rank failed; that failure is the one reported.
struct Aborted {};

thread_local int tls_rank = -1;  // threads schedule: the rank this OS thread runs

}  // namespace

struct Network::Waiter {
  std::unique_ptr<sim::Fiber> fiber;
  int rank = 0;
  std::function<bool()> ready;  // null: runnable
  std::function<std::string()> what;
};

Network::Network(NetworkOptions options)
    : options_(std::move(options)),
      ranks_(options_.layout.world_size()),
      sends_(static_cast<size_t>(ranks_) * static_cast<size_t>(ranks_)),
      receives_(sends_.size()),
      sent_count_(sends_.size(), 0),
      waiting_(static_cast<size_t>(ranks_)),
      start_(std::chrono::steady_clock::now()) {}

Network::~Network() = default;

std::string Network::where(int rank) const { return rank_text(options_.layout, rank); }

std::string Network::describe(const Transfer& t) const { return transfer_text(options_.layout, t); }

int Network::current_rank() const { return options_.schedule == sim::Schedule::kSeeded ? current_ : tls_rank; }

uint64_t Network::now() const {
  if (options_.schedule == sim::Schedule::kSeeded) return steps_;
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start_).count());
}

std::vector<MessageRecord> Network::messages() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return records_;
}

// ---- waiting -----------------------------------------------------------------------------------

void Network::block_until(std::function<bool()> ready, std::function<std::string()> what) {
  Waiter* self = waiters_[static_cast<size_t>(current_)].get();
  self->ready = std::move(ready);
  self->what = std::move(what);
  self->fiber->yield();  // resumed only once ready() holds
  self->ready = nullptr;
}

void Network::wait_bounded(int rank, const std::function<bool()>& ready, const std::function<std::string()>& what) {
  const auto deadline = sim::deadline_after(options_.timeout);
  std::unique_lock<std::mutex> lock(mutex_);
  waiting_[static_cast<size_t>(rank)] = what;
  struct Clear {
    std::function<std::string()>& slot;
    ~Clear() { slot = nullptr; }
  } clear{waiting_[static_cast<size_t>(rank)]};
  while (!ready()) {
    if (aborted_.load()) throw Aborted{};
    if (changed_.wait_until(lock, deadline) == std::cv_status::timeout && !ready()) {
      // Two waits can time out together; the first to take the lock reports, and it marks the run
      // aborted under the lock, so that the other stops quietly instead of reporting a list from
      // which the first has already left.
      if (aborted_.load()) throw Aborted{};
      aborted_.store(true);
      // The first wait to time out is often a consequence (a rank waiting on a peer that waits on
      // a lost message), so the error lists what every waiting rank waits for.
      std::string everyone;
      for (int r = 0; r < ranks_; ++r) {
        if (waiting_[static_cast<size_t>(r)])
          everyone += "\n  " + where(r) + " waits for " + waiting_[static_cast<size_t>(r)]();
      }
      throw sim::SimError(sim::SimFailure::kTimeout, where(rank) + " waited " +
                                                         std::to_string(options_.timeout.count()) + " ms for " +
                                                         what() + "; every waiting rank:" + everyone);
    }
  }
}

// ---- the network ---------------------------------------------------------------------------------

void Network::deliver(Posted& send, Posted& receive) {
  const Transfer& s = send.transfer;
  const Transfer& r = receive.transfer;
  if (s.payload != r.payload || s.chunk != r.chunk || s.bytes != r.bytes) {
    throw std::runtime_error("mismatched transfer between " + where(send.owner) + " and " + where(receive.owner) +
                             ": the sender's next message is " + describe(s) + ", the receiver's next receive is " +
                             describe(r));
  }
  std::memcpy(r.data, s.data, s.bytes);
  records_[send.record].t_delivered = now();
  *send.done = true;
  *receive.done = true;
}

std::vector<std::pair<int, int>> Network::deliverable_pairs() const {
  std::vector<std::pair<int, int>> out;
  for (int from = 0; from < ranks_; ++from) {
    for (int to = 0; to < ranks_; ++to) {
      const size_t pair = static_cast<size_t>(from * ranks_ + to);
      if (!sends_[pair].empty() && !receives_[pair].empty()) out.emplace_back(from, to);
    }
  }
  return out;
}

void Network::deliver_pair(int from, int to) {
  const size_t pair = static_cast<size_t>(from * ranks_ + to);
  Posted send = sends_[pair].front();
  Posted receive = receives_[pair].front();
  sends_[pair].pop_front();
  receives_[pair].pop_front();
  deliver(send, receive);
}

void Network::group(int rank, const Transfer* transfers, int count) {
  std::unique_ptr<bool[]> done(new bool[static_cast<size_t>(count)]());
  {
    // 1. Post every transfer of the group.
    std::lock_guard<std::mutex> lock(mutex_);
    for (int i = 0; i < count; ++i) {
      const Transfer& t = transfers[i];
      if (t.peer < 0 || t.peer >= ranks_ || t.peer == rank) {
        throw std::logic_error(where(rank) + ": transfer to or from rank " + std::to_string(t.peer));
      }
      Posted posted{t, rank, 0, &done[static_cast<size_t>(i)]};
      if (t.send) {
        const size_t pair = static_cast<size_t>(rank * ranks_ + t.peer);
        const int index = sent_count_[pair]++;
        MessageRecord m{now(), 0, rank, t.peer, t.payload, t.chunk, t.bytes, false};
        for (const DroppedMessage& d : options_.drop)
          m.dropped = m.dropped || (d.from == rank && d.to == t.peer && d.index == index);
        posted.record = records_.size();
        records_.push_back(m);
        if (m.dropped) {
          done[static_cast<size_t>(i)] = true;  // lost on the wire: the sender does not know
        } else {
          sends_[pair].push_back(posted);
        }
      } else {
        receives_[static_cast<size_t>(t.peer * ranks_ + rank)].push_back(posted);
      }
    }
    // 2. Threads: deliver whatever both ends now have (seeded: deliveries are scheduling steps).
    if (options_.schedule == sim::Schedule::kThreads) {
      for (int i = 0; i < count; ++i) {
        const Transfer& t = transfers[i];
        const int from = t.send ? rank : t.peer, to = t.send ? t.peer : rank;
        const size_t pair = static_cast<size_t>(from * ranks_ + to);
        while (!sends_[pair].empty() && !receives_[pair].empty()) deliver_pair(from, to);
      }
      changed_.notify_all();
    }
  }
  // 3. Wait until every transfer of the group is complete.
  auto complete = [&done, count] {
    for (int i = 0; i < count; ++i) {
      if (!done[static_cast<size_t>(i)]) return false;
    }
    return true;
  };
  auto missing = [&, rank] {
    std::string text;
    for (int i = 0; i < count; ++i) {
      if (done[static_cast<size_t>(i)]) continue;
      const Transfer& t = transfers[i];
      text += std::string(text.empty() ? "" : "; ") + (t.send ? "the receive of its " : "") + describe(t) +
              (t.send ? ", which never posted it" : ", which never arrived");
    }
    return text;
  };
  if (options_.schedule == sim::Schedule::kSeeded) {
    block_until(complete, missing);
  } else {
    wait_bounded(rank, complete, missing);
  }
}

// ---- flags of the node kernels --------------------------------------------------------------------

void Network::signal(const sim::BlockEnv& env, uint32_t* flag, uint32_t value, int peer, int set) {
  if (options_.schedule == sim::Schedule::kSeeded) {
    waiters_[static_cast<size_t>(current_)]->fiber->yield();  // others may run before the store lands
    std::atomic_ref<uint32_t>(*flag).store(value, std::memory_order_release);
  } else {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      std::atomic_ref<uint32_t>(*flag).store(value, std::memory_order_release);
    }
    changed_.notify_all();
  }
  sim::trace_flag(env, sim::TraceEvent::Kind::kSignal, now(), 0, peer, set, value);
}

void Network::wait(const sim::BlockEnv& env, const uint32_t* flag, uint32_t value, int peer, int set) {
  const uint64_t since = now();
  const int rank = current_rank();
  auto ready = [flag, value] {
    return std::atomic_ref<uint32_t>(*const_cast<uint32_t*>(flag)).load(std::memory_order_acquire) == value;
  };
  auto what = [this, &env, flag, value, peer, set, rank] {
    const int peer_rank = options_.layout.rank_of(options_.layout.node_of(rank), peer);
    return "flag set " + std::to_string(set) + " of block " + std::to_string(env.block) + " from " + where(peer_rank) +
           " to hold barrier " + std::to_string(value) + " of node kernel " + std::to_string(env.launch) +
           " (it holds " + std::to_string(*flag) + "): " + where(peer_rank) + " never arrived";
  };
  if (options_.schedule == sim::Schedule::kSeeded) {
    if (!ready()) block_until(ready, what);
  } else {
    wait_bounded(rank, ready, what);
  }
  sim::trace_flag(env, sim::TraceEvent::Kind::kWait, now(), since, peer, set, value);
}

// ---- running -------------------------------------------------------------------------------------

void Network::run(const std::function<void(int rank)>& body) {
  std::exception_ptr first_error;
  if (options_.schedule == sim::Schedule::kThreads) {
    std::mutex error_mutex;
    std::vector<std::thread> threads;
    // A thread that cannot start (too many ranks for the process's limits): the ranks already
    // running are aborted and joined before the error leaves (a joinable std::thread destroyed
    // during unwinding would terminate the process).
    auto abort_and_join = [&] {
      aborted_.store(true);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        changed_.notify_all();
      }
      for (auto& t : threads) t.join();
    };
    for (int r = 0; r < ranks_; ++r) {
      try {
        threads.emplace_back([&, r] {
          tls_rank = r;
          try {
            body(r);
          } catch (const Aborted&) {
          } catch (...) {
            {
              std::lock_guard<std::mutex> lock(error_mutex);
              if (!first_error) first_error = std::current_exception();
            }
            aborted_.store(true);
            std::lock_guard<std::mutex> lock(mutex_);
            changed_.notify_all();
          }
        });
      } catch (const std::system_error& e) {
        abort_and_join();
        throw std::runtime_error("could not start the thread of rank " + std::to_string(r) + " of " +
                                 std::to_string(ranks_) + ": " + e.what());
      }
    }
    for (auto& t : threads) t.join();
  } else {
    const std::string reproduce = "reproduce with --schedule-seed " + std::to_string(options_.seed);
    sim::Xoshiro256 rng(options_.seed);
    for (int r = 0; r < ranks_; ++r) {
      auto w = std::make_unique<Waiter>();
      w->rank = r;
      w->fiber = std::make_unique<sim::Fiber>(stacks_, [&body, r] { body(r); });
      waiters_.push_back(std::move(w));
    }
    std::vector<Waiter*> runnable;
    while (true) {
      // 1. Who can run, and which messages can be delivered.
      runnable.clear();
      bool unfinished = false;
      for (const auto& w : waiters_) {
        if (w->fiber->finished()) continue;
        unfinished = true;
        if (!w->ready || w->ready()) runnable.push_back(w.get());
      }
      if (!unfinished) break;
      const auto pairs = deliverable_pairs();
      if (runnable.empty() && pairs.empty()) {
        std::string report;
        for (const auto& w : waiters_) {
          if (!w->fiber->finished() && w->what) report += "\n  " + where(w->rank) + " waits for " + w->what();
        }
        throw sim::SimError(sim::SimFailure::kDeadlock,
                            "deadlock after " + std::to_string(steps_) + " scheduling steps (seeded schedule, seed " +
                                std::to_string(options_.seed) + "):" + report + "\n" + reproduce);
      }
      if (steps_ >= options_.max_steps) {
        throw sim::SimError(sim::SimFailure::kLivelock, "no completion within " + std::to_string(options_.max_steps) +
                                                            " scheduling steps (seed " + std::to_string(options_.seed) +
                                                            ")\n" + reproduce);
      }
      // 2. The PRNG picks a rank to run until its next scheduling point, or a message to deliver.
      ++steps_;
      const uint64_t pick = rng.below(runnable.size() + pairs.size());
      if (pick >= runnable.size()) {
        const auto [from, to] = pairs[static_cast<size_t>(pick - runnable.size())];
        try {
          deliver_pair(from, to);
        } catch (const std::exception& e) {
          throw sim::SimError(sim::SimFailure::kError, std::string(e.what()) + "\n" + reproduce);
        }
        continue;
      }
      Waiter* next = runnable[static_cast<size_t>(pick)];
      next->ready = nullptr;
      current_ = next->rank;
      next->fiber->resume();
      current_ = -1;
      if (next->fiber->finished() && next->fiber->error() && !first_error) {
        try {
          std::rethrow_exception(next->fiber->error());
        } catch (const sim::SimError&) {
          throw;
        } catch (const std::exception& e) {
          throw sim::SimError(sim::SimFailure::kError, where(next->rank) + " failed: " + e.what() + "\n" + reproduce);
        }
      }
    }
  }
  if (first_error) {
    try {
      std::rethrow_exception(first_error);
    } catch (const sim::SimError&) {
      throw;
    } catch (const std::exception& e) {
      throw sim::SimError(sim::SimFailure::kError, std::string("a rank failed: ") + e.what());
    }
  }
}

}  // namespace exactcoll::multinode

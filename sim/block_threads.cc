#include "sim/block_threads.h"

#include <exception>
#include <stdexcept>
#include <string>
#include <utility>

#include "sim/prng.h"

// Why block_barrier's waits cannot deadlock on this schedule (block_threads.h). Let pos(t) be
// thread t's place in the order, the same in every block. Suppose some unfinished blocks were all
// stuck; take those at the lowest barrier number K (a block at a later barrier passed K and so
// signaled every peer for K; a block at K waits only for blocks at K). In barrier K, thread t of
// rank x's block signals peers p = t, t + nt, ... and then waits for each such p's flag, which
// thread (x mod nt) of p's block signals before any wait of its own. Let c(x) be the thread that
// rank x's block runs: every thread before it in the order has finished the interval, c(x) has
// sent its signals, the threads after it have not started. c(x) waits for some p with
// p mod nt = c(x) whose thread x mod nt has not started: pos(x mod nt) > pos(c(p)). p is stuck too,
// on some q with q mod nt = c(p) and pos(p mod nt) > pos(c(q)), i.e. pos(c(x)) > pos(c(q)). So
// pos(c(.)) falls strictly two steps along the chain x -> p -> q -> ..., which over finitely many
// blocks must return to where it started: impossible. (With orders that differ between blocks the
// chain compares positions in different orders and proves nothing; a rank waiting on another block
// of its own rank is excluded by the world's rule that barriers pair equal block indices.)

namespace exactcoll::sim {
namespace {

// A thread's stack: kernels use little (no recursion, small register arrays), the scheduler's wait
// path a little more. Pages are touched only as used (StackPool maps them MAP_NORESERVE).
constexpr size_t kThreadStackBytes = 128 * 1024;

}  // namespace

std::vector<int> BlockThreads::order(int threads, uint64_t seed) {
  std::vector<int> o(static_cast<size_t>(threads > 0 ? threads : 0));
  for (size_t i = 0; i < o.size(); ++i) o[i] = static_cast<int>(i);
  Xoshiro256 rng(seed);
  for (size_t i = o.size(); i > 1; --i) std::swap(o[i - 1], o[rng.below(i)]);
  return o;
}

void BlockThreads::run(int threads, const Body& body, std::optional<uint64_t> order_seed) {
  if (threads < 1 || threads > kMaxThreads) {
    throw std::invalid_argument("a simulated block has 1.." + std::to_string(kMaxThreads) + " threads, got " +
                                std::to_string(threads));
  }
  BlockThreads block(threads);
  if (threads == 1) {
    body(0, block);
    return;
  }
  std::vector<int> turns;
  if (order_seed) {
    turns = order(threads, *order_seed);
  } else {
    for (int t = 0; t < threads; ++t) turns.push_back(t);
  }
  // One pool per OS thread: the threads scheduler runs ranks on their own OS threads, the seeded
  // scheduler every block on the caller's; stacks are reused by the next block.
  thread_local StackPool stacks(kThreadStackBytes);
  for (int t = 0; t < threads; ++t) {
    block.fibers_.push_back(std::make_unique<Fiber>(stacks, [&block, &body, t] { body(t, block); }));
  }
  // One interval per pass: every unfinished thread runs to its next sync_block() or its end. A
  // pass ends every thread's interval, so there are as many passes as the kernel has syncs, plus one.
  for (uint64_t interval = 1;; ++interval) {
    int finished = 0;
    std::exception_ptr error;
    for (const int t : turns) {
      Fiber& fiber = *block.fibers_[static_cast<size_t>(t)];
      if (fiber.finished()) {
        ++finished;
        continue;
      }
      block.running_ = t;
      fiber.resume();
      block.running_ = -1;
      if (fiber.finished()) {
        ++finished;
        error = fiber.error();
        if (error) break;  // the others stay where they are: unwound below
      }
    }
    if (error) {
      block.unwind_waiting();
      std::rethrow_exception(error);
    }
    if (finished == threads) return;
    if (finished > 0) {
      block.unwind_waiting();
      throw std::logic_error("a simulated block's threads diverged: " + std::to_string(finished) + " of " +
                             std::to_string(threads) + " returned while the others wait in sync_block() #" +
                             std::to_string(interval) + " (every thread must reach every sync_block)");
    }
  }
}

void BlockThreads::sync_block() {
  if (fibers_.empty()) return;
  fibers_[static_cast<size_t>(running_)]->yield();
  if (unwinding_) throw Unwind{};
}

// Resumes every thread suspended in sync_block() so that it throws Unwind: its stack unwinds (its
// destructors run) and its fiber finishes. A thread that never ran holds no frames and stays so (a
// fiber's first resume would start its body).
void BlockThreads::unwind_waiting() {
  unwinding_ = true;
  for (size_t t = 0; t < fibers_.size(); ++t) {
    Fiber& fiber = *fibers_[t];
    if (fiber.finished() || !fiber.started()) continue;
    running_ = static_cast<int>(t);
    fiber.resume();
  }
  running_ = -1;
}

}  // namespace exactcoll::sim

// Fibers (stackful coroutines on ucontext) for the seeded scheduler: every simulated (rank, block)
// runs on its own stack, and exactly one runs at a time, switching only where the scheduler says.
// Also the threads of one simulated block (sim/block_threads.h). Host-only; each fiber is resumed
// on one OS thread only.
#pragma once

#include <ucontext.h>

#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <vector>

namespace exactcoll::sim {

// A reusable pool of guarded stacks (mmap'd; a PROT_NONE page below each catches overflow).
class StackPool {
 public:
  explicit StackPool(size_t stack_bytes = 256 * 1024) : stack_bytes_(stack_bytes) {}
  ~StackPool();
  StackPool(const StackPool&) = delete;
  StackPool& operator=(const StackPool&) = delete;

  // Returns the lowest usable address of a stack of stack_bytes().
  void* take();
  void give_back(void* stack);
  size_t stack_bytes() const { return stack_bytes_; }

 private:
  size_t stack_bytes_;
  std::vector<void*> free_;
  std::vector<void*> all_;
};

class Fiber {
 public:
  // The body runs on a stack from `pool` the first time resume() is called. An exception that
  // escapes the body is kept (error()) and finishes the fiber.
  Fiber(StackPool& pool, std::function<void()> body);
  ~Fiber();
  Fiber(const Fiber&) = delete;
  Fiber& operator=(const Fiber&) = delete;

  // Runs the fiber until it yields or finishes. Precondition: !finished(). Fibers nest: resume()
  // may be called from inside another fiber (sim/block_threads.h runs a block's threads so), and
  // the outer fiber's yield() from inside the inner one suspends both, to resume where it yielded.
  void resume();
  // From inside the fiber: returns control to resume()'s caller.
  void yield();
  // Whether resume() was ever called (the body has begun).
  bool started() const { return started_; }
  bool finished() const { return finished_; }
  std::exception_ptr error() const { return error_; }

 private:
  static void trampoline(unsigned low, unsigned high);
  StackPool& pool_;
  void* stack_ = nullptr;
  std::function<void()> body_;
  ucontext_t context_;
  ucontext_t caller_;
  bool started_ = false;
  bool finished_ = false;
  std::exception_ptr error_;
};

}  // namespace exactcoll::sim

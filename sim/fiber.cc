#include "sim/fiber.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <new>
#include <stdexcept>
#include <string>

namespace exactcoll::sim {
namespace {

size_t page_size() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

}  // namespace

StackPool::~StackPool() {
  for (void* s : all_) munmap(static_cast<char*>(s) - page_size(), stack_bytes_ + page_size());
}

void* StackPool::take() {
  if (!free_.empty()) {
    void* s = free_.back();
    free_.pop_back();
    return s;
  }
  const size_t page = page_size();
  void* mem =
      mmap(nullptr, stack_bytes_ + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (mem == MAP_FAILED) throw std::bad_alloc();
  if (mprotect(mem, page, PROT_NONE) != 0) {
    munmap(mem, stack_bytes_ + page);
    throw std::runtime_error("fiber stack: mprotect of the guard page failed");
  }
  void* stack = static_cast<char*>(mem) + page;
  all_.push_back(stack);
  return stack;
}

void StackPool::give_back(void* stack) { free_.push_back(stack); }

Fiber::Fiber(StackPool& pool, std::function<void()> body) : pool_(pool), body_(std::move(body)) {
  stack_ = pool_.take();
  if (getcontext(&context_) != 0) throw std::runtime_error("fiber: getcontext failed");
  context_.uc_stack.ss_sp = stack_;
  context_.uc_stack.ss_size = pool_.stack_bytes();
  context_.uc_link = &caller_;  // a body that returns goes back to resume()'s caller
  const auto self = reinterpret_cast<uintptr_t>(this);
  makecontext(&context_, reinterpret_cast<void (*)()>(&Fiber::trampoline), 2, static_cast<unsigned>(self & 0xFFFFFFFFu),
              static_cast<unsigned>(self >> 32));
}

Fiber::~Fiber() { pool_.give_back(stack_); }

void Fiber::trampoline(unsigned low, unsigned high) {
  Fiber* self = reinterpret_cast<Fiber*>(static_cast<uintptr_t>(low) | (static_cast<uintptr_t>(high) << 32));
  try {
    self->body_();
  } catch (...) {
    self->error_ = std::current_exception();
  }
  self->finished_ = true;
  // Returning follows uc_link back to the caller.
}

void Fiber::resume() {
  started_ = true;
  swapcontext(&caller_, &context_);
}

void Fiber::yield() { swapcontext(&context_, &caller_); }

}  // namespace exactcoll::sim

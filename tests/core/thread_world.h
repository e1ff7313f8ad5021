// A minimal execution context for the core templates, for tests only: every (rank, block, thread)
// is a std::thread; sync_block is a std::barrier per (rank, block); flags are atomics with release
// stores and acquire loads; waits are bounded (a flag that never arrives aborts the test with a
// message naming it). It exists so that core/fused_rmsnorm.h can be tested without the simulator;
// the simulator (sim/) runs the same templates in its own world.
#pragma once

#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "core/collectives.h"
#include "core/contract.h"
#include "core/lamport.h"
#include "core/signal.h"

namespace exactcoll::testing_world {

// 16-byte aligned storage for n elements of T.
template <class T>
struct AlignedBuffer {
  explicit AlignedBuffer(size_t n = 0) { resize(n); }
  void resize(size_t n) {
    size = n;
    bytes.reset(new (std::align_val_t{16}) Pack<T>[(n + Storage<T>::kPack - 1) / Storage<T>::kPack + 1]());
  }
  T* data() { return reinterpret_cast<T*>(bytes.get()); }
  const T* data() const { return reinterpret_cast<const T*>(bytes.get()); }
  struct Free {
    void operator()(Pack<T>* p) const { ::operator delete[](p, std::align_val_t{16}); }
  };
  std::unique_ptr<Pack<T>[], Free> bytes;
  size_t size = 0;
};

template <class T>
struct ThreadWorld {
  int ranks = 1, blocks = 1, threads = 1;
  std::vector<AlignedBuffer<T>> inputs, scratches, outputs;
  std::vector<std::unique_ptr<SignalBuffer>> signals;
  std::vector<std::unique_ptr<std::barrier<>>> block_barriers;  // [rank * blocks + block]
  int wait_timeout_ms = 20000;
  std::vector<AlignedBuffer<float>> lamports;  // per rank: the Lamport region (core/lamport.h)
  size_t lamport_region = 0;

  // Gives every rank a Lamport region of `bytes`, filled with sentinels (0xFF bytes).
  void add_lamport(size_t bytes) {
    lamport_region = bytes / 16 * 16;
    lamports.clear();
    for (int r = 0; r < ranks; ++r) {
      lamports.emplace_back(lamport_region / 4);
      std::memset(static_cast<void*>(lamports.back().data()), 0xFF, lamport_region);
    }
  }

  ThreadWorld(int ranks_, int blocks_, int threads_, size_t input_elems, size_t scratch_elems, size_t output_elems)
      : ranks(ranks_), blocks(blocks_), threads(threads_) {
    for (int r = 0; r < ranks; ++r) {
      inputs.emplace_back(input_elems);
      scratches.emplace_back(scratch_elems);
      outputs.emplace_back(output_elems);
      signals.push_back(std::make_unique<SignalBuffer>());
      std::memset(signals.back().get(), 0, sizeof(SignalBuffer));
    }
    for (int i = 0; i < ranks * blocks; ++i) block_barriers.push_back(std::make_unique<std::barrier<>>(threads));
  }

  struct Ctx {
    using value_type = T;
    static constexpr bool kTraceSteps = false;
    static constexpr bool kTraceElements = false;
    ThreadWorld* w;
    int rank_, block_, thread_;
    int rank() const { return rank_; }
    int world_size() const { return w->ranks; }
    int block() const { return block_; }
    int num_blocks() const { return w->blocks; }
    int thread() const { return thread_; }
    int num_threads() const { return w->threads; }
    const T* input(int peer) const { return w->inputs[peer].data(); }
    T* scratch(int peer) const { return w->scratches[peer].data(); }
    size_t scratch_elements() const { return w->scratches[0].size; }
    T* output() const { return w->outputs[rank_].data(); }
    SignalBuffer* signals(int peer) const { return w->signals[peer].get(); }
    void signal(uint32_t* flag, uint32_t value, int, int) {
      std::atomic_ref<uint32_t>(*flag).store(value, std::memory_order_release);
    }
    void wait(const uint32_t* flag, uint32_t value, int peer, int set) {
      std::atomic_ref<uint32_t> a(*const_cast<uint32_t*>(flag));
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(w->wait_timeout_ms);
      while (a.load(std::memory_order_acquire) != value) {
        if (std::chrono::steady_clock::now() > deadline) {
          std::fprintf(stderr, "ThreadWorld: rank %d block %d waited %d ms for flag value %u from rank %d (set %d)\n",
                       rank_, block_, w->wait_timeout_ms, value, peer, set);
          std::abort();
        }
        std::this_thread::yield();
      }
    }
    void sync_block() { w->block_barriers[rank_ * w->blocks + block_]->arrive_and_wait(); }
    Pack<T> load(const Pack<T>* p) const { return *p; }
    void store(Pack<T>* p, const Pack<T>& v) const { *p = v; }
    template <class Row>
    float row_sum_squares(const contract::RmsNormTree& tree, Row row) {
      return contract::sum_squares(tree, row);  // every thread computes the whole tree: same bits
    }
    // core/lamport.h: element-wise release stores and acquire polls (a pack may be seen in part).
    unsigned char* lamport(int peer) const { return reinterpret_cast<unsigned char*>(w->lamports[peer].data()); }
    size_t lamport_bytes() const { return w->lamport_region; }
    static uint32_t word(const unsigned char* p) {
      if constexpr (sizeof(T) == 2) {
        return std::atomic_ref<uint16_t>(*reinterpret_cast<uint16_t*>(const_cast<unsigned char*>(p)))
            .load(std::memory_order_acquire);
      } else {
        return std::atomic_ref<uint32_t>(*reinterpret_cast<uint32_t*>(const_cast<unsigned char*>(p)))
            .load(std::memory_order_acquire);
      }
    }
    void lamport_store(Pack<T>* p, const Pack<T>& x, int) const {
      unsigned char* d = reinterpret_cast<unsigned char*>(p);
      for (int e = 0; e < Storage<T>::kPack; ++e) {
        const uint32_t bits = Storage<T>::bits(x.v[e]);
        if constexpr (sizeof(T) == 2) {
          std::atomic_ref<uint16_t>(*reinterpret_cast<uint16_t*>(d + 2 * e))
              .store(static_cast<uint16_t>(bits), std::memory_order_release);
        } else {
          std::atomic_ref<uint32_t>(*reinterpret_cast<uint32_t*>(d + 4 * e)).store(bits, std::memory_order_release);
        }
      }
    }
    // One acquire load of the pack, element by element, whatever it finds (sentinels too).
    Pack<T> lamport_peek(const Pack<T>* p) const {
      const unsigned char* s = reinterpret_cast<const unsigned char*>(p);
      Pack<T> x;
      for (int e = 0; e < Storage<T>::kPack; ++e) {
        const uint32_t bits = word(s + e * sizeof(T));
        if constexpr (sizeof(T) == 2) {
          x.v[e] = T{static_cast<uint16_t>(bits)};
        } else {
          x.v[e] = bits_to_float(bits);
        }
      }
      return x;
    }
    Pack<T> lamport_poll(const Pack<T>* p, int peer, const LamportPoll& where) const {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(w->wait_timeout_ms);
      while (true) {
        const Pack<T> x = lamport_peek(p);
        if (lamport_arrived(x)) return x;
        if (std::chrono::steady_clock::now() > deadline) {
          std::fprintf(stderr,
                       "ThreadWorld: rank %d block %d polled rank %d's slot (buffer %d, call %u, element %zu) "
                       "for %d ms: rank %d never wrote it\n",
                       rank_, block_, peer, where.buffer, where.call, where.element, w->wait_timeout_ms, peer);
          std::abort();
        }
        std::this_thread::yield();
      }
    }
  };

  // Runs body(ctx) on every (rank, block, thread) concurrently and joins them all.
  void run(const std::function<void(Ctx&)>& body) {
    std::vector<std::thread> all;
    for (int r = 0; r < ranks; ++r)
      for (int b = 0; b < blocks; ++b)
        for (int t = 0; t < threads; ++t)
          all.emplace_back([this, &body, r, b, t] {
            Ctx ctx{this, r, b, t};
            body(ctx);
          });
    for (auto& th : all) th.join();
  }
};

}  // namespace exactcoll::testing_world

// Small RAII helpers and timing for the GPU commands: device buffers, a stream, and per-op times
// by CUDA-graph replay and by eager launches (median of many, events around each).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tools/stats/median.h"

namespace exactcoll::gpu {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

class Stream {
 public:
  Stream();
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// A CUDA graph of what `enqueue` enqueues on `stream` (captured once, thread-local capture mode),
// instantiated; destroyed with the object. Example: CapturedGraph g(s, call); g.launch(s);
class CapturedGraph {
 public:
  CapturedGraph(cudaStream_t stream, const std::function<void()>& enqueue);
  ~CapturedGraph();
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;
  void launch(cudaStream_t stream) const;

 private:
  cudaGraphExec_t exec_ = nullptr;
};

// Whether a timed span pays the host's launch of the work it times.
//   kHidden: the same work is launched once, untimed, right before the span's start event, so the
//     timed work is already queued when the span starts, as each step of a loop of back-to-back
//     steps is (nccl-tests times many launches between two events for the same reason). Each
//     launch also lines the ranks up: the lead's collectives end within one NVLink latency of
//     each other on every rank, so a rank's span does not hold the others' host skew.
//   kInSpan: the span starts on an idle stream and holds the host's launch of the graph (or of
//     the first eager call) and the ranks' skew: the GPU commands' timing up to 2026-11-28
//     (`bench --launch-in-span`).
enum class LaunchCost { kHidden, kInSpan };

// Returns the median over `replays` of (time of one graph launch) / ops, in µs: `enqueue` (which
// enqueues one op on stream) is captured `ops` times into one graph, launched `warmup` times
// untimed, then `replays` times with events around each launch (with launch_cost kHidden, each
// behind an untimed lead launch of the graph). `check` runs after each timed replay, outside the
// timed span (the communicator's check(): a peer that died stops the loop at its first timeout
// instead of after every replay).
double time_graph_us(cudaStream_t stream, const std::function<void()>& enqueue, int ops, int warmup, int replays,
                     const std::function<void()>& check, LaunchCost launch_cost = LaunchCost::kHidden);

// The same for eager launches: `rounds` rounds of `ops` back-to-back enqueue() calls (with
// kHidden, each behind an untimed lead round).
double time_eager_us(cudaStream_t stream, const std::function<void()>& enqueue, int ops, int warmup, int rounds,
                     const std::function<void()>& check, LaunchCost launch_cost = LaunchCost::kHidden);

using stats::median;  // tools/stats/median.h

// Splits "a,b,c" at commas (empty items dropped).
std::vector<std::string> split_list(const std::string& text);

// Parses "a,b,c" of positive whole numbers (at most 9 digits each) into *out, replacing what it
// held. Returns false on anything else, or on an empty list.
bool parse_counts(const std::string& text, std::vector<int64_t>* out);

}  // namespace exactcoll::gpu

// ce_sm_probe: can copy-engine (CE) copies and SM loads/stores over NVLink run at the same time
// and together bring more incoming bandwidth per GPU than either alone?
//
// Standalone: one process drives every visible GPU (2 to 8). Build (no Bazel target on purpose):
//   nvcc -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -o ce_sm_probe ce_sm_probe.cu
//        -Xcompiler -static-libgcc -cudart static
//
// Layout. Every GPU g owns two buffers of gpu_count slots, kSlotBytes each:
//   source[g]       slot d holds the piece meant for GPU d; word w of the buffer is
//                   expected_word(g, w), so any received word can be checked on its own;
//   destination[g]  slot p receives the piece that comes from GPU p.
// A piece (the first piece_bytes of a slot) goes source[p] slot d -> destination[d] slot p for
// every ordered pair p != d. The modes differ only in who moves which bytes:
//   ce_pull     GPU d's copy engines pull every piece (cudaMemcpyPeerAsync, one stream per peer);
//   sm_pull     a kernel on GPU d loads the pieces through peer pointers and stores them locally;
//   sm_push     a kernel on GPU p loads locally and stores into the peers' destinations;
//   mixed       the first fraction f of every piece as in ce_pull, the rest as in sm_pull, at once;
//   mixed_push  the first fraction f as in ce_pull, the rest as in sm_push, at once.
// Diagnostics for the CE side (see kCePullOneStream): ce_pull_1s (ce_pull with all of a GPU's copies
// on one stream), ce_push (GPU p's engines write its pieces into the peers), and mixed_cepush /
// mixed_cepush_push (the mixed modes with the CE part pushed instead of pulled).
//
// Timing. By default the host enqueues GPU after GPU, then waits for all:
//   event_us  per GPU, cudaEvents around its own transfers (from its `start` event); max over GPUs;
//   wall_us   host steady_clock from before the first enqueue to seeing every GPU's stop event.
// Each figure is the median of kTimedRepetitions runs after kWarmupRepetitions. GB/s = 1e9 bytes/s
// of bytes received by one GPU ((gpu_count - 1) pieces), divided by the time.
// Options (a gate keeps launch overhead and launch skew out of both clocks):
//   --gate           each GPU first parks a one-thread kernel spinning on a host-mapped flag; once
//                    all are parked, the host enqueues the transfers behind them and opens all gates
//                    at once; event_us runs from gate exit, wall_us from opening. On 4 H100s this
//                    made CE copies up to 2x slower (ce_push ~170-190 GB/s against ~370 ungated) for
//                    a reason not found; SM kernels were unaffected. Hence not the default.
//   --stagger-us N   --gate, with GPU d's gate opened d*N us after GPU 0's; wall_us from GPU 0's.
//
// Every wait is a poll with a deadline (kWatchdogSeconds): a transfer that never ends is named and
// the process exits 1 instead of hanging. No NVLink multicast/NVLS of any kind is used.

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr int kMaxGpus = 8;
constexpr int kMaxPeers = kMaxGpus - 1;
constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kSlotBytes = 64 * kMiB;  // the largest piece; smaller pieces use a slot's start
constexpr size_t kPieceBytesList[] = {16 * kMiB, 64 * kMiB};
constexpr double kCeFractions[] = {0.3, 0.4, 0.5, 0.6, 0.7};
constexpr int kSmOnlyBlockCounts[] = {64, 132, 264};
constexpr int kMixedBlockCounts[] = {32, 64, 132};
constexpr int kWarmupRepetitions = 3;
constexpr int kTimedRepetitions = 10;
constexpr double kWatchdogSeconds = 30.0;

// The CE/SM split point is rounded to this so that both parts stay whole warp chunks (512 bytes)
// and the CE part starts and ends on generously aligned addresses.
constexpr size_t kSplitAlignBytes = 64 * 1024;

constexpr int kThreadsPerBlock = 512;
// Independent 16-byte loads each thread issues before it stores: a remote NVLink load takes on the
// order of a microsecond, so small grids need several loads in flight per thread to fill the link.
constexpr int kVectorsInFlight = 4;
// Consecutive 32-vector (512-byte) chunks of the flattened work go to different peers, so each warp
// touches one peer with fully coalesced accesses while the grid as a whole draws on all peers.
constexpr uint32_t kWarpChunkVectors = 32;

constexpr int kRandomSamplesPerPiece = 1024;
constexpr int kRandomSamplesOwnSlot = 16;

using Clock = std::chrono::steady_clock;

[[noreturn]] void die() {
  std::fflush(stdout);
  std::fflush(stderr);
  // _Exit skips the CUDA runtime's teardown, which could itself wait on a stuck transfer.
  std::_Exit(1);
}

void check_cuda(cudaError_t result, const char* call, const char* file, int line) {
  if (result == cudaSuccess) return;
  int current_gpu = -1;
  (void)cudaGetDevice(&current_gpu);
  std::printf("FAIL: CUDA error %s (%s) at %s:%d, current GPU %d: %s\n", cudaGetErrorName(result),
              cudaGetErrorString(result), file, line, current_gpu, call);
  die();
}
#define CUDA_CHECK(call) check_cuda((call), #call, __FILE__, __LINE__)

// The value of word `word_index` of GPU `gpu`'s source buffer: a hash, forced odd so that it can
// never match the zeroes a destination is cleared to before a checked run.
__host__ __device__ inline uint32_t expected_word(int gpu, uint64_t word_index) {
  uint64_t x = word_index * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(gpu + 1) * 0xD1B54A32D192ED03ull;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return static_cast<uint32_t>(x) | 1u;
}

__global__ void fill_source(uint32_t* words, uint64_t word_count, int gpu) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < word_count; i += stride) {
    words[i] = expected_word(gpu, i);
  }
}

// Parks the stream until the host opens the gate for `generation`; reports arrival first so the
// host opens it only once every GPU is parked.
__global__ void wait_for_release(const volatile uint32_t* release, volatile uint32_t* arrived, uint32_t generation) {
  *arrived = generation;
  __threadfence_system();
  while (*release < generation) __nanosleep(256);
}

// One kernel's share of the pieces: piece k goes source[k] -> destination[k]; every piece has the
// same length. Either side may be a peer pointer (pull: sources remote; push: destinations remote).
struct PieceCopies {
  const uint4* source[kMaxPeers];
  uint4* destination[kMaxPeers];
  uint32_t piece_count;
  uint32_t vectors_per_piece;  // a multiple of kWarpChunkVectors
};

__device__ __forceinline__ void locate_vector(const PieceCopies& copies, uint32_t flat_index, uint32_t& piece,
                                              uint32_t& offset_vectors) {
  const uint32_t chunk = flat_index / kWarpChunkVectors;
  piece = chunk % copies.piece_count;
  offset_vectors = (chunk / copies.piece_count) * kWarpChunkVectors + flat_index % kWarpChunkVectors;
}

// __grid_constant__ lets the pointer tables be indexed by a runtime piece number straight from the
// kernel-parameter bank; a by-value parameter indexed that way is first copied to local memory.
__global__ void __launch_bounds__(kThreadsPerBlock, 2) copy_pieces(const __grid_constant__ PieceCopies copies) {
  const uint32_t total_vectors = copies.piece_count * copies.vectors_per_piece;
  const uint32_t stride = gridDim.x * blockDim.x;
  for (uint32_t first = blockIdx.x * blockDim.x + threadIdx.x; first < total_vectors;
       first += stride * kVectorsInFlight) {
    uint4 values[kVectorsInFlight];
    uint32_t pieces[kVectorsInFlight];
    uint32_t offsets[kVectorsInFlight];
#pragma unroll
    for (int k = 0; k < kVectorsInFlight; ++k) {
      const uint32_t flat_index = first + k * stride;
      values[k] = make_uint4(0, 0, 0, 0);
      pieces[k] = 0;
      offsets[k] = 0;
      if (flat_index < total_vectors) {
        locate_vector(copies, flat_index, pieces[k], offsets[k]);
        values[k] = copies.source[pieces[k]][offsets[k]];
      }
    }
#pragma unroll
    for (int k = 0; k < kVectorsInFlight; ++k) {
      if (first + k * stride < total_vectors) copies.destination[pieces[k]][offsets[k]] = values[k];
    }
  }
}

__global__ void gather_words(const uint32_t* words, const uint64_t* indices, uint32_t* values, int count) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < count) values[i] = words[indices[i]];
}

// How the copy engines take part: not at all, the whole piece, or the first fraction f of it.
enum class CeShare { kNone, kWhole, kFraction };
// Which side drives a transfer. Pull: the receiver's engine or kernel reads the peer's memory.
// Push: the sender's engine or kernel writes into the peer's memory.
enum class Direction { kPull, kPush };

struct Mode {
  const char* name;
  CeShare ce_share;
  Direction ce_direction;
  bool ce_one_stream;  // every peer copy of a GPU on one stream (serialized) instead of one per peer
  Direction sm_direction;
};

// The requested modes, then diagnostics for the CE side: on 4 H100s the per-peer-stream CE pull
// delivered only ~190 GB/s per GPU (with one peer: ~360), so one stream per GPU and CE push show
// whether the copy engines' direction or concurrency is what limits them.
constexpr Mode kCePull{"ce_pull", CeShare::kWhole, Direction::kPull, false, Direction::kPull};
constexpr Mode kCePullOneStream{"ce_pull_1s", CeShare::kWhole, Direction::kPull, true, Direction::kPull};
constexpr Mode kCePush{"ce_push", CeShare::kWhole, Direction::kPush, false, Direction::kPull};
constexpr Mode kSmPull{"sm_pull", CeShare::kNone, Direction::kPull, false, Direction::kPull};
constexpr Mode kSmPush{"sm_push", CeShare::kNone, Direction::kPull, false, Direction::kPush};
constexpr Mode kMixed{"mixed", CeShare::kFraction, Direction::kPull, false, Direction::kPull};
constexpr Mode kMixedPush{"mixed_push", CeShare::kFraction, Direction::kPull, false, Direction::kPush};
constexpr Mode kMixedCePush{"mixed_cepush", CeShare::kFraction, Direction::kPush, false, Direction::kPull};
constexpr Mode kMixedCePushSmPush{"mixed_cepush_push", CeShare::kFraction, Direction::kPush, false, Direction::kPush};

struct Config {
  Mode mode;
  size_t piece_bytes;
  double ce_fraction;  // meaningful for CeShare::kFraction only
  int sm_blocks;       // 0 when the copy engines move everything

  // Bytes at the start of every piece that the copy engines move; the SM kernel moves the rest.
  size_t ce_bytes() const {
    switch (mode.ce_share) {
      case CeShare::kNone: return 0;
      case CeShare::kWhole: return piece_bytes;
      case CeShare::kFraction: {
        const double aligned_units = std::round(ce_fraction * static_cast<double>(piece_bytes) / kSplitAlignBytes);
        return std::min(piece_bytes, static_cast<size_t>(aligned_units) * kSplitAlignBytes);
      }
    }
    return 0;
  }
  size_t sm_bytes() const { return piece_bytes - ce_bytes(); }
};

struct GpuState {
  uint8_t* source = nullptr;
  uint8_t* destination = nullptr;
  cudaStream_t control_stream = nullptr;  // events, gate (--gate), clearing and checking
  std::vector<cudaStream_t> ce_streams;   // one per peer, as the CE-only measurement used
  cudaStream_t sm_stream = nullptr;
  cudaEvent_t start = nullptr;  // this GPU's transfers may begin
  cudaEvent_t stop = nullptr;   // every transfer of this GPU done
  std::vector<cudaEvent_t> ce_done;
  cudaEvent_t sm_done = nullptr;
  uint64_t* sample_indices = nullptr;  // host-mapped: the kernel reads them in place
  uint32_t* sample_values = nullptr;   // host-mapped: the kernel writes them in place
};

struct Probe {
  int gpu_count = 0;
  std::string gpu_name;  // of GPU 0; the probe assumes a uniform box
  std::vector<GpuState> gpus;
  volatile uint32_t* release = nullptr;  // host-mapped gate flags, one word per GPU
  volatile uint32_t* arrived = nullptr;  // host-mapped, one word per GPU
  bool use_gate = false;                 // --gate: start every GPU at once (see the file comment)
  double gate_stagger_us = 0;            // --stagger-us N: open GPU d's gate d*N us after GPU 0's
  uint32_t generation = 0;
  int max_samples = 0;

  size_t slot_words() const { return kSlotBytes / sizeof(uint32_t); }
  size_t buffer_bytes() const { return static_cast<size_t>(gpu_count) * kSlotBytes; }
  uint8_t* source_piece(int owner, int receiver) const { return gpus[owner].source + receiver * kSlotBytes; }
  uint8_t* destination_piece(int receiver, int sender) const {
    return gpus[receiver].destination + sender * kSlotBytes;
  }
};

struct PendingEvent {
  int gpu;
  cudaEvent_t event;
};

// Polls until every event has completed; past the deadline, names the first GPU still busy.
void wait_events_bounded(const std::vector<PendingEvent>& pending, const std::string& what) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(kWatchdogSeconds);
  std::vector<bool> done(pending.size(), false);
  size_t remaining = pending.size();
  while (remaining > 0) {
    for (size_t i = 0; i < pending.size(); ++i) {
      if (done[i]) continue;
      CUDA_CHECK(cudaSetDevice(pending[i].gpu));
      const cudaError_t result = cudaEventQuery(pending[i].event);
      if (result == cudaSuccess) {
        done[i] = true;
        --remaining;
      } else if (result != cudaErrorNotReady) {
        CUDA_CHECK(result);
      }
    }
    if (remaining > 0 && Clock::now() > deadline) {
      for (size_t i = 0; i < pending.size(); ++i) {
        if (!done[i]) {
          std::printf("FAIL: watchdog: GPU %d never finished %s within %.0f s\n", pending[i].gpu, what.c_str(),
                      kWatchdogSeconds);
        }
      }
      die();
    }
  }
}

// Waits for everything enqueued so far on every GPU's control stream (where setup work goes).
void wait_control_streams(Probe& probe, const std::string& what) {
  std::vector<PendingEvent> pending;
  for (int d = 0; d < probe.gpu_count; ++d) {
    CUDA_CHECK(cudaSetDevice(d));
    CUDA_CHECK(cudaEventRecord(probe.gpus[d].stop, probe.gpus[d].control_stream));
    pending.push_back({d, probe.gpus[d].stop});
  }
  wait_events_bounded(pending, what);
}

void enable_peer_access(int gpu_count) {
  for (int d = 0; d < gpu_count; ++d) {
    CUDA_CHECK(cudaSetDevice(d));
    for (int p = 0; p < gpu_count; ++p) {
      if (p == d) continue;
      int can_access = 0;
      CUDA_CHECK(cudaDeviceCanAccessPeer(&can_access, d, p));
      if (!can_access) {
        std::printf("FAIL: GPU %d cannot access GPU %d as a peer\n", d, p);
        die();
      }
      const cudaError_t result = cudaDeviceEnablePeerAccess(p, 0);
      if (result == cudaErrorPeerAccessAlreadyEnabled) {
        (void)cudaGetLastError();  // harmless; clear the sticky-free error so later checks stay clean
      } else {
        CUDA_CHECK(result);
      }
    }
  }
}

void set_up(Probe& probe) {
  const int peer_count = probe.gpu_count - 1;
  probe.max_samples = peer_count * (kRandomSamplesPerPiece + 16) + kRandomSamplesOwnSlot;

  // Portable + mapped: every GPU may read and write it; with UVA the host pointer is the device one.
  void* flags = nullptr;
  CUDA_CHECK(cudaHostAlloc(&flags, 2 * kMaxGpus * sizeof(uint32_t), cudaHostAllocMapped | cudaHostAllocPortable));
  probe.release = static_cast<volatile uint32_t*>(flags);
  probe.arrived = probe.release + kMaxGpus;
  for (int d = 0; d < kMaxGpus; ++d) probe.release[d] = probe.arrived[d] = 0;

  probe.gpus.resize(probe.gpu_count);
  for (int d = 0; d < probe.gpu_count; ++d) {
    GpuState& gpu = probe.gpus[d];
    CUDA_CHECK(cudaSetDevice(d));
    CUDA_CHECK(cudaMalloc(&gpu.source, probe.buffer_bytes()));
    CUDA_CHECK(cudaMalloc(&gpu.destination, probe.buffer_bytes()));
    // Non-blocking streams: nothing here may serialize behind the legacy default stream.
    CUDA_CHECK(cudaStreamCreateWithFlags(&gpu.control_stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&gpu.sm_stream, cudaStreamNonBlocking));
    gpu.ce_streams.resize(peer_count);
    gpu.ce_done.resize(peer_count);
    for (int k = 0; k < peer_count; ++k) {
      CUDA_CHECK(cudaStreamCreateWithFlags(&gpu.ce_streams[k], cudaStreamNonBlocking));
      CUDA_CHECK(cudaEventCreateWithFlags(&gpu.ce_done[k], cudaEventDisableTiming));
    }
    CUDA_CHECK(cudaEventCreateWithFlags(&gpu.sm_done, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreate(&gpu.start));
    CUDA_CHECK(cudaEventCreate(&gpu.stop));
    CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&gpu.sample_indices), probe.max_samples * sizeof(uint64_t),
                             cudaHostAllocMapped | cudaHostAllocPortable));
    CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&gpu.sample_values), probe.max_samples * sizeof(uint32_t),
                             cudaHostAllocMapped | cudaHostAllocPortable));

    const uint64_t word_count = probe.buffer_bytes() / sizeof(uint32_t);
    fill_source<<<1024, 256, 0, gpu.control_stream>>>(reinterpret_cast<uint32_t*>(gpu.source), word_count, d);
    CUDA_CHECK(cudaGetLastError());
  }
  wait_control_streams(probe, "filling the source buffers");
}

void tear_down(Probe& probe) {
  for (int d = 0; d < probe.gpu_count; ++d) {
    GpuState& gpu = probe.gpus[d];
    CUDA_CHECK(cudaSetDevice(d));
    CUDA_CHECK(cudaFree(gpu.source));
    CUDA_CHECK(cudaFree(gpu.destination));
    for (cudaStream_t stream : gpu.ce_streams) CUDA_CHECK(cudaStreamDestroy(stream));
    for (cudaEvent_t event : gpu.ce_done) CUDA_CHECK(cudaEventDestroy(event));
    CUDA_CHECK(cudaStreamDestroy(gpu.control_stream));
    CUDA_CHECK(cudaStreamDestroy(gpu.sm_stream));
    CUDA_CHECK(cudaEventDestroy(gpu.sm_done));
    CUDA_CHECK(cudaEventDestroy(gpu.start));
    CUDA_CHECK(cudaEventDestroy(gpu.stop));
    CUDA_CHECK(cudaFreeHost(gpu.sample_indices));
    CUDA_CHECK(cudaFreeHost(gpu.sample_values));
  }
  CUDA_CHECK(cudaFreeHost(const_cast<uint32_t*>(probe.release)));
}

void launch_gate(Probe& probe, int d) {
  CUDA_CHECK(cudaSetDevice(d));
  wait_for_release<<<1, 1, 0, probe.gpus[d].control_stream>>>(probe.release + d, probe.arrived + d, probe.generation);
  CUDA_CHECK(cudaGetLastError());
}

// Enqueues GPU d's share of one run, all of it released by its `start` event (which follows the
// parked gate with --gate): its CE copies and its SM kernel, each pulling (peers -> d) or pushing
// (d -> peers) as the mode says.
void enqueue_transfers(Probe& probe, const Config& config, int d) {
  GpuState& gpu = probe.gpus[d];
  CUDA_CHECK(cudaSetDevice(d));
  CUDA_CHECK(cudaEventRecord(gpu.start, gpu.control_stream));

  const size_t ce_bytes = config.ce_bytes();
  const size_t sm_bytes = config.sm_bytes();
  PieceCopies copies{};
  copies.vectors_per_piece = static_cast<uint32_t>(sm_bytes / sizeof(uint4));

  // Peers in rotated order (d+1, d+2, ...): where copies run one after another (ce_pull_1s), each
  // GPU is then the source of exactly one copy at a time instead of GPU 0 serving everyone first.
  for (int peer_index = 0; peer_index < probe.gpu_count - 1; ++peer_index) {
    const int p = (d + 1 + peer_index) % probe.gpu_count;
    if (ce_bytes > 0) {
      const int stream_index = config.mode.ce_one_stream ? 0 : peer_index;
      cudaStream_t stream = gpu.ce_streams[stream_index];
      // With one stream, the repeated waits and records are redundant but harmless: a wait binds
      // to the event's latest record at the time of the call.
      CUDA_CHECK(cudaStreamWaitEvent(stream, gpu.start, 0));
      if (config.mode.ce_direction == Direction::kPush) {
        CUDA_CHECK(
            cudaMemcpyPeerAsync(probe.destination_piece(p, d), p, probe.source_piece(d, p), d, ce_bytes, stream));
      } else {
        CUDA_CHECK(
            cudaMemcpyPeerAsync(probe.destination_piece(d, p), d, probe.source_piece(p, d), p, ce_bytes, stream));
      }
      CUDA_CHECK(cudaEventRecord(gpu.ce_done[stream_index], stream));
      CUDA_CHECK(cudaStreamWaitEvent(gpu.control_stream, gpu.ce_done[stream_index], 0));
    }
    if (config.mode.sm_direction == Direction::kPush) {
      copies.source[peer_index] = reinterpret_cast<const uint4*>(probe.source_piece(d, p) + ce_bytes);
      copies.destination[peer_index] = reinterpret_cast<uint4*>(probe.destination_piece(p, d) + ce_bytes);
    } else {
      copies.source[peer_index] = reinterpret_cast<const uint4*>(probe.source_piece(p, d) + ce_bytes);
      copies.destination[peer_index] = reinterpret_cast<uint4*>(probe.destination_piece(d, p) + ce_bytes);
    }
  }
  copies.piece_count = static_cast<uint32_t>(probe.gpu_count - 1);

  if (sm_bytes > 0) {
    CUDA_CHECK(cudaStreamWaitEvent(gpu.sm_stream, gpu.start, 0));
    copy_pieces<<<config.sm_blocks, kThreadsPerBlock, 0, gpu.sm_stream>>>(copies);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaEventRecord(gpu.sm_done, gpu.sm_stream));
    CUDA_CHECK(cudaStreamWaitEvent(gpu.control_stream, gpu.sm_done, 0));
  }
  CUDA_CHECK(cudaEventRecord(gpu.stop, gpu.control_stream));
}

struct RunTimes {
  double event_max_us;
  double wall_us;
};

std::string describe(const Config& config) {
  char text[128];
  std::snprintf(text, sizeof(text), "%s piece=%zu MiB f=%.1f blocks=%d", config.mode.name, config.piece_bytes / kMiB,
                config.ce_fraction, config.sm_blocks);
  return text;
}

RunTimes wait_and_time(Probe& probe, const Config& config, Clock::time_point started);

RunTimes run_once(Probe& probe, const Config& config) {
  ++probe.generation;
  if (!probe.use_gate) {
    const auto launched = Clock::now();
    for (int d = 0; d < probe.gpu_count; ++d) enqueue_transfers(probe, config, d);
    return wait_and_time(probe, config, launched);
  }
  // Every gate must be parked before any transfer is enqueued: a first try that enqueued GPU 0's
  // transfers before launching GPU 1's gate saw GPU 1's gate never start (4 and 2 H100s), likely
  // because the driver queues part of a peer copy on the peer's side, behind GPU 0's closed gate.
  for (int d = 0; d < probe.gpu_count; ++d) launch_gate(probe, d);
  const auto deadline = Clock::now() + std::chrono::duration<double>(kWatchdogSeconds);
  for (int d = 0; d < probe.gpu_count; ++d) {
    while (probe.arrived[d] != probe.generation) {
      if (Clock::now() > deadline) {
        std::printf("FAIL: watchdog: GPU %d never reached its start gate for %s (earlier work stuck?)\n", d,
                    describe(config).c_str());
        die();
      }
    }
  }
  for (int d = 0; d < probe.gpu_count; ++d) enqueue_transfers(probe, config, d);
  // Opening all gates at once lets every GPU start within about a PCIe round trip of the others.
  // With a stagger, GPU d starts d*N us late, to tell effects of lockstep starts from the rest.
  const auto opened = Clock::now();
  for (int d = 0; d < probe.gpu_count; ++d) {
    const auto open_at = opened + std::chrono::duration<double, std::micro>(d * probe.gate_stagger_us);
    while (Clock::now() < open_at) {
    }
    probe.release[d] = probe.generation;
  }
  return wait_and_time(probe, config, opened);
}

// Waits for every GPU's stop event; wall time runs from `started` (gate opening or first launch).
RunTimes wait_and_time(Probe& probe, const Config& config, Clock::time_point started) {
  std::vector<PendingEvent> pending;
  for (int d = 0; d < probe.gpu_count; ++d) pending.push_back({d, probe.gpus[d].stop});
  wait_events_bounded(pending, describe(config));
  const auto finished = Clock::now();

  RunTimes times{0.0, std::chrono::duration<double, std::micro>(finished - started).count()};
  for (int d = 0; d < probe.gpu_count; ++d) {
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, probe.gpus[d].start, probe.gpus[d].stop));
    times.event_max_us = std::max(times.event_max_us, 1000.0 * ms);
  }
  return times;
}

// What destination word `word_index` of GPU `receiver` must hold after a run of `piece_bytes`
// pieces into a cleared buffer: the sender's word inside a piece, zero everywhere else.
uint32_t expected_destination_word(const Probe& probe, int receiver, size_t piece_bytes, uint64_t word_index) {
  const int sender = static_cast<int>(word_index / probe.slot_words());
  const uint64_t word_in_slot = word_index % probe.slot_words();
  if (sender == receiver || word_in_slot >= piece_bytes / sizeof(uint32_t)) return 0;
  return expected_word(sender, static_cast<uint64_t>(receiver) * probe.slot_words() + word_in_slot);
}

// Clears every destination, runs the config once and compares sampled destination words on the
// host: random words of each piece, both piece ends, both sides of the CE/SM split, the first words
// past a piece (must stay zero) and a few words of the receiver's own slot (must stay zero).
bool run_checked(Probe& probe, const Config& config) {
  for (int d = 0; d < probe.gpu_count; ++d) {
    CUDA_CHECK(cudaSetDevice(d));
    // Stream order puts this before `start` (and the gate), so before every transfer.
    CUDA_CHECK(cudaMemsetAsync(probe.gpus[d].destination, 0, probe.buffer_bytes(), probe.gpus[d].control_stream));
  }
  (void)run_once(probe, config);

  const uint64_t piece_words = config.piece_bytes / sizeof(uint32_t);
  const uint64_t split_word = config.ce_bytes() / sizeof(uint32_t);
  std::mt19937_64 random(0x5eed + probe.generation);
  std::vector<int> sample_counts(probe.gpu_count, 0);
  for (int d = 0; d < probe.gpu_count; ++d) {
    GpuState& gpu = probe.gpus[d];
    int& count = sample_counts[d];
    auto add_sample = [&](uint64_t word_index) {
      if (count < probe.max_samples) gpu.sample_indices[count++] = word_index;
    };
    for (int p = 0; p < probe.gpu_count; ++p) {
      const uint64_t slot_start = static_cast<uint64_t>(p) * probe.slot_words();
      if (p == d) {
        for (int i = 0; i < kRandomSamplesOwnSlot; ++i) add_sample(slot_start + random() % probe.slot_words());
        continue;
      }
      const uint64_t edges[] = {
          0, 1, piece_words - 1, split_word - 1, split_word, split_word + 1, piece_words, piece_words + 1};
      for (uint64_t edge : edges) {
        if (edge < probe.slot_words()) add_sample(slot_start + edge);  // also drops split_word - 1 wrapped at 0
      }
      for (int i = 0; i < kRandomSamplesPerPiece; ++i) add_sample(slot_start + random() % piece_words);
    }
    CUDA_CHECK(cudaSetDevice(d));
    gather_words<<<(count + 255) / 256, 256, 0, gpu.control_stream>>>(
        reinterpret_cast<const uint32_t*>(gpu.destination), gpu.sample_indices, gpu.sample_values, count);
    CUDA_CHECK(cudaGetLastError());
  }
  wait_control_streams(probe, "gathering check samples for " + describe(config));

  bool all_match = true;
  for (int d = 0; d < probe.gpu_count; ++d) {
    int mismatches = 0;
    for (int i = 0; i < sample_counts[d]; ++i) {
      const uint64_t word_index = probe.gpus[d].sample_indices[i];
      const uint32_t expected = expected_destination_word(probe, d, config.piece_bytes, word_index);
      const uint32_t actual = probe.gpus[d].sample_values[i];
      if (actual == expected) continue;
      if (mismatches++ < 3) {
        std::printf("FAIL: %s: GPU %d destination slot %" PRIu64 " word %" PRIu64 ": got 0x%08x, expected 0x%08x\n",
                    describe(config).c_str(), d, word_index / probe.slot_words(), word_index % probe.slot_words(),
                    actual, expected);
      }
    }
    if (mismatches > 0) {
      std::printf("FAIL: %s: GPU %d: %d of %d sampled words wrong\n", describe(config).c_str(), d, mismatches,
                  sample_counts[d]);
      all_match = false;
    }
  }
  return all_match;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

struct Result {
  Config config;
  double event_us;
  double wall_us;
  bool correct;
};

Result measure(Probe& probe, const Config& config) {
  Result result{config, 0.0, 0.0, run_checked(probe, config)};
  for (int i = 0; i < kWarmupRepetitions; ++i) (void)run_once(probe, config);
  std::vector<double> event_us;
  std::vector<double> wall_us;
  for (int i = 0; i < kTimedRepetitions; ++i) {
    const RunTimes times = run_once(probe, config);
    event_us.push_back(times.event_max_us);
    wall_us.push_back(times.wall_us);
  }
  result.event_us = median(event_us);
  result.wall_us = median(wall_us);
  return result;
}

std::vector<Config> all_configs() {
  std::vector<Config> configs;
  for (size_t piece_bytes : kPieceBytesList) {
    for (const Mode& mode : {kCePull, kCePullOneStream, kCePush}) configs.push_back({mode, piece_bytes, 1.0, 0});
    for (const Mode& mode : {kSmPull, kSmPush}) {
      for (int blocks : kSmOnlyBlockCounts) configs.push_back({mode, piece_bytes, 0.0, blocks});
    }
    for (const Mode& mode : {kMixed, kMixedPush, kMixedCePush, kMixedCePushSmPush}) {
      for (int blocks : kMixedBlockCounts) {
        for (double fraction : kCeFractions) configs.push_back({mode, piece_bytes, fraction, blocks});
      }
    }
  }
  return configs;
}

std::string format_result_line(const Result& result, int gpu_count) {
  const Config& config = result.config;
  const double incoming_bytes = static_cast<double>(gpu_count - 1) * static_cast<double>(config.piece_bytes);
  const bool mixed = config.mode.ce_share == CeShare::kFraction;
  char fraction[16] = "-";
  char blocks[16] = "-";
  if (mixed) std::snprintf(fraction, sizeof(fraction), "%.1f", config.ce_fraction);
  if (config.sm_blocks > 0) std::snprintf(blocks, sizeof(blocks), "%d", config.sm_blocks);
  char line[200];
  std::snprintf(line, sizeof(line), "%-17s %9zu %4s %6s %10.1f %10.1f %12.1f %11.1f  %s", config.mode.name,
                config.piece_bytes / kMiB, fraction, blocks, result.event_us, result.wall_us,
                incoming_bytes / (result.event_us * 1e3), incoming_bytes / (result.wall_us * 1e3),
                result.correct ? "ok" : "FAIL");
  return line;
}

const char* kTableHeader =
    "mode              piece_MiB    f blocks   event_us    wall_us  GBps_in_evt GBps_in_wall  check";

}  // namespace

int main(int argc, char** argv) {
  const auto program_start = Clock::now();
  Probe probe;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--gate") {
      probe.use_gate = true;
    } else if (arg == "--stagger-us" && i + 1 < argc) {
      probe.use_gate = true;
      probe.gate_stagger_us = std::atof(argv[++i]);
    } else {
      std::printf("usage: %s [--gate | --stagger-us N]\n", argv[0]);
      return 2;
    }
  }
  CUDA_CHECK(cudaGetDeviceCount(&probe.gpu_count));
  if (probe.gpu_count < 2 || probe.gpu_count > kMaxGpus) {
    std::printf("FAIL: need 2 to %d visible GPUs, found %d\n", kMaxGpus, probe.gpu_count);
    return 1;
  }
  std::printf("ce_sm_probe: %d GPUs\n", probe.gpu_count);
  for (int d = 0; d < probe.gpu_count; ++d) {
    cudaDeviceProp properties{};
    CUDA_CHECK(cudaGetDeviceProperties(&properties, d));
    std::printf("  GPU %d: %s, %d SMs, PCI %04x:%02x:%02x\n", d, properties.name, properties.multiProcessorCount,
                properties.pciDomainID, properties.pciBusID, properties.pciDeviceID);
    if (d == 0) probe.gpu_name = properties.name;
  }
  std::printf(
      "SM kernel: %d threads/block, %d x 16-byte loads in flight per thread, 512-byte warp chunks "
      "interleaved over peers\n",
      kThreadsPerBlock, kVectorsInFlight);
  if (probe.use_gate) {
    if (probe.gate_stagger_us > 0) std::printf("gates opened %.1f us apart (GPU d at d*N)\n", probe.gate_stagger_us);
    std::printf(
        "times (--gate): median of %d after %d warm-ups; event_us = max over GPUs of per-GPU cudaEvent "
        "time from its start gate; wall_us = host clock gate-open to all done; GB/s = 1e9 B/s received "
        "per GPU\n",
        kTimedRepetitions, kWarmupRepetitions);
  } else {
    std::printf(
        "times: median of %d after %d warm-ups; event_us = max over GPUs of per-GPU cudaEvent time from "
        "its own launch; wall_us = host clock first launch to all done; GB/s = 1e9 B/s received per GPU\n",
        kTimedRepetitions, kWarmupRepetitions);
  }
  std::fflush(stdout);

  enable_peer_access(probe.gpu_count);
  set_up(probe);

  std::printf("%s\n", kTableHeader);
  std::vector<Result> results;
  for (const Config& config : all_configs()) {
    results.push_back(measure(probe, config));
    std::printf("%s\n", format_result_line(results.back(), probe.gpu_count).c_str());
    std::fflush(stdout);
  }
  tear_down(probe);

  bool all_correct = true;
  const char* start_kind = !probe.use_gate             ? "no gate (default)"
                           : probe.gate_stagger_us > 0 ? "staggered gates"
                                                       : "gated start";
  std::printf("\n== ce_sm_probe summary: %d x %s; incoming per GPU = %d pieces; %s ==\n%s\n", probe.gpu_count,
              probe.gpu_name.c_str(), probe.gpu_count - 1, start_kind, kTableHeader);
  for (const Result& result : results) {
    std::printf("%s\n", format_result_line(result, probe.gpu_count).c_str());
    all_correct = all_correct && result.correct;
  }
  const double total_seconds = std::chrono::duration<double>(Clock::now() - program_start).count();
  std::printf("%s (%.1f s)\n", all_correct ? "ALL OK" : "FAIL: some modes delivered wrong data", total_seconds);
  return all_correct ? 0 : 1;
}

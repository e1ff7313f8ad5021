// launch_floor_probe: what the small all-reduces' time is made of, measured without exactcoll.
//   1. floor: one kernel behind the previous one in a CUDA graph on one GPU (20 launches a graph, as
//      `exactcoll bench` times them: each timed replay behind an untimed one, median of 25). The
//      kernel waits for the previous grid (griddepcontrol.wait), lets the next one launch, then
//      makes `depth` dependent global loads, each followed by a block sync (the shape of a Lamport
//      kernel's prologue: the call number, then the input, then the clear's extent). depth 0 is the
//      empty kernel; the step from depth d to d + 1 is one dependent round trip to L2. Beside them,
//      lamport_shaped_kernel: a one-rank Lamport all-reduce's loads, syncs and stores, 16 bytes a
//      thread (4 x 256 threads: 16 KB), without its arithmetic.
//   2. ping: one NVLink store-to-poll between GPU 0 and GPU 1 (when there are two): a one-thread
//      kernel on each, in turn storing a counter into the other's memory and polling its own until
//      the other's store arrives; the round trips' time / (2 x rounds) is one store-to-poll. Once
//      with volatile stores and loads (a Lamport push and poll), once with release and acquire at
//      system scope (a flag).
//
// Standalone, one process (no Bazel target, as ce_sm_probe). Build:
//   nvcc -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -o launch_floor_probe launch_floor_probe.cu
//        -Xcompiler -static-libgcc -cudart static
// Every wait is bounded: the ping's polls give up after kPollTimeoutNs (the kernel records it and the
// probe exits 1, naming the GPU whose store never arrived); no NVLink multicast of any kind is used.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

constexpr const char* kProbeName = "launch_floor_probe";
#include "probe_util.h"  // CHECK, visible_gpus_or_exit, launch_config

namespace {

constexpr int kOpsPerGraph = 20;
constexpr int kTimedReplays = 25;
constexpr int kMaxDepth = 4;
constexpr int kCells = 1024;  // the loads' addresses: one 4 KiB table, resident in L2
constexpr int kPingRounds = 2000;
constexpr uint64_t kPollTimeoutNs = 2'000'000'000ull;

__device__ __forceinline__ uint32_t load_relaxed_gpu(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// cells[c] = c + 1 (mod kCells): each load's address is the previous load's value, so the loads
// cannot overlap. The last value is stored where no one reads it, so that no load is dead code.
template <int kDepth>
__global__ void floor_kernel(const uint32_t* cells, uint32_t* sink) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  uint32_t v = threadIdx.x;
#pragma unroll
  for (int d = 0; d < kDepth; ++d) {
    v = load_relaxed_gpu(cells + (v % kCells));
    __syncthreads();
  }
  if (kDepth > 0 && v == 0xFFFFFFFFu) sink[blockIdx.x] = v;  // never true; keeps the loads
}

// The shape of a one-rank Lamport all-reduce (lamport_one_shot with no peer), without its
// arithmetic: the block's call number loaded, the block's sync, one 16-byte load of the input and
// one store of it to the output per thread, the block's sync, the next call number stored.
__global__ void lamport_shaped_kernel(const uint4* input, uint4* output, uint32_t* calls) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  const uint32_t call = load_relaxed_gpu(calls + blockIdx.x);
  __syncthreads();
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  uint4 x = input[i];
  x.x ^= call & 0x80000000u;  // depends on the call number, as the pushes' addresses do; no change
  output[i] = x;
  __syncthreads();
  if (threadIdx.x == 0) calls[blockIdx.x] = call + 1;
}

using FloorKernel = void (*)(const uint32_t*, uint32_t*);

FloorKernel floor_kernel_of(int depth) {
  switch (depth) {
    case 0: return floor_kernel<0>;
    case 1: return floor_kernel<1>;
    case 2: return floor_kernel<2>;
    case 3: return floor_kernel<3>;
    default: return floor_kernel<4>;
  }
}

// µs per launch: a graph of kOpsPerGraph launches, each timed replay behind an untimed one;
// depth < 0: lamport_shaped_kernel on the buffers shaped_* (blocks x threads 16-byte elements).
const uint4* shaped_input = nullptr;
uint4* shaped_output = nullptr;
uint32_t* shaped_calls = nullptr;
double time_floor_us(int depth, int blocks, int threads, bool programmatic, const uint32_t* cells, uint32_t* sink) {
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int op = 0; op < kOpsPerGraph; ++op) {
    cudaLaunchAttribute attribute;
    const cudaLaunchConfig_t config = launch_config(blocks, threads, stream, programmatic, &attribute);
    if (depth < 0) {
      CHECK(cudaLaunchKernelEx(&config, lamport_shaped_kernel, shaped_input, shaped_output, shaped_calls));
    } else {
      CHECK(cudaLaunchKernelEx(&config, floor_kernel_of(depth), cells, sink));
    }
  }
  cudaGraph_t graph;
  CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  std::vector<double> us;
  for (int replay = -2; replay < kTimedReplays; ++replay) {
    CHECK(cudaGraphLaunch(exec, stream));  // the untimed lead
    CHECK(cudaEventRecord(start, stream));
    CHECK(cudaGraphLaunch(exec, stream));
    CHECK(cudaEventRecord(stop, stream));
    CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (replay >= 0) us.push_back(ms * 1000.0 / kOpsPerGraph);
  }
  std::sort(us.begin(), us.end());
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  CHECK(cudaStreamDestroy(stream));
  return us[us.size() / 2];
}

// One side of the ping: the initiator stores round r into the other GPU's flag, then polls its own
// flag for r; the responder polls for r, then stores r. result[0]: the ns from the first store to
// the last arrival (initiator), result[1]: 0, or the round that never arrived (+ 1).
// ordered: st.release.sys / ld.acquire.sys (exactcoll's flags); else st.volatile / ld.volatile (its
// Lamport pushes and polls).
__device__ __forceinline__ void ping_store(uint32_t* p, uint32_t v, bool ordered) {
  if (ordered) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
  } else {
    asm volatile("st.volatile.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
  }
}
__device__ __forceinline__ uint32_t ping_load(const uint32_t* p, bool ordered) {
  uint32_t v;
  if (ordered) {
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  } else {
    asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  }
  return v;
}

__global__ void ping_kernel(uint32_t* remote_flag, const uint32_t* own_flag, bool initiator, bool ordered,
                            uint64_t* result) {
  const uint64_t begin = global_timer_ns();
  for (uint32_t round = 1; round <= kPingRounds; ++round) {
    if (initiator) ping_store(remote_flag, round, ordered);
    const uint64_t poll_start = global_timer_ns();
    for (;;) {
      if (ping_load(own_flag, ordered) == round) break;
      if (global_timer_ns() - poll_start > kPollTimeoutNs) {
        result[1] = round;
        return;
      }
    }
    if (!initiator) ping_store(remote_flag, round, ordered);
  }
  result[0] = global_timer_ns() - begin;
  result[1] = 0;
}

// Returns the one-way store-to-poll in µs, or a negative number after printing what never arrived.
double ping_us(bool ordered) {
  uint32_t* flag[2];
  uint64_t* result[2];
  cudaStream_t stream[2];
  for (int g = 0; g < 2; ++g) {
    CHECK(cudaSetDevice(g));
    const cudaError_t e = cudaDeviceEnablePeerAccess(1 - g, 0);
    if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) CHECK(e);
    (void)cudaGetLastError();
    CHECK(cudaMalloc(&flag[g], sizeof(uint32_t)));
    CHECK(cudaMemset(flag[g], 0, sizeof(uint32_t)));
    CHECK(cudaMallocManaged(&result[g], 2 * sizeof(uint64_t)));
    result[g][0] = 0;
    result[g][1] = 0;
    CHECK(cudaStreamCreateWithFlags(&stream[g], cudaStreamNonBlocking));
    CHECK(cudaDeviceSynchronize());
  }
  // The responder first, so that it is polling when the first store comes.
  CHECK(cudaSetDevice(1));
  ping_kernel<<<1, 1, 0, stream[1]>>>(flag[0], flag[1], false, ordered, result[1]);
  CHECK(cudaGetLastError());
  CHECK(cudaSetDevice(0));
  ping_kernel<<<1, 1, 0, stream[0]>>>(flag[1], flag[0], true, ordered, result[0]);
  CHECK(cudaGetLastError());
  for (int g = 0; g < 2; ++g) {
    CHECK(cudaSetDevice(g));
    CHECK(cudaStreamSynchronize(stream[g]));
  }
  double us = -1;
  if (result[0][1] != 0 || result[1][1] != 0) {
    for (int g = 0; g < 2; ++g) {
      if (result[g][1] != 0) {
        std::fprintf(stderr, "launch_floor_probe: ping: GPU %d never saw GPU %d's store of round %llu\n", g, 1 - g,
                     static_cast<unsigned long long>(result[g][1]));
      }
    }
  } else {
    us = static_cast<double>(result[0][0]) / 1000.0 / (2.0 * kPingRounds);
  }
  for (int g = 0; g < 2; ++g) {
    CHECK(cudaSetDevice(g));
    CHECK(cudaFree(flag[g]));
    CHECK(cudaFree(result[g]));
    CHECK(cudaStreamDestroy(stream[g]));
  }
  CHECK(cudaSetDevice(0));
  return us;
}

}  // namespace

int main() {
  cudaDeviceProp prop;
  const int gpus = visible_gpus_or_exit(&prop);
  std::printf("launch_floor_probe on %s (%d GPUs visible)\n", prop.name, gpus);
  CHECK(cudaSetDevice(0));
  std::vector<uint32_t> host(kCells);
  for (int c = 0; c < kCells; ++c) host[c] = static_cast<uint32_t>((c + 1) % kCells);
  uint32_t *cells = nullptr, *sink = nullptr;
  CHECK(cudaMalloc(&cells, kCells * sizeof(uint32_t)));
  CHECK(cudaMalloc(&sink, 1024 * sizeof(uint32_t)));
  CHECK(cudaMemcpy(cells, host.data(), kCells * sizeof(uint32_t), cudaMemcpyHostToDevice));
  std::printf("floor: us per launch, graph of %d launches, median of %d replays each behind an untimed one\n",
              kOpsPerGraph, kTimedReplays);
  std::printf("%-8s %-8s %-13s", "blocks", "threads", "programmatic");
  for (int depth = 0; depth <= kMaxDepth; ++depth) std::printf(" depth%-4d", depth);
  std::printf(" lamport-shaped\n");
  const int grids[][2] = {{1, 256}, {4, 256}, {32, 512}, {128, 256}, {128, 512}};
  constexpr size_t kShapedElements = 128 * 512;  // the largest grid's threads
  uint4 *shaped_in = nullptr, *shaped_out = nullptr;
  CHECK(cudaMalloc(&shaped_in, kShapedElements * sizeof(uint4)));
  CHECK(cudaMalloc(&shaped_out, kShapedElements * sizeof(uint4)));
  CHECK(cudaMalloc(&shaped_calls, 1024 * sizeof(uint32_t)));
  CHECK(cudaMemset(shaped_in, 0, kShapedElements * sizeof(uint4)));
  CHECK(cudaMemset(shaped_calls, 0, 1024 * sizeof(uint32_t)));
  shaped_input = shaped_in;
  shaped_output = shaped_out;
  for (const auto& grid : grids) {
    for (int programmatic = 1; programmatic >= 0; --programmatic) {
      std::printf("%-8d %-8d %-13s", grid[0], grid[1], programmatic ? "yes" : "no");
      for (int depth = 0; depth <= kMaxDepth; ++depth) {
        std::printf(" %-9.2f", time_floor_us(depth, grid[0], grid[1], programmatic != 0, cells, sink));
      }
      std::printf(" %-9.2f\n", time_floor_us(-1, grid[0], grid[1], programmatic != 0, cells, sink));
    }
  }
  CHECK(cudaFree(shaped_in));
  CHECK(cudaFree(shaped_out));
  CHECK(cudaFree(shaped_calls));
  CHECK(cudaFree(cells));
  CHECK(cudaFree(sink));
  if (gpus >= 2) {
    int can = 0;
    CHECK(cudaDeviceCanAccessPeer(&can, 0, 1));
    if (!can) {
      std::printf("ping: GPUs 0 and 1 cannot access each other: skipped\n");
      return 0;
    }
    for (int trial = 0; trial < 3; ++trial) {
      for (const bool ordered : {false, true}) {
        const double us = ping_us(ordered);
        if (us < 0) return 1;
        std::printf("ping: one NVLink store-to-poll, GPU 0 <-> 1, %s, %d round trips: %.3f us\n",
                    ordered ? "st.release.sys / ld.acquire.sys" : "st.volatile / ld.volatile", kPingRounds, us);
      }
    }
  }
  return 0;
}

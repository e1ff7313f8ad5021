/* The C API on GPUs: one process per rank, started by torchrun (or any launcher that sets RANK,
 * WORLD_SIZE, MASTER_ADDR and MASTER_PORT), bootstrapped through the library's TCP store on a port
 * of its own (EXACTCOLL_STORE_PORT, default MASTER_PORT + 1), checked against the simulator.
 *   export EXACTCOLL_STORE_TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
 *   torchrun --nproc-per-node 2 --no-python bazel-bin/examples/c/gpu_allreduce
 * Ranks may share one GPU (then slowly, by time slicing): every rank uses LOCAL_RANK mod the GPUs.
 */
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exactcoll/exactcoll.h"

#define CHECK(call)                                                              \
  do {                                                                           \
    int status_ = (call);                                                        \
    if (status_ != EXACTCOLL_OK) {                                               \
      fprintf(stderr, "rank %d: %s: %s\n", rank, #call, exactcoll_last_error()); \
      return 1;                                                                  \
    }                                                                            \
  } while (0)

enum { kCount = 4099, kMaxRanks = 16 };

/* Rank r's input: a deterministic pattern, so every rank can make every rank's input. */
static uint16_t input_of(int r, int i) { return (uint16_t)(0x3C00 + ((i * 37 + r * 101) % 1024)); }

int main(void) {
  int rank = -1, world = 0, devices = 0;
  exactcoll_store store;
  if (exactcoll_store_create_from_env(&store, &rank, &world) != EXACTCOLL_OK) {
    fprintf(stderr, "gpu_allreduce: %s\n", exactcoll_last_error());
    return 2;
  }
  if (world > kMaxRanks || cudaGetDeviceCount(&devices) != cudaSuccess || devices < 1) {
    fprintf(stderr, "rank %d: needs a CUDA device and at most %d ranks\n", rank, kMaxRanks);
    return 2;
  }
  const char* local = getenv("LOCAL_RANK");
  const int device = (local ? atoi(local) : rank) % devices;
  cudaSetDevice(device);

  exactcoll_comm_options options;
  exactcoll_comm_options_init(&options);
  options.buffer_bytes = 8 << 20;
  options.device = device; /* explicit: this program's CUDA runtime and the library's are separate copies */
  exactcoll_comm comm;
  CHECK(exactcoll_comm_create(store, rank, world, &options, &comm));
  exactcoll_comm_properties props;
  props.struct_size = sizeof props;
  CHECK(exactcoll_comm_properties_get(comm, &props));

  static uint16_t host_in[kCount], host_out[kCount], all_in[kMaxRanks * kCount], want[kMaxRanks * kCount];
  for (int i = 0; i < kCount; ++i) host_in[i] = input_of(rank, i);
  void *d_in = NULL, *d_out = NULL;
  cudaMalloc(&d_in, sizeof host_in);
  cudaMalloc(&d_out, sizeof host_out);
  cudaMemcpy(d_in, host_in, sizeof host_in, cudaMemcpyHostToDevice);

  exactcoll_call_info info;
  exactcoll_call_info_init(&info);
  CHECK(exactcoll_allreduce(comm, d_in, d_out, kCount, EXACTCOLL_BF16, EXACTCOLL_ALGO_AUTO, NULL, -1, &info));
  CHECK(exactcoll_comm_check(comm, NULL));
  cudaMemcpy(host_out, d_out, sizeof host_out, cudaMemcpyDeviceToHost);

  /* The same all-reduce on the simulator: every output bit must match. */
  for (int r = 0; r < world; ++r) {
    for (int i = 0; i < kCount; ++i) all_in[r * kCount + i] = input_of(r, i);
  }
  CHECK(exactcoll_sim_collective(EXACTCOLL_OP_ALLREDUCE, EXACTCOLL_ALGO_AUTO, EXACTCOLL_BF16, world, kCount, all_in,
                                 want, NULL, NULL));
  int differing = 0;
  for (int i = 0; i < kCount; ++i) differing += host_out[i] != want[rank * kCount + i];
  printf("rank %d of %d (GPU %d%s): %s, exact %d, %d of %d elements differ from the simulator\n", rank, world,
         props.device, props.shared_gpu ? ", shared" : "", exactcoll_algo_name(info.algo), info.exact, differing,
         kCount);

  cudaFree(d_in);
  cudaFree(d_out);
  CHECK(exactcoll_comm_destroy(comm));
  CHECK(exactcoll_store_destroy(store));
  return differing == 0 ? 0 : 1;
}

/* What one C API call costs on the host, and what a CUDA-graph-captured call costs on the GPU, on a
 * communicator of one rank: the baseline that python/examples/bench_overhead.py holds the Python
 * layer against (same ops, sizes, call counts and method). Prints one line per case:
 *   op  shape  host_us_per_call  graph_us_per_op
 * Method: host = wall time of N back-to-back enqueues / N (the GPU runs behind; N stays below the
 * launch queue's depth); graph = a graph of 20 calls replayed 25 times, median replay / 20; each
 * measured in 5 rounds and the median round reported (one round's noise is a few percent).
 *   bazel build //tools/api_bench:api_host_bench   (run on a GPU machine)
 */
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "exactcoll/exactcoll.h"

enum { kCalls = 200, kGraphOps = 20, kReplays = 25, kRounds = 5, kMaxKeys = 256 };

/* A one-rank store in this process: a list of keys and values. */
static char* keys[kMaxKeys];
static char* values[kMaxKeys];
static size_t lengths[kMaxKeys];
static int used;

static int find(const char* key) {
  for (int i = 0; i < used; ++i) {
    if (strcmp(keys[i], key) == 0) return i;
  }
  return -1;
}
static int store_set(void* user, const char* key, const void* value, size_t bytes) {
  (void)user;
  int i = find(key);
  if (i < 0) {
    if (used == kMaxKeys) return EXACTCOLL_ERROR_STORE;
    i = used++;
    keys[i] = strdup(key);
  } else {
    free(values[i]);
  }
  values[i] = malloc(bytes + 1);
  memcpy(values[i], value, bytes);
  lengths[i] = bytes;
  return EXACTCOLL_OK;
}
static int store_get(void* user, const char* key, int64_t timeout_ms, void* buffer, size_t capacity, size_t* bytes) {
  (void)user;
  (void)timeout_ms; /* one rank: a key that is not there now never comes */
  const int i = find(key);
  if (i < 0) return EXACTCOLL_ERROR_TIMEOUT;
  memcpy(buffer, values[i], lengths[i] < capacity ? lengths[i] : capacity);
  *bytes = lengths[i];
  return EXACTCOLL_OK;
}
static int store_add(void* user, const char* key, int64_t delta, int64_t* result) {
  char text[32];
  size_t n = 0;
  int64_t v = 0;
  if (store_get(user, key, 0, text, sizeof text - 1, &n) == EXACTCOLL_OK) {
    text[n < sizeof text - 1 ? n : sizeof text - 1] = '\0';
    v = atoll(text);
  }
  *result = v + delta;
  snprintf(text, sizeof text, "%lld", (long long)*result);
  return store_set(user, key, text, strlen(text));
}

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int compare_float(const void* a, const void* b) {
  const float x = *(const float*)a, y = *(const float*)b;
  return (x > y) - (x < y);
}

/* One call of the case on stream. */
typedef struct {
  const char* op;
  int64_t rows, hidden;
} Case;

static exactcoll_comm comm;
static void *x, *residual, *weight, *out, *residual_out;

static int call(const Case* c, cudaStream_t stream) {
  const size_t count = (size_t)(c->rows * c->hidden);
  if (strcmp(c->op, "all_reduce") == 0) {
    return exactcoll_allreduce(comm, x, out, count, EXACTCOLL_BF16, EXACTCOLL_ALGO_AUTO, stream, -1, NULL);
  }
  return exactcoll_fused_add_rmsnorm(comm, x, residual, weight, residual_out, out, c->rows, c->hidden, 1e-6f,
                                     EXACTCOLL_BF16, EXACTCOLL_FUSED_AUTO, stream, -1, NULL);
}

int main(void) {
  exactcoll_store_callbacks cb;
  memset(&cb, 0, sizeof cb);
  cb.struct_size = sizeof cb;
  cb.set = store_set;
  cb.get = store_get;
  cb.add = store_add;
  exactcoll_store store;
  if (exactcoll_store_create(&cb, 0, 1, &store) != EXACTCOLL_OK ||
      exactcoll_comm_create(store, 0, 1, NULL, &comm) != EXACTCOLL_OK) {
    fprintf(stderr, "api_host_bench: %s\n", exactcoll_last_error());
    return 1;
  }
  const size_t bytes = (size_t)4096 * 8192 * 2;
  cudaMalloc(&x, bytes);
  cudaMalloc(&residual, bytes);
  cudaMalloc(&weight, 8192 * 2);
  cudaMalloc(&out, bytes);
  cudaMalloc(&residual_out, bytes);
  cudaMemset(x, 0, bytes);
  cudaMemset(residual, 0, bytes);
  cudaMemset(weight, 0, 8192 * 2);
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  const Case cases[] = {{"all_reduce", 1, 4096},
                        {"all_reduce", 256, 8192},
                        {"fused_add_rms_norm", 1, 8192},
                        {"fused_add_rms_norm", 256, 8192}};
  printf("%-20s %-12s %16s %16s\n", "op", "shape", "host_us_per_call", "graph_us_per_op");
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; ++k) {
    const Case* c = &cases[k];
    for (int i = 0; i < 20; ++i) call(c, stream); /* warm up */
    cudaStreamSynchronize(stream);
    float host_rounds[kRounds], graph_rounds[kRounds];
    for (int round = 0; round < kRounds; ++round) {
      const double start = now_us();
      for (int i = 0; i < kCalls; ++i) {
        if (call(c, stream) != EXACTCOLL_OK) {
          fprintf(stderr, "api_host_bench: %s\n", exactcoll_last_error());
          return 1;
        }
      }
      host_rounds[round] = (float)((now_us() - start) / kCalls);
      cudaStreamSynchronize(stream);
    }

    cudaGraph_t graph;
    cudaGraphExec_t exec;
    cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
    for (int i = 0; i < kGraphOps; ++i) call(c, stream);
    if (cudaStreamEndCapture(stream, &graph) != cudaSuccess || cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) {
      fprintf(stderr, "api_host_bench: graph capture failed\n");
      return 1;
    }
    cudaEvent_t begin, end;
    cudaEventCreate(&begin);
    cudaEventCreate(&end);
    cudaGraphLaunch(exec, stream); /* warm up */
    for (int round = 0; round < kRounds; ++round) {
      float times[kReplays];
      for (int i = 0; i < kReplays; ++i) {
        cudaEventRecord(begin, stream);
        cudaGraphLaunch(exec, stream);
        cudaEventRecord(end, stream);
        cudaEventSynchronize(end);
        cudaEventElapsedTime(&times[i], begin, end);
      }
      qsort(times, kReplays, sizeof times[0], compare_float);
      graph_rounds[round] = times[kReplays / 2] * 1000.0f / kGraphOps;
    }
    qsort(host_rounds, kRounds, sizeof host_rounds[0], compare_float);
    qsort(graph_rounds, kRounds, sizeof graph_rounds[0], compare_float);
    const double host = host_rounds[kRounds / 2];
    char shape[32];
    snprintf(shape, sizeof shape, "%lldx%lld", (long long)c->rows, (long long)c->hidden);
    printf("%-20s %-12s %16.2f %16.2f\n", c->op, shape, host, graph_rounds[kRounds / 2]);
    if (exactcoll_comm_check(comm, stream) != EXACTCOLL_OK) {
      fprintf(stderr, "api_host_bench: %s\n", exactcoll_last_error());
      return 1;
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  exactcoll_comm_destroy(comm);
  exactcoll_store_destroy(store);
  return 0;
}

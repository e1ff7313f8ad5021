/* The C API's host cost per call, measured inside the Python process that measures its own layer
 * (python/examples/bench_overhead.py loads this through ctypes): the same communicator, tensors,
 * stream and thread, so the difference between the two is the Python layer's and nothing else.
 * Each function makes `calls` calls back to back and returns the wall time per call in
 * microseconds, or -1 when a call fails (exactcoll_last_error says why). */
#include <stdint.h>
#include <time.h>

#include "exactcoll/exactcoll.h"

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

double exactcoll_bench_allreduce_us(uint64_t comm_id, const void* input, void* output, size_t count, int dtype,
                                    void* stream, int calls) {
  const exactcoll_comm comm = {comm_id};
  const double start = now_us();
  for (int i = 0; i < calls; ++i) {
    if (exactcoll_allreduce(comm, input, output, count, dtype, EXACTCOLL_ALGO_AUTO, stream, -1, NULL) != EXACTCOLL_OK) {
      return -1;
    }
  }
  return (now_us() - start) / calls;
}

double exactcoll_bench_fused_us(uint64_t comm_id, const void* x, const void* residual, const void* weight,
                                void* residual_out, void* out, int64_t rows, int64_t hidden, float eps, int dtype,
                                void* stream, int calls) {
  const exactcoll_comm comm = {comm_id};
  exactcoll_call_info info;
  exactcoll_call_info_init(&info);
  const double start = now_us();
  for (int i = 0; i < calls; ++i) {
    if (exactcoll_fused_add_rmsnorm(comm, x, residual, weight, residual_out, out, rows, hidden, eps, dtype,
                                    EXACTCOLL_FUSED_AUTO, stream, -1, &info) != EXACTCOLL_OK) {
      return -1;
    }
  }
  return (now_us() - start) / calls;
}

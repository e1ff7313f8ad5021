// The C API's GPU functions in a library built without a CUDA toolkit: each returns
// EXACTCOLL_ERROR_UNAVAILABLE and says so (the simulator functions work as usual).
#include "capi/api_support.h"
#include "exactcoll/exactcoll.h"

using namespace exactcoll::capi;

namespace {

int unavailable(const char* function) {
  return guarded(function, [] {
    fail(EXACTCOLL_ERROR_UNAVAILABLE,
         "this libexactcoll was built without CUDA (no toolkit at build time): the simulator functions work, the GPU "
         "ones do not");
  });
}

}  // namespace

extern "C" {

int exactcoll_has_cuda(void) { return 0; }

int exactcoll_comm_create(exactcoll_store, int, int, const exactcoll_comm_options*, exactcoll_comm*) {
  return unavailable("exactcoll_comm_create");
}
int exactcoll_comm_destroy(exactcoll_comm) { return unavailable("exactcoll_comm_destroy"); }
int exactcoll_comm_properties_get(exactcoll_comm, exactcoll_comm_properties*) {
  return unavailable("exactcoll_comm_properties_get");
}
int exactcoll_comm_register_buffer(exactcoll_comm, const void*, size_t, int*) {
  return unavailable("exactcoll_comm_register_buffer");
}

int exactcoll_comm_register_graph_buffers(exactcoll_comm, size_t*) {
  return unavailable("exactcoll_comm_register_graph_buffers");
}
int exactcoll_allreduce(exactcoll_comm, const void*, void*, size_t, int, int, void*, int, exactcoll_call_info*) {
  return unavailable("exactcoll_allreduce");
}
int exactcoll_reduce_scatter(exactcoll_comm, const void*, void*, size_t, int, int, void*, int, exactcoll_call_info*) {
  return unavailable("exactcoll_reduce_scatter");
}
int exactcoll_allgather(exactcoll_comm, const void*, void*, size_t, int, int, void*, int, exactcoll_call_info*) {
  return unavailable("exactcoll_allgather");
}
int exactcoll_fused_add_rmsnorm(exactcoll_comm, const void*, const void*, const void*, void*, void*, int64_t, int64_t,
                                float, int, int, void*, int, exactcoll_call_info*) {
  return unavailable("exactcoll_fused_add_rmsnorm");
}
int exactcoll_add_rmsnorm(const void*, const void*, const void*, void*, void*, int64_t, int64_t, float, int, int,
                          void*) {
  return unavailable("exactcoll_add_rmsnorm");
}
int exactcoll_comm_check(exactcoll_comm, void*) { return unavailable("exactcoll_comm_check"); }
int exactcoll_comm_set_max_blocks(exactcoll_comm, int, int*) { return unavailable("exactcoll_comm_set_max_blocks"); }

}  // extern "C"

#include "tools/gpu/api_comm.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "capi/api_support.h"
#include "capi/gpu_internal.h"

namespace exactcoll::gpu {
namespace {

// The worker's store as the C API's callbacks (exactcoll_store_callbacks): each returns a status,
// after exactcoll_set_store_error says why.
template <class Body>
int store_call(Body&& body) {
  try {
    body();
    return EXACTCOLL_OK;
  } catch (const std::exception& e) {
    exactcoll_set_store_error(e.what());
    return EXACTCOLL_ERROR_STORE;
  }
}

int store_set(void* user_data, const char* key, const void* value, size_t value_bytes) {
  return store_call(
      [&] { static_cast<Store*>(user_data)->set(key, std::string(static_cast<const char*>(value), value_bytes)); });
}

int store_get(void* user_data, const char* key, int64_t timeout_ms, void* buffer, size_t capacity,
              size_t* value_bytes) {
  const auto start = std::chrono::steady_clock::now();
  const int status = store_call([&] {
    const std::string value = static_cast<Store*>(user_data)->get(key, std::chrono::milliseconds(timeout_ms));
    *value_bytes = value.size();
    std::memcpy(buffer, value.data(), std::min(capacity, value.size()));
  });
  // The store says why in its message; the status the callback contract asks for is TIMEOUT when
  // the wait ran its whole course (the store's own errors come sooner).
  const auto waited = std::chrono::steady_clock::now() - start;
  if (status == EXACTCOLL_ERROR_STORE && waited >= std::chrono::milliseconds(timeout_ms))
    return EXACTCOLL_ERROR_TIMEOUT;
  return status;
}

int store_add(void* user_data, const char* key, int64_t delta, int64_t* result) {
  return store_call([&] { *result = static_cast<Store*>(user_data)->add(key, delta); });
}

int store_erase(void* user_data, const char* key, int* existed) {
  return store_call([&] { *existed = static_cast<Store*>(user_data)->erase(key) ? 1 : 0; });
}

// The report of a C API call's exactcoll_call_info; `names` gives the algorithm's name.
CallReport report_of(const exactcoll_call_info& info, const char* (*names)(int), const char* inexact_note) {
  CallReport r;
  const char* name = names(info.algo);
  r.algo = name != nullptr ? name : "?";
  if (info.allreduce_algo >= 0) r.detail = std::string("all-reduce ") + exactcoll_algo_name(info.allreduce_algo);
  r.grid = cuda::LaunchConfig{info.blocks, info.threads};
  r.staged = info.staged != 0;
  r.exact = info.exact != 0;
  r.inexact_note = info.note[0] != '\0' ? info.note : inexact_note;
  return r;
}

int c_value(const char* name, int (*from_name)(const char*, int*)) {
  int value = -1;
  throw_unless_ok(from_name(name, &value));
  return value;
}

// The C enum values of the library's, looked up by name once (every C name is the backend's:
// tests/capi/enum_names_test.cc), so that a timed eager call pays no string lookups.
int c_dtype(DType d) {
  static const int values[] = {c_value("bf16", exactcoll_dtype_from_name), c_value("fp16", exactcoll_dtype_from_name),
                               c_value("fp32", exactcoll_dtype_from_name)};
  return values[d == DType::kBF16 ? 0 : d == DType::kFP16 ? 1 : 2];
}

// Each collective's two entry points: the C API's function, and the backend's member function for
// a forced grid (which the C API does not take). Indexed by cuda::Op.
using CollectiveApi = int (*)(exactcoll_comm, const void*, void*, size_t, int, int, void*, int, exactcoll_call_info*);
using CollectiveBackend = cuda::CallInfo (cuda::Communicator::*)(const void*, void*, size_t, DType, cuda::Algorithm,
                                                                 cudaStream_t, const cuda::RegisteredBuffer*,
                                                                 std::optional<cuda::LaunchConfig>);
struct CollectiveEntry {
  CollectiveApi api;
  CollectiveBackend backend;
};
constexpr CollectiveEntry kCollectives[] = {
    {exactcoll_allreduce, &cuda::Communicator::allreduce},            // Op::kAllReduce
    {exactcoll_reduce_scatter, &cuda::Communicator::reduce_scatter},  // Op::kReduceScatter
    {exactcoll_allgather, &cuda::Communicator::allgather},            // Op::kAllGather
};

static_assert(static_cast<size_t>(cuda::Op::kAllReduce) == 0 && static_cast<size_t>(cuda::Op::kReduceScatter) == 1 &&
                  static_cast<size_t>(cuda::Op::kAllGather) == 2,
              "kCollectives is indexed by cuda::Op");

constexpr const char* kNcclFusedNote = "NCCL's sums follow no contract";

// Runs a call into the objects behind the handle with the C path's error types: the handle
// table's ApiError becomes ApiCallError like a returned status.
template <class Body>
decltype(auto) backend_call(Body&& body) {
  try {
    return body();
  } catch (const capi::ApiError& e) {
    throw ApiCallError(e.status, e.what());
  }
}

}  // namespace

void throw_unless_ok(int status) {
  if (status != EXACTCOLL_OK) throw ApiCallError(status, exactcoll_last_error());
}

ApiComm::ApiComm(Store& store, int rank, int world_size, const ApiCommOptions& options) {
  exactcoll_store_callbacks callbacks{};
  callbacks.struct_size = sizeof callbacks;
  callbacks.user_data = &store;
  callbacks.set = store_set;
  callbacks.get = store_get;
  callbacks.add = store_add;
  callbacks.erase = store_erase;
  throw_unless_ok(exactcoll_store_create(&callbacks, rank, world_size, &store_));
  exactcoll_comm_options o;
  exactcoll_comm_options_init(&o);
  o.name = options.name.c_str();
  o.buffer_bytes = options.buffer_bytes;
  o.flag_timeout_ms = options.flag_timeout_ms;
  o.use_nccl = options.use_nccl ? 1 : 0;
  o.programmatic_launch = options.programmatic_launch ? 1 : 0;
  o.contract = static_cast<int>(options.contract);  // the registry's values are the C values
  const int status = exactcoll_comm_create(store_, rank, world_size, &o, &comm_);
  if (status != EXACTCOLL_OK) {
    const std::string message = exactcoll_last_error();  // before the store's release can replace it
    (void)exactcoll_store_destroy(store_);
    throw ApiCallError(status, message);
  }
  std::memset(&properties_, 0, sizeof properties_);
  properties_.struct_size = sizeof properties_;
  if (exactcoll_comm_properties_get(comm_, &properties_) != EXACTCOLL_OK) {
    const std::string message = exactcoll_last_error();
    (void)exactcoll_comm_destroy(comm_);  // the closing barrier: the peers are not left waiting
    (void)exactcoll_store_destroy(store_);
    throw ApiCallError(EXACTCOLL_ERROR_INTERNAL, message);
  }
}

ApiComm::~ApiComm() {
  if (exactcoll_comm_destroy(comm_) != EXACTCOLL_OK) std::fprintf(stderr, "%s\n", exactcoll_last_error());
  if (exactcoll_store_destroy(store_) != EXACTCOLL_OK) std::fprintf(stderr, "%s\n", exactcoll_last_error());
}

int ApiComm::register_buffer(const void* buffer, size_t bytes) {
  int id = -1;
  throw_unless_ok(exactcoll_comm_register_buffer(comm_, buffer, bytes, &id));
  return id;
}

CallReport ApiComm::collective(cuda::Op op, const void* input, void* output, size_t count, DType dtype,
                               cuda::Algorithm algo, cudaStream_t stream, int registered_id,
                               std::optional<cuda::LaunchConfig> grid) {
  const CollectiveEntry& entry = kCollectives[static_cast<size_t>(op)];
  if (grid) {
    const cuda::RegisteredBuffer reg =
        registered_id >= 0 ? backend_registered(registered_id) : cuda::RegisteredBuffer{};
    const cuda::CallInfo info = (backend().*entry.backend)(input, output, count, dtype, algo, stream,
                                                           registered_id >= 0 ? &reg : nullptr, grid);
    return CallReport{cuda::algorithm_name(info.algo),       "", info.grid, info.staged, info.exact,
                      info.note.empty() ? "NCCL" : info.note};
  }
  exactcoll_call_info info;
  exactcoll_call_info_init(&info);
  int& c_algo = c_algorithms_.at(static_cast<size_t>(algo));
  if (c_algo < 0) c_algo = c_value(cuda::algorithm_name(algo), exactcoll_algo_from_name);
  throw_unless_ok(entry.api(comm_, input, output, count, c_dtype(dtype), c_algo, stream, registered_id, &info));
  return report_of(info, exactcoll_algo_name, "NCCL");
}

CallReport ApiComm::fused(const cuda::fused::FusedRmsNormBuffers& b, const cuda::fused::FusedRmsNormShape& shape,
                          cuda::fused::FusedAlgorithm algo, cudaStream_t stream, int registered_id,
                          std::optional<cuda::LaunchConfig> grid) {
  if (grid) {
    const cuda::RegisteredBuffer reg =
        registered_id >= 0 ? backend_registered(registered_id) : cuda::RegisteredBuffer{};
    const cuda::fused::FusedCallInfo info =
        fused_backend().run(b, shape, algo, stream, registered_id >= 0 ? &reg : nullptr, grid);
    return CallReport{cuda::fused::fused_algorithm_name(info.algo),
                      info.allreduce.empty() ? "" : "all-reduce " + info.allreduce,
                      info.grid,
                      info.staged,
                      info.exact,
                      kNcclFusedNote};
  }
  exactcoll_call_info info;
  exactcoll_call_info_init(&info);
  int& c_algo = c_fused_algorithms_.at(static_cast<size_t>(algo));
  if (c_algo < 0) c_algo = c_value(cuda::fused::fused_algorithm_name(algo), exactcoll_fused_algo_from_name);
  throw_unless_ok(exactcoll_fused_add_rmsnorm(comm_, b.x, b.residual, b.weight, b.residual_out, b.out, shape.rows,
                                              shape.hidden, shape.eps, c_dtype(shape.dtype), c_algo, stream,
                                              registered_id, &info));
  return report_of(info, exactcoll_fused_algo_name, kNcclFusedNote);
}

void ApiComm::check(cudaStream_t stream) { throw_unless_ok(exactcoll_comm_check(comm_, stream)); }

cuda::RegisteredBuffer ApiComm::backend_registered(int registered_id) const {
  return backend_call([&] { return capi::backend_registered(comm_, registered_id); });
}

cuda::Communicator& ApiComm::backend() const {
  return backend_call([&]() -> cuda::Communicator& { return capi::backend_communicator(comm_); });
}
cuda::fused::FusedRmsNorm& ApiComm::fused_backend() const {
  return backend_call([&]() -> cuda::fused::FusedRmsNorm& { return capi::backend_fused(comm_); });
}

}  // namespace exactcoll::gpu

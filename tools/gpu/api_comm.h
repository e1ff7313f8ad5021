// A communicator of the GPU commands (gpu, verify, bench), made and called through the library's
// public C API (include/exactcoll/exactcoll.h), so that the CLI runs the code that C, Python and
// PyTorch programs run: the worker's store is handed over as C callbacks (the path torch's store
// takes), and the ops, registration and checks are exactcoll_* calls whose statuses become
// exceptions here. What a testing and tuning tool needs beyond the C API (a forced grid, the choice
// auto makes, peers' addresses, a measured fused table) goes to the objects behind the handle
// (backend(), fused_backend(): capi/gpu_internal.h).
//
// Example:
//   ApiComm comm(worker.store(), rank, n, ApiCommOptions{"gpu", 10000, 128 << 20, true, true});
//   const int id = comm.register_buffer(x, bytes);
//   CallReport ran = comm.collective(Op::kAllReduce, x, y, count, DType::kBF16, Algorithm::kAuto, stream, id);
//   comm.check(stream);
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

#include "core/registry.h"
#include "core/store.h"
#include "cuda_backend/communicator.h"
#include "cuda_backend/fused/fused_rmsnorm.h"
#include "exactcoll/exactcoll.h"

namespace exactcoll::gpu {

// What ran, in the words of the summary line and of verify's mismatch lines.
struct CallReport {
  std::string algo;    // the algorithm that ran (auto resolved)
  std::string detail;  // more of it, e.g. "all-reduce one_shot" under the fused op's unfused path; or ""
  cuda::LaunchConfig grid{};
  bool staged = true;
  bool exact = true;         // false for NCCL's sums
  std::string inexact_note;  // why not, when !exact
};

// A C API call failed: status is its exactcoll_status, what() is exactcoll_last_error(), which
// names the function. (An invalid argument here is the library's error, not the user's: the
// commands check their flags and inputs before calling.)
struct ApiCallError : std::runtime_error {
  ApiCallError(int s, const std::string& message) : std::runtime_error(message), status(s) {}
  int status;
};

// Throws the exception of a status (nothing for EXACTCOLL_OK), with exactcoll_last_error().
void throw_unless_ok(int status);

// exactcoll_comm_options as the GPU commands set them.
struct ApiCommOptions {
  std::string name = "exactcoll";  // store key prefix, unique per communicator in a job
  uint64_t flag_timeout_ms = 5000;
  size_t buffer_bytes = size_t{128} << 20;
  bool use_nccl = true;
  bool programmatic_launch = true;
  // exactcoll_comm_options.contract: the library contract every exact call folds under (canonical
  // or tree; across nodes the C API takes tree for powers of two only).
  Contract contract = Contract::kCanonical;
};

class ApiComm {
 public:
  // Collective, like exactcoll_comm_create. store must outlive the object.
  ApiComm(Store& store, int rank, int world_size, const ApiCommOptions& options);
  // Collective (exactcoll_comm_destroy: a store barrier). Never throws; a failure is printed.
  ~ApiComm();
  ApiComm(const ApiComm&) = delete;
  ApiComm& operator=(const ApiComm&) = delete;

  exactcoll_comm handle() const { return comm_; }
  const exactcoll_comm_properties& properties() const { return properties_; }

  // exactcoll_comm_register_buffer: returns the id the ops take.
  int register_buffer(const void* buffer, size_t bytes);

  // One collective: exactcoll_allreduce, _reduce_scatter or _allgather (registered_id -1: staged).
  // A forced grid is a tuning feature the C API leaves out: that call goes to backend().
  CallReport collective(cuda::Op op, const void* input, void* output, size_t count, DType dtype, cuda::Algorithm algo,
                        cudaStream_t stream, int registered_id, std::optional<cuda::LaunchConfig> grid = {});

  // The fused op: exactcoll_fused_add_rmsnorm (a forced grid goes to fused_backend()).
  CallReport fused(const cuda::fused::FusedRmsNormBuffers& buffers, const cuda::fused::FusedRmsNormShape& shape,
                   cuda::fused::FusedAlgorithm algo, cudaStream_t stream, int registered_id,
                   std::optional<cuda::LaunchConfig> grid = {});

  // exactcoll_comm_check: throws ApiCallError naming the peer that never arrived.
  void check(cudaStream_t stream);

  // The objects behind the handle (capi/gpu_internal.h), for what the C API leaves out.
  cuda::Communicator& backend() const;
  cuda::fused::FusedRmsNorm& fused_backend() const;
  // The backend's view of a registered id (e.g. for Communicator::peer_address).
  cuda::RegisteredBuffer backend_registered(int registered_id) const;

 private:
  exactcoll_store store_{};
  exactcoll_comm comm_{};
  exactcoll_comm_properties properties_{};
  // The C enum value of each of the library's algorithms, looked up once (-1: not yet).
  std::array<int, 16> c_algorithms_ = filled(-1), c_fused_algorithms_ = filled(-1);
  static std::array<int, 16> filled(int v) {
    std::array<int, 16> a;
    a.fill(v);
    return a;
  }
};

}  // namespace exactcoll::gpu

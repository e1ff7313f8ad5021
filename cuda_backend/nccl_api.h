// NCCL, opened at run time (dlopen of libnccl.so.2), so that the exactcoll binary starts and runs
// the IPC path on machines without NCCL; only the NCCL baseline and fallback need it.
//
// Example:
//   const NcclApi& nccl = NcclApi::get();          // throws NcclError if libnccl.so.2 is missing
//   nccl.check(nccl.AllReduce(in, out, n, ncclBfloat16, ncclSum, comm, stream), "ncclAllReduce");
#pragma once

#include <nccl.h>

#include <stdexcept>
#include <string>

namespace exactcoll::cuda {

struct NcclError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct NcclApi {
  ncclResult_t (*GetVersion)(int*) = nullptr;
  ncclResult_t (*GetUniqueId)(ncclUniqueId*) = nullptr;
  ncclResult_t (*CommInitRank)(ncclComm_t*, int, ncclUniqueId, int) = nullptr;
  ncclResult_t (*CommDestroy)(ncclComm_t) = nullptr;
  ncclResult_t (*CommAbort)(ncclComm_t) = nullptr;
  ncclResult_t (*AllReduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                            cudaStream_t) = nullptr;
  ncclResult_t (*ReduceScatter)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                cudaStream_t) = nullptr;
  ncclResult_t (*AllGather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t) = nullptr;
  // Point-to-point (the multi-node transport, cuda_backend/multinode): sends and receives issued
  // between GroupStart and GroupEnd progress together.
  ncclResult_t (*Send)(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*Recv)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*GroupStart)() = nullptr;
  ncclResult_t (*GroupEnd)() = nullptr;
  const char* (*GetErrorString)(ncclResult_t) = nullptr;

  // Returns the process-wide API, loading libnccl.so.2 on first use. Throws NcclError naming the
  // library or symbol that could not be loaded.
  static const NcclApi& get();

  // Throws NcclError("<what>: <NCCL's message>") unless result is ncclSuccess.
  void check(ncclResult_t result, const char* what) const;

  // "2.28.3" (the loaded library's version).
  std::string version() const;
};

}  // namespace exactcoll::cuda

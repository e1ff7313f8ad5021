#include "cuda_backend/nccl_api.h"

#include <dlfcn.h>

#include <mutex>

namespace exactcoll::cuda {
namespace {

template <class Fn>
void bind(void* library, const char* symbol, Fn* fn) {
  void* address = dlsym(library, symbol);
  if (address == nullptr) throw NcclError(std::string("libnccl.so.2 has no symbol ") + symbol);
  *fn = reinterpret_cast<Fn>(address);
}

NcclApi load() {
  void* library = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* why = dlerror();
    throw NcclError(std::string("cannot load libnccl.so.2 (NCCL baseline and fallback unavailable): ") +
                    (why != nullptr ? why : "unknown error"));
  }
  NcclApi api;
  bind(library, "ncclGetVersion", &api.GetVersion);
  bind(library, "ncclGetUniqueId", &api.GetUniqueId);
  bind(library, "ncclCommInitRank", &api.CommInitRank);
  bind(library, "ncclCommDestroy", &api.CommDestroy);
  bind(library, "ncclCommAbort", &api.CommAbort);
  bind(library, "ncclAllReduce", &api.AllReduce);
  bind(library, "ncclReduceScatter", &api.ReduceScatter);
  bind(library, "ncclAllGather", &api.AllGather);
  bind(library, "ncclGetErrorString", &api.GetErrorString);
  bind(library, "ncclSend", &api.Send);
  bind(library, "ncclRecv", &api.Recv);
  bind(library, "ncclGroupStart", &api.GroupStart);
  bind(library, "ncclGroupEnd", &api.GroupEnd);
  return api;  // the library stays loaded for the life of the process
}

}  // namespace

const NcclApi& NcclApi::get() {
  static std::once_flag once;
  static NcclApi api;
  static std::string error;
  std::call_once(once, [] {
    try {
      api = load();
    } catch (const NcclError& e) {
      error = e.what();
    }
  });
  if (!error.empty()) throw NcclError(error);
  return api;
}

void NcclApi::check(ncclResult_t result, const char* what) const {
  if (result == ncclSuccess) return;
  throw NcclError(std::string(what) + ": " + GetErrorString(result));
}

std::string NcclApi::version() const {
  int code = 0;
  check(GetVersion(&code), "ncclGetVersion");
  // NCCL >= 2.9 encodes major*10000 + minor*100 + patch.
  return std::to_string(code / 10000) + "." + std::to_string(code / 100 % 100) + "." + std::to_string(code % 100);
}

}  // namespace exactcoll::cuda

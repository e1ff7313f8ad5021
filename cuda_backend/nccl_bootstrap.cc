#include "cuda_backend/nccl_bootstrap.h"

#include "cuda_backend/nccl_api.h"

namespace exactcoll::cuda {
namespace {

std::string to_hex(const void* data, size_t bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  out.reserve(bytes * 2);
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) {
    out.push_back(digits[p[i] >> 4]);
    out.push_back(digits[p[i] & 15]);
  }
  return out;
}

// Returns false when text is not 2*bytes hex digits.
bool from_hex(const std::string& text, void* data, size_t bytes) {
  if (text.size() != bytes * 2) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  auto* p = static_cast<unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) {
    const int hi = nibble(text[2 * i]), lo = nibble(text[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    p[i] = static_cast<unsigned char>(hi * 16 + lo);
  }
  return true;
}

}  // namespace

ncclComm_t create_nccl_comm(Store& store, const std::string& prefix, int rank, int world_size,
                            std::chrono::milliseconds timeout, std::string* why) {
  std::string problem;
  try {
    (void)NcclApi::get();
  } catch (const NcclError& e) {
    problem = e.what();
  }
  store.set(prefix + "/loaded/" + std::to_string(rank), problem);
  store.barrier(prefix + "/loaded", rank, world_size, timeout);
  for (int p = 0; p < world_size; ++p) {
    if (!store.get(prefix + "/loaded/" + std::to_string(p), timeout).empty()) {
      *why = "libnccl.so.2 could not be loaded on some rank";
      return nullptr;
    }
  }
  const NcclApi& nccl = NcclApi::get();
  ncclUniqueId id{};
  if (rank == 0) {
    nccl.check(nccl.GetUniqueId(&id), "ncclGetUniqueId");
    store.set(prefix + "/id", to_hex(&id, sizeof id));
  } else if (!from_hex(store.get(prefix + "/id", timeout), &id, sizeof id)) {
    throw NcclError("malformed NCCL unique id in the store (" + prefix + "/id)");
  }
  ncclComm_t comm = nullptr;
  nccl.check(nccl.CommInitRank(&comm, world_size, id, rank), "ncclCommInitRank");
  return comm;
}

}  // namespace exactcoll::cuda

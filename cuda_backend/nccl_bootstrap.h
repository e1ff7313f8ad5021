// An NCCL communicator formed through the job's store: the one piece of code that the IPC
// communicator (its baseline and fallback) and the multi-node communicator (its cross-node
// transport) both use.
#pragma once

#include <nccl.h>

#include <chrono>
#include <string>

#include "core/store.h"

namespace exactcoll::cuda {

// Collective over world_size ranks. Returns a communicator, or nullptr with *why set when
// libnccl.so.2 could not be loaded on some rank: every rank publishes whether it loaded NCCL and no
// rank calls ncclCommInitRank (which waits for every rank without a bound) unless all did. Rank 0
// makes the unique id and publishes it as hex. Store keys: <prefix>/loaded/<rank>, <prefix>/loaded
// (a barrier), <prefix>/id. Throws NcclError when NCCL fails or the id in the store is malformed,
// StoreError when a store wait times out.
ncclComm_t create_nccl_comm(Store& store, const std::string& prefix, int rank, int world_size,
                            std::chrono::milliseconds timeout, std::string* why);

}  // namespace exactcoll::cuda

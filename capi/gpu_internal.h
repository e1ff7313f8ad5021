// The objects behind a GPU communicator handle, for the library's own `exactcoll` CLI: what a
// tuning and testing tool needs beyond the C API (forced grids, the choice `auto` makes, peers'
// addresses, a measured fused table). Not in the public header: C, Python and PyTorch programs
// never need them, and the CLI makes its communicators and its ordinary calls through the public
// functions like they do (tools/gpu/api_comm.h).
#pragma once

#include "cuda_backend/communicator.h"
#include "cuda_backend/fused/fused_rmsnorm.h"
#include "exactcoll/exactcoll.h"

namespace exactcoll::capi {

// Returns the communicator behind a handle, and the fused op bound to it; valid until
// exactcoll_comm_destroy. Throws ApiError (INVALID_ARGUMENT) for a handle never created or
// destroyed.
cuda::Communicator& backend_communicator(exactcoll_comm comm);
cuda::fused::FusedRmsNorm& backend_fused(exactcoll_comm comm);
// Returns the buffer of exactcoll_comm_register_buffer's id (a copy); throws ApiError
// (INVALID_ARGUMENT) for an id the handle never gave.
cuda::RegisteredBuffer backend_registered(exactcoll_comm comm, int registered_id);

}  // namespace exactcoll::capi

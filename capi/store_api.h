// The C API's store handles, shared with the communicator functions (which keep a store alive for
// as long as a communicator made on it exists).
#pragma once

#include <memory>

#include "core/store.h"
#include "exactcoll/exactcoll.h"

namespace exactcoll::capi {

// The store behind a handle; INVALID_ARGUMENT when it was never created or was destroyed.
std::shared_ptr<Store> store_of(exactcoll_store store);

}  // namespace exactcoll::capi

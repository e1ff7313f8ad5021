// The C API's version, error and name functions (exactcoll.h, "version", "errors", "types").
#include <string>

#include "capi/api_support.h"
#include "capi/enum_names.h"
#include "cuda_backend/communicator_options.h"
#include "exactcoll/exactcoll.h"

using namespace exactcoll::capi;

namespace {

// Each C enum value is the registry's value of the same name (core/registry.h): python/tests'
// test_names_match_the_library holds every entry to its EXACTCOLL_* line of the installed header.

template <class Entry, size_t N>
int from_name(const Entry (&names)[N], const char* name, int* value, const char* what) {
  return guarded(what, [&] {
    require(name, "name");
    require(value, "the result pointer");
    const int v = value_of(names, name);
    if (v < 0) bad_argument("unknown name '" + std::string(name) + "'; expected one of " + name_list(names));
    *value = v;
  });
}

}  // namespace

extern "C" {

int exactcoll_version(void) {
  return EXACTCOLL_VERSION_MAJOR * 10000 + EXACTCOLL_VERSION_MINOR * 100 + EXACTCOLL_VERSION_PATCH;
}

int exactcoll_abi_version(void) { return EXACTCOLL_ABI_VERSION; }

const char* exactcoll_version_string(void) {
#define EXACTCOLL_STR2(x) #x
#define EXACTCOLL_STR(x) EXACTCOLL_STR2(x)
  static const char* const with_cuda = EXACTCOLL_STR(EXACTCOLL_VERSION_MAJOR) "." EXACTCOLL_STR(
      EXACTCOLL_VERSION_MINOR) "." EXACTCOLL_STR(EXACTCOLL_VERSION_PATCH) " (cuda)";
  static const char* const without_cuda = EXACTCOLL_STR(EXACTCOLL_VERSION_MAJOR) "." EXACTCOLL_STR(
      EXACTCOLL_VERSION_MINOR) "." EXACTCOLL_STR(EXACTCOLL_VERSION_PATCH) " (no cuda)";
#undef EXACTCOLL_STR
#undef EXACTCOLL_STR2
  return exactcoll_has_cuda() ? with_cuda : without_cuda;
}

size_t exactcoll_struct_size(const char* struct_name) {
  if (struct_name == nullptr) return 0;
  const std::string name = struct_name;
  if (name == "exactcoll_call_info") return sizeof(exactcoll_call_info);
  if (name == "exactcoll_store_callbacks") return sizeof(exactcoll_store_callbacks);
  if (name == "exactcoll_comm_options") return sizeof(exactcoll_comm_options);
  if (name == "exactcoll_comm_properties") return sizeof(exactcoll_comm_properties);
  if (name == "exactcoll_sim_options") return sizeof(exactcoll_sim_options);
  if (name == "exactcoll_sim_multinode_options") return sizeof(exactcoll_sim_multinode_options);
  if (name == "exactcoll_sim_multinode_stats") return sizeof(exactcoll_sim_multinode_stats);
  if (name == "exactcoll_link_rates") return sizeof(exactcoll_link_rates);
  if (name == "exactcoll_model_prediction") return sizeof(exactcoll_model_prediction);
  return 0;
}

const char* exactcoll_last_error(void) { return current_last_error().c_str(); }

const char* exactcoll_dtype_name(int dtype) { return name_of(kDtypeNames, dtype); }
const char* exactcoll_op_name(int op) { return name_of(kOpNames, op); }
const char* exactcoll_algo_name(int algo) { return name_of(kAlgoNames, algo); }
const char* exactcoll_fused_algo_name(int algo) { return name_of(kFusedAlgoNames, algo); }
const char* exactcoll_contract_name(int contract) { return name_of(kContractNames, contract); }

int exactcoll_dtype_from_name(const char* name, int* dtype) {
  return from_name(kDtypeNames, name, dtype, "exactcoll_dtype_from_name");
}
int exactcoll_algo_from_name(const char* name, int* algo) {
  return from_name(kAlgoNames, name, algo, "exactcoll_algo_from_name");
}
int exactcoll_fused_algo_from_name(const char* name, int* algo) {
  return from_name(kFusedAlgoNames, name, algo, "exactcoll_fused_algo_from_name");
}
int exactcoll_op_from_name(const char* name, int* op) {
  return guarded("exactcoll_op_from_name", [&] {
    require(name, "name");
    require(op, "the result pointer");
    const int v = value_of(kOpNames, std::string(exactcoll::canonical_op_name(name)));  // registry kOpAliases
    if (v < 0) {  // an unknown name is reported as given
      bad_argument("unknown name '" + std::string(name) + "'; expected one of " + name_list(kOpNames) +
                   " (or all_reduce, all_gather)");
    }
    *op = v;
  });
}
int exactcoll_contract_from_name(const char* name, int* contract) {
  return from_name(kContractNames, name, contract, "exactcoll_contract_from_name");
}

void exactcoll_comm_options_init(exactcoll_comm_options* options) {
  if (options == nullptr) return;
  const exactcoll::cuda::CommunicatorOptions defaults;
  *options = exactcoll_comm_options{};
  options->struct_size = sizeof(exactcoll_comm_options);
  options->name = nullptr;
  options->buffer_bytes = defaults.buffer_bytes;
  options->flag_timeout_ms = defaults.flag_timeout_ms;
  options->store_timeout_ms = defaults.store_timeout.count();
  options->use_nccl = defaults.use_nccl ? 1 : 0;
  options->programmatic_launch = defaults.programmatic_launch ? 1 : 0;
  options->device = -1;
  options->node = -1;             // from the launcher's variables, else node 0
  options->local_world_size = 0;  // from LOCAL_WORLD_SIZE, else world_size (one node)
  options->graph_in_place = defaults.graph_in_place ? 1 : 0;
  options->eager_in_place = defaults.eager_in_place ? 1 : 0;
}

void exactcoll_call_info_init(exactcoll_call_info* info) {
  if (info == nullptr) return;
  *info = exactcoll_call_info{};
  info->struct_size = sizeof(exactcoll_call_info);
  info->algo = -1;
  info->allreduce_algo = -1;
  info->exact = 1;
}

}  // extern "C"

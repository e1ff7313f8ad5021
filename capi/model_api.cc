// The C API's multi-node performance model (exactcoll.h, "the multi-node performance model"):
// core/multinode_model.h's predictions for a case the caller describes.
#include <string>
#include <vector>

#include "capi/api_support.h"
#include "capi/enum_names.h"
#include "core/multinode_model.h"
#include "exactcoll/exactcoll.h"

using namespace exactcoll;
using namespace exactcoll::capi;

extern "C" {

void exactcoll_link_rates_init(exactcoll_link_rates* rates) {
  if (rates == nullptr) return;
  const multinode::LinkRates defaults;
  *rates = exactcoll_link_rates{};
  rates->struct_size = sizeof(exactcoll_link_rates);
  rates->nvlink_gbps = defaults.nvlink_gbps;
  rates->network_gbps = defaults.network_gbps;
  rates->network_latency_us = defaults.network_latency_us;
  rates->kernel_latency_us = defaults.kernel_latency_us;
  rates->nvlink_step_us = defaults.nvlink_step_us;
}

int exactcoll_model_multinode(int op, int dtype, int nodes, int gpus_per_node, size_t bytes,
                              const exactcoll_link_rates* rates, exactcoll_model_prediction* predictions, int capacity,
                              int* count) {
  return guarded("exactcoll_model_multinode", [&] {
    checked_name(kOpNames, op, "op");
    const DType type = to_dtype(dtype);
    require(count, "count");
    *count = 0;
    multinode::LinkRates r;
    if (rates != nullptr) {
      require_struct_size(rates->struct_size, sizeof(exactcoll_link_rates), "exactcoll_link_rates");
      r.nvlink_gbps = rates->nvlink_gbps;
      r.network_gbps = rates->network_gbps;
      r.network_latency_us = rates->network_latency_us;
      r.kernel_latency_us = rates->kernel_latency_us;
      r.nvlink_step_us = rates->nvlink_step_us;
    }
    multinode::ModelCase c;
    c.op = static_cast<Op>(op);  // the registry's values are the C values
    c.nodes = nodes;
    c.gpus_per_node = gpus_per_node;
    c.bytes = bytes;
    c.element_bytes = dtype_size(type);
    if (const std::string problem = multinode::check_model(c, r); !problem.empty()) bad_argument(problem);
    const std::vector<multinode::Prediction> p = multinode::predict(c, r);
    if (capacity < static_cast<int>(p.size())) {
      bad_argument("capacity " + std::to_string(capacity) + " is less than the " + std::to_string(p.size()) +
                   " predictions (EXACTCOLL_MODEL_MAX_PREDICTIONS suffices)");
    }
    require(predictions, "predictions");
    for (size_t i = 0; i < p.size(); ++i) {
      exactcoll_model_prediction& out = predictions[i];
      out = exactcoll_model_prediction{};
      copy_text(out.algorithm, p[i].name);
      out.time_us = p[i].time_us;
      out.nic_bytes = p[i].nic_bytes;
      out.chunk_elements = p[i].chunk_elements;
    }
    *count = static_cast<int>(p.size());
  });
}

}  // extern "C"

#include "core/multinode_model.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace exactcoll::multinode {
namespace {

// GB/s -> bytes per microsecond.
double per_us(double gbps) { return gbps * 1e3; }

// The chain's time for one chunk size: (J + 2(M - 1)) steps on one stream, each a network group,
// then the node kernels (core/multinode.h's steps 1-3).
double chain_time_us(const ModelCase& c, const LinkRates& r, double chunk, bool overlapped) {
  const double M = c.nodes, L = c.gpus_per_node, b = c.element_bytes;
  const double elements = static_cast<double>(c.bytes) / b;
  const double net = per_us(r.network_gbps), nv = per_us(r.nvlink_gbps);
  double steps = 0, step_us = 0;
  if (c.op == Op::kAllReduce) {
    // A rail carries local rank l's slice (chunk / L): the fp32 carry forward and the rounded
    // result around the ring; the fold and the gather each read (L-1)/L of the chunk over NVLink.
    steps = std::ceil(elements / chunk) + 2 * (M - 1);
    const double nic = chunk / L * (4 + (M > 2 ? b : 0));  // node 0 forwards results only for M >= 3
    const double network_us = r.network_latency_us + std::max(nic, chunk / L * 4) / net;
    const double kernels_us = 2 * r.kernel_latency_us + 2 * (L - 1) / L * chunk * b / nv;
    step_us = overlapped ? std::max(network_us, kernels_us) : network_us + kernels_us;
  } else if (c.op == Op::kReduceScatter) {
    // Pieces of chunk / M per owner; a rail carries M pieces' carries and up to M - 1 results.
    const double piece = std::max(64.0, chunk / M);
    const double per = elements / (M * L);
    steps = std::ceil(per / piece) + 2 * (M - 1);
    const double network_us = r.network_latency_us + (M * piece * 4 + (M - 1) * piece * b) / net;
    const double kernels_us = r.kernel_latency_us + (L - 1) * M * piece * b / nv;
    step_us = overlapped ? std::max(network_us, kernels_us) : network_us + kernels_us;
  } else {
    // All-gather: each chunk of the input straight to the M - 1 other nodes (groups of 4 peers),
    // then one gather kernel writing n chunks.
    const double piece = std::max(64.0, chunk / M);
    steps = std::ceil(elements / piece);
    const double network_us = std::ceil((M - 1) / 4) * r.network_latency_us + (M - 1) * piece * b / net;
    const double kernels_us = r.kernel_latency_us + M * L * piece * b / nv;
    step_us = overlapped ? std::max(network_us, kernels_us) : network_us + kernels_us;
  }
  return steps * step_us;
}

// The tree contract's exchange for one chunk size (core/multinode.h's tree_allreduce and
// tree_reduce_scatter): per chunk, the node fold, log2(M) network groups each followed by a combine
// kernel, and (all-reduce) the node gather, one after another on one stream (no pipelining: every
// node works on the same chunk at the same step).
//   all-reduce: step s moves a rail's rounded slice (chunk / L x b bytes) each way; the fold and the
//     gather each read (L-1)/L of the chunk over NVLink.
//   reduce-scatter: the chunk's M pieces of chunk / M (at least 64) elements; step s moves M / 2^(s+1)
//     pieces; the fold reads (L-1) M pieces over NVLink.
double tree_time_us(const ModelCase& c, const LinkRates& r, double chunk) {
  const double M = c.nodes, L = c.gpus_per_node, b = c.element_bytes;
  const double elements = static_cast<double>(c.bytes) / b;
  const double net = per_us(r.network_gbps), nv = per_us(r.nvlink_gbps);
  const int steps = static_cast<int>(std::lround(std::log2(M)));
  if (c.op == Op::kAllReduce) {
    const double chunks = std::ceil(elements / chunk);
    const double node_us = 2 * r.kernel_latency_us + 2 * (L - 1) / L * chunk * b / nv;
    const double exchange_us = steps * (r.network_latency_us + chunk / L * b / net + r.kernel_latency_us);
    return chunks * (node_us + exchange_us);
  }
  const double piece = std::max(64.0, chunk / M);
  const double chunks = std::ceil(elements / (M * L) / piece);
  double exchange_us = 0;
  for (int s = 0; s < steps; ++s) {
    exchange_us += r.network_latency_us + M / std::pow(2.0, s + 1) * piece * b / net + r.kernel_latency_us;
  }
  return chunks * (r.kernel_latency_us + (L - 1) * M * piece * b / nv + exchange_us);
}

}  // namespace

bool tree_modelled(const ModelCase& c) {
  return c.op != Op::kAllGather && (c.nodes & (c.nodes - 1)) == 0 && (c.gpus_per_node & (c.gpus_per_node - 1)) == 0;
}

double tree_total_cross_node_bytes(const ModelCase& c) {
  const double M = c.nodes, b = c.element_bytes;
  const double elements = static_cast<double>(c.bytes) / b;
  switch (c.op) {
    case Op::kAllReduce: return M * std::log2(M) * elements * b;  // every node's whole message, log2 M times
    case Op::kReduceScatter: return (M - 1) * elements * b;       // a rank's M - 1 foreign pieces, once each
    case Op::kAllGather: return chain_total_cross_node_bytes(c);  // a copy: the same exchange
  }
  return 0;
}

double chain_total_cross_node_bytes(const ModelCase& c) {
  const double M = c.nodes, b = c.element_bytes;
  const double elements = static_cast<double>(c.bytes) / b;
  const double n = M * c.gpus_per_node;
  switch (c.op) {
    case Op::kAllReduce:
      return elements * (M - 1) * (4 + b);  // every element's carry and result cross M - 1 boundaries
    case Op::kReduceScatter: return elements * (M - 1) * (4 + b / 2);  // owner k's result crosses k + 1 boundaries
    case Op::kAllGather: return n * (M - 1) * elements * b;            // every input to M - 1 other nodes
  }
  return 0;
}

std::vector<Prediction> predict(const ModelCase& c, const LinkRates& r) {
  const double M = c.nodes, L = c.gpus_per_node, n = M * L, b = c.element_bytes;
  const double S = static_cast<double>(c.bytes);
  const double net = per_us(r.network_gbps), nv = per_us(r.nvlink_gbps);
  const double bus = std::min(L * net, nv);  // NCCL's ring: the node's NICs or one GPU's NVLink
  std::vector<Prediction> out;
  // exactcoll's chain, at the best chunk among powers of two from 64 Ki to 64 Mi elements: as built
  // (the node kernels and the NCCL groups take turns on one stream), and overlapped (the kernels
  // of one chunk beside the transfers of the next on a second stream: not built, the model says
  // what it would buy).
  const double elements = S / b;
  const double chain_nic = [&] {
    switch (c.op) {
      case Op::kAllReduce: return elements / L * (4 + (M > 2 ? b : 0));
      case Op::kReduceScatter: return elements / L * (4 + b * (M - 1) / M);
      case Op::kAllGather: return (M - 1) * S;
    }
    return 0.0;
  }();
  for (const bool overlapped : {false, true}) {
    Prediction chain{overlapped ? "chain, overlapped" : "exactcoll chain", std::numeric_limits<double>::infinity(),
                     chain_nic, 0};
    for (double chunk = 65536; chunk <= 64.0 * 1024 * 1024; chunk *= 2) {
      const double t = chain_time_us(c, r, chunk, overlapped);
      if (t < chain.time_us) {
        chain.time_us = t;
        chain.chunk_elements = static_cast<size_t>(chunk);
      }
      if (chunk >= elements) break;
    }
    out.push_back(chain);
  }
  if (c.op == Op::kAllReduce) {
    // The direct reduce-scatter + all-gather: raw slices to their owners, results back, per NIC.
    const double nic = 2 * (M - 1) / M * S;
    out.push_back({"exactcoll direct", nic / net + 2 * (L - 1) / L * S / nv + 2 * r.network_latency_us, nic, 0});
    // NCCL ring: 2 (n-1)/n S through every rank; 2 (n-1) steps, each as slow as its network edge.
    const double ring = 2 * (n - 1) / n * S;
    out.push_back({"nccl ring", ring / bus + 2 * (n - 1) * r.network_latency_us, ring / L, 0});
    // NCCL tree: reduce up and broadcast down, about 2 S per node through its L NICs and 2 S per
    // GPU along the chain inside the node; 2 log2 M network steps and 2 (L-1) NVLink steps.
    const double tree_bw = std::max(2 * S / (L * net), 2 * S / nv);
    out.push_back(
        {"nccl tree",
         tree_bw + 2 * std::ceil(std::log2(std::max(2.0, M))) * r.network_latency_us + 2 * (L - 1) * r.nvlink_step_us,
         2 * S / L, 0});
  } else {
    // NCCL ring reduce-scatter (input S) and all-gather (output n S): (n-1)/n of the larger side.
    const double big = c.op == Op::kReduceScatter ? S : n * S;
    const double ring = (n - 1) / n * big;
    out.push_back({"nccl ring", ring / bus + (n - 1) * r.network_latency_us, ring / L, 0});
  }
  // The tree contract's exchange (appended: the C API's list keeps its order), at the best chunk
  // as the chain's: the rounded slice log2(M) times through each NIC (all-reduce, recursive
  // doubling), or (M-1)/M of a rank's input / L (reduce-scatter, recursive halving). Other bits than
  // the chain's (the tree contract's), for M and L powers of two only.
  if (tree_modelled(c)) {
    const double steps = std::log2(M);
    const double nic = c.op == Op::kAllReduce ? steps * S / L : (M - 1) / M * S / L;
    Prediction tree{"exactcoll tree", std::numeric_limits<double>::infinity(), nic, 0};
    for (double chunk = 65536; chunk <= 64.0 * 1024 * 1024; chunk *= 2) {
      const double t = tree_time_us(c, r, chunk);
      if (t < tree.time_us) {
        tree.time_us = t;
        tree.chunk_elements = static_cast<size_t>(chunk);
      }
      if (chunk >= elements) break;
    }
    out.push_back(tree);
  }
  return out;
}

std::string check_model(const ModelCase& c, const LinkRates& rates) {
  if (c.nodes < 1 || c.nodes > 1024) return "nodes must be 1..1024, got " + std::to_string(c.nodes);
  if (c.gpus_per_node < 1 || c.gpus_per_node > 16) {
    return "GPUs per node must be 1..16, got " + std::to_string(c.gpus_per_node);
  }
  if (c.bytes < 64 || c.bytes > (size_t{1} << 40)) return "bytes must be 64..2^40, got " + std::to_string(c.bytes);
  if (c.element_bytes != 2 && c.element_bytes != 4) {
    return "element bytes must be 2 (bf16, fp16) or 4 (fp32), got " + std::to_string(c.element_bytes);
  }
  auto finite_at_least = [](double v, double low, bool strict) {
    return std::isfinite(v) && (strict ? v > low : v >= low);
  };
  if (!finite_at_least(rates.nvlink_gbps, 0, true) || !finite_at_least(rates.network_gbps, 0, true)) {
    return "link rates must be finite and > 0";
  }
  if (!finite_at_least(rates.network_latency_us, 0, false) || !finite_at_least(rates.kernel_latency_us, 0, false) ||
      !finite_at_least(rates.nvlink_step_us, 0, false)) {
    return "latencies must be finite and >= 0";
  }
  return "";
}

}  // namespace exactcoll::multinode

// A performance model of the multi-node collectives: how the time of each op grows from 2 to 64
// nodes of L GPUs, for exactcoll's algorithms (core/multinode.h) and NCCL's ring and tree, from
// link rates (NVLink measured; the network measured or given) and per-step latencies. An
// alpha-beta model: each step costs its latency plus its bytes over the slowest link it uses; a
// GPU's network link is its own NIC (rail-optimized: GPU l of every node on rail l), full duplex.
//
// What it models, per rank (S = message bytes per rank, b = bytes per element, c = S / b, n = M L):
//   exactcoll carry chain (all-reduce): the message in chunks of C elements; step t of the ring
//     moves a rail's carry slice (C / L x 4 bytes) and result slice (C / L x b bytes) through one
//     NIC and runs two node kernels over NVLink (fold: (L-1)/L x C x b read; gather: the same);
//     J + 2(M-1) steps on one stream, so a step's time is the sum of its parts.
//   exactcoll direct (all-reduce, not built: the reference point the issue names): every rank
//     sends its raw slices to their owners and receives the results: 2 (M-1)/M x S per NIC.
//   NCCL ring: 2 (n-1)/n x S through every rank, the inter-node edges spread over the L NICs;
//     2 (n-1) steps.
//   NCCL tree (double binary tree between nodes, a chain inside): about 2 S / L per NIC, and
//     2 log2(M) network steps plus 2 (L-1) NVLink steps of latency.
//   reduce-scatter and all-gather: the same shapes for their byte counts.
//   exactcoll tree (the tree contract: other bits than the chain's, M and L powers of two):
//     all-reduce, recursive doubling: per chunk the node fold, log2(M) steps each moving a rail's
//     rounded slice (C / L x b bytes) and a combine kernel, then the node gather; log2(M) S / L
//     per NIC. Reduce-scatter, recursive halving: M / 2 + ... + 1 = M - 1 pieces per rail,
//     (M-1)/M x S / L per NIC, log2(M) steps. Appended after NCCL's rows (the C API's order).
// Every formula is in multinode_model.cc next to its derivation; docs/design.md has the diagram.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/op.h"

namespace exactcoll::multinode {

struct LinkRates {
  double nvlink_gbps = 390.0;       // GB/s per direction, one GPU (measured on H200: docs/design.md)
  double network_gbps = 50.0;       // GB/s per direction per GPU's NIC (given: 400 Gb/s)
  double network_latency_us = 5.0;  // one network step (a p2p group, or an NCCL ring step across nodes)
  double kernel_latency_us = 4.0;   // one node kernel (launch + IPC barrier)
  double nvlink_step_us = 1.0;      // one NCCL step inside a node
};

struct ModelCase {
  Op op = Op::kAllReduce;
  int nodes = 2;
  int gpus_per_node = 8;
  size_t bytes = 64 << 20;  // message bytes per rank (all-reduce, reduce-scatter: the input; all-gather: the input)
  int element_bytes = 2;    // bf16 / fp16: 2, fp32: 4
};

struct Prediction {
  std::string name;  // "exactcoll chain", "chain, overlapped", "exactcoll direct", "nccl ring", "nccl tree",
                     // "exactcoll tree"
  double time_us = 0;
  double nic_bytes = 0;       // bytes through the busiest NIC (one direction)
  size_t chunk_elements = 0;  // chain and tree: the chunk the model chose
};

// The bytes the carry chain sends across node boundaries, summed over all ranks (the simulator
// counts the same number: tests/core/multinode_model_test.cc).
double chain_total_cross_node_bytes(const ModelCase& c);

// The same for the tree contract's exchange (all-reduce: M log2(M) x the message; reduce-scatter:
// (M - 1) x a rank's input; all-gather: the chain's, a copy either way).
double tree_total_cross_node_bytes(const ModelCase& c);

// Whether predict() has an "exactcoll tree" row for c: the all-reduce or the reduce-scatter, on M
// and L powers of two (core/multinode.h's check_tree_layout).
bool tree_modelled(const ModelCase& c);

// Returns "" when the case and rates can be modelled, else what is wrong: nodes 1..1024, GPUs per
// node 1..16, bytes 64..2^40, element bytes 2 or 4, link rates > 0, latencies >= 0 (finite).
std::string check_model(const ModelCase& c, const LinkRates& rates);

// Every algorithm's prediction for the case: exactcoll's chain (and direct), NCCL's, then the tree
// contract's exchange where tree_modelled. Preconditions: check_model == "".
std::vector<Prediction> predict(const ModelCase& c, const LinkRates& rates);

}  // namespace exactcoll::multinode

// `exactcoll model`: predicted time of each op for 2 to 64 nodes of L GPUs, exactcoll's multi-node
// algorithms (the carry chain; the tree contract's exchange) beside NCCL's ring and tree
// (core/multinode_model.h has the model).
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "tools/cli.h"
#include "core/multinode_model.h"
#include "tools/sim/sim_flags.h"

namespace exactcoll::multinode {
namespace {

// "2,4,8" -> {2, 4, 8}; false on anything else or a value outside 1..1024.
bool parse_nodes(const std::string& text, std::vector<int>* out) {
  std::vector<uint64_t> values;
  if (!tools::parse_indices(text, &values)) return false;
  out->clear();
  for (uint64_t v : values) {
    if (v < 1 || v > 1024) return false;
    out->push_back(static_cast<int>(v));
  }
  return true;
}

int model_main(int argc, char** argv) {
  std::string op_text = "allreduce", nodes_text = "2,4,8,16,32,64", dtype = "bf16", csv;
  int64_t gpus = 8, bytes = 64 << 20;
  LinkRates rates;
  cli::ArgParser parser(
      "exactcoll model [--op allreduce|reduce_scatter|allgather|fused_rmsnorm] [--nodes 2,4,...] [--gpus-per-node L] "
      "[--bytes B] [--dtype bf16|fp16|fp32] [--nvlink-gbps G] [--network-gbps G] [--network-latency-us U] "
      "[--kernel-latency-us U] [--csv FILE]",
      "Predicts each op's time on M nodes of L GPUs from link rates: exactcoll's carry chain (and, for\n"
      "the all-reduce, the direct reduce-scatter + all-gather it is compared with) beside NCCL's ring\n"
      "and tree, then \"exactcoll tree\": the tree contract's exchange (other bits than the chain's;\n"
      "recursive doubling, halving for reduce_scatter; M and L powers of two only).\n"
      "An alpha-beta model (core/multinode_model.h): NVLink defaults to the 390 GB/s\n"
      "measured on one H200 with torch.cuda (docs/design.md), the network to 50 GB/s per GPU (400 Gb/s\n"
      "NICs, one per GPU, rail-optimized); give the network you have. fused_rmsnorm is the all-reduce\n"
      "plus a local norm kernel of a few microseconds (not modelled). bytes: the message per rank.");
  parser.add_op_choice("op", &op_text, {"allreduce", "reduce_scatter", "allgather", "fused_rmsnorm"}, "the op");
  parser.add_string("nodes", &nodes_text, "node counts, e.g. 2,4,8,16,32,64");
  parser.add_int("gpus-per-node", &gpus, "GPUs (ranks) per node, 1..16");
  parser.add_int("bytes", &bytes, "message bytes per rank (all-gather: the input)");
  parser.add_choice("dtype", &dtype, {"bf16", "fp16", "fp32"}, "storage type");
  parser.add_double("nvlink-gbps", &rates.nvlink_gbps, "GB/s per direction of one GPU's NVLink");
  parser.add_double("network-gbps", &rates.network_gbps, "GB/s per direction of one GPU's NIC");
  parser.add_double("network-latency-us", &rates.network_latency_us, "microseconds per network step");
  parser.add_double("kernel-latency-us", &rates.kernel_latency_us, "microseconds per node kernel");
  parser.add_string("csv", &csv, "also write the table as CSV");
  if (auto code = parser.parse(argc, argv)) return *code;
  std::vector<int> nodes;
  if (!parse_nodes(nodes_text, &nodes)) return cli::fail("model", "--nodes must be counts 1..1024 separated by commas");
  if (gpus < 1 || gpus > 16) return cli::fail("model", "--gpus-per-node must be 1..16");
  if (bytes < 64 || bytes > (int64_t{1} << 40)) return cli::fail("model", "--bytes must be 64..2^40");
  ModelCase c;
  // fused_rmsnorm is modelled as its all-reduce (the norm kernel is local and not modelled).
  c.op = op_text == "fused_rmsnorm" ? Op::kAllReduce : *parse_op(op_text);
  c.gpus_per_node = static_cast<int>(gpus);
  c.element_bytes = dtype == "fp32" ? 4 : 2;
  c.bytes = static_cast<size_t>(bytes);
  for (int m : nodes) {
    c.nodes = m;
    if (const std::string problem = check_model(c, rates); !problem.empty()) return cli::fail("model", problem);
  }
  std::printf(
      "exactcoll model: %s, %s, %lld bytes per rank, %lld GPUs per node, NVLink %.0f GB/s, network %.0f GB/s per GPU, "
      "%.1f us per network step, %.1f us per node kernel\n",
      op_text.c_str(), dtype.c_str(), static_cast<long long>(bytes), static_cast<long long>(gpus), rates.nvlink_gbps,
      rates.network_gbps, rates.network_latency_us, rates.kernel_latency_us);
  std::string table = "nodes,gpus,algorithm,time_us,busiest_nic_bytes,chain_chunk_elements,vs_nccl_ring\n";
  std::printf("%6s %6s  %-18s %12s %16s %12s %8s\n", "nodes", "gpus", "algorithm", "time (us)", "NIC bytes", "chunk",
              "/ring");
  for (int m : nodes) {
    c.nodes = m;
    const std::vector<Prediction> p = predict(c, rates);
    double ring = 0;
    for (const Prediction& x : p) ring = x.name == "nccl ring" ? x.time_us : ring;
    for (const Prediction& x : p) {
      std::printf("%6d %6d  %-18s %12.1f %16.0f %12s %8.2f\n", m, m * c.gpus_per_node, x.name.c_str(), x.time_us,
                  x.nic_bytes, x.chunk_elements ? std::to_string(x.chunk_elements).c_str() : "-", x.time_us / ring);
      char line[256];
      std::snprintf(line, sizeof line, "%d,%d,%s,%.3f,%.0f,%zu,%.4f\n", m, m * c.gpus_per_node, x.name.c_str(),
                    x.time_us, x.nic_bytes, x.chunk_elements, x.time_us / ring);
      table += line;
    }
  }
  if (!csv.empty()) {
    std::ofstream f(cli::resolve_path(csv), std::ios::binary | std::ios::trunc);
    f << table;
    if (!f) return cli::fail("model", "cannot write " + csv, cli::kExitFailure);
    std::printf("wrote %s\n", csv.c_str());
  }
  return cli::kExitOk;
}

const cli::Registrar kRegistrar({"model", "predicted multi-node times: exactcoll beside NCCL ring and tree",
                                 model_main});

}  // namespace
}  // namespace exactcoll::multinode

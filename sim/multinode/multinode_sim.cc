#include "sim/multinode/multinode_sim.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>

#include "core/multinode_kernels.h"
#include "core/signal.h"
#include "sim/fused/fused_sim.h"
#include "sim/world.h"

namespace exactcoll::multinode {
namespace {

// A zeroed, 64-byte aligned allocation.
class Region {
 public:
  Region() = default;
  explicit Region(size_t bytes) {
    const size_t rounded = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
    data_.reset(static_cast<std::byte*>(std::aligned_alloc(64, rounded)));
    if (!data_) throw std::bad_alloc();
    std::memset(data_.get(), 0, rounded);
    bytes_ = rounded;
  }
  std::byte* data() const { return data_.get(); }
  size_t bytes() const { return bytes_; }

 private:
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte[], Free> data_;
  size_t bytes_ = 0;
};

struct RankHeap {
  Region signals, input, scratch, carry_in, carry_out, output;
  Region residual, weight, out;  // the fused op's
};

// Every rank's memory, the node tables that the node kernels see, the network, the traces.
template <class T>
class Job {
 public:
  Job(const NetworkOptions& net, int blocks, size_t input_elements, size_t output_elements, const BufferNeeds& needs,
      const std::vector<uint64_t>& trace_elements)
      : network(net), layout(net.layout), blocks(blocks), launches(static_cast<size_t>(layout.world_size()), 0) {
    const int n = layout.world_size(), L = layout.local_ranks;
    for (int r = 0; r < n; ++r) {
      RankHeap h;
      h.signals = Region(sizeof(SignalBuffer));
      h.input = Region(input_elements * sizeof(T));
      h.scratch = Region(needs.scratch_elements * sizeof(T));
      h.carry_in = Region(needs.carry_floats * sizeof(float));
      h.carry_out = Region(needs.carry_floats * sizeof(float));
      h.output = Region(output_elements * sizeof(T));
      heaps.push_back(std::move(h));
    }
    // Each node is an IPC world of its own: local rank q of node k sees its node's peers only.
    tables.resize(static_cast<size_t>(layout.nodes));
    for (int k = 0; k < layout.nodes; ++k) {
      sim::PeerTable table;
      for (int q = 0; q < L; ++q) {
        const RankHeap& h = heaps[static_cast<size_t>(layout.rank_of(k, q))];
        table.signals[static_cast<size_t>(q)] = reinterpret_cast<SignalBuffer*>(h.signals.data());
        table.input[static_cast<size_t>(q)] = h.input.data();
        table.scratch[static_cast<size_t>(q)] = h.scratch.data();
      }
      table.scratch_bytes = heaps[0].scratch.bytes();
      tables[static_cast<size_t>(k)] = table;
    }
    if (net.trace) {
      for (int k = 0; k < layout.nodes; ++k) tracers.push_back(std::make_unique<sim::Tracer>(L, trace_elements));
      names.resize(static_cast<size_t>(layout.nodes));
    }
  }

  // Runs kernel(ctx) on every block of rank's next node launch, inline on the rank's thread
  // (legal: barriers pair equal block indices, and every local rank runs its blocks in order).
  // The context folds under kFold (canonical or tree: sim::SimCtx's contract).
  template <Contract kFold = Contract::kCanonical, class Kernel>
  void launch(int rank, const char* name, Kernel kernel) {
    const int node = layout.node_of(rank);
    const uint32_t id = launches[static_cast<size_t>(rank)]++;
    sim::Tracer* tracer = tracers.empty() ? nullptr : tracers[static_cast<size_t>(node)].get();
    if (tracer != nullptr) {
      std::lock_guard<std::mutex> lock(names_mutex);
      auto& list = names[static_cast<size_t>(node)];
      if (list.size() <= id) list.resize(id + 1);
      list[id] = name;
    }
    for (int b = 0; b < blocks; ++b) {
      sim::BlockEnv env;
      env.rank = layout.local_of(rank);
      env.world_size = layout.local_ranks;
      env.block = b;
      env.num_blocks = blocks;
      env.launch = id;
      env.peers = &tables[static_cast<size_t>(node)];
      env.output = heaps[static_cast<size_t>(rank)].output.data();
      env.executor = &network;
      env.tracer = tracer;
      // A traced element's tree_node events name global ranks; with several nodes a node's tree is a
      // subtree, and the cross-node combines record the levels above it and the round.
      env.tree_trace_scope = TreeTraceScope{layout.rank_of(node, 0), layout.nodes == 1};
      if (tracer != nullptr) {
        sim::SimCtx<T, true, kFold> ctx(env);
        kernel(ctx);
      } else {
        sim::SimCtx<T, false, kFold> ctx(env);
        kernel(ctx);
      }
    }
  }

  // The JSON lines of the run: every message (send, and deliver or lost) and every node kernel's
  // events, merged by time. Kernel events carry "node" and "local_rank" (their "peer" fields are
  // local ranks of that node; "input_rank" of a fold is global).
  MultiNodeTrace trace() {
    MultiNodeTrace out;
    std::vector<std::pair<uint64_t, std::string>> lines;
    for (const MessageRecord& m : network.messages()) {
      ++out.messages;
      out.cross_node_bytes += m.bytes;
      const int from_node = layout.node_of(m.from), to_node = layout.node_of(m.to);
      auto line = [&](const char* event, uint64_t t) {
        std::string s = "{\"t\":" + std::to_string(t) + ",\"event\":\"" + event +
                        "\",\"from\":" + std::to_string(m.from) + ",\"from_node\":" + std::to_string(from_node) +
                        ",\"to\":" + std::to_string(m.to) + ",\"to_node\":" + std::to_string(to_node) +
                        ",\"boundary\":\"node " + std::to_string(from_node) + " -> node " + std::to_string(to_node) +
                        "\",\"payload\":\"" + payload_name(m.payload) + "\",\"chunk\":" + std::to_string(m.chunk) +
                        ",\"bytes\":" + std::to_string(m.bytes);
        if (std::strcmp(event, "deliver") == 0) s += ",\"sent\":" + std::to_string(m.t_sent);
        lines.emplace_back(t, s + "}");
      };
      line("send", m.t_sent);
      line(m.dropped ? "lost" : "deliver", m.dropped ? m.t_sent : m.t_delivered);
    }
    for (int k = 0; k < static_cast<int>(tracers.size()); ++k) {
      tracers[static_cast<size_t>(k)]->set_launch_names(names[static_cast<size_t>(k)]);
      const std::string text = tracers[static_cast<size_t>(k)]->json_lines();
      for (size_t begin = 0; begin < text.size();) {
        size_t end = text.find('\n', begin);
        if (end == std::string::npos) end = text.size();
        std::string s = text.substr(begin, end - begin);
        begin = end + 1;
        const uint64_t t = std::strtoull(s.c_str() + 5, nullptr, 10);  // after {"t":
        const size_t at = s.find(",\"rank\":");
        if (at != std::string::npos) s.replace(at, 8, ",\"local_rank\":");
        lines.emplace_back(t, "{\"node\":" + std::to_string(k) + "," + s.substr(1));
      }
    }
    std::stable_sort(lines.begin(), lines.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (const auto& [t, s] : lines) out.json_lines += s + "\n";
    return out;
  }

  Network network;
  NodeLayout layout;
  int blocks;
  std::vector<RankHeap> heaps;
  std::vector<sim::PeerTable> tables;  // per node
  std::vector<std::unique_ptr<sim::Tracer>> tracers;
  std::vector<std::vector<std::string>> names;  // per node, per launch
  std::mutex names_mutex;
  std::vector<uint32_t> launches;  // per rank
};

// The transport concept of core/multinode.h for one simulated rank; its node folds run under
// `contract` (canonical: the chain's carried fold; tree: the node subtrees).
template <class T>
class SimPrims {
 public:
  SimPrims(Job<T>& job, int rank, Contract contract = Contract::kCanonical)
      : job_(job), rank_(rank), heap_(job.heaps[static_cast<size_t>(rank)]), contract_(contract) {}

  NodeLayout layout() const { return job_.layout; }
  int node() const { return job_.layout.node_of(rank_); }
  int local() const { return job_.layout.local_of(rank_); }
  T* output() const { return reinterpret_cast<T*>(heap_.output.data()); }
  const T* input() const { return reinterpret_cast<const T*>(heap_.input.data()); }
  T* scratch() const { return reinterpret_cast<T*>(heap_.scratch.data()); }
  float* carry_in() const { return reinterpret_cast<float*>(heap_.carry_in.data()); }
  float* carry_out() const { return reinterpret_cast<float*>(heap_.carry_out.data()); }
  Contract contract() const { return contract_; }

  void group(const Transfer* transfers, int count) { job_.network.group(rank_, transfers, count); }
  void fold(const NodeFoldArgs<T>& a) {
    if (contract_ == Contract::kTree) {
      job_.template launch<Contract::kTree>(rank_, "node_fold", [&a](auto& ctx) { node_fold<T>(ctx, a); });
    } else {
      job_.launch(rank_, "node_fold", [&a](auto& ctx) { node_fold<T>(ctx, a); });
    }
  }
  void combine(const NodeCombineArgs& a) {
    job_.launch(rank_, "node_tree_combine", [&a](auto& ctx) { node_tree_combine<T>(ctx, a); });
  }
  void gather(const NodeGatherArgs& a) {
    job_.launch(rank_, "node_gather", [&a](auto& ctx) { node_gather<T>(ctx, a); });
  }
  void gather_inputs(const NodeGatherInputsArgs& a) {
    job_.launch(rank_, "node_gather_inputs", [&a](auto& ctx) { node_gather_inputs<T>(ctx, a); });
  }
  void copy(T* dst, const T* src, size_t elements) { std::memcpy(dst, src, elements * sizeof(T)); }

 private:
  Job<T>& job_;
  int rank_;
  RankHeap& heap_;
  Contract contract_;
};

template <class F>
void with_type(DType d, F&& f) {
  switch (d) {
    case DType::kBF16: f(bf16{}); break;
    case DType::kFP16: f(fp16{}); break;
    case DType::kFP32: f(float{}); break;
  }
}

std::string check_common(int blocks, size_t chunk_elements, const NodeLayout& layout) {
  if (blocks < 1 || blocks > kMaxBlocks) {
    return "blocks must be 1.." + std::to_string(kMaxBlocks) + ", not " + std::to_string(blocks);
  }
  if (chunk_elements == 0 || chunk_elements % 64 != 0) {
    return "the chunk must be a positive multiple of 64 elements, not " + std::to_string(chunk_elements);
  }
  if (layout.local_ranks < 1 || layout.local_ranks > kMaxRanks || layout.nodes < 1) {
    return "a node has 1.." + std::to_string(kMaxRanks) + " local ranks (IPC worlds), not " +
           std::to_string(layout.local_ranks);
  }
  return "";
}

}  // namespace

// "" or why contract cannot run on layout: not a library contract, or tree on a layout whose
// tree is not the tree over node subtrees (check_tree_layout).
std::string check_contract(Contract contract, const NodeLayout& layout) {
  if (!info(contract).library_contract || (info(contract).runs_on & kOnMultiNode) == 0) {
    return std::string("across nodes the collectives fold under ") + library_contract_names(kOnMultiNode) + ", not " +
           contract_name(contract);
  }
  return contract == Contract::kTree ? check_tree_layout(layout) : "";
}

std::string check_multinode_spec(const MultiNodeSpec& spec, const NodeLayout& layout) {
  if (spec.count == 0) return "count must be >= 1";
  if (spec.result_slots < 1 || spec.result_slots > 2) return "result_slots must be 1 or 2";
  if (std::string problem = check_contract(spec.contract, layout); !problem.empty()) return problem;
  const size_t n = static_cast<size_t>(layout.world_size());
  if (spec.op == Op::kReduceScatter && spec.count % n != 0) {
    return "reduce_scatter needs a count that is a multiple of the " + std::to_string(n) + " ranks, not " +
           std::to_string(spec.count);
  }
  return check_common(spec.blocks, spec.chunk_elements, layout);
}

void run_multinode(const NetworkOptions& net, const MultiNodeSpec& spec, const std::vector<const void*>& inputs,
                   const std::vector<void*>& outputs, MultiNodeTrace* trace,
                   const std::vector<uint64_t>& trace_elements) {
  const std::string problem = check_multinode_spec(spec, net.layout);
  if (!problem.empty()) throw std::invalid_argument(problem);
  const int n = net.layout.world_size();
  if (static_cast<int>(inputs.size()) != n || static_cast<int>(outputs.size()) != n) {
    throw std::invalid_argument("one input and one output per rank are needed (" + std::to_string(n) + " ranks)");
  }
  const bool tree = spec.contract == Contract::kTree;
  with_type(spec.dtype, [&](auto tag) {
    using T = decltype(tag);
    const size_t out_count = output_count(spec.op, spec.count, n);
    Job<T> job(net, spec.blocks, spec.count, out_count,
               buffer_needs<T>(spec.op, net.layout, spec.count, spec.chunk_elements, spec.contract), trace_elements);
    for (int r = 0; r < n; ++r)
      std::memcpy(job.heaps[static_cast<size_t>(r)].input.data(), inputs[static_cast<size_t>(r)],
                  spec.count * sizeof(T));
    job.network.run([&](int rank) {
      SimPrims<T> prims(job, rank, spec.contract);
      if (spec.op == Op::kAllReduce && tree) {
        tree_allreduce<T>(prims, spec.count, spec.chunk_elements, spec.tree_steps_top_down);
      } else if (spec.op == Op::kAllReduce) {
        allreduce<T>(prims, spec.count, spec.chunk_elements, spec.result_slots);
      } else if (spec.op == Op::kReduceScatter && tree) {
        tree_reduce_scatter<T>(prims, spec.count, spec.chunk_elements);
      } else if (spec.op == Op::kReduceScatter) {
        reduce_scatter<T>(prims, spec.count, spec.chunk_elements);
      } else {
        allgather<T>(prims, spec.count, spec.chunk_elements);
      }
    });
    for (int r = 0; r < n; ++r)
      std::memcpy(outputs[static_cast<size_t>(r)], job.heaps[static_cast<size_t>(r)].output.data(),
                  out_count * sizeof(T));
    if (trace != nullptr) *trace = job.trace();
  });
}

std::string check_multinode_fused_spec(const MultiNodeFusedSpec& spec, const NodeLayout& layout) {
  if (spec.rows < 1) return "rows must be >= 1, not " + std::to_string(spec.rows);
  const int pack = pack_elements(spec.dtype);
  if (spec.hidden <= 0 || spec.hidden % pack != 0) {
    return "the hidden size must be a positive multiple of " + std::to_string(pack) + " (the pack), not " +
           std::to_string(spec.hidden);
  }
  if (std::string problem = check_contract(spec.contract, layout); !problem.empty()) return problem;
  return check_common(spec.blocks, spec.chunk_elements, layout);
}

void run_multinode_fused(const NetworkOptions& net, const MultiNodeFusedSpec& spec, const MultiNodeFusedIo& io,
                         MultiNodeTrace* trace) {
  const std::string problem = check_multinode_fused_spec(spec, net.layout);
  if (!problem.empty()) throw std::invalid_argument(problem);
  const int n = net.layout.world_size();
  for (const size_t size : {io.x.size(), io.residual.size(), io.weight.size(), io.residual_out.size(), io.out.size()}) {
    if (static_cast<int>(size) != n) throw std::invalid_argument("every fused buffer needs one pointer per rank");
  }
  with_type(spec.dtype, [&](auto tag) {
    using T = decltype(tag);
    const size_t count = static_cast<size_t>(spec.rows) * static_cast<size_t>(spec.hidden);
    const size_t H = static_cast<size_t>(spec.hidden);
    Job<T> job(net, spec.blocks, count, count,
               buffer_needs<T>(Op::kAllReduce, net.layout, count, spec.chunk_elements, spec.contract), {});
    for (int r = 0; r < n; ++r) {
      RankHeap& h = job.heaps[static_cast<size_t>(r)];
      h.residual = Region(count * sizeof(T));
      h.weight = Region(H * sizeof(T));
      h.out = Region(count * sizeof(T));
      std::memcpy(h.input.data(), io.x[static_cast<size_t>(r)], count * sizeof(T));
      std::memcpy(h.residual.data(), io.residual[static_cast<size_t>(r)], count * sizeof(T));
      std::memcpy(h.weight.data(), io.weight[static_cast<size_t>(r)], H * sizeof(T));
    }
    job.network.run([&](int rank) {
      // 1. The all-reduce of x into residual_out (this rank's output buffer), as s: the chain, or
      //    the tree's exchange under the tree contract.
      SimPrims<T> prims(job, rank, spec.contract);
      if (spec.contract == Contract::kTree) {
        tree_allreduce<T>(prims, count, spec.chunk_elements);
      } else {
        allreduce<T>(prims, count, spec.chunk_elements);
      }
      // 2. Locally: residual_out = residual_add(s, residual) in place, then out = RMSNorm(residual_out),
      //    each a launch of its own (the norm's rows need every block's residual_out).
      RankHeap& h = job.heaps[static_cast<size_t>(rank)];
      T* ro = reinterpret_cast<T*>(h.output.data());
      const T* residual = reinterpret_cast<const T*>(h.residual.data());
      job.launch(rank, "residual_add", [&](auto& ctx) {
        fused::with_fused_ctx(ctx, [&](auto& f) { residual_add_step<T>(f, ro, residual, ro, count); });
      });
      job.launch(rank, "rmsnorm", [&](auto& ctx) {
        fused::with_fused_ctx(ctx, [&](auto& f) {
          rmsnorm_step<T>(f, ro, reinterpret_cast<const T*>(h.weight.data()), reinterpret_cast<T*>(h.out.data()),
                          spec.rows, spec.hidden, spec.eps);
        });
      });
    });
    for (int r = 0; r < n; ++r) {
      const RankHeap& h = job.heaps[static_cast<size_t>(r)];
      std::memcpy(io.residual_out[static_cast<size_t>(r)], h.output.data(), count * sizeof(T));
      std::memcpy(io.out[static_cast<size_t>(r)], h.out.data(), count * sizeof(T));
    }
    if (trace != nullptr) *trace = job.trace();
  });
}

}  // namespace exactcoll::multinode

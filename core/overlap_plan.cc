#include "core/overlap_plan.h"

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>
#include <tuple>

namespace exactcoll::overlap {

const char* pattern_name(Pattern p) { return p == Pattern::kAgMatmul ? "ag_matmul" : "prefetch"; }

bool parse_pattern(const std::string& text, Pattern* out) {
  if (text == "ag_matmul") {
    *out = Pattern::kAgMatmul;
    return true;
  }
  if (text == "prefetch") {
    *out = Pattern::kPrefetch;
    return true;
  }
  return false;
}

const char* grouping_name(ProductGrouping g) {
  switch (g) {
    case ProductGrouping::kPerShard: return "per_shard";
    case ProductGrouping::kMerged: return "merged";
    case ProductGrouping::kPairs: return "pairs";
  }
  return "?";
}

bool parse_grouping(const std::string& text, ProductGrouping* out) {
  for (ProductGrouping g : {ProductGrouping::kPerShard, ProductGrouping::kMerged, ProductGrouping::kPairs}) {
    if (text == grouping_name(g)) {
      *out = g;
      return true;
    }
  }
  return false;
}

int max_shards_per_product(ProductGrouping g, int world_size) {
  switch (g) {
    case ProductGrouping::kPerShard: return 1;
    case ProductGrouping::kMerged: return world_size;
    case ProductGrouping::kPairs: return 2;
  }
  return 1;
}

const char* op_name(OpKind kind) {
  switch (kind) {
    case OpKind::kSignalReady: return "signal_ready";
    case OpKind::kWaitReady: return "wait_ready";
    case OpKind::kPullShard: return "pull_shard";
    case OpKind::kCopyOwnShard: return "copy_own_shard";
    case OpKind::kSignalConsumed: return "signal_consumed";
    case OpKind::kRecordArrival: return "record_arrival";
    case OpKind::kWaitArrival: return "wait_arrival";
    case OpKind::kMatmul: return "matmul";
    case OpKind::kWaitConsumed: return "wait_consumed";
  }
  return "?";
}

RankPlan make_plan(Pattern pattern, int rank, int world_size, int comm_streams, ProductGrouping grouping) {
  if (world_size < 1 || world_size > kMaxOverlapRanks) {
    throw std::invalid_argument("overlap: world size must be 1.." + std::to_string(kMaxOverlapRanks) + ", not " +
                                std::to_string(world_size));
  }
  if (rank < 0 || rank >= world_size) {
    throw std::invalid_argument("overlap: rank " + std::to_string(rank) + " outside a world of " +
                                std::to_string(world_size));
  }
  if (comm_streams < 1) throw std::invalid_argument("overlap: at least one communication stream is needed");
  RankPlan plan;
  plan.pattern = pattern;
  plan.grouping = grouping;
  plan.rank = rank;
  plan.world_size = world_size;
  plan.streams.resize(static_cast<size_t>(comm_streams) + 1);
  for (int s = 0; s < comm_streams; ++s) plan.streams[static_cast<size_t>(s)].name = "comm" + std::to_string(s);
  plan.streams.back().name = "compute";
  auto comm = [&](int s) -> std::vector<PlanOp>& { return plan.streams[static_cast<size_t>(s)].ops; };
  std::vector<PlanOp>& compute = plan.streams.back().ops;

  // 1. The owner marks its shard ready for every puller (first thing on comm stream 0).
  for (int j = 1; j < world_size; ++j)
    comm(0).push_back({OpKind::kSignalReady, -1, shard_of_step(rank, j, world_size)});
  // 2. Its own shard goes into the gathered A on the last comm stream (idle at first when there
  //    are two or more).
  comm(comm_streams - 1).push_back({OpKind::kCopyOwnShard, 0, rank});
  // 3. Step j pulls shard rank+j on comm stream (j-1) mod comm_streams: wait, copy, release, tell compute.
  for (int j = 1; j < world_size; ++j) {
    const int owner = shard_of_step(rank, j, world_size);
    std::vector<PlanOp>& ops = comm((j - 1) % comm_streams);
    ops.push_back({OpKind::kWaitReady, j, owner});
    ops.push_back({OpKind::kPullShard, j, owner});
    ops.push_back({OpKind::kSignalConsumed, j, owner});
    ops.push_back({OpKind::kRecordArrival, j, owner});
  }
  // 4. The compute stream: the products, then the owner's wait until every puller is done.
  if (pattern == Pattern::kAgMatmul) {
    compute.push_back({OpKind::kMatmul, 0, rank, 1});
    // The after block [rank+1, n), then the before block [0, rank) (ProductGrouping says why),
    // each cut into products of at most `most` shards in pull order (ascending shard index).
    const int most = max_shards_per_product(grouping, world_size);
    for (const ShardRange block : {ShardRange{rank + 1, world_size - rank - 1}, ShardRange{0, rank}}) {
      for (int first = block.first; first < block.first + block.count; first += most) {
        const int count = std::min(most, block.first + block.count - first);
        for (int shard = first; shard < first + count; ++shard) {
          compute.push_back({OpKind::kWaitArrival, step_of_shard(rank, shard, world_size), shard});
        }
        const int step = count == 1 ? step_of_shard(rank, first, world_size) : -1;
        compute.push_back({OpKind::kMatmul, step, first, count});
      }
    }
  } else {
    compute.push_back({OpKind::kMatmul, -1, -1});
  }
  for (int j = 1; j < world_size; ++j) {
    compute.push_back({OpKind::kWaitConsumed, -1, shard_of_step(rank, j, world_size)});
  }
  return plan;
}

std::vector<ShardRange> product_ranges(const RankPlan& plan) {
  std::vector<ShardRange> out;
  for (const PlanOp& op : plan.compute().ops) {
    if (op.kind == OpKind::kMatmul) out.push_back({op.peer, op.shards});
  }
  return out;
}

namespace {

std::string where(const RankPlan& plan, size_t stream, size_t index) {
  return "rank " + std::to_string(plan.rank) + " " + plan.streams[stream].name + " op " + std::to_string(index) + " (" +
         op_name(plan.streams[stream].ops[index].kind) + ")";
}

// Returns "" when the kAgMatmul product ops[i] (on the compute stream) covers valid shards, is
// the local shard alone exactly when it is step 0, and comes after the wait_arrival of every
// peer shard it covers; else what is wrong.
std::string check_product(const RankPlan& plan, const std::vector<PlanOp>& ops, size_t i) {
  const PlanOp& op = ops[i];
  const int n = plan.world_size, me = plan.rank;
  if (op.shards < 1 || op.peer < 0 || op.peer + op.shards > n) {
    return "shards [" + std::to_string(op.peer) + ", " + std::to_string(op.peer + op.shards) + ") outside 0.." +
           std::to_string(n);
  }
  const bool covers_own = op.peer <= me && me < op.peer + op.shards;
  if ((op.step == 0) != covers_own || (covers_own && op.shards != 1)) {
    return "the own shard must be multiplied alone, at step 0 (from the symmetric buffer)";
  }
  if (covers_own) return "";  // reads the symmetric buffer: nothing to wait for
  const int expected_step = op.shards == 1 ? step_of_shard(me, op.peer, n) : -1;
  if (op.step != expected_step) return "step " + std::to_string(op.step) + ", not " + std::to_string(expected_step);
  for (int shard = op.peer; shard < op.peer + op.shards; ++shard) {
    const int step = step_of_shard(me, shard, n);
    bool waited = false;
    for (size_t b = 0; b < i; ++b) waited = waited || (ops[b].kind == OpKind::kWaitArrival && ops[b].step == step);
    if (!waited)
      return "product of shard " + std::to_string(shard) + " (step " + std::to_string(step) +
             ") before its shard arrived";
  }
  return "";
}

// Structural checks of one rank's plan.
std::string check_structure(const RankPlan& plan) {
  const int n = plan.world_size;
  const int me = plan.rank;
  if (plan.streams.size() < 2) return "rank " + std::to_string(me) + ": a plan needs a comm and a compute stream";
  std::map<int, int> pulls, ready_signals, consumed_waits, matmul_shards;
  int own_copies = 0, products = 0;
  std::set<int> recorded;
  for (size_t s = 0; s < plan.streams.size(); ++s) {
    const auto& ops = plan.streams[s].ops;
    const bool is_compute = s + 1 == plan.streams.size();
    for (size_t i = 0; i < ops.size(); ++i) {
      const PlanOp& op = ops[i];
      const bool peer_ok = op.peer >= 0 && op.peer < n && op.peer != me;
      switch (op.kind) {
        case OpKind::kSignalReady:
          if (!peer_ok) return where(plan, s, i) + ": no valid peer";
          ++ready_signals[op.peer];
          break;
        case OpKind::kPullShard:
          if (!peer_ok) return where(plan, s, i) + ": no valid peer";
          if (op.peer != shard_of_step(me, op.step, n)) {
            return where(plan, s, i) + ": step " + std::to_string(op.step) + " must pull shard " +
                   std::to_string(shard_of_step(me, op.step, n)) + ", not " + std::to_string(op.peer);
          }
          if (i == 0 || ops[i - 1].kind != OpKind::kWaitReady || ops[i - 1].peer != op.peer) {
            return where(plan, s, i) + ": not guarded by wait_ready of rank " + std::to_string(op.peer);
          }
          if (i + 1 >= ops.size() || ops[i + 1].kind != OpKind::kSignalConsumed || ops[i + 1].peer != op.peer) {
            return where(plan, s, i) + ": not followed by signal_consumed to rank " + std::to_string(op.peer);
          }
          ++pulls[op.peer];
          break;
        case OpKind::kCopyOwnShard: ++own_copies; break;
        case OpKind::kRecordArrival: {
          bool pulled_before = false;
          for (size_t b = 0; b < i; ++b) {
            pulled_before = pulled_before || (ops[b].kind == OpKind::kPullShard && ops[b].step == op.step);
          }
          if (!pulled_before)
            return where(plan, s, i) + ": step " + std::to_string(op.step) + " recorded before its pull";
          recorded.insert(op.step);
          break;
        }
        case OpKind::kMatmul:
          if (!is_compute) return where(plan, s, i) + ": products belong on the compute stream";
          ++products;
          if (plan.pattern == Pattern::kAgMatmul) {
            if (const std::string problem = check_product(plan, ops, i); !problem.empty()) {
              return where(plan, s, i) + ": " + problem;
            }
            for (int shard = op.peer; shard < op.peer + op.shards; ++shard) ++matmul_shards[shard];
          }
          break;
        case OpKind::kWaitConsumed:
          if (!peer_ok) return where(plan, s, i) + ": no valid peer";
          if (!is_compute)
            return where(plan, s, i) + ": wait_consumed belongs on the compute stream (it ends the call)";
          ++consumed_waits[op.peer];
          break;
        case OpKind::kWaitReady:
        case OpKind::kSignalConsumed:
          if (!peer_ok) return where(plan, s, i) + ": no valid peer";
          break;
        case OpKind::kWaitArrival:
          if (!is_compute) return where(plan, s, i) + ": wait_arrival belongs on the compute stream";
          break;
      }
    }
  }
  const std::string who = "rank " + std::to_string(me) + ": ";
  if (own_copies != 1) return who + "its own shard is copied " + std::to_string(own_copies) + " times, not once";
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    if (pulls[p] != 1)
      return who + "shard " + std::to_string(p) + " is pulled " + std::to_string(pulls[p]) + " times, not once";
    if (ready_signals[p] != 1)
      return who + "marks its shard ready for rank " + std::to_string(p) + " " + std::to_string(ready_signals[p]) +
             " times, not once";
    if (consumed_waits[p] != 1)
      return who + "waits for rank " + std::to_string(p) + "'s consumed signal " + std::to_string(consumed_waits[p]) +
             " times, not once";
  }
  if (plan.pattern == Pattern::kAgMatmul) {
    for (int p = 0; p < n; ++p) {
      if (matmul_shards[p] != 1)
        return who + "computes the rows of C of shard " + std::to_string(p) + " " + std::to_string(matmul_shards[p]) +
               " times, not once";
    }
  } else if (products != 1) {
    return who + "prefetch runs " + std::to_string(products) + " products, not one";
  }
  return "";
}

}  // namespace

std::string check_plans(const std::vector<RankPlan>& plans) {
  const int n = static_cast<int>(plans.size());
  for (int r = 0; r < n; ++r) {
    if (plans[static_cast<size_t>(r)].rank != r || plans[static_cast<size_t>(r)].world_size != n) {
      return "plan " + std::to_string(r) + " is for rank " + std::to_string(plans[static_cast<size_t>(r)].rank) +
             " of " + std::to_string(plans[static_cast<size_t>(r)].world_size);
    }
    const std::string problem = check_structure(plans[static_cast<size_t>(r)]);
    if (!problem.empty()) return problem;
  }
  // An abstract run of one call in the threads scheduler's order: each rank runs its streams one
  // after the other in index order, ranks concurrently. Signals set booleans; a wait is enabled
  // once its signal was set. If this order completes, every interleaving that respects the
  // signals completes (waits only ever become enabled), and the threads scheduler is legal.
  std::set<std::tuple<int, int, int>> ready, consumed, arrived;  // (reader, writer or step, 0)
  std::vector<size_t> stream(static_cast<size_t>(n), 0), index(static_cast<size_t>(n), 0);
  while (true) {
    bool progress = false, unfinished = false;
    for (int r = 0; r < n; ++r) {
      const RankPlan& plan = plans[static_cast<size_t>(r)];
      size_t& s = stream[static_cast<size_t>(r)];
      size_t& i = index[static_cast<size_t>(r)];
      while (s < plan.streams.size()) {
        if (i >= plan.streams[s].ops.size()) {
          ++s;
          i = 0;
          continue;
        }
        const PlanOp& op = plan.streams[s].ops[i];
        bool enabled = true;
        switch (op.kind) {
          case OpKind::kSignalReady: ready.insert({op.peer, r, 0}); break;
          case OpKind::kSignalConsumed: consumed.insert({op.peer, r, 0}); break;
          case OpKind::kRecordArrival: arrived.insert({r, op.step, 0}); break;
          case OpKind::kWaitReady: enabled = ready.count({r, op.peer, 0}) > 0; break;
          case OpKind::kWaitConsumed: enabled = consumed.count({r, op.peer, 0}) > 0; break;
          case OpKind::kWaitArrival: enabled = arrived.count({r, op.step, 0}) > 0; break;
          default: break;
        }
        if (!enabled) break;
        ++i;
        progress = true;
      }
      unfinished = unfinished || s < plan.streams.size();
    }
    if (!unfinished) return "";
    if (!progress) {
      std::string stuck;
      for (int r = 0; r < n; ++r) {
        const RankPlan& plan = plans[static_cast<size_t>(r)];
        const size_t s = stream[static_cast<size_t>(r)];
        if (s < plan.streams.size())
          stuck += (stuck.empty() ? "" : "; ") + where(plan, s, index[static_cast<size_t>(r)]);
      }
      return "the plans deadlock when each rank runs its streams in order: " + stuck;
    }
  }
}

std::string plan_text(const RankPlan& plan) {
  std::string out;
  for (const StreamPlan& s : plan.streams) {
    out += s.name + ":";
    for (const PlanOp& op : s.ops) {
      out += " ";
      out += op_name(op.kind);
      std::string args;
      if (op.kind == OpKind::kMatmul && op.shards > 1) {
        args = std::to_string(op.peer) + ".." + std::to_string(op.peer + op.shards - 1);
      } else if (op.peer >= 0) {
        args += std::to_string(op.peer);
      }
      if (op.step >= 0) args += (args.empty() ? "s" : ",s") + std::to_string(op.step);
      out += "(" + args + ")";
    }
    out += "\n";
  }
  return out;
}

}  // namespace exactcoll::overlap

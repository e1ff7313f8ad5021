// The all-gather + matmul overlap schedules, written once as data: for every rank, an ordered list
// of operations per stream. The simulator (sim/overlap/overlap_sim.h) runs each stream as one
// simulated block; the CUDA backend (cuda_backend/overlap/pipeline.h) enqueues each operation on a
// CUDA stream. Plain C++, no simulator or CUDA dependency, so both backends walk the same plan.
//
// ---- The two patterns ----------------------------------------------------------------------------
// kAgMatmul (tensor parallel): A [m, k] is sharded by rows over n ranks (shard r = rows
//   [r*m/n, (r+1)*m/n)), B [k, n_out] is replicated, every rank computes C = allgather(A) @ B.
//   Step 0 multiplies the local shard (read from this rank's own symmetric buffer) while the
//   communication streams pull the peers' shards in the order rank+1, rank+2, ... (step j pulls
//   shard (rank + j) mod n on comm stream (j - 1) mod comm_streams). The peers' rows are multiplied
//   as the ProductGrouping below says: one product per shard (kPerShard, step j's product waits
//   only for step j's shard), or fewer, larger products over contiguous rows of C.
// kPrefetch (FSDP style): the same all-gather, with no data dependency, beside one unrelated
//   product on the compute stream.
//
// ---- The "get" protocol ----------------------------------------------------------------------------
// Each rank's symmetric memory holds its shard and an OverlapFlags block. Flags carry the call's
// epoch (1, 2, ... counted by the host, equal on every rank).
//   1. The owner marks its shard ready: for every peer q it stores the epoch into q's ready[owner]
//      (signal_ready). The shard was written before the call (stream order).
//   2. The puller waits until its OWN ready[owner] holds the epoch (wait_ready): the state is
//      mirrored into the puller's memory, so the wait polls local memory, never a peer's.
//   3. It copies the shard into its gathered A (pull_shard: a copy engine on the GPU), then
//      stores the epoch into the owner's consumed[puller] (signal_consumed).
//   4. Before the call ends, the owner waits until its OWN consumed[q] holds the epoch for every
//      peer q (wait_consumed): after that nobody reads its shard, so the next call may overwrite it.
// Why equality waits suffice: the owner stores epoch e+1 into ready[owner] only after its
// wait_consumed for e, which needs this puller's consumed e, sent after its wait_ready e; and a
// puller stores e+1 into consumed[] only after wait_ready e+1, sent after the owner's
// wait_consumed e. So a slot never moves past e before its reader has seen e.
// Local stream-to-stream dependencies (step j's product after step j's pull) are record_arrival /
// wait_arrival: CUDA events on the GPU, a local flag in the simulator.
//
// ---- Stream layout ---------------------------------------------------------------------------------
// streams[0 .. comm_streams-1] are communication streams, streams.back() is the compute stream.
// Every cross-stream wait goes from a later stream to an earlier one or across ranks, never from
// an earlier stream of a rank to a later stream of the same rank: the simulator's threads
// scheduler runs a rank's blocks in index order, and this ordering keeps that schedule legal.
//
// Example (rank 1 of 4, kAgMatmul, 2 comm streams, kPerShard; plan_text's form: op(peer,s<step>)):
//   comm0:   signal_ready(2) signal_ready(3) signal_ready(0)
//            wait_ready(2,s1) pull_shard(2,s1) signal_consumed(2,s1) record_arrival(2,s1)
//            wait_ready(0,s3) pull_shard(0,s3) signal_consumed(0,s3) record_arrival(0,s3)
//   comm1:   copy_own_shard(1,s0) wait_ready(3,s2) pull_shard(3,s2) signal_consumed(3,s2) record_arrival(3,s2)
//   compute: matmul(1,s0) wait_arrival(2,s1) matmul(2,s1) wait_arrival(3,s2) matmul(3,s2)
//            wait_arrival(0,s3) matmul(0,s3) wait_consumed(2) wait_consumed(3) wait_consumed(0)
// The same rank with kMerged (the comm streams unchanged; a product of shards 2 and 3 as matmul(2..3)):
//   compute: matmul(1,s0) wait_arrival(2,s1) wait_arrival(3,s2) matmul(2..3) wait_arrival(0,s3)
//            matmul(0,s3) wait_consumed(2) wait_consumed(3) wait_consumed(0)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace exactcoll::overlap {

inline constexpr int kMaxOverlapRanks = 16;

enum class Pattern : uint8_t { kAgMatmul, kPrefetch };

const char* pattern_name(Pattern p);
// Parses "ag_matmul" | "prefetch"; returns false otherwise.
bool parse_pattern(const std::string& text, Pattern* out);

// How kAgMatmul's compute stream groups the rows of C into products. Step 0 always multiplies the
// local shard alone (read in place, nothing to wait for). Rank r's other rows form at most two
// contiguous blocks of C: "after" = shards r+1 .. n-1 (pulled at steps 1 .. n-1-r) and "before" =
// shards 0 .. r-1 (pulled at steps n-r .. n-1); rank 0 has no before block, rank n-1 no after
// block. Each block is cut, in pull order, into products of at most max_shards_per_product()
// shards, and each product waits for the arrival of every shard it covers.
//   kPerShard  one product per shard: the products follow the pulls step by step.
//   kMerged    each block in one product: two peer products at most (one on ranks 0 and n-1).
//   kPairs     at most two shards per product.
// Order: the after block first. Its shards are the first ones pulled, so its products wait only
// for a prefix of the pulls, and the before block's last product, which waits for the last pull
// in either order, comes as late as possible; before-first would hold the compute stream at its
// first peer product until the last pull. No order helps ranks 0 and n-1 under kMerged: their one
// peer product covers every peer shard and so waits for the whole all-gather, while step 0's
// product may end sooner (on 4 H200s, 512-row shard product ~190 us, all-gather alone ~266 us).
// kPairs bounds the first peer product's wait by the second pull, which with two or more comm
// streams runs beside the first.
enum class ProductGrouping : uint8_t { kPerShard, kMerged, kPairs };

const char* grouping_name(ProductGrouping g);
// Parses "per_shard" | "merged" | "pairs"; returns false otherwise.
bool parse_grouping(const std::string& text, ProductGrouping* out);
// Returns the most shards one product covers under g in a world of world_size ranks.
int max_shards_per_product(ProductGrouping g, int world_size);

enum class OpKind : uint8_t {
  kSignalReady,     // peer: store epoch into peer's ready[rank]
  kWaitReady,       // peer, step: wait until own ready[peer] == epoch
  kPullShard,       // peer, step: copy peer's shard into gathered rows of shard `peer`
  kCopyOwnShard,    // step 0: copy own shard into own gathered rows
  kSignalConsumed,  // peer, step: store epoch into peer's consumed[rank]
  kRecordArrival,   // step: step's shard is in gathered (for the compute stream)
  kWaitArrival,     // step: wait for record_arrival(step)
  kMatmul,          // kAgMatmul: rows of shards [peer, peer + shards) (step 0: the own shard, read from the
                    // own symmetric buffer); kPrefetch: the unrelated product (peer = -1, step = -1)
  kWaitConsumed,    // peer: wait until own consumed[peer] == epoch
};

const char* op_name(OpKind kind);

struct PlanOp {
  OpKind kind = OpKind::kMatmul;
  int step = 0;    // pipeline step (0 = own shard); -1 where no step applies (a product of several shards)
  int peer = -1;   // the other rank (or the shard's owner for a pull; the first shard for matmul), -1 where none
  int shards = 1;  // kMatmul of kAgMatmul: how many consecutive shards (rows of C) it covers
};

// Rows of C of shards [first, first + count): one product's rows.
struct ShardRange {
  int first = 0;
  int count = 1;
};

struct StreamPlan {
  std::string name;  // "comm0", "comm1", ..., "compute"
  std::vector<PlanOp> ops;
};

struct RankPlan {
  Pattern pattern = Pattern::kAgMatmul;
  ProductGrouping grouping = ProductGrouping::kPerShard;  // kAgMatmul only
  int rank = 0;
  int world_size = 1;
  std::vector<StreamPlan> streams;  // comm streams first, the compute stream last
  const StreamPlan& compute() const { return streams.back(); }
  int comm_streams() const { return static_cast<int>(streams.size()) - 1; }
};

// Shared layout of a rank's flag block in symmetric memory (zeroed once at allocation).
// ready[p]: written by owner p, read by this rank. consumed[q]: written by puller q, read by this
// rank. arrived[j]: the simulator's local flag for record/wait_arrival of step j (the GPU uses
// CUDA events and leaves it untouched).
struct OverlapFlags {
  uint32_t ready[kMaxOverlapRanks];
  uint32_t consumed[kMaxOverlapRanks];
  uint32_t arrived[kMaxOverlapRanks];
};

// Trace "set" numbers of the three flag kinds (the simulator's signal/wait events carry them).
inline constexpr int kFlagReady = 0;
inline constexpr int kFlagConsumed = 1;
inline constexpr int kFlagArrived = 2;

// Returns the shard rank `rank` works on at pipeline step `step`: (rank + step) mod world_size.
inline int shard_of_step(int rank, int step, int world_size) { return (rank + step) % world_size; }
// Returns the step at which rank `rank` pulls shard `shard` (0: its own): the inverse of shard_of_step.
inline int step_of_shard(int rank, int shard, int world_size) { return (shard - rank + world_size) % world_size; }

// Returns rank's plan. `grouping` applies to kAgMatmul (kPrefetch has one unrelated product).
// Preconditions: 1 <= world_size <= kMaxOverlapRanks, 0 <= rank < world_size, comm_streams >= 1.
// Throws std::invalid_argument otherwise.
RankPlan make_plan(Pattern pattern, int rank, int world_size, int comm_streams = 2,
                   ProductGrouping grouping = ProductGrouping::kPerShard);

// Returns the row ranges of a kAgMatmul plan's products, in compute-stream order: what an
// unpipelined reference must multiply to give the same bits (a product's bits may depend on its
// row count: cuBLASLt's algorithm and Eigen's blocking are chosen per shape).
std::vector<ShardRange> product_ranges(const RankPlan& plan);

// Returns "" when `plans` (one per rank, index = rank) is a complete, deadlock-free get protocol:
// every shard pulled exactly once per peer, each pull preceded on its stream by the wait_ready of
// the same peer and followed by its signal_consumed, every wait matched by a signal, every
// cross-stream dependency legal for the stream layout above; for kAgMatmul every row of C
// produced by exactly one product, the local shard's product alone at step 0, and every other
// product after the arrival of every shard it covers. Otherwise what is wrong (naming rank,
// stream and op).
std::string check_plans(const std::vector<RankPlan>& plans);

// One line per stream: "comm0: signal_ready(0) wait_ready(2,s1) ...", a product of several
// shards as "matmul(first..last)".
std::string plan_text(const RankPlan& plan);

}  // namespace exactcoll::overlap

// The registry: one constexpr table each for the ops, the collective algorithms, the fused
// all-reduce + residual + RMSNorm algorithms and the rounding contracts. Every layer takes its
// enum, its names and its lists from here:
//   - the simulator (sim::) and the CUDA backend (cuda::) use these enums themselves;
//   - an enumerator's value is the C API's value (include/exactcoll/exactcoll.h: EXACTCOLL_ALGO_*,
//     EXACTCOLL_FUSED_*, EXACTCOLL_CONTRACT_*, EXACTCOLL_OP_*; python/tests/test_api.py holds
//     every entry to its line of the installed header);
//   - the C API's *_name / *_from_name functions, Python's ALGOS / FUSED_ALGOS (read from the
//     library) and every --help list come from the tables' names;
//   - tests/capi/enum_names_test.cc and tests/sim/collectives_test.cc fail when an entry lacks a
//     piece: a runner in a layer that claims it (the simulator runs it against the reference, the
//     GPU dispatch has a launcher and a kernel), a C name.
// docs/design.md ("Add an op, an algorithm or a contract") lists the files a new entry touches.
//
// Host+device: the enums are used in kernels; the tables and lookups are host code (constexpr, so
// nvcc accepts them in headers it compiles).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace exactcoll {

// ---- where an entry runs ----------------------------------------------------------------------

// Bits of an entry's `runs_on`.
inline constexpr uint8_t kOnSimulator = 1;  // sim/ (the CLI's sim commands, exactcoll.sim, C exactcoll_sim_*)
inline constexpr uint8_t kOnGpu = 2;        // cuda_backend/'s single-node communicator (IPC)
inline constexpr uint8_t kOnMultiNode = 4;  // cuda_backend/multinode/ (IPC inside nodes, NCCL between)

// ---- ops --------------------------------------------------------------------------------------

// New values go at the end (tables, traces and the C API's exactcoll_op numbering rely on it).
enum class Op : uint8_t { kAllReduce, kReduceScatter, kAllGather };

constexpr uint8_t op_bit(Op op) { return static_cast<uint8_t>(1u << static_cast<unsigned>(op)); }
inline constexpr uint8_t kEveryOp = 0x7;

struct OpInfo {
  Op op;
  const char* name;  // the CLI's, the tables' and the traces' spelling
  uint8_t runs_on;
  const char* summary;  // one line saying what it does (the table is its documentation)
};

// Indexed by value.
inline constexpr OpInfo kOpInfos[] = {
    {Op::kAllReduce, "allreduce", kOnSimulator | kOnGpu | kOnMultiNode,
     "every rank gets the sum of every rank's input"},
    {Op::kReduceScatter, "reduce_scatter", kOnSimulator | kOnGpu | kOnMultiNode,
     "rank r gets slice r of the sum (count must be a multiple of the ranks)"},
    {Op::kAllGather, "allgather", kOnSimulator | kOnGpu | kOnMultiNode,
     "every rank gets every rank's input, rank after rank"},
};

// Every Op, in the order the command line lists them.
inline constexpr Op kOps[] = {Op::kAllReduce, Op::kReduceScatter, Op::kAllGather};

// The other spelling of op names: torch's and Python's, words apart (all_reduce, the rms_norm of
// fused_add_rms_norm), beside the canonical one that the C names, the tables, the traces and every
// printed line use (allreduce, fused_rmsnorm). Every front-end accepts both (canonical_op_name);
// the fused op has no Op of its own, but its CLI name is an op name all the same.
struct OpAlias {
  const char* alias;
  const char* name;  // canonical
};
inline constexpr OpAlias kOpAliases[] = {
    {"all_reduce", "allreduce"},
    {"all_gather", "allgather"},
    {"fused_rms_norm", "fused_rmsnorm"},
};

// Returns the canonical spelling of an op name: `name` itself unless it is an alias (kOpAliases).
// Example: canonical_op_name("all_reduce") == "allreduce"; canonical_op_name("allreduce") ==
// "allreduce"; canonical_op_name("bogus") == "bogus".
constexpr std::string_view canonical_op_name(std::string_view name) {
  for (const OpAlias& a : kOpAliases) {
    if (name == a.alias) return a.name;
  }
  return name;
}

// Returns the help text that documents the aliases, for every --help that takes an op name:
// "all_reduce, all_gather and fused_rms_norm are accepted for allreduce, allgather and fused_rmsnorm".
inline std::string op_aliases_note() {
  std::string aliases, names;
  constexpr size_t n = sizeof(kOpAliases) / sizeof(kOpAliases[0]);
  for (size_t i = 0; i < n; ++i) {
    const char* separator = i == 0 ? "" : i + 1 == n ? " and " : ", ";
    (aliases += separator) += kOpAliases[i].alias;
    (names += separator) += kOpAliases[i].name;
  }
  return aliases + " are accepted for " + names;
}

// ---- collective algorithms --------------------------------------------------------------------

// Values are the C API's EXACTCOLL_ALGO_*. New values go at the end.
enum class Algorithm : uint8_t {
  kAuto,
  kOneShot,
  kTwoShot,
  kPushOneShot,
  kPushTwoShot,
  kDirect,
  kCopyEngine,
  kNccl,
  kLamportOneShot,
  kLamportTwoShot,
};

// How the GPU runs an algorithm: the launcher family (cuda_backend/communicator.cc, launcher_for).
enum class Family : uint8_t {
  kChoice,      // auto: resolved to another entry before anything launches
  kSmKernels,   // one SM kernel per chunk (cuda_backend/kernel_args.h, sm_kernel_kind)
  kLamport,     // an SM kernel per Lamport slot, the input read in place
  kCopyEngine,  // copy-engine copies between two barriers
  kNccl,        // NCCL's own collective
};

// What an algorithm needs besides the input and output (the limits a caller meets).
enum class Needs : uint8_t {
  kNothing,
  kSliceScratch,   // two_shot: a slice of the message per rank
  kPushScratch,    // push_*: two halves of n receive slots of the message per rank (or chunks)
  kLamportRegion,  // lamport_*: three Lamport buffers of n slots (or chunks)
  kNcclCommunicator,
};

struct AlgorithmInfo {
  Algorithm algorithm;
  const char* name;
  uint8_t ops;          // op_bit(...) of the ops it implements
  uint8_t runs_on;      // kOnSimulator | kOnGpu | kOnMultiNode
  bool exact;           // its bits are the contract's (NCCL's sums follow none)
  bool picked_by_auto;  // one of the IPC algorithms the GPU's `auto` chooses among (the tuned table)
  Family family;
  Needs needs;
  // Peers never read this rank's input (they get its data through their own scratch or Lamport
  // region), so the GPU reads the input where the caller keeps it: no staging copy and no
  // registration, eager or in a CUDA graph. false (the safe default) stages it.
  bool input_private = false;
  const char* summary;  // one line saying what it does (the table is its documentation)
};

inline constexpr uint8_t kAllReduceOnly = op_bit(Op::kAllReduce);

// Indexed by value.
inline constexpr AlgorithmInfo kAlgorithmInfos[] = {
    {.algorithm = Algorithm::kAuto,
     .name = "auto",
     .ops = kEveryOp,
     .runs_on = kOnSimulator | kOnGpu | kOnMultiNode,
     .exact = true,
     .picked_by_auto = false,
     .family = Family::kChoice,
     .needs = Needs::kNothing,
     .summary = "the tuned table on GPUs; one_shot / two_shot by size in the simulator (same bits)"},
    {.algorithm = Algorithm::kOneShot,
     .name = "one_shot",
     .ops = kAllReduceOnly,
     .runs_on = kOnSimulator | kOnGpu,
     .exact = true,
     .picked_by_auto = true,
     .family = Family::kSmKernels,
     .needs = Needs::kNothing,
     .summary = "every rank reads every input and folds them (one barrier round)"},
    {.algorithm = Algorithm::kTwoShot,
     .name = "two_shot",
     .ops = kAllReduceOnly,
     .runs_on = kOnSimulator | kOnGpu,
     .exact = true,
     .picked_by_auto = true,
     .family = Family::kSmKernels,
     .needs = Needs::kSliceScratch,
     .summary = "reduce-scatter of slices, then an all-gather of the results"},
    {.algorithm = Algorithm::kPushOneShot,
     .name = "push_one_shot",
     .ops = kAllReduceOnly,
     .runs_on = kOnSimulator | kOnGpu,
     .exact = true,
     .picked_by_auto = true,
     .family = Family::kSmKernels,
     .needs = Needs::kPushScratch,
     .input_private = true,
     .summary = "inputs pushed into peers' scratch, one barrier per call"},
    {.algorithm = Algorithm::kPushTwoShot,
     .name = "push_two_shot",
     .ops = kAllReduceOnly,
     .runs_on = kOnSimulator | kOnGpu,
     .exact = true,
     .picked_by_auto = true,
     .family = Family::kSmKernels,
     .needs = Needs::kPushScratch,
     .input_private = true,
     .summary = "slices pushed to their owners, results pushed back (two barriers)"},
    {.algorithm = Algorithm::kDirect,
     .name = "direct",
     .ops = op_bit(Op::kReduceScatter) | op_bit(Op::kAllGather),
     .runs_on = kOnSimulator | kOnGpu,
     .exact = true,
     .picked_by_auto = true,
     .family = Family::kSmKernels,
     .needs = Needs::kNothing,
     .summary = "the SM kernel of reduce_scatter / allgather"},
    {.algorithm = Algorithm::kCopyEngine,
     .name = "copy_engine",
     .ops = op_bit(Op::kAllGather),
     .runs_on = kOnGpu,
     .exact = true,
     .picked_by_auto = true,
     .family = Family::kCopyEngine,
     .needs = Needs::kNothing,
     .summary = "all-gather by copy-engine copies between two barriers"},
    {.algorithm = Algorithm::kNccl,
     .name = "nccl",
     .ops = kEveryOp,
     .runs_on = kOnGpu | kOnMultiNode,
     .exact = false,
     .picked_by_auto = false,
     .family = Family::kNccl,
     .needs = Needs::kNcclCommunicator,
     .summary = "NCCL (baseline; its sums follow no contract)"},
    {.algorithm = Algorithm::kLamportOneShot,
     .name = "lamport_one_shot",
     .ops = kAllReduceOnly,
     .runs_on = kOnSimulator | kOnGpu,
     .exact = true,
     .picked_by_auto = true,
     .family = Family::kLamport,
     .needs = Needs::kLamportRegion,
     .input_private = true,
     .summary = "inputs pushed into peers' Lamport buffers, flag in the data (no barrier)"},
    {.algorithm = Algorithm::kLamportTwoShot,
     .name = "lamport_two_shot",
     .ops = kAllReduceOnly,
     .runs_on = kOnSimulator | kOnGpu,
     .exact = true,
     .picked_by_auto = true,
     .family = Family::kLamport,
     .needs = Needs::kLamportRegion,
     .input_private = true,
     .summary = "slices pushed to their owners' Lamport buffers, results pushed back (no barrier)"},
};

// ---- fused all-reduce + residual add + RMSNorm algorithms -------------------------------------

// Values are the C API's EXACTCOLL_FUSED_*. New values go at the end.
enum class FusedAlgorithm : uint8_t {
  kAuto,
  kOneStage,
  kTwoStage,
  kPushOneStage,
  kUnfused,
  kOneStageReg,
  kGatherNorm,
  kNcclSplit,
  kLamportOneStage,
  kPushOneStageReg,
  kLamportTwoStage,
};

struct FusedAlgorithmInfo {
  FusedAlgorithm algorithm;
  const char* name;
  uint8_t runs_on;
  bool exact;
  bool picked_by_auto;      // the GPU's fused `auto` chooses among these (the tuned fused table)
  bool one_kernel;          // one kernel with peers (not the all-reduce + a separate norm kernel)
  bool rows_per_block_all;  // each block walks all rows (one-stage kinds), not a rank's slice
  const char* summary;
};

// Indexed by value.
inline constexpr FusedAlgorithmInfo kFusedAlgorithmInfos[] = {
    {FusedAlgorithm::kAuto, "auto", kOnSimulator | kOnGpu | kOnMultiNode, true, false, false, false,
     "the tuned fused table on GPUs; one_stage in the simulator (same bits)"},
    {FusedAlgorithm::kOneStage, "one_stage", kOnSimulator | kOnGpu, true, true, true, true,
     "every rank folds every row and normalizes it (one kernel)"},
    {FusedAlgorithm::kTwoStage, "two_stage", kOnSimulator | kOnGpu, true, true, true, false,
     "each rank folds and normalizes its slice of rows, then gathers both outputs"},
    {FusedAlgorithm::kPushOneStage, "push_one_stage", kOnSimulator | kOnGpu, true, true, true, true,
     "x pushed into peers' scratch, one barrier (the GPU runs it on the register path)"},
    {FusedAlgorithm::kUnfused, "unfused", kOnSimulator | kOnGpu, true, true, false, false,
     "the all-reduce, then the separate residual + RMSNorm kernel (across nodes: what auto runs)"},
    {FusedAlgorithm::kOneStageReg, "one_stage_reg", kOnSimulator | kOnGpu, true, true, true, true,
     "one_stage with the row in registers"},
    {FusedAlgorithm::kGatherNorm, "gather_norm", kOnSimulator | kOnGpu, true, true, true, false,
     "two-stage variant: gathers residual_out only and normalizes locally"},
    {FusedAlgorithm::kNcclSplit, "nccl_split", kOnGpu | kOnMultiNode, false, false, false, false,
     "NCCL's all-reduce + the canonical norm (baseline; not the contract's bits)"},
    {FusedAlgorithm::kLamportOneStage, "lamport_one_stage", kOnSimulator | kOnGpu, true, true, true, true,
     "x pushed into peers' Lamport buffers, flag in the data, norm in the same kernel"},
    {FusedAlgorithm::kPushOneStageReg, "push_one_stage_reg", kOnSimulator, true, false, true, true,
     "push_one_stage on the register path: the GPU's push_one_stage kernel, in the simulator"},
    {FusedAlgorithm::kLamportTwoStage, "lamport_two_stage", kOnSimulator | kOnGpu, true, true, true, true,
     "x pushed to each row's owner, folded rows pushed back (Lamport, no barrier), norm in the same kernel"},
};

// ---- rounding contracts -----------------------------------------------------------------------

// Values are the C API's EXACTCOLL_CONTRACT_*. New values go at the end.
enum class Contract : uint8_t { kCanonical, kF32Residual, kBf16Accumulate, kRotatedTwoShot, kTree };

struct ContractInfo {
  Contract contract;
  const char* name;
  bool library_contract;  // exactcoll's own (every algorithm gives its bits); false: an emulation
                          // of another system's rounding, simulator reference only
  uint8_t runs_on;
  const char* summary;
};

// Indexed by value.
inline constexpr ContractInfo kContractInfos[] = {
    {Contract::kCanonical, "canonical", true, kOnSimulator | kOnGpu | kOnMultiNode,
     "exactcoll's: fold ranks in rank order in fp32, round once (docs/numerics.md)"},
    {Contract::kF32Residual, "f32_residual", false, kOnSimulator,
     "emulation: RMSNorm from the unrounded fp32 sum + residual (the 1-stage bug class AITER PR 2586 fixed)"},
    {Contract::kBf16Accumulate, "bf16_accumulate", false, kOnSimulator,
     "emulation: the running sum rounded to storage after every peer's add"},
    {Contract::kRotatedTwoShot, "rotated_two_shot", false, kOnSimulator,
     "emulation: each two-shot slice folds from its owner rank on (vLLM's 2-stage kernel)"},
    {Contract::kTree, "tree", true, kOnSimulator | kOnGpu | kOnMultiNode,
     "exactcoll's: a balanced binary tree over ranks, every node rounded; the same bits at every TP size "
     "(docs/numerics.md; across nodes: M and L powers of two)"},
};

// Every Contract, in the order the command line lists them.
inline constexpr Contract kContracts[] = {Contract::kCanonical, Contract::kTree, Contract::kF32Residual,
                                          Contract::kBf16Accumulate, Contract::kRotatedTwoShot};

// ---- lookups ----------------------------------------------------------------------------------

constexpr const OpInfo& info(Op op) { return kOpInfos[static_cast<size_t>(op)]; }
constexpr const AlgorithmInfo& info(Algorithm a) { return kAlgorithmInfos[static_cast<size_t>(a)]; }
constexpr const FusedAlgorithmInfo& info(FusedAlgorithm a) { return kFusedAlgorithmInfos[static_cast<size_t>(a)]; }
constexpr const ContractInfo& info(Contract c) { return kContractInfos[static_cast<size_t>(c)]; }

// Returns "allreduce", "reduce_scatter" or "allgather".
constexpr const char* op_name(Op op) { return info(op).name; }
// Returns e.g. "one_shot", "push_one_stage", "canonical".
constexpr const char* algorithm_name(Algorithm a) { return info(a).name; }
constexpr const char* fused_algorithm_name(FusedAlgorithm a) { return info(a).name; }
constexpr const char* contract_name(Contract c) { return info(c).name; }

// Does `a` implement `op`?
constexpr bool implements(Algorithm a, Op op) { return (info(a).ops & op_bit(op)) != 0; }

namespace registry_detail {
template <class Entry, size_t N, class Id>
constexpr bool indexed_by_value(const Entry (&table)[N], Id Entry::*id) {
  for (size_t i = 0; i < N; ++i) {
    if (static_cast<size_t>(table[i].*id) != i) return false;
  }
  return true;
}
template <class Entry, size_t N>
constexpr bool names_unique(const Entry (&table)[N]) {
  for (size_t i = 0; i < N; ++i) {
    for (size_t j = i + 1; j < N; ++j) {
      if (std::string_view(table[i].name) == std::string_view(table[j].name)) return false;
    }
  }
  return true;
}

// Returns the entry of `table` named `name` that has all of `runs_on`'s bits, or nullopt.
template <class Id, class Entry, size_t N>
constexpr std::optional<Id> parse(const Entry (&table)[N], std::string_view name, uint8_t runs_on) {
  for (const Entry& e : table) {
    if (name == e.name && (e.runs_on & runs_on) == runs_on) return static_cast<Id>(&e - table);
  }
  return std::nullopt;
}
}  // namespace registry_detail

static_assert(registry_detail::indexed_by_value(kOpInfos, &OpInfo::op), "kOpInfos must be indexed by value");
static_assert(registry_detail::indexed_by_value(kAlgorithmInfos, &AlgorithmInfo::algorithm),
              "kAlgorithmInfos must be indexed by value");
static_assert(registry_detail::indexed_by_value(kFusedAlgorithmInfos, &FusedAlgorithmInfo::algorithm),
              "kFusedAlgorithmInfos must be indexed by value");
static_assert(registry_detail::indexed_by_value(kContractInfos, &ContractInfo::contract),
              "kContractInfos must be indexed by value");
static_assert(registry_detail::names_unique(kOpInfos) && registry_detail::names_unique(kAlgorithmInfos) &&
                  registry_detail::names_unique(kFusedAlgorithmInfos) && registry_detail::names_unique(kContractInfos),
              "names must be unique within a table");
static_assert(sizeof(kOps) / sizeof(kOps[0]) == sizeof(kOpInfos) / sizeof(kOpInfos[0]), "kOps lists every Op");
static_assert(sizeof(kContracts) / sizeof(kContracts[0]) == sizeof(kContractInfos) / sizeof(kContractInfos[0]),
              "kContracts lists every Contract");

// Returns the Op / algorithm / contract named `name` that runs on every backend in `runs_on`
// (default: any), or nullopt. An op may be named by its alias (kOpAliases).
// Example: parse_algorithm_name("two_shot", kOnSimulator) == Algorithm::kTwoShot;
//          parse_algorithm_name("nccl", kOnSimulator) == nullopt;
//          parse_op("all_reduce") == Op::kAllReduce.
constexpr std::optional<Op> parse_op(std::string_view name, uint8_t runs_on = 0) {
  return registry_detail::parse<Op>(kOpInfos, canonical_op_name(name), runs_on);
}
constexpr std::optional<Algorithm> parse_algorithm_name(std::string_view name, uint8_t runs_on = 0) {
  return registry_detail::parse<Algorithm>(kAlgorithmInfos, name, runs_on);
}
constexpr std::optional<FusedAlgorithm> parse_fused_algorithm_name(std::string_view name, uint8_t runs_on = 0) {
  return registry_detail::parse<FusedAlgorithm>(kFusedAlgorithmInfos, name, runs_on);
}
constexpr std::optional<Contract> parse_contract_name(std::string_view name, uint8_t runs_on = 0) {
  return registry_detail::parse<Contract>(kContractInfos, name, runs_on);
}

// The entries that run on every backend in kRunsOn, except auto (a choice, not a kernel), in the
// registry's order, as a constexpr array (for loops over every runnable algorithm).
// Example: fused_algorithms_on<kOnSimulator>() == {one_stage, two_stage, push_one_stage, unfused,
//          one_stage_reg, gather_norm, lamport_one_stage, push_one_stage_reg, lamport_two_stage}.
template <uint8_t kRunsOn, class Entry, size_t N>
constexpr size_t count_entries_on(const Entry (&table)[N]) {
  size_t count = 0;
  for (const Entry& e : table) count += (e.runs_on & kRunsOn) == kRunsOn && std::string_view(e.name) != "auto";
  return count;
}
template <uint8_t kRunsOn>
constexpr auto fused_algorithms_on() {
  std::array<FusedAlgorithm, count_entries_on<kRunsOn>(kFusedAlgorithmInfos)> out{};
  size_t i = 0;
  for (const FusedAlgorithmInfo& e : kFusedAlgorithmInfos) {
    if ((e.runs_on & kRunsOn) == kRunsOn && e.algorithm != FusedAlgorithm::kAuto) out[i++] = e.algorithm;
  }
  return out;
}

// "a, b, c" (or with `separator`): the names of the entries that run on every backend in `runs_on`
// and, for algorithms, implement `op` (nullopt: any op). For --help texts and error messages.
// Example: algorithm_names(kOnSimulator, Op::kAllReduce) ==
//          "auto, one_shot, two_shot, push_one_shot, push_two_shot, lamport_one_shot, lamport_two_shot".
template <class Entry, size_t N, class Keep>
std::string joined_names(const Entry (&table)[N], const char* separator, Keep keep) {
  std::string text;
  for (const Entry& e : table) {
    if (!keep(e)) continue;
    if (!text.empty()) text.append(separator);
    text.append(e.name);
  }
  return text;
}
// The same names as a list (command-line choices).
template <class Entry, size_t N, class Keep>
std::vector<std::string> name_list(const Entry (&table)[N], Keep keep) {
  std::vector<std::string> names;
  for (const Entry& e : table) {
    if (keep(e)) names.emplace_back(e.name);
  }
  return names;
}
inline std::vector<std::string> algorithm_name_list(uint8_t runs_on, std::optional<Op> op = std::nullopt) {
  return name_list(kAlgorithmInfos, [&](const AlgorithmInfo& e) {
    return (e.runs_on & runs_on) == runs_on && (!op || (e.ops & op_bit(*op)) != 0);
  });
}
inline std::vector<std::string> fused_algorithm_name_list(uint8_t runs_on) {
  return name_list(kFusedAlgorithmInfos, [&](const FusedAlgorithmInfo& e) { return (e.runs_on & runs_on) == runs_on; });
}
inline std::vector<std::string> contract_name_list(uint8_t runs_on = 0) {
  return name_list(kContractInfos, [&](const ContractInfo& e) { return (e.runs_on & runs_on) == runs_on; });
}

inline std::string algorithm_names(uint8_t runs_on, std::optional<Op> op = std::nullopt, const char* separator = ", ") {
  return joined_names(kAlgorithmInfos, separator, [&](const AlgorithmInfo& e) {
    return (e.runs_on & runs_on) == runs_on && (!op || (e.ops & op_bit(*op)) != 0);
  });
}
inline std::string fused_algorithm_names(uint8_t runs_on, const char* separator = ", ") {
  return joined_names(kFusedAlgorithmInfos, separator,
                      [&](const FusedAlgorithmInfo& e) { return (e.runs_on & runs_on) == runs_on; });
}
inline std::string contract_names(uint8_t runs_on = 0, const char* separator = ", ") {
  return joined_names(kContractInfos, separator,
                      [&](const ContractInfo& e) { return (e.runs_on & runs_on) == runs_on; });
}
// The library's own contracts (canonical, tree) that run on every backend in runs_on: what the
// collectives and the GPU's fused op fold under (the emulations are the fused reference's only).
inline std::vector<std::string> library_contract_name_list(uint8_t runs_on = 0) {
  return name_list(kContractInfos,
                   [&](const ContractInfo& e) { return e.library_contract && (e.runs_on & runs_on) == runs_on; });
}
inline std::string library_contract_names(uint8_t runs_on = 0, const char* separator = ", ") {
  return joined_names(kContractInfos, separator,
                      [&](const ContractInfo& e) { return e.library_contract && (e.runs_on & runs_on) == runs_on; });
}
inline std::string op_names(const char* separator = ", ") {
  return joined_names(kOpInfos, separator, [](const OpInfo&) { return true; });
}

}  // namespace exactcoll

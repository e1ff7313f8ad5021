// Element traces of the fused op (sim/fused/element_trace.h, fused_reference's traces): every
// contract's trace has the documented steps in order, chained (each step starts from the previous
// one's result) and ending at the output bits; tracing changes no output bit; a canonical or tree
// run's trace agrees with the simulated run (a tree's nodes are its inputs' tree, recomputed here)
// and a flipped bit anywhere is caught; each alternative contract
// departs from canonical at the step docs/numerics.md names.
#include "sim/fused/element_trace.h"

#include <cstring>
#include <cstddef>
#include <iterator>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "sim/fused/fused_sim.h"
#include "sim/fused/random.h"
#include "sim/fused/reference.h"
#include "sim/world.h"
#include "tests/sim/fused/random_case.h"
#include "tests/sim/tree_nodes.h"

namespace exactcoll::fused {
namespace {

const StepValue& value(const ElementStep& s, const char* name) {
  for (const StepValue& v : s.values) {
    if (std::strcmp(v.name, name) == 0) return v;
  }
  ADD_FAILURE() << "step " << s.step << " has no value " << name;
  static const StepValue none;
  return none;
}

uint32_t bits(const StepValue& v) { return float_to_bits(v.value); }

// The storage value a step value holds (its bits).
template <class T>
T stored_value(const StepValue& v) {
  if constexpr (sizeof(T) == 4) {
    return bits_to_float(v.bits);
  } else {
    return T{static_cast<uint16_t>(v.bits)};
  }
}

// The documented steps, in order, for n ranks under contract c: n rank-by-rank folds, or under
// tree its n - 1 nodes.
std::vector<std::string> expected_steps(int n, Contract c) {
  std::vector<std::string> s =
      c == Contract::kTree ? std::vector<std::string>(n - 1, "tree_node") : std::vector<std::string>(n, "fold");
  for (const char* name : {"round", "residual_add", "square", "lane_sum"}) s.push_back(name);
  for (int k = 0; k < 5; ++k) s.push_back("group_butterfly");
  for (int k = 0; k < 5; ++k) s.push_back("final_butterfly");
  for (const char* name : {"ss", "inv", "scale"}) s.push_back(name);
  return s;
}

// Checks one trace: its steps, their chaining and its last values against the outputs.
template <class T>
void check_trace(const ElementTrace& t, int n, int hidden, const std::vector<T>& ro, const std::vector<T>& out) {
  SCOPED_TRACE("contract " + std::string(contract_name(t.contract)) + ", element " + std::to_string(t.index));
  EXPECT_EQ(t.index, static_cast<uint64_t>(t.row) * hidden + t.col);
  std::vector<std::string> names;
  for (const ElementStep& s : t.steps) names.push_back(s.step);
  ASSERT_EQ(names, expected_steps(n, t.contract));
  const auto& st = t.steps;
  const int f = t.contract == Contract::kTree ? n - 1 : n;  // the fold's steps
  const ElementStep& round = st[f];
  if (t.contract == Contract::kTree) {
    // Every node is its two children added and rounded; the last node is what the round stores.
    for (int k = 0; k < f; ++k) {
      const T left = stored_value<T>(value(st[k], "left")), right = stored_value<T>(value(st[k], "right"));
      EXPECT_EQ(value(st[k], "stored").bits, Storage<T>::bits(contract::tree_node(left, right))) << "node " << k;
    }
    if (f > 0) {
      EXPECT_EQ(value(round, "stored").bits, value(st[f - 1], "stored").bits);
    }
  } else {
    // The fold: every rank once, each step starting from the previous accumulator.
    std::vector<bool> rank_seen(n, false);
    for (int k = 0; k < n; ++k) {
      ASSERT_EQ(st[k].labels.size(), 1u);
      rank_seen.at(st[k].labels[0].second) = true;
      if (k > 0) {
        EXPECT_EQ(bits(value(st[k], "acc_before")), bits(value(st[k - 1], "acc_after"))) << "fold " << k;
      }
    }
    for (int r = 0; r < n; ++r) EXPECT_TRUE(rank_seen[r]) << "rank " << r << " folded";
    EXPECT_EQ(bits(value(round, "acc")), bits(value(st[n - 1], "acc_after")));
  }
  const ElementStep& add = st[f + 1];
  EXPECT_EQ(bits(value(add, "s")), bits(value(round, "stored")));
  EXPECT_EQ(value(add, "stored").bits, Storage<T>::bits(ro[t.index])) << "residual_add ends at residual_out";
  const ElementStep& square = st[f + 2];
  // The norm reads the stored residual_out, except f32_residual (the unrounded sum).
  const float v = t.contract == Contract::kF32Residual ? value(add, "sum").value : to_float(ro[t.index]);
  EXPECT_EQ(bits(value(square, "v")), float_to_bits(v));
  EXPECT_EQ(bits(value(square, "square")), float_to_bits(v * v));
  const ElementStep& lane = st[f + 3];
  EXPECT_EQ(lane.labels[0].second, square.labels[0].second) << "the element's own lane";
  float carried = value(lane, "total").value;
  for (int k = 0; k < 10; ++k) {
    const ElementStep& level = st[f + 4 + k];
    EXPECT_EQ(bits(value(level, "a")), float_to_bits(carried)) << level.step << " " << k;
    EXPECT_EQ(bits(value(level, "sum")), float_to_bits(value(level, "a").value + value(level, "b").value));
    carried = value(level, "sum").value;
  }
  const ElementStep& ss = st[f + 14];
  EXPECT_EQ(bits(value(ss, "ss")), float_to_bits(carried)) << "the path ends at the row's sum of squares";
  const ElementStep& inv = st[f + 15];
  EXPECT_EQ(bits(value(inv, "ss")), bits(value(ss, "ss")));
  const ElementStep& scale = st[f + 16];
  EXPECT_EQ(bits(value(scale, "v")), float_to_bits(v));
  EXPECT_EQ(bits(value(scale, "inv")), bits(value(inv, "inv")));
  EXPECT_EQ(value(scale, "stored").bits, Storage<T>::bits(out[t.index])) << "scale ends at out";
}

template <class T>
void every_contract(int n, int rows, int hidden, uint64_t seed) {
  const Case<T> c(n, rows, hidden, seed);
  const size_t count = c.count();
  const std::vector<uint64_t> elements = {0, 7, static_cast<uint64_t>(hidden) + 5, count - 1, count + 3};
  for (Contract contract : kContracts) {
    std::vector<T> ro(count), out(count), plain_ro(count), plain_out(count);
    std::vector<ElementTrace> traces;
    fused_reference<T>(contract, c.problem(), ro.data(), out.data(), elements, &traces);
    fused_reference<T>(contract, c.problem(), plain_ro.data(), plain_out.data());
    EXPECT_EQ(std::memcmp(ro.data(), plain_ro.data(), count * sizeof(T)), 0) << "tracing changes no bit";
    EXPECT_EQ(std::memcmp(out.data(), plain_out.data(), count * sizeof(T)), 0) << "tracing changes no bit";
    ASSERT_EQ(traces.size(), 4u) << "one trace per element inside [rows, H], in rising order";
    EXPECT_EQ(traces[0].index, 0u);
    EXPECT_EQ(traces[3].index, count - 1);
    for (const ElementTrace& t : traces) {
      EXPECT_EQ(t.contract, contract);
      check_trace<T>(t, n, hidden, ro, out);
    }
  }
}

TEST(ElementTrace, EveryContractHasTheStepsInOrderEndingAtTheOutputBits) {
  every_contract<bf16>(4, 3, 64, 1);
  every_contract<fp16>(3, 2, 2880, 2);  // 12 groups: a path through the final butterfly
  every_contract<float>(5, 2, 64, 3);
  every_contract<bf16>(1, 2, 16384, 4);  // 2 packs a lane, 32 groups
}

// Under tree: the trace's tree_node steps are the nodes of the element's tree recomputed from its
// inputs by the definition (tests/sim/tree_nodes.h), in tree_in_place's order (level by level),
// every node once, and its round stores the root.
template <class T>
void check_tree_steps(const ElementTrace& t, const FusedProblem<T>& problem) {
  SCOPED_TRACE("element " + std::to_string(t.index));
  const int n = problem.ranks;
  const size_t count = static_cast<size_t>(problem.rows) * problem.hidden;
  std::vector<T> inputs(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) inputs[static_cast<size_t>(r)] = problem.x[static_cast<size_t>(r) * count + t.index];
  const simtest::DefinitionTree tree = simtest::definition_tree(inputs);
  std::vector<std::pair<int, int>> order;  // level by level: strides 1, 2, 4, ...
  for (int stride = 1; stride < n; stride *= 2) {
    for (int q = 0; q + stride < n; q += 2 * stride) order.push_back({q, q + stride});
  }
  ASSERT_EQ(order.size(), tree.nodes.size());
  ASSERT_GE(t.steps.size(), order.size() + 1);
  for (size_t k = 0; k < order.size(); ++k) {
    const ElementStep& s = t.steps[k];
    ASSERT_EQ(std::string(s.step), "tree_node");
    ASSERT_EQ(s.labels.size(), 2u);
    EXPECT_EQ(std::make_pair(s.labels[0].second, s.labels[1].second), order[k]) << "node " << k;
    const simtest::TreeNodeBits got = {simtest::canonical_fp32_bits(bits(value(s, "left"))),
                                       simtest::canonical_fp32_bits(bits(value(s, "right"))), value(s, "sum").bits,
                                       value(s, "stored").bits};
    EXPECT_EQ(got, tree.nodes.at(order[k])) << "node " << k;
  }
  const ElementStep& round = t.steps[order.size()];
  EXPECT_EQ(std::string(round.step), "round");
  EXPECT_EQ(value(round, "acc").bits, simtest::canonical_fp32_bits(tree.root_sum));
  EXPECT_EQ(value(round, "stored").bits, tree.root);
}

// A run on the simulator under a library contract (canonical or tree), traced: the reference's
// trace agrees with it (under tree its nodes are the definition's tree of the inputs), and one
// flipped bit of the run (an output bit or a recorded fold or tree node) or a missing tree node
// makes trace_simulated_run refuse.
template <class T>
void simulated_run(Contract contract, FusedAlgorithm algo, int n, int rows, int hidden, sim::Schedule schedule) {
  SCOPED_TRACE(std::string(contract_name(contract)) + ", " + fused_algorithm_name(algo) + ", " + std::to_string(n) +
               " ranks, H " + std::to_string(hidden));
  const bool tree = contract == Contract::kTree;
  const Case<T> c(n, rows, hidden, 11);
  const size_t count = c.count();
  const std::vector<uint64_t> elements = {3, static_cast<uint64_t>(hidden) + 70 % hidden, count - 1};
  sim::WorldOptions options;
  options.ranks = n;
  options.schedule = schedule;
  options.trace = true;
  options.trace_elements = elements;
  sim::World world(options);
  FusedSpec spec;
  spec.algo = algo;
  spec.dtype = dtype_of<T>();
  spec.rows = rows;
  spec.hidden = hidden;
  spec.contract = contract;
  std::vector<std::vector<T>> ro(n, std::vector<T>(count)), out(n, std::vector<T>(count));
  FusedIo io;
  for (int r = 0; r < n; ++r) {
    io.x.push_back(c.x.data() + r * count);
    io.residual.push_back(c.residual.data());
    io.weight.push_back(c.weight.data());
    io.residual_out.push_back(ro[r].data());
    io.out.push_back(out[r].data());
  }
  run_fused(world, spec, io);
  std::vector<const T*> ro_ptrs, out_ptrs;
  for (int r = 0; r < n; ++r) ro_ptrs.push_back(ro[r].data()), out_ptrs.push_back(out[r].data());
  const std::vector<sim::TraceEvent> events = world.tracer()->merged();
  std::vector<ElementTrace> traces;
  ASSERT_EQ(trace_simulated_run<T>(contract, c.problem(), elements, ro_ptrs, out_ptrs, events, &traces), "");
  ASSERT_EQ(traces.size(), elements.size());
  for (const ElementTrace& t : traces) {
    EXPECT_EQ(t.contract, contract);
    for (int r = 0; r < n; ++r) check_trace<T>(t, n, hidden, ro[r], out[r]);
    if (tree) check_tree_steps<T>(t, c.problem());
  }
  // Under tree the run itself recorded tree_node events (and no canonical fold) for each element.
  size_t folds = 0, nodes = 0;
  for (const sim::TraceEvent& e : events) {
    folds += e.kind == sim::TraceEvent::Kind::kFold;
    nodes += e.kind == sim::TraceEvent::Kind::kTreeNode;
  }
  EXPECT_EQ(folds == 0, tree);
  EXPECT_EQ(nodes > 0, tree && n > 1);
  // One flipped bit of one rank's out, elsewhere in a traced row: caught.
  {
    std::vector<T> bad = out[n - 1];
    const size_t i = static_cast<size_t>(traces[1].row) * hidden + (traces[1].col + 1) % hidden;
    if constexpr (sizeof(T) == 4) {
      bad[i] = bits_to_float(float_to_bits(bad[i]) ^ 1u);
    } else {
      bad[i].bits ^= 1u;
    }
    std::vector<const T*> bad_ptrs = out_ptrs;
    bad_ptrs[n - 1] = bad.data();
    std::vector<ElementTrace> unused;
    const std::string problem =
        trace_simulated_run<T>(contract, c.problem(), elements, ro_ptrs, bad_ptrs, events, &unused);
    EXPECT_NE(problem.find("'s out at col"), std::string::npos) << problem;
    EXPECT_TRUE(unused.empty());
  }
  // One flipped bit of a recorded fold (canonical: the last rank's add; tree: the first node's
  // sum): caught.
  {
    std::vector<sim::TraceEvent> bad = events;
    bool flipped = false;
    for (sim::TraceEvent& e : bad) {
      if (!flipped && e.index == elements[0] &&
          (tree ? e.kind == sim::TraceEvent::Kind::kTreeNode
                : e.kind == sim::TraceEvent::Kind::kFold && e.input_rank == n - 1)) {
        e.acc_after = bits_to_float(float_to_bits(e.acc_after) ^ 1u);
        flipped = true;
      }
    }
    ASSERT_TRUE(flipped) << "the run recorded the element's fold";
    std::vector<ElementTrace> unused;
    const std::string problem =
        trace_simulated_run<T>(contract, c.problem(), elements, ro_ptrs, out_ptrs, bad, &unused);
    EXPECT_NE(problem.find(tree ? "tree node 0" : "fold step"), std::string::npos) << problem;
  }
  // Under tree, one missing node event (the element's last one: a rank's root) is caught.
  if (tree) {
    std::vector<sim::TraceEvent> bad = events;
    for (size_t k = bad.size(); k-- > 0;) {
      if (bad[k].kind == sim::TraceEvent::Kind::kTreeNode && bad[k].index == elements[0]) {
        bad.erase(bad.begin() + static_cast<std::ptrdiff_t>(k));
        break;
      }
    }
    ASSERT_LT(bad.size(), events.size());
    std::vector<ElementTrace> unused;
    const std::string problem =
        trace_simulated_run<T>(contract, c.problem(), elements, ro_ptrs, out_ptrs, bad, &unused);
    EXPECT_NE(problem.find("tree_node steps and 1 roundings of it; a whole fold is " + std::to_string(n - 1)),
              std::string::npos)
        << problem;
  }
}

TEST(ElementTrace, CanonicalRunTraceAgreesWithTheRunAndCatchesAFlippedBit) {
  simulated_run<bf16>(Contract::kCanonical, FusedAlgorithm::kOneStage, 3, 3, 64, sim::Schedule::kThreads);
  simulated_run<bf16>(Contract::kCanonical, FusedAlgorithm::kTwoStage, 3, 3, 64, sim::Schedule::kSeeded);
  simulated_run<fp16>(Contract::kCanonical, FusedAlgorithm::kOneStageReg, 2, 2, 2880, sim::Schedule::kThreads);
  simulated_run<float>(Contract::kCanonical, FusedAlgorithm::kUnfused, 4, 2, 64, sim::Schedule::kThreads);
  simulated_run<bf16>(Contract::kCanonical, FusedAlgorithm::kLamportOneStage, 2, 2, 64, sim::Schedule::kSeeded);
  simulated_run<bf16>(Contract::kCanonical, FusedAlgorithm::kLamportTwoStage, 3, 5, 64, sim::Schedule::kSeeded);
}

// Under tree: the run's tree_node events (one per node of the ranks' tree on every rank that
// folds the element) and round agree with the reference's tree trace, whose nodes are the
// definition's tree of the element's inputs; a flipped or missing node is caught. Every fused
// algorithm family, 3 ranks (the largest power of two below n on the left), 4 and 5, both
// schedules.
TEST(ElementTrace, TreeRunTraceIsTheInputsTreeAndCatchesAFlippedOrMissingNode) {
  simulated_run<bf16>(Contract::kTree, FusedAlgorithm::kOneStage, 4, 3, 64, sim::Schedule::kThreads);
  simulated_run<bf16>(Contract::kTree, FusedAlgorithm::kTwoStage, 3, 3, 64, sim::Schedule::kSeeded);
  simulated_run<fp16>(Contract::kTree, FusedAlgorithm::kOneStageReg, 4, 2, 2880, sim::Schedule::kThreads);
  simulated_run<float>(Contract::kTree, FusedAlgorithm::kUnfused, 5, 2, 64, sim::Schedule::kThreads);
  simulated_run<bf16>(Contract::kTree, FusedAlgorithm::kLamportOneStage, 4, 2, 64, sim::Schedule::kSeeded);
  simulated_run<bf16>(Contract::kTree, FusedAlgorithm::kLamportTwoStage, 4, 6, 64, sim::Schedule::kSeeded);
  simulated_run<bf16>(Contract::kTree, FusedAlgorithm::kPushOneStage, 4, 2, 64, sim::Schedule::kSeeded);
  simulated_run<bf16>(Contract::kTree, FusedAlgorithm::kGatherNorm, 4, 2, 64, sim::Schedule::kThreads);
}

// Where each alternative departs from canonical (docs/numerics.md, "Tracing one element"):
//   f32_residual     at round (seq n) when the fp32 fold is not a storage value, else (if at all)
//                    in the norm, which reads the row's unrounded residual sums;
//   bf16_accumulate  at the first fold k >= 1 whose fp32 sum is not a storage value;
//   rotated_two_shot at a fold, only for elements whose two-shot owner is not rank 0;
// and otherwise, if at all, in the norm (square or later), where the row's other elements enter.
TEST(ElementTrace, AlternativesDepartWhereTheContractSays) {
  const int n = 4, rows = 2, hidden = 64;
  const Case<bf16> c(n, rows, hidden, 5);
  const size_t count = c.count();
  std::vector<uint64_t> all(count);
  for (size_t i = 0; i < count; ++i) all[i] = i;
  std::vector<bf16> ro(count), out(count);
  std::vector<ElementTrace> canonical;
  fused_reference<bf16>(Contract::kCanonical, c.problem(), ro.data(), out.data(), all, &canonical);
  int departed[std::size(kContracts)] = {};
  for (Contract contract : kContracts) {
    // tree's steps are tree nodes, not rank-by-rank folds: there is no step of canonical's to
    // line each one up with (TreeRunTraceIsTheInputsTreeAndCatchesAFlippedOrMissingNode checks
    // its trace).
    if (contract == Contract::kTree) continue;
    std::vector<ElementTrace> traces;
    const std::vector<int> departs =
        trace_alternative<bf16>(contract, c.problem(), all, ro.data(), out.data(), &traces);
    ASSERT_EQ(departs.size(), count);
    for (size_t i = 0; i < count; ++i) {
      const ElementTrace& t = traces[i];
      const ElementTrace& canon = canonical[i];
      SCOPED_TRACE(std::string(contract_name(contract)) + " element " + std::to_string(i));
      const int d = departs[i];
      if (d >= 0) ++departed[static_cast<int>(contract)];
      for (size_t s = 0; s < t.steps.size(); ++s) {
        const auto mark = t.steps[s].vs_canonical;
        if (contract == Contract::kCanonical) {
          EXPECT_EQ(mark, ElementStep::VsCanonical::kNotCompared);
        } else if (static_cast<int>(s) < d || d < 0) {
          EXPECT_EQ(mark, ElementStep::VsCanonical::kSame);
        } else if (static_cast<int>(s) == d) {
          EXPECT_EQ(mark, ElementStep::VsCanonical::kDeparts);
        }
      }
      const float fold = value(canon.steps[n - 1], "acc_after").value;
      switch (contract) {
        case Contract::kCanonical: EXPECT_EQ(d, -1); break;
        case Contract::kF32Residual: {
          // At round when the fold is not a bf16 value (it is not rounded); otherwise its residual
          // add has canonical's bits and it can depart only in the norm (square or later), which
          // reads the row's unrounded sums.
          if (float_to_bits(to_float(round_to<bf16>(fold))) != float_to_bits(fold)) {
            EXPECT_EQ(d, n);
            EXPECT_EQ(std::string(t.steps[n].step), "round");
          } else if (d >= 0) {
            EXPECT_GE(d, n + 2) << "departs in the norm, at " << t.steps[d].step;
          }
          break;
        }
        case Contract::kBf16Accumulate: {
          // Until it departs it adds what canonical adds, so it departs at the first fold k >= 1
          // whose fp32 sum (canonical's) is not a bf16 value; otherwise, if at all, in the norm.
          int first = -1;
          for (int k = 1; k < n && first < 0; ++k) {
            const float sum = value(canon.steps[k], "acc_after").value;
            if (float_to_bits(to_float(round_to<bf16>(sum))) != float_to_bits(sum)) first = k;
          }
          if (first >= 0) {
            EXPECT_EQ(d, first) << "departs at the first fold whose running sum is rounded";
          } else if (d >= 0) {
            EXPECT_GE(d, n + 2) << "departs in the norm, at " << t.steps[d].step;
          }
          break;
        }
        case Contract::kTree: break;  // skipped above
        case Contract::kRotatedTwoShot:
          // Its fold starts at the owner of the element's two-shot slice: an element of rank 0's
          // slice folds in canonical's order, and can depart only in the norm (from other elements).
          if (t.steps[0].labels[0].second == 0) {
            EXPECT_TRUE(d < 0 || d >= n + 2) << d;
          } else if (d >= 0 && d < n + 2) {
            EXPECT_LT(d, n) << "its own part departs in the fold";
          }
          break;
      }
    }
  }
  EXPECT_GT(departed[static_cast<int>(Contract::kF32Residual)], 0);
  EXPECT_GT(departed[static_cast<int>(Contract::kBf16Accumulate)], 0);
  EXPECT_GT(departed[static_cast<int>(Contract::kRotatedTwoShot)], 0);
}

}  // namespace
}  // namespace exactcoll::fused

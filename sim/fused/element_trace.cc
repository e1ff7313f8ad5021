#include "sim/fused/element_trace.h"

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>

#include "core/contract.h"
#include "core/storage.h"

namespace exactcoll::fused {
namespace {

template <class T>
T from_bits(uint32_t bits) {
  if constexpr (sizeof(T) == 4) {
    return bits_to_float(bits);
  } else {
    return T{static_cast<uint16_t>(bits)};
  }
}

uint32_t fp32_bits(float f) { return float_to_bits(canonicalize_nan(f)); }

// The step named `name` of t (the first one), or null.
const ElementStep* find_step(const ElementTrace& t, const char* name) {
  for (const ElementStep& s : t.steps) {
    if (std::strcmp(s.step, name) == 0) return &s;
  }
  return nullptr;
}

// The value named `name` of step s; throws when absent (a trace that lacks it is a bug here).
const StepValue& value_of(const ElementStep& s, const char* name) {
  for (const StepValue& v : s.values) {
    if (std::strcmp(v.name, name) == 0) return v;
  }
  throw std::logic_error(std::string("element trace: step ") + s.step + " has no value " + name);
}

std::string where(const ElementTrace& t) {
  return "element " + std::to_string(t.index) + " [row " + std::to_string(t.row) + ", col " + std::to_string(t.col) +
         "]";
}

std::string hex(uint32_t bits) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08" PRIx32, bits);
  return buf;
}

// "" when run event e, one of the fold events of t's element (canonical: a fold; tree: a
// tree_node), has the values of step f (the k-th fold step of the trace), else what differs.
std::string compare_fold_event(const ElementTrace& t, const sim::TraceEvent& e, int k, const ElementStep& f) {
  // Storage values as stored (widening is exact): a NaN read from the wrong place (the run's
  // unwritten pattern) must not pass as the input NaN it replaced.
  auto same_storage = [&](float run, const char* name) {
    return float_to_bits(run) == float_to_bits(value_of(f, name).value);
  };
  auto label = [&](size_t at) { return at < f.labels.size() ? f.labels[at].second : -1; };
  const std::string whose = where(t) + ": rank " + std::to_string(e.rank) + "'s ";
  if (t.contract == Contract::kTree) {
    if (e.left_rank != label(0) || e.input_rank != label(1) || !same_storage(e.acc_before, "left") ||
        !same_storage(e.x, "right") || fp32_bits(e.acc_after) != value_of(f, "sum").bits ||
        e.stored_bits != value_of(f, "stored").bits) {
      return whose + "tree node " + std::to_string(k) + " (ranks " + std::to_string(e.left_rank) + ".. + " +
             std::to_string(e.input_rank) + "..: sum " + hex(fp32_bits(e.acc_after)) + ", stored " +
             hex(e.stored_bits) + ") is not the trace's (ranks " + std::to_string(label(0)) + ".. + " +
             std::to_string(label(1)) + "..: sum " + hex(value_of(f, "sum").bits) + ", stored " +
             hex(value_of(f, "stored").bits) + ")";
    }
    return "";
  }
  if (e.input_rank != label(0) || fp32_bits(e.acc_after) != value_of(f, "acc_after").bits || !same_storage(e.x, "x")) {
    return whose + "fold step " + std::to_string(k) + " (input rank " + std::to_string(e.input_rank) + ", acc " +
           hex(fp32_bits(e.acc_after)) + ") is not the trace's (input rank " + std::to_string(label(0)) + ", acc " +
           hex(value_of(f, "acc_after").bits) + ")";
  }
  return "";
}

// "" when the run's fold and round events of t's element match t's fold and round steps: under
// canonical n fold events (one per rank), under tree n - 1 tree_node events (one per internal
// node), in the trace's order, then one round, on every rank that folded the element, and at
// least one rank did.
std::string check_folds(const ElementTrace& t, int ranks, const std::vector<sim::TraceEvent>& run_events) {
  const bool tree = t.contract == Contract::kTree;
  const char* fold_step = tree ? "tree_node" : "fold";
  const sim::TraceEvent::Kind fold_kind = tree ? sim::TraceEvent::Kind::kTreeNode : sim::TraceEvent::Kind::kFold;
  const sim::TraceEvent::Kind other_kind = tree ? sim::TraceEvent::Kind::kFold : sim::TraceEvent::Kind::kTreeNode;
  const int whole = tree ? ranks - 1 : ranks;  // fold events of one whole fold
  std::vector<const ElementStep*> folds;
  for (const ElementStep& s : t.steps) {
    if (std::strcmp(s.step, fold_step) == 0) folds.push_back(&s);
  }
  const ElementStep* round = find_step(t, "round");
  if (static_cast<int>(folds.size()) != whole || round == nullptr) return where(t) + ": the trace has no whole fold";
  std::vector<int> seen(ranks, 0), rounds(ranks, 0);  // fold and round events seen per rank
  for (const sim::TraceEvent& e : run_events) {
    if (e.index != t.index) continue;
    if (e.kind == fold_kind) {
      if (whole == 0) {
        return where(t) + ": rank " + std::to_string(e.rank) + " recorded a " + fold_step +
               " event; one rank's fold has none";
      }
      const int k = seen[e.rank]++ % whole;
      if (std::string problem = compare_fold_event(t, e, k, *folds[k]); !problem.empty()) return problem;
    } else if (e.kind == other_kind) {
      return where(t) + ": rank " + std::to_string(e.rank) + " recorded a " + (tree ? "fold" : "tree_node") +
             " event; the " + contract_name(t.contract) + " fold records " + fold_step + " events";
    } else if (e.kind == sim::TraceEvent::Kind::kRound) {
      ++rounds[e.rank];
      if (fp32_bits(e.acc_before) != value_of(*round, "acc").bits) {
        return where(t) + ": rank " + std::to_string(e.rank) + " rounded the accumulator " +
               hex(fp32_bits(e.acc_before)) + ", the trace's is " + hex(value_of(*round, "acc").bits);
      }
      if (e.stored_bits != value_of(*round, "stored").bits) {
        return where(t) + ": rank " + std::to_string(e.rank) + " stored the all-reduce as " + hex(e.stored_bits) +
               ", the trace says " + hex(value_of(*round, "stored").bits);
      }
    }
  }
  // Every rank that folded the element folded it whole and rounded each fold.
  int folded = 0;
  for (int r = 0; r < ranks; ++r) {
    folded += rounds[r];
    if (whole > 0 && (seen[r] % whole != 0 || rounds[r] != seen[r] / whole)) {
      return where(t) + ": rank " + std::to_string(r) + " recorded " + std::to_string(seen[r]) + " " + fold_step +
             " steps and " + std::to_string(rounds[r]) + " roundings of it; a whole fold is " + std::to_string(whole) +
             " steps and one rounding";
    }
  }
  if (folded == 0) return where(t) + ": the run recorded no fold of it (was it traced?)";
  return "";
}

}  // namespace

template <class T>
std::string trace_simulated_run(Contract contract, const FusedProblem<T>& problem,
                                const std::vector<uint64_t>& elements, const std::vector<const T*>& run_residual_out,
                                const std::vector<const T*>& run_out, const std::vector<sim::TraceEvent>& run_events,
                                std::vector<ElementTrace>* traces) {
  if (!info(contract).library_contract) {
    throw std::invalid_argument(std::string("trace_simulated_run: ") + contract_name(contract) +
                                " is not one of the library's contracts (it has no simulated run)");
  }
  const int H = problem.hidden;
  const size_t count = static_cast<size_t>(problem.rows) * H;
  std::vector<T> ro(count), out(count);
  std::vector<ElementTrace> mine;
  fused_reference<T>(contract, problem, ro.data(), out.data(), elements, &mine);
  contract::RmsNormTree tree;
  contract::make_rmsnorm_tree<T>(H, &tree);
  for (const ElementTrace& t : mine) {
    const size_t base = static_cast<size_t>(t.row) * H;
    // 1. Every rank's rows, whole.
    for (size_t r = 0; r < run_out.size(); ++r) {
      for (int j = 0; j < H; ++j) {
        const uint32_t want_ro = Storage<T>::bits(ro[base + j]), want_out = Storage<T>::bits(out[base + j]);
        const uint32_t got_ro = Storage<T>::bits(run_residual_out[r][base + j]);
        const uint32_t got_out = Storage<T>::bits(run_out[r][base + j]);
        if (got_ro != want_ro || got_out != want_out) {
          return where(t) + ": rank " + std::to_string(r) + "'s " + (got_ro != want_ro ? "residual_out" : "out") +
                 " at col " + std::to_string(j) + " is " + hex(got_ro != want_ro ? got_ro : got_out) +
                 ", the trace's reference computes " + hex(got_ro != want_ro ? want_ro : want_out);
        }
      }
    }
    // 2. The run's own fold and round events.
    if (std::string problem_text = check_folds(t, problem.ranks, run_events); !problem_text.empty()) {
      return problem_text;
    }
    // 3. Core's functions on the run's values give the trace's.
    const ElementStep* round = find_step(t, "round");
    const ElementStep* add = find_step(t, "residual_add");
    const ElementStep* ss_step = find_step(t, "ss");
    const ElementStep* inv_step = find_step(t, "inv");
    const ElementStep* scale = find_step(t, "scale");
    if (!round || !add || !ss_step || !inv_step || !scale) return where(t) + ": the trace misses a step";
    const T s = from_bits<T>(value_of(*round, "stored").bits);
    const T res = problem.residual[t.index];
    if (Storage<T>::bits(contract::residual_add<T>(s, res)) != value_of(*add, "stored").bits) {
      return where(t) + ": contract::residual_add disagrees with the trace's residual_add";
    }
    const T* ro_row = run_residual_out[0] + base;
    const float ss = contract::sum_squares(tree, [ro_row](int j) { return to_float(ro_row[j]); });
    if (fp32_bits(ss) != value_of(*ss_step, "ss").bits) {
      return where(t) + ": contract::sum_squares of the run's row is " + hex(fp32_bits(ss)) + ", the trace's ss " +
             hex(value_of(*ss_step, "ss").bits);
    }
    const float inv = contract::rmsnorm_inverse(ss, H, problem.eps);
    if (fp32_bits(inv) != value_of(*inv_step, "inv").bits) {
      return where(t) + ": contract::rmsnorm_inverse is " + hex(fp32_bits(inv)) + ", the trace's inv " +
             hex(value_of(*inv_step, "inv").bits);
    }
    const T y = contract::rmsnorm_scale<T>(to_float(ro_row[t.col]), inv, problem.weight[t.col]);
    if (Storage<T>::bits(y) != value_of(*scale, "stored").bits) {
      return where(t) + ": contract::rmsnorm_scale disagrees with the trace's scale";
    }
  }
  traces->insert(traces->end(), mine.begin(), mine.end());
  return "";
}

template <class T>
std::vector<int> trace_alternative(Contract contract, const FusedProblem<T>& problem,
                                   const std::vector<uint64_t>& elements, T* residual_out, T* out,
                                   std::vector<ElementTrace>* traces) {
  const size_t count = static_cast<size_t>(problem.rows) * problem.hidden;
  std::vector<ElementTrace> mine, canonical;
  fused_reference<T>(contract, problem, residual_out, out, elements, &mine);
  std::vector<int> departs;
  if (contract != Contract::kCanonical) {
    std::vector<T> ro(count), y(count);
    fused_reference<T>(Contract::kCanonical, problem, ro.data(), y.data(), elements, &canonical);
  }
  for (size_t k = 0; k < mine.size(); ++k) {
    departs.push_back(k < canonical.size() ? compare_with_canonical(&mine[k], canonical[k]) : -1);
  }
  traces->insert(traces->end(), mine.begin(), mine.end());
  return departs;
}

#define EXC_INSTANTIATE(T)                                                                                           \
  template std::string trace_simulated_run<T>(Contract, const FusedProblem<T>&, const std::vector<uint64_t>&,        \
                                              const std::vector<const T*>&, const std::vector<const T*>&,            \
                                              const std::vector<sim::TraceEvent>&, std::vector<ElementTrace>*);      \
  template std::vector<int> trace_alternative<T>(Contract, const FusedProblem<T>&, const std::vector<uint64_t>&, T*, \
                                                 T*, std::vector<ElementTrace>*);
EXC_INSTANTIATE(bf16)
EXC_INSTANTIATE(fp16)
EXC_INSTANTIATE(float)
#undef EXC_INSTANTIATE

}  // namespace exactcoll::fused

#include "sim/fused/reference.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>

#include "core/collectives.h"  // two_shot_slice: the slice boundaries are part of rotated_two_shot
#include "sim/trace.h"         // float_text

namespace exactcoll::fused {

bool parse_contract(const std::string& name, Contract* c) {
  const std::optional<Contract> k = parse_contract_name(name);
  if (!k) return false;
  *c = *k;
  return true;
}

std::string check_eps(double eps) {
  if (std::isfinite(eps) && eps >= 0 && eps <= static_cast<double>(std::numeric_limits<float>::max())) return "";
  char text[64];
  std::snprintf(text, sizeof text, "%g", eps);
  return std::string("--eps must be a finite number >= 0 (RMSNorm's epsilon, held as a float), got ") + text;
}

namespace {

// ---- Recording helpers (element traces) ----

StepValue fp32_value(const char* name, float f) {
  const float shown = canonicalize_nan(f);
  return StepValue{name, float_to_bits(shown), 4, shown};
}

template <class T>
StepValue storage_value(const char* name, T x) {
  return StepValue{name, Storage<T>::bits(x), static_cast<int>(sizeof(T)), to_float(x)};
}

ElementStep make_step(const char* step, std::vector<std::pair<const char*, int>> labels, std::vector<StepValue> values,
                      const char* note = nullptr) {
  ElementStep s;
  s.step = step;
  s.labels = std::move(labels);
  s.values = std::move(values);
  s.note = note;
  return s;
}

// The traced columns of one row and where their steps go: steps[k] receives cols[k]'s.
struct RowTrace {
  std::vector<int> cols;
  std::vector<std::vector<ElementStep>*> steps;
  // Returns k with cols[k] == col, or -1.
  int find(int col) const {
    for (size_t k = 0; k < cols.size(); ++k) {
      if (cols[k] == col) return static_cast<int>(k);
    }
    return -1;
  }
};

// Host arithmetic is IEEE single precision, built with -ffp-contract=off: each + and * below is one
// rounding, as the contract says. NaN payloads may differ from the GPU's in intermediates, but
// every stored value goes through round_to, which makes every NaN the canonical pattern.
// With a RowTrace, records the square, lane_sum, group_butterfly, final_butterfly and ss steps of
// its columns (the recording reads the values computed here; it changes none).
float sum_squares_traced(const float* v, int hidden, int pack, const RowTrace* trace) {
  const int num_packs = hidden / pack;
  const int active = num_packs < 1024 ? num_packs : 1024;
  const int lanes = 32 * ((active + 31) / 32);
  const int groups = lanes / 32;
  // The lane of column j.
  auto lane_of = [&](int j) { return (j / pack) % lanes; };
  // The 32-lane xor butterfly over a[0..32) in place; record(off, a, next) sees each level's values
  // before (a) and after (next).
  auto butterfly = [](float* a, auto record) {
    for (int off = 16; off >= 1; off /= 2) {
      float next[32];
      for (int l = 0; l < 32; ++l) next[l] = a[l] + a[l ^ off];
      record(off, a, next);
      for (int l = 0; l < 32; ++l) a[l] = next[l];
    }
  };
  float group_value[32] = {};
  for (int g = 0; g < groups; ++g) {
    float lane_value[32];
    for (int l = 0; l < 32; ++l) {
      const int lane = g * 32 + l;
      float acc = 0.0f;
      for (int p = lane; p < num_packs; p += lanes) {
        for (int e = 0; e < pack; ++e) {
          const float x = v[p * pack + e];
          const float before = acc;
          const float square = x * x;
          acc = acc + square;
          if (trace != nullptr) {
            if (const int k = trace->find(p * pack + e); k >= 0) {
              trace->steps[k]->push_back(make_step("square", {{"lane", lane}, {"pack", p}},
                                                   {fp32_value("v", x), fp32_value("square", square),
                                                    fp32_value("lane_before", before), fp32_value("lane_after", acc)}));
            }
          }
        }
      }
      lane_value[l] = acc;
      if (trace != nullptr) {
        for (size_t k = 0; k < trace->cols.size(); ++k) {
          if (lane_of(trace->cols[k]) == lane) {
            trace->steps[k]->push_back(make_step("lane_sum", {{"lane", lane}}, {fp32_value("total", acc)}));
          }
        }
      }
    }
    butterfly(lane_value, [&](int off, const float* a, const float* next) {
      if (trace == nullptr) return;
      for (size_t k = 0; k < trace->cols.size(); ++k) {
        const int lane = lane_of(trace->cols[k]);
        if (lane / 32 != g) continue;
        const int l = lane % 32;
        trace->steps[k]->push_back(
            make_step("group_butterfly", {{"group", g}, {"lane", l}, {"off", off}, {"partner", l ^ off}},
                      {fp32_value("a", a[l]), fp32_value("b", a[l ^ off]), fp32_value("sum", next[l])}));
      }
    });
    group_value[g] = lane_value[0];
  }
  butterfly(group_value, [&](int off, const float* a, const float* next) {
    if (trace == nullptr) return;
    for (size_t k = 0; k < trace->cols.size(); ++k) {
      const int g = lane_of(trace->cols[k]) / 32;
      trace->steps[k]->push_back(
          make_step("final_butterfly", {{"group", g}, {"off", off}, {"partner", g ^ off}},
                    {fp32_value("a", a[g]), fp32_value("b", a[g ^ off]), fp32_value("sum", next[g])}));
    }
  });
  if (trace != nullptr) {
    for (auto* steps : trace->steps) steps->push_back(make_step("ss", {}, {fp32_value("ss", group_value[0])}));
  }
  return group_value[0];
}

}  // namespace

float reference_sum_squares(const float* v, int hidden, int pack) {
  return sum_squares_traced(v, hidden, pack, nullptr);
}

namespace {

// The traced elements of a [rows, hidden] problem under contract c: `traced` sorted, without
// repeats or indices past count (none when traces is null), each with its row and column.
std::vector<ElementTrace> traced_elements(Contract c, int H, size_t count, const std::vector<uint64_t>& traced,
                                          const std::vector<ElementTrace>* traces) {
  std::vector<uint64_t> wanted;
  if (traces != nullptr) {
    for (uint64_t i : traced) {
      if (i < count) wanted.push_back(i);
    }
    std::sort(wanted.begin(), wanted.end());
    wanted.erase(std::unique(wanted.begin(), wanted.end()), wanted.end());
  }
  std::vector<ElementTrace> mine(wanted.size());
  for (size_t k = 0; k < wanted.size(); ++k) {
    mine[k].contract = c;
    mine[k].index = wanted[k];
    mine[k].row = static_cast<int>(wanted[k] / H);
    mine[k].col = static_cast<int>(wanted[k] % H);
  }
  return mine;
}

// Returns the fold of element i of the ranks' inputs (count elements each) in contract c's order:
// canonical and f32_residual add in rank order in fp32, bf16_accumulate rounds the running sum to
// storage after every add, rotated_two_shot starts at the owner of i's two-shot slice. With
// steps, records each rank's fold step.
template <class T>
float fold_element(Contract c, const FusedProblem<T>& problem, size_t count, size_t i,
                   std::vector<ElementStep>* steps) {
  const int n = problem.ranks;
  const int pack = Storage<T>::kPack;
  auto x = [&](int r, size_t i) { return to_float(problem.x[static_cast<size_t>(r) * count + i]); };
  // fold step of rank r: acc before, the input, acc after (and bf16_accumulate's fp32 sum).
  auto fold_step = [&](int r, int k_th, float before, float xr, float after, const float* sum) {
    if (steps == nullptr) return;
    std::vector<StepValue> values;
    if (k_th > 0) values.push_back(fp32_value("acc_before", before));
    values.push_back(storage_value<T>("x", problem.x[static_cast<size_t>(r) * count + i]));
    if (sum != nullptr) values.push_back(fp32_value("sum", *sum));
    values.push_back(fp32_value("acc_after", after));
    (void)xr;
    steps->push_back(make_step("fold", {{"input_rank", r}}, std::move(values),
                               sum != nullptr ? "bf16_accumulate: the running sum is rounded to storage" : nullptr));
  };
  float acc = 0.0f;
  switch (c) {
    case Contract::kCanonical:
    case Contract::kF32Residual:
      acc = x(0, i);
      fold_step(0, 0, 0.0f, acc, acc, nullptr);
      for (int r = 1; r < n; ++r) {
        const float before = acc;
        acc = acc + x(r, i);
        fold_step(r, r, before, x(r, i), acc, nullptr);
      }
      break;
    case Contract::kBf16Accumulate:
      acc = x(0, i);
      fold_step(0, 0, 0.0f, acc, acc, nullptr);
      for (int r = 1; r < n; ++r) {
        const float before = acc;
        const float sum = acc + x(r, i);
        acc = to_float(round_to<T>(sum));
        fold_step(r, r, before, x(r, i), acc, &sum);
      }
      break;
    case Contract::kTree: {
      // The tree of the ranks' values (contract::tree_in_place_reporting), each internal node a
      // step. acc is the root's fp32 sum (or the one value), whose rounding is the root: the round
      // step then shows both, as the simulator's round event of a traced tree does.
      std::vector<T> level(static_cast<size_t>(n));
      for (int r = 0; r < n; ++r) level[static_cast<size_t>(r)] = problem.x[static_cast<size_t>(r) * count + i];
      acc = to_float(level[0]);
      contract::tree_in_place_reporting(level.data(), n, [&](int left, int right, T lv, T rv, float sum, T node) {
        acc = sum;
        if (steps == nullptr) return;
        steps->push_back(make_step("tree_node", {{"left_rank", left}, {"right_rank", right}},
                                   {storage_value<T>("left", lv), storage_value<T>("right", rv), fp32_value("sum", sum),
                                    storage_value<T>("stored", node)},
                                   "tree: every node rounds to storage"));
      });
      break;
    }
    case Contract::kRotatedTwoShot: {
      int owner = 0;
      for (int p = 0; p < n; ++p) {
        const Slice s = two_shot_slice(count, pack, p, n);
        if (i >= s.begin && i < s.end) owner = p;
      }
      acc = x(owner, i);
      fold_step(owner, 0, 0.0f, acc, acc, nullptr);
      for (int k_th = 1; k_th < n; ++k_th) {
        const int r = (owner + k_th) % n;
        const float before = acc;
        acc = acc + x(r, i);
        fold_step(r, k_th, before, x(r, i), acc, nullptr);
      }
      break;
    }
  }
  return acc;
}

// Adds element i's residual to acc (its fold) under contract c and stores residual_out[i]: f32_residual
// adds in fp32 and the norm reads the unrounded sum; the others round the fold to storage first and
// the norm reads the stored residual_out. Returns what the norm reads. With steps, records the
// round and residual_add steps.
template <class T>
float add_residual(Contract c, const FusedProblem<T>& problem, size_t i, float acc, T* residual_out,
                   std::vector<ElementStep>* steps) {
  const T res_t = problem.residual[i];
  const float res = to_float(res_t);
  if (c == Contract::kF32Residual) {
    const float rf = acc + res;
    residual_out[i] = round_to<T>(rf);
    if (steps != nullptr) {
      steps->push_back(make_step("round", {}, {fp32_value("acc", acc), fp32_value("stored", acc)},
                                 "f32_residual: not rounded, the fold stays in fp32"));
      steps->push_back(make_step("residual_add", {},
                                 {fp32_value("s", acc), storage_value<T>("residual", res_t), fp32_value("sum", rf),
                                  storage_value<T>("stored", residual_out[i])},
                                 "f32_residual: the norm reads sum, not stored"));
    }
    return rf;
  }
  const T s_t = round_to<T>(acc);
  const float s = to_float(s_t);
  const float sum = s + res;
  residual_out[i] = round_to<T>(sum);
  if (steps != nullptr) {
    steps->push_back(make_step("round", {}, {fp32_value("acc", acc), storage_value<T>("stored", s_t)}));
    steps->push_back(make_step("residual_add", {},
                               {storage_value<T>("s", s_t), storage_value<T>("residual", res_t), fp32_value("sum", sum),
                                storage_value<T>("stored", residual_out[i])}));
  }
  return to_float(residual_out[i]);
}

// RMSNorm of one row (norm_input: the H values the norm reads) into out[base, base + H): the
// tree's sum of squares, inv = 1 / sqrt(ss / H + eps), each value times inv times the weight,
// rounded once. Records the sum of squares' steps, inv and scale for the row's traced columns.
template <class T>
void norm_row(const FusedProblem<T>& problem, const std::vector<float>& norm_input, size_t base, T* out,
              const RowTrace& row_trace) {
  const int H = problem.hidden;
  const int pack = Storage<T>::kPack;
  const bool row_traced = !row_trace.cols.empty();
  const float ss = sum_squares_traced(norm_input.data(), H, pack, row_traced ? &row_trace : nullptr);
  const float mean = ss / static_cast<float>(H);
  const float mean_eps = mean + problem.eps;
  const float root = std::sqrt(mean_eps);
  const float inv = 1.0f / root;
  for (auto* steps : row_trace.steps) {
    steps->push_back(make_step("inv", {},
                               {fp32_value("ss", ss), fp32_value("mean", mean), fp32_value("mean_eps", mean_eps),
                                fp32_value("root", root), fp32_value("inv", inv)}));
  }
  for (int j = 0; j < H; ++j) {
    const float v_inv = norm_input[j] * inv;
    const float product = v_inv * to_float(problem.weight[j]);
    out[base + j] = round_to<T>(product);
    if (row_traced) {
      if (const int k = row_trace.find(j); k >= 0) {
        row_trace.steps[k]->push_back(
            make_step("scale", {},
                      {fp32_value("v", norm_input[j]), fp32_value("inv", inv), fp32_value("v_inv", v_inv),
                       storage_value<T>("weight", problem.weight[j]), fp32_value("product", product),
                       storage_value<T>("stored", out[base + j])}));
      }
    }
  }
}

}  // namespace

template <class T>
void fused_reference(Contract c, const FusedProblem<T>& problem, T* residual_out, T* out,
                     const std::vector<uint64_t>& traced, std::vector<ElementTrace>* traces) {
  const int n = problem.ranks, rows = problem.rows, H = problem.hidden;
  const int pack = Storage<T>::kPack;
  if (n < 1) throw std::invalid_argument("ranks must be >= 1");
  if (rows < 0) throw std::invalid_argument("rows must be >= 0");
  if (H <= 0 || H % pack != 0) {
    throw std::invalid_argument("hidden size " + std::to_string(H) + " is not a positive multiple of the " +
                                Storage<T>::kName + " pack (" + std::to_string(pack) + " elements)");
  }
  const size_t count = static_cast<size_t>(rows) * H;
  // The traced elements, sorted, without repeats or indices past the end; their traces.
  std::vector<ElementTrace> mine = traced_elements(c, H, count, traced, traces);
  size_t next_traced = 0;            // the first element of `mine` not in a row before this one
  std::vector<float> norm_input(H);  // the values the norm reads: float(ro), or rf
  for (int row = 0; row < rows; ++row) {
    const size_t base = static_cast<size_t>(row) * H;
    // This row's traced columns.
    RowTrace row_trace;
    while (next_traced < mine.size() && mine[next_traced].row < row) ++next_traced;
    for (size_t k = next_traced; k < mine.size() && mine[k].row == row; ++k) {
      row_trace.cols.push_back(mine[k].col);
      row_trace.steps.push_back(&mine[k].steps);
    }
    const bool row_traced = !row_trace.cols.empty();
    for (int j = 0; j < H; ++j) {
      const size_t i = base + j;
      const int k = row_traced ? row_trace.find(j) : -1;
      std::vector<ElementStep>* steps = k >= 0 ? row_trace.steps[k] : nullptr;
      const float acc = fold_element(c, problem, count, i, steps);
      norm_input[j] = add_residual(c, problem, i, acc, residual_out, steps);
    }
    norm_row(problem, norm_input, base, out, row_trace);
  }
  if (traces != nullptr) traces->insert(traces->end(), mine.begin(), mine.end());
}

namespace {

bool same_bits(const StepValue& a, const StepValue& b) { return float_to_bits(a.value) == float_to_bits(b.value); }

}  // namespace

int compare_with_canonical(ElementTrace* alternative, const ElementTrace& canonical) {
  if (alternative->index != canonical.index || alternative->steps.size() != canonical.steps.size()) return -1;
  for (size_t s = 0; s < canonical.steps.size(); ++s) {
    if (std::string(alternative->steps[s].step) != canonical.steps[s].step || alternative->steps[s].values.empty() ||
        canonical.steps[s].values.empty()) {
      return -1;
    }
  }
  int departs = -1;
  for (size_t s = 0; s < canonical.steps.size(); ++s) {
    ElementStep& a = alternative->steps[s];
    const bool same = same_bits(a.values.back(), canonical.steps[s].values.back());
    if (same) {
      a.vs_canonical = ElementStep::VsCanonical::kSame;
    } else if (departs < 0) {
      a.vs_canonical = ElementStep::VsCanonical::kDeparts;
      departs = static_cast<int>(s);
    } else {
      a.vs_canonical = ElementStep::VsCanonical::kDiffers;
    }
  }
  return departs;
}

std::string element_trace_json(const std::vector<ElementTrace>& traces) {
  std::string out;
  char buf[96];
  for (const ElementTrace& t : traces) {
    for (size_t s = 0; s < t.steps.size(); ++s) {
      const ElementStep& step = t.steps[s];
      std::snprintf(buf, sizeof buf, "{\"event\":\"element\",\"contract\":\"%s\",\"index\":%llu",
                    contract_name(t.contract), static_cast<unsigned long long>(t.index));
      out += buf;
      std::snprintf(buf, sizeof buf, ",\"row\":%d,\"col\":%d,\"seq\":%zu,\"step\":\"%s\"", t.row, t.col, s, step.step);
      out += buf;
      for (const auto& [name, value] : step.labels) {
        std::snprintf(buf, sizeof buf, ",\"%s\":%d", name, value);
        out += buf;
      }
      for (const StepValue& v : step.values) {
        std::snprintf(buf, sizeof buf, v.bytes == 2 ? ",\"%s\":\"0x%04x\"" : ",\"%s\":\"0x%08x\"", v.name, v.bits);
        out += buf;
        out += ",\"" + std::string(v.name) + "_value\":\"" + sim::float_text(v.value) + "\"";
      }
      if (step.note != nullptr) out += ",\"note\":\"" + std::string(step.note) + "\"";
      switch (step.vs_canonical) {
        case ElementStep::VsCanonical::kNotCompared: break;
        case ElementStep::VsCanonical::kSame: out += ",\"vs_canonical\":\"same\""; break;
        case ElementStep::VsCanonical::kDiffers: out += ",\"vs_canonical\":\"differs\""; break;
        case ElementStep::VsCanonical::kDeparts: out += ",\"vs_canonical\":\"departs\""; break;
      }
      out += "}\n";
    }
  }
  return out;
}

template void fused_reference<bf16>(Contract, const FusedProblem<bf16>&, bf16*, bf16*, const std::vector<uint64_t>&,
                                    std::vector<ElementTrace>*);
template void fused_reference<fp16>(Contract, const FusedProblem<fp16>&, fp16*, fp16*, const std::vector<uint64_t>&,
                                    std::vector<ElementTrace>*);
template void fused_reference<float>(Contract, const FusedProblem<float>&, float*, float*, const std::vector<uint64_t>&,
                                     std::vector<ElementTrace>*);

}  // namespace exactcoll::fused

#include "sim/reference.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>

#include "core/contract.h"
#include "sim/collectives.h"
#include "sim/world.h"

namespace exactcoll::sim {
namespace {

template <class T>
T element(const void* base, size_t i) {
  T x;
  std::memcpy(&x, static_cast<const uint8_t*>(base) + i * sizeof(T), sizeof(T));
  return x;
}

// The contract's fold of element i over every rank's input: canonical's contract::fold or the
// tree's contract::tree_fold (core/contract.h), nothing else in between.
template <class T>
T fold_of(Contract contract, const std::vector<Bytes>& inputs, size_t i) {
  const int n = static_cast<int>(inputs.size());
  const auto value = [&](int r) { return element<T>(inputs[static_cast<size_t>(r)].data(), i); };
  switch (contract) {  // exhaustive: a new library contract fails to compile (-Wswitch) until it is here
    case Contract::kCanonical: return contract::fold<T>(n, value);
    case Contract::kTree: return contract::tree_fold<T>(n, value);
    case Contract::kF32Residual:
    case Contract::kBf16Accumulate:
    case Contract::kRotatedTwoShot: break;  // emulations of other systems: no GPU runs them
  }
  throw std::logic_error(std::string("the GPU reference folds the library contracts only, not ") +
                         contract_name(contract));
}

template <class T>
Bytes contract_typed(Contract contract, Op op, const std::vector<Bytes>& inputs, size_t count, int rank) {
  const int n = static_cast<int>(inputs.size());
  const size_t out_count = output_count(op, count, n);
  Bytes out(out_count * sizeof(T));
  T* o = reinterpret_cast<T*>(out.data());
  switch (op) {
    case Op::kAllReduce:
      for (size_t i = 0; i < count; ++i) o[i] = fold_of<T>(contract, inputs, i);
      break;
    case Op::kReduceScatter: {
      const size_t per = count / static_cast<size_t>(n);
      const size_t begin = per * static_cast<size_t>(rank);
      for (size_t j = 0; j < per; ++j) o[j] = fold_of<T>(contract, inputs, begin + j);
      break;
    }
    case Op::kAllGather:
      for (int r = 0; r < n; ++r) std::memcpy(o + static_cast<size_t>(r) * count, inputs[r].data(), count * sizeof(T));
      break;
  }
  return out;
}

}  // namespace

Simulator::Simulator(int world_size, Contract contract) : world_size_(world_size), contract_(contract) {
  if (!info(contract).library_contract) {
    throw std::invalid_argument(std::string("Simulator: the collectives fold under the library's contracts, not ") +
                                contract_name(contract));
  }
  sim::WorldOptions options;
  options.ranks = world_size;
  world_ = std::make_unique<sim::World>(options);
}

Simulator::~Simulator() = default;

std::vector<Bytes> Simulator::run(Op op, Algorithm algo, DType dtype, const std::vector<Bytes>& inputs, size_t count,
                                  int blocks) {
  if (static_cast<int>(inputs.size()) != world_size_) throw std::invalid_argument("Simulator::run: one input per rank");
  sim::CollectiveSpec spec;
  spec.op = op;  // one enum, core/registry.h
  // The same algorithm where the simulator runs it (one enum, core/registry.h); else (auto, nccl,
  // copy_engine) the op's own: every exact algorithm gives the contract's bits.
  const bool simulated = algo != Algorithm::kAuto && (info(algo).runs_on & kOnSimulator) != 0 && implements(algo, op);
  spec.algorithm = simulated ? algo : op == Op::kAllReduce ? Algorithm::kOneShot : Algorithm::kAuto;
  spec.dtype = dtype;
  spec.count = count;
  spec.blocks = blocks;
  spec.contract = contract_;
  const size_t out_bytes = output_count(op, count, world_size_) * static_cast<size_t>(dtype_size(dtype));
  std::vector<Bytes> outputs(static_cast<size_t>(world_size_), Bytes(out_bytes));
  std::vector<const void*> in_ptrs;
  std::vector<void*> out_ptrs;
  for (int r = 0; r < world_size_; ++r) {
    in_ptrs.push_back(inputs[static_cast<size_t>(r)].data());
    out_ptrs.push_back(outputs[static_cast<size_t>(r)].data());
  }
  sim::enqueue_collective(*world_, spec, in_ptrs, out_ptrs);
  world_->run();
  return outputs;
}

Bytes contract_output(Op op, DType dtype, const std::vector<Bytes>& inputs, size_t count, int rank, Contract contract) {
  if (!info(contract).library_contract) {
    throw std::invalid_argument(std::string("contract_output: not one of the library's contracts: ") +
                                contract_name(contract));
  }
  return with_storage_type(dtype,
                           [&](auto tag) { return contract_typed<decltype(tag)>(contract, op, inputs, count, rank); });
}

Comparison compare_bits(DType dtype, const void* got, const void* want, size_t count) {
  Comparison c;
  c.compared = count;
  const size_t size = static_cast<size_t>(dtype_size(dtype));
  const auto* g = static_cast<const uint8_t*>(got);
  const auto* w = static_cast<const uint8_t*>(want);
  if (std::memcmp(g, w, count * size) == 0) return c;
  for (size_t i = 0; i < count; ++i) {
    if (std::memcmp(g + i * size, w + i * size, size) == 0) continue;
    if (c.mismatches++ == 0) {
      c.first = i;
      std::memcpy(&c.got_bits, g + i * size, size);
      std::memcpy(&c.want_bits, w + i * size, size);
    }
  }
  return c;
}

namespace {

struct Limits {
  double unit_roundoff, smallest_subnormal, largest_finite;
};

template <class T>
constexpr Limits kLimits{};
template <>
constexpr Limits kLimits<bf16>{0x1p-8, 0x1p-133, 0x1.FEp127};
template <>
constexpr Limits kLimits<fp16>{0x1p-11, 0x1p-24, 65504.0};
template <>
constexpr Limits kLimits<float>{0x1p-24, 0x1p-149, 0x1.FFFFFEp127};

template <class T>
SumBoundCheck check_sum_typed(Op op, const std::vector<Bytes>& inputs, size_t count, int rank, const void* got) {
  const int n = static_cast<int>(inputs.size());
  const size_t out_count = output_count(op, count, n);
  const size_t begin = op == Op::kReduceScatter ? out_count * static_cast<size_t>(rank) : 0;
  const Limits& l = kLimits<T>;
  const double nu = n * l.unit_roundoff;
  const double gamma = nu / (1.0 - nu);
  SumBoundCheck c;
  c.compared = out_count;
  for (size_t j = 0; j < out_count; ++j) {
    // The sum in double: exact for bf16 and fp16, within n * 2^-53 * sum|x| for fp32 (far inside
    // the bound); NaN and inf follow IEEE (NaN, or the inf of the sum).
    double exact = 0, magnitude = 0;
    for (int r = 0; r < n; ++r) {
      const double x = to_float(element<T>(inputs[static_cast<size_t>(r)].data(), begin + j));
      exact += x;
      magnitude += std::fabs(x);
    }
    const double g = to_float(element<T>(got, j));
    const double bound = gamma * magnitude + n * l.smallest_subnormal;
    bool within;
    if (std::isnan(exact)) {
      within = std::isnan(g);
    } else if (std::isinf(exact)) {
      within = g == exact;
    } else if (std::isinf(g)) {
      within = std::fabs(exact) + bound >= l.largest_finite && std::signbit(g) == std::signbit(exact);
    } else {
      within = !std::isnan(g) && std::fabs(g - exact) <= bound;
    }
    if (!within && c.outside++ == 0) {
      c.first = j;
      c.got = g;
      c.exact = exact;
      c.bound = bound;
    }
  }
  return c;
}

}  // namespace

SumBoundCheck check_sum_within_bound(Op op, DType dtype, const std::vector<Bytes>& inputs, size_t count, int rank,
                                     const void* got) {
  if (op == Op::kAllGather) throw std::invalid_argument("check_sum_within_bound: all-gather is a copy, not a sum");
  return with_storage_type(dtype,
                           [&](auto tag) { return check_sum_typed<decltype(tag)>(op, inputs, count, rank, got); });
}

std::string bits_hex(DType dtype, uint32_t bits) {
  char text[16];
  std::snprintf(text, sizeof text, dtype == DType::kFP32 ? "0x%08x" : "0x%04x", bits);
  return text;
}

}  // namespace exactcoll::sim

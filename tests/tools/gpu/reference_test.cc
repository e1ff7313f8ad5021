// The machinery `exactcoll verify` and `bench` compare GPU outputs with, on CPU: the input
// patterns hold what they promise, the simulator and the independent contract transcription agree
// on them (so a GPU mismatch reported by verify is the GPU's), and the bit comparison catches one
// flipped bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>

#include "sim/reference.h"
#include "tools/inputs/inputs.h"

namespace exactcoll::gpu {
namespace {

using sim::bits_hex;
using sim::Bytes;
using sim::check_sum_within_bound;
using sim::compare_bits;
using sim::Comparison;
using sim::contract_output;
using sim::Simulator;
using sim::SumBoundCheck;

uint32_t bits_at(DType d, const Bytes& b, size_t i) {
  uint32_t v = 0;
  std::memcpy(&v, b.data() + i * static_cast<size_t>(dtype_size(d)), static_cast<size_t>(dtype_size(d)));
  return v;
}

TEST(Inputs, AreDeterministicPerSeedAndDifferPerRank) {
  const Bytes a = make_input(DType::kBF16, 1000, 1, 42, Pattern::kRandom);
  EXPECT_EQ(a, make_input(DType::kBF16, 1000, 1, 42, Pattern::kRandom));
  EXPECT_NE(a, make_input(DType::kBF16, 1000, 2, 42, Pattern::kRandom));
  EXPECT_NE(a, make_input(DType::kBF16, 1000, 1, 43, Pattern::kRandom));
  EXPECT_EQ(a.size(), 2000u);
  EXPECT_EQ(make_input(DType::kFP32, 10, 0, 1, Pattern::kRandom).size(), 40u);
}

TEST(Inputs, SpecialsHoldEveryKindOfValue) {
  for (DType d : {DType::kBF16, DType::kFP16}) {
    const Bytes x = make_input(d, 20000, 0, 7, Pattern::kSpecials);
    const uint32_t exp_mask = d == DType::kBF16 ? 0x7F80u : 0x7C00u;
    const uint32_t mant_mask = d == DType::kBF16 ? 0x7Fu : 0x3FFu;
    std::set<std::string> seen;
    for (size_t i = 0; i < 20000; ++i) {
      const uint32_t b = bits_at(d, x, i);
      const uint32_t mag = b & 0x7FFFu;
      if (mag == 0) seen.insert(b & 0x8000u ? "-0" : "+0");
      if (mag == exp_mask) seen.insert(b & 0x8000u ? "-inf" : "+inf");
      if ((b & exp_mask) == exp_mask && (b & mant_mask) != 0) seen.insert(b == 0x7FFFu ? "nan7fff" : "nan_payload");
      if ((b & exp_mask) == 0 && (b & mant_mask) != 0) seen.insert("subnormal");
    }
    for (const char* kind : {"+0", "-0", "+inf", "-inf", "nan_payload", "subnormal"}) {
      EXPECT_TRUE(seen.count(kind)) << dtype_name(d) << " specials lack " << kind;
    }
  }
}

TEST(Inputs, CancelGivesRanksZeroAndOneOppositeValues) {
  const auto in = make_inputs(DType::kFP32, 100, 3, 5, Pattern::kCancel);
  for (size_t i = 0; i < 100; ++i)
    EXPECT_EQ(bits_at(DType::kFP32, in[0], i) ^ 0x80000000u, bits_at(DType::kFP32, in[1], i));
}

// The simulator and the scalar contract agree on every pattern, op, dtype and world size tried.
TEST(Reference, SimulatorEqualsContractOnAdversarialInputs) {
  for (int n : {1, 2, 3, 4}) {
    Simulator sim(n);
    for (Op op : {Op::kAllReduce, Op::kReduceScatter, Op::kAllGather}) {
      for (DType d : {DType::kBF16, DType::kFP16, DType::kFP32}) {
        for (Pattern p : all_patterns()) {
          for (size_t c : {size_t{1}, size_t{9}, size_t{1001}}) {
            const size_t count = op == Op::kReduceScatter ? c * static_cast<size_t>(n) : c;
            const auto inputs = make_inputs(d, count, n, 11, p);
            const std::vector<Algorithm> algos =
                op == Op::kAllReduce ? std::vector<Algorithm>{Algorithm::kOneShot, Algorithm::kTwoShot,
                                                              Algorithm::kPushOneShot, Algorithm::kPushTwoShot}
                                     : std::vector<Algorithm>{Algorithm::kDirect};
            for (Algorithm a : algos) {
              const auto outs = sim.run(op, a, d, inputs, count, 3);
              for (int r = 0; r < n; ++r) {
                const Bytes want = contract_output(op, d, inputs, count, r);
                const Comparison cmp =
                    compare_bits(d, outs[static_cast<size_t>(r)].data(), want.data(), output_count(op, count, n));
                EXPECT_EQ(cmp.mismatches, 0u)
                    << op_name(op) << " " << dtype_name(d) << " " << pattern_name(p) << " n=" << n << " count=" << count
                    << " rank " << r << " first " << cmp.first;
              }
            }
          }
        }
      }
    }
  }
}

TEST(Reference, ContractAllReduceFollowsTheFoldOrder) {
  // bf16 max finite 0x7F7F: (max + max) overflows in fp32? No: 2 * 3.39e38 = 6.8e38 > FLT_MAX, so
  // (max + max) + (-max) = inf, while the other orders give max. Rank order 0, 1, 2 decides.
  std::vector<Bytes> in(3, Bytes(2));
  const uint16_t max = 0x7F7F, neg = 0xFF7F;
  std::memcpy(in[0].data(), &max, 2);
  std::memcpy(in[1].data(), &max, 2);
  std::memcpy(in[2].data(), &neg, 2);
  const Bytes out = contract_output(Op::kAllReduce, DType::kBF16, in, 1, 0);
  EXPECT_EQ(bits_at(DType::kBF16, out, 0), 0x7F80u);  // +inf
  std::swap(in[1], in[2]);
  const Bytes out2 = contract_output(Op::kAllReduce, DType::kBF16, in, 1, 0);
  EXPECT_EQ(bits_at(DType::kBF16, out2, 0), 0x7F7Fu);  // max
}

// Under tree the scalar transcription rounds every node of the tree to storage: bf16 1, 2^-8,
// 2^-8, 0 gives round(1 + 2^-8) = 1 (a tie, to even) on the left and 2^-8 on the right, so 1;
// canonical adds all four in fp32 (1 + 2^-7) and rounds once.
TEST(Reference, ContractOutputUnderTreeRoundsEveryNode) {
  const uint16_t bits[4] = {0x3F80, 0x3B80, 0x3B80, 0x0000};  // 1, 2^-8, 2^-8, +0
  std::vector<Bytes> in(4, Bytes(2));
  for (int r = 0; r < 4; ++r) std::memcpy(in[static_cast<size_t>(r)].data(), &bits[r], 2);
  EXPECT_EQ(bits_at(DType::kBF16, contract_output(Op::kAllReduce, DType::kBF16, in, 1, 0, Contract::kTree), 0),
            0x3F80u);
  EXPECT_EQ(bits_at(DType::kBF16, contract_output(Op::kAllReduce, DType::kBF16, in, 1, 0, Contract::kCanonical), 0),
            0x3F81u);
  // Three ranks 2^-8, 2^-8, 1: the largest power of two below 3 (ranks 0 and 1) on the left, so
  // round(2^-7 + 1) = 1 + 2^-7; the other split (rank 0 alone on the left) would give
  // round(2^-8 + round(2^-8 + 1)) = 1.
  const uint16_t three[3] = {0x3B80, 0x3B80, 0x3F80};
  in.assign(3, Bytes(2));
  for (int r = 0; r < 3; ++r) std::memcpy(in[static_cast<size_t>(r)].data(), &three[r], 2);
  EXPECT_EQ(bits_at(DType::kBF16, contract_output(Op::kAllReduce, DType::kBF16, in, 1, 0, Contract::kTree), 0),
            0x3F81u);
}

// Under tree the simulator (CollectiveSpec::contract) and the scalar transcription
// (contract::tree_fold) agree on every pattern, op, dtype and world size tried, powers of two and
// not; on random inputs both differ from canonical (from 3 ranks on, fp32 from 4). The emulations
// are refused.
TEST(Reference, TreeSimulatorEqualsTreeContract) {
  for (int n : {1, 2, 3, 4, 5, 8}) {
    Simulator sim(n, Contract::kTree);
    Simulator canonical(n);
    for (Op op : {Op::kAllReduce, Op::kReduceScatter, Op::kAllGather}) {
      for (DType d : {DType::kBF16, DType::kFP16, DType::kFP32}) {
        for (Pattern p : all_patterns()) {
          for (size_t c : {size_t{1}, size_t{9}, size_t{1001}}) {
            const size_t count = op == Op::kReduceScatter ? c * static_cast<size_t>(n) : c;
            const auto inputs = make_inputs(d, count, n, 13, p);
            const std::vector<Algorithm> algos =
                op == Op::kAllReduce
                    ? std::vector<Algorithm>{Algorithm::kOneShot, Algorithm::kTwoShot, Algorithm::kPushOneShot,
                                             Algorithm::kPushTwoShot, Algorithm::kLamportOneShot}
                    : std::vector<Algorithm>{Algorithm::kDirect};
            for (Algorithm a : algos) {
              const auto outs = sim.run(op, a, d, inputs, count, 3);
              for (int r = 0; r < n; ++r) {
                const Bytes want = contract_output(op, d, inputs, count, r, Contract::kTree);
                const Comparison cmp =
                    compare_bits(d, outs[static_cast<size_t>(r)].data(), want.data(), output_count(op, count, n));
                EXPECT_EQ(cmp.mismatches, 0u)
                    << op_name(op) << " " << dtype_name(d) << " " << pattern_name(p) << " n=" << n << " count=" << count
                    << " " << algorithm_name(a) << " rank " << r << " first " << cmp.first;
              }
            }
            // fp32 adds in fp32 either way: with 3 ranks both are (x0 + x1) + x2; from 4 on the
            // orders differ. bf16 and fp16 round every node, so from 3 on.
            if (op == Op::kAllReduce && p == Pattern::kRandom && c == 1001 && n >= (d == DType::kFP32 ? 4 : 3)) {
              EXPECT_NE(sim.run(op, Algorithm::kOneShot, d, inputs, count, 3)[0],
                        canonical.run(op, Algorithm::kOneShot, d, inputs, count, 3)[0])
                  << dtype_name(d) << " n=" << n << ": tree gave canonical's bits";
            }
          }
        }
      }
    }
  }
  EXPECT_THROW(Simulator(2, Contract::kF32Residual), std::invalid_argument);
  EXPECT_THROW(
      contract_output(Op::kAllReduce, DType::kBF16, std::vector<Bytes>(2, Bytes(2)), 1, 0, Contract::kBf16Accumulate),
      std::invalid_argument);
}

TEST(Reference, CompareBitsCatchesOneFlippedBit) {
  Bytes a = make_input(DType::kBF16, 4096, 0, 3, Pattern::kRandomBits);
  Bytes b = a;
  EXPECT_EQ(compare_bits(DType::kBF16, a.data(), b.data(), 4096).mismatches, 0u);
  b[2 * 1234 + 1] ^= 0x01;  // one bit of element 1234
  const Comparison c = compare_bits(DType::kBF16, a.data(), b.data(), 4096);
  EXPECT_EQ(c.mismatches, 1u);
  EXPECT_EQ(c.first, 1234u);
  EXPECT_EQ(c.got_bits ^ c.want_bits, 0x100u);
  EXPECT_EQ(bits_hex(DType::kBF16, 0x7fc1), "0x7fc1");
  EXPECT_EQ(bits_hex(DType::kFP32, 0x7fc00001), "0x7fc00001");
}

// The sum bound bench holds NCCL to: the contract's result and a sum in another order are both
// inside it; an element moved by a few bound-widths is outside, and so are a NaN where the sum is
// finite and a finite value where it is NaN.
template <class T>
Bytes reverse_order_sum(const std::vector<Bytes>& inputs, size_t count) {
  // A different order than the contract's: rank n-1 first, rounding to T after every addition.
  Bytes out(count * sizeof(T));
  for (size_t i = 0; i < count; ++i) {
    float acc = 0;
    for (size_t r = inputs.size(); r-- > 0;) {
      T x;
      std::memcpy(&x, inputs[r].data() + i * sizeof(T), sizeof(T));
      acc = to_float(round_to<T>(acc + to_float(x)));
    }
    const T y = round_to<T>(acc);
    std::memcpy(out.data() + i * sizeof(T), &y, sizeof(T));
  }
  return out;
}

TEST(SumBound, HoldsForEveryOrderAndCatchesAMovedElement) {
  for (DType d : {DType::kBF16, DType::kFP16, DType::kFP32}) {
    for (int n : {2, 4, 8}) {
      const size_t count = 4096;
      const auto in = make_inputs(d, count, n, 11, Pattern::kRandom);
      const Bytes contract = contract_output(Op::kAllReduce, d, in, count, 0);
      const SumBoundCheck a = check_sum_within_bound(Op::kAllReduce, d, in, count, 0, contract.data());
      EXPECT_EQ(a.compared, count);
      EXPECT_EQ(a.outside, 0u) << dtype_name(d) << " n=" << n << " element " << a.first << ": got " << a.got
                               << ", exact " << a.exact << ", bound " << a.bound;
      const Bytes other = d == DType::kBF16   ? reverse_order_sum<bf16>(in, count)
                          : d == DType::kFP16 ? reverse_order_sum<fp16>(in, count)
                                              : reverse_order_sum<float>(in, count);
      // Two addends commute; from 4 on, the other order rounds some elements differently.
      if (n > 2) {
        EXPECT_NE(other, contract) << dtype_name(d) << " n=" << n << ": the other order rounded alike";
      }
      EXPECT_EQ(check_sum_within_bound(Op::kAllReduce, d, in, count, 0, other.data()).outside, 0u)
          << dtype_name(d) << " n=" << n;
      // Element 100 moved by 4 bound-widths (the value of the type nearest exact + 4 * bound).
      Bytes moved = contract;
      double exact = 0, magnitude = 0;
      for (int r = 0; r < n; ++r) {
        double x = 0;
        if (d == DType::kFP32) {
          float f;
          std::memcpy(&f, in[static_cast<size_t>(r)].data() + 100 * 4, 4);
          x = f;
        } else {
          uint16_t h;
          std::memcpy(&h, in[static_cast<size_t>(r)].data() + 100 * 2, 2);
          x = d == DType::kBF16 ? bf16_bits_to_float(h) : fp16_bits_to_float(h);
        }
        exact += x;
        magnitude += std::fabs(x);
      }
      const double u = d == DType::kBF16 ? 0x1p-8 : d == DType::kFP16 ? 0x1p-11 : 0x1p-24;
      const double far = exact + 4 * (n * u / (1 - n * u)) * magnitude + 1e-3;
      if (d == DType::kFP32) {
        const float f = static_cast<float>(far);
        std::memcpy(moved.data() + 100 * 4, &f, 4);
      } else {
        const uint16_t h = d == DType::kBF16 ? round_to<bf16>(static_cast<float>(far)).bits
                                             : round_to<fp16>(static_cast<float>(far)).bits;
        std::memcpy(moved.data() + 100 * 2, &h, 2);
      }
      const SumBoundCheck m = check_sum_within_bound(Op::kAllReduce, d, in, count, 0, moved.data());
      EXPECT_EQ(m.outside, 1u) << dtype_name(d) << " n=" << n;
      EXPECT_EQ(m.first, 100u);
    }
  }
}

TEST(SumBound, ReduceScatterChecksItsSliceAndNaNsAreChecked) {
  const int n = 4;
  const size_t count = 64;
  auto in = make_inputs(DType::kFP32, count, n, 3, Pattern::kRandom);
  for (int rank = 0; rank < n; ++rank) {
    const Bytes out = contract_output(Op::kReduceScatter, DType::kFP32, in, count, rank);
    const SumBoundCheck c = check_sum_within_bound(Op::kReduceScatter, DType::kFP32, in, count, rank, out.data());
    EXPECT_EQ(c.compared, count / n);
    EXPECT_EQ(c.outside, 0u) << "rank " << rank;
    // Rank 0's slice given as rank 1's: outside nearly everywhere.
    if (rank == 1) {
      const Bytes slice0 = contract_output(Op::kReduceScatter, DType::kFP32, in, count, 0);
      EXPECT_GT(check_sum_within_bound(Op::kReduceScatter, DType::kFP32, in, count, 1, slice0.data()).outside, 12u);
    }
  }
  // A NaN input: the sum must be a NaN; a NaN output where the sum is finite is outside.
  const float nan = std::nanf(""), one = 1.0f;
  std::memcpy(in[2].data() + 5 * 4, &nan, 4);
  Bytes out = contract_output(Op::kAllReduce, DType::kFP32, in, count, 0);
  EXPECT_EQ(check_sum_within_bound(Op::kAllReduce, DType::kFP32, in, count, 0, out.data()).outside, 0u);
  std::memcpy(out.data() + 5 * 4, &one, 4);
  std::memcpy(out.data() + 6 * 4, &nan, 4);
  const SumBoundCheck c = check_sum_within_bound(Op::kAllReduce, DType::kFP32, in, count, 0, out.data());
  EXPECT_EQ(c.outside, 2u);
  EXPECT_EQ(c.first, 5u);
  EXPECT_THROW(check_sum_within_bound(Op::kAllGather, DType::kFP32, in, count, 0, out.data()), std::invalid_argument);
}

}  // namespace
}  // namespace exactcoll::gpu

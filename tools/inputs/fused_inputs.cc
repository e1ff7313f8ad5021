#include "tools/inputs/fused_inputs.h"

#include <cstring>

#include "sim/fused/random.h"

namespace exactcoll::gpu {
namespace {

uint64_t stream_seed(uint64_t seed, uint64_t a, uint64_t b) {
  fused::SplitMix64 mix(seed ^ (a * 0x9E3779B97F4A7C15ull) ^ (b * 0xC2B2AE3D27D4EB4Full));
  return mix.next();
}

// Storage bits of a finite value from `bits` (at least 1 + 3 + mantissa bits used): sign (when
// random_sign), an unbiased exponent lo + (3 bits % span), the mantissa.
uint32_t finite_bits(DType dtype, uint64_t bits, int lo, int span, bool random_sign) {
  const uint32_t sign = random_sign ? static_cast<uint32_t>(bits & 1) : 0u;
  const int e = lo + static_cast<int>((bits >> 1) & 7) % span;
  const uint64_t m = bits >> 4;
  switch (dtype) {
    case DType::kBF16: return (sign << 15) | (static_cast<uint32_t>(e + 127) << 7) | static_cast<uint32_t>(m & 0x7F);
    case DType::kFP16: return (sign << 15) | (static_cast<uint32_t>(e + 15) << 10) | static_cast<uint32_t>(m & 0x3FF);
    case DType::kFP32:
      return (sign << 31) | (static_cast<uint32_t>(e + 127) << 23) | static_cast<uint32_t>(m & 0x7FFFFF);
  }
  return 0;
}

// Fills n elements at dst with finite values: 16 random bits each for bf16/fp16, 32 for fp32.
void fill_finite(DType dtype, uint64_t seed, int lo, int span, bool random_sign, uint8_t* dst, size_t n) {
  fused::SplitMix64 rng(seed);
  if (dtype == DType::kFP32) {
    for (size_t i = 0; i < n; i += 2) {
      const uint64_t r = rng.next();
      for (size_t k = 0; k < 2 && i + k < n; ++k) {
        const uint32_t v = finite_bits(dtype, r >> (32 * k), lo, span, random_sign);
        std::memcpy(dst + (i + k) * 4, &v, 4);
      }
    }
  } else {
    for (size_t i = 0; i < n; i += 4) {
      const uint64_t r = rng.next();
      for (size_t k = 0; k < 4 && i + k < n; ++k) {
        const uint16_t v = static_cast<uint16_t>(finite_bits(dtype, (r >> (16 * k)) & 0xFFFF, lo, span, random_sign));
        std::memcpy(dst + (i + k) * 2, &v, 2);
      }
    }
  }
}

struct Specials {
  uint32_t nan_payload, pos_inf, neg_inf, largest, neg_zero;
};

Specials specials_of(DType dtype) {
  switch (dtype) {
    case DType::kBF16: return {0xFF81u, 0x7F80u, 0xFF80u, 0x7F7Fu, 0x8000u};
    case DType::kFP16: return {0xFE01u, 0x7C00u, 0xFC00u, 0x7BFFu, 0x8000u};
    case DType::kFP32: return {0xFFC00123u, 0x7F800000u, 0xFF800000u, 0x7F7FFFFFu, 0x80000000u};
  }
  return {};
}

// -0, +0 or one of the smallest subnormals of either sign.
uint32_t tiny_bits(DType dtype, uint64_t r) {
  const uint32_t sign = static_cast<uint32_t>(r & 1);
  const uint32_t m = static_cast<uint32_t>((r >> 1) % 4);
  return dtype == DType::kFP32 ? (sign << 31) | m : (sign << 15) | m;
}

void put(uint8_t* base, DType dtype, size_t i, uint32_t bits) {
  if (dtype == DType::kFP32) {
    std::memcpy(base + i * 4, &bits, 4);
  } else {
    const uint16_t h = static_cast<uint16_t>(bits);
    std::memcpy(base + i * 2, &h, 2);
  }
}

constexpr uint64_t kResidualStream = 1ull << 40, kSpecialStream = 2ull << 40, kWeightStream = 3ull << 40;

// Writes row `row` of the problem into row `at` of *in (x of the ranks whose buffers are not empty).
void make_row(uint64_t seed, bool specials, int row, FusedInputs* in, int at) {
  const DType dtype = in->dtype;
  const size_t elem = static_cast<size_t>(dtype_size(dtype));
  const size_t H = static_cast<size_t>(in->hidden);
  const size_t offset = static_cast<size_t>(at) * H;
  // 1. Finite values (x: exponents -6..1; residual: -3..0).
  for (int r = 0; r < in->ranks; ++r) {
    auto& x = in->x[static_cast<size_t>(r)];
    if (!x.empty()) {
      fill_finite(dtype, stream_seed(seed, static_cast<uint64_t>(row), static_cast<uint64_t>(r)), -6, 8, true,
                  x.data() + offset * elem, H);
    }
  }
  fill_finite(dtype, stream_seed(seed, static_cast<uint64_t>(row), kResidualStream), -3, 4, true,
              in->residual.data() + offset * elem, H);
  if (!specials) return;
  // 2. One kind of adversarial value in about half of the rows.
  const Specials s = specials_of(dtype);
  fused::SplitMix64 rng(stream_seed(seed, static_cast<uint64_t>(row), kSpecialStream));
  const uint64_t kind = rng.next() % 12;
  const size_t column = rng.next() % H;
  const size_t i = offset + column;
  const size_t rank = static_cast<size_t>(rng.next() % static_cast<uint64_t>(in->ranks));
  auto put_x = [&](size_t r, size_t index, uint32_t bits) {
    if (!in->x[r].empty()) put(in->x[r].data(), dtype, index, bits);
  };
  switch (kind) {
    case 0: put_x(rank, i, s.nan_payload); break;
    case 1: put(in->residual.data(), dtype, i, s.pos_inf); break;
    case 2: put(in->residual.data(), dtype, i, s.neg_inf); break;
    case 3:  // +inf and -inf at one element: NaN (one rank: just -inf)
      put_x(0, i, s.pos_inf);
      put_x(static_cast<size_t>(in->ranks - 1), i, s.neg_inf);
      break;
    case 4:
      for (size_t r = 0; r < in->x.size(); ++r) put_x(r, i, s.largest);
      break;
    case 5:
      for (size_t j = 0; j < H; ++j) {
        for (size_t r = 0; r < in->x.size(); ++r) put_x(r, offset + j, tiny_bits(dtype, rng.next()));
        put(in->residual.data(), dtype, offset + j, tiny_bits(dtype, rng.next()));
      }
      break;
    default: break;  // a plain row
  }
}

FusedInputs allocate(DType dtype, int ranks, int rows, int hidden, uint64_t seed, bool specials, int only_rank) {
  FusedInputs in;
  in.ranks = ranks, in.rows = rows, in.hidden = hidden, in.dtype = dtype;
  const size_t elem = static_cast<size_t>(dtype_size(dtype));
  in.x.resize(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    if (only_rank < 0 || r == only_rank) in.x[static_cast<size_t>(r)].resize(in.count() * elem);
  }
  in.residual.resize(in.count() * elem);
  in.weight.resize(static_cast<size_t>(hidden) * elem);
  // Weights in [0.5, 2) (exponents -1..0), positive.
  fill_finite(dtype, stream_seed(seed, 0, kWeightStream), -1, 2, false, in.weight.data(), static_cast<size_t>(hidden));
  if (specials && seed % 3 == 0 && hidden >= 3) {
    const Specials s = specials_of(dtype);
    put(in.weight.data(), dtype, 0, s.nan_payload);
    put(in.weight.data(), dtype, 1, s.pos_inf);
    put(in.weight.data(), dtype, 2, s.neg_zero);
  }
  return in;
}

}  // namespace

FusedInputs make_fused_inputs(DType dtype, int ranks, int rows, int hidden, uint64_t seed, bool specials,
                              int only_rank) {
  FusedInputs in = allocate(dtype, ranks, rows, hidden, seed, specials, only_rank);
  for (int row = 0; row < rows; ++row) make_row(seed, specials, row, &in, row);
  return in;
}

FusedInputs make_fused_rows(DType dtype, int ranks, int hidden, uint64_t seed, bool specials,
                            const std::vector<int>& row_list) {
  FusedInputs in = allocate(dtype, ranks, static_cast<int>(row_list.size()), hidden, seed, specials, -1);
  for (size_t k = 0; k < row_list.size(); ++k) make_row(seed, specials, row_list[k], &in, static_cast<int>(k));
  return in;
}

std::string check_fused_arrays(DType dtype, int64_t ranks, const std::string& ranks_flag, NamedArray x,
                               NamedArray residual, NamedArray weight) {
  const std::string want = dtype == DType::kFP32 ? npy::kF32 : npy::kU16;
  for (const NamedArray& a : {x, residual, weight}) {
    if (a.array.dtype != want) {
      return a.path + " holds '" + a.array.dtype + "' but --dtype " + dtype_name(dtype) + " needs '" + want +
             "' (bf16 and fp16 as uint16 bit patterns, fp32 as float32)";
    }
  }
  const std::vector<int64_t>& shape = x.array.shape;
  if (shape.size() != 3) return x.path + " must be [N, rows, H], got shape " + npy::shape_text(shape);
  if (shape[0] != ranks) {
    return x.path + " has " + std::to_string(shape[0]) + " ranks in its first dimension, " + ranks_flag + " is " +
           std::to_string(ranks);
  }
  const int64_t rows = shape[1], hidden = shape[2];
  if (rows < 1 || hidden < 1 || rows > (1 << 24) || hidden > (1 << 24)) {
    return x.path + ": rows and H must be in 1..16777216, got shape " + npy::shape_text(shape);
  }
  if (residual.array.shape != std::vector<int64_t>{rows, hidden}) {
    return residual.path + " must be [rows, H] = " + npy::shape_text({rows, hidden}) + ", got " +
           npy::shape_text(residual.array.shape);
  }
  if (weight.array.shape != std::vector<int64_t>{hidden}) {
    return weight.path + " must be [H] = " + npy::shape_text({hidden}) + ", got " + npy::shape_text(weight.array.shape);
  }
  const int pack = pack_elements(dtype);
  if (hidden % pack != 0) {
    return "hidden size " + std::to_string(hidden) + " is not a positive multiple of the " + dtype_name(dtype) +
           " pack (" + std::to_string(pack) + " elements)";
  }
  return "";
}

std::string read_fused_files(const FusedInputFlags& flags, DType dtype, int64_t ranks, const std::string& ranks_flag,
                             int only_rank, FusedInputs* in) {
  npy::NpyArray x, residual, weight;
  try {
    x = npy::read_npy(cli::resolve_path(flags.input));
    residual = npy::read_npy(cli::resolve_path(flags.residual));
    weight = npy::read_npy(cli::resolve_path(flags.weight));
  } catch (const npy::NpyError& e) {
    return e.what();
  }
  if (const std::string problem = check_fused_arrays(dtype, ranks, ranks_flag, {flags.input, x},
                                                     {flags.residual, residual}, {flags.weight, weight});
      !problem.empty()) {
    return problem;
  }
  in->ranks = static_cast<int>(ranks);
  in->rows = static_cast<int>(x.shape[1]);
  in->hidden = static_cast<int>(x.shape[2]);
  in->dtype = dtype;
  const size_t bytes = in->count() * static_cast<size_t>(dtype_size(dtype));
  in->x.assign(static_cast<size_t>(ranks), {});
  for (int r = 0; r < ranks; ++r) {
    if (only_rank >= 0 && r != only_rank) continue;
    const auto first = x.data.begin() + static_cast<std::ptrdiff_t>(bytes * static_cast<size_t>(r));
    in->x[static_cast<size_t>(r)].assign(first, first + static_cast<std::ptrdiff_t>(bytes));
  }
  in->residual = std::move(residual.data);
  in->weight = std::move(weight.data);
  return "";
}

void add_fused_input_flags(cli::ArgParser& parser, FusedInputFlags* flags) {
  parser.add_string("input", &flags->input, "x.npy: [N, rows, H] partial sums");
  parser.add_string("residual", &flags->residual, "r.npy: [rows, H] residual (the same on every rank)");
  parser.add_string("weight", &flags->weight, "w.npy: [H] RMSNorm weight");
  parser.add_int("rows", &flags->rows, "rows of random inputs (without --input)");
  parser.set_default_note("rows", "required without --input");
  parser.add_int("hidden", &flags->hidden, "H of random inputs (without --input)");
  parser.set_default_note("hidden", "required without --input");
  parser.add_bool("specials", &flags->specials, "random inputs with NaN, inf, overflow and subnormal rows");
  parser.add_double("eps", &flags->eps, "RMSNorm epsilon");
  parser.add_string("residual-output", &flags->residual_output, "ro.npy: [N, rows, H] residual output");
}

}  // namespace exactcoll::gpu

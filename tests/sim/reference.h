// A small, independent scalar reference of the rounding contract (docs/numerics.md) for the
// simulator tests. It shares no code with core/: widening is written from the format definitions
// (ldexp), and narrowing finds the nearest representable value in a table of every finite value
// of the format (ties to the even bit pattern; past the largest finite value the next power of two
// stands for infinity, as IEEE rounding with an unbounded exponent prescribes).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace exactcoll::reference {

enum class Format { kBF16, kFP16, kFP32 };

inline float from_bits32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t to_bits32(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

constexpr uint32_t kNaN32 = 0x7FFFFFFF;
constexpr uint16_t kNaN16 = 0x7FFF;

// Value of a 16-bit pattern (bf16: 8 exponent bits, 7 mantissa; fp16: 5 and 10). NaN: bf16 keeps
// the payload (a 16-bit shift), fp16 gives the canonical 0x7FFFFFFF.
inline float widen16(Format f, uint16_t bits) {
  const bool negative = bits & 0x8000;
  if (f == Format::kBF16) {
    const int e = (bits >> 7) & 0xFF;
    const int m = bits & 0x7F;
    if (e == 0xFF) return m ? from_bits32(static_cast<uint32_t>(bits) << 16) : (negative ? -INFINITY : INFINITY);
    const double v = e == 0 ? std::ldexp(m, -133) : std::ldexp(128 + m, e - 134);
    return static_cast<float>(negative ? -v : v);
  }
  const int e = (bits >> 10) & 0x1F;
  const int m = bits & 0x3FF;
  if (e == 0x1F) return m ? from_bits32(kNaN32) : (negative ? -INFINITY : INFINITY);
  const double v = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
  return static_cast<float>(negative ? -v : v);
}

// Every non-negative finite value of a 16-bit format in increasing order, then the next power of
// two (standing for infinity).
struct Table {
  std::vector<double> values;
  std::vector<uint16_t> bits;
};

inline const Table& table(Format f) {
  static const std::vector<Table> all = [] {
    std::vector<Table> t(2);
    for (int which = 0; which < 2; ++which) {
      const Format format = which == 0 ? Format::kBF16 : Format::kFP16;
      const uint16_t max_finite = format == Format::kBF16 ? 0x7F7F : 0x7BFF;
      for (uint32_t b = 0; b <= max_finite; ++b) {
        t[which].values.push_back(widen16(format, static_cast<uint16_t>(b)));
        t[which].bits.push_back(static_cast<uint16_t>(b));
      }
      t[which].values.push_back(format == Format::kBF16 ? std::ldexp(1.0, 128) : 65536.0);
      t[which].bits.push_back(format == Format::kBF16 ? 0x7F80 : 0x7C00);
    }
    return t;
  }();
  return all[f == Format::kBF16 ? 0 : 1];
}

// Round to nearest, ties to even; NaN -> 0x7FFF; the sign of x is kept (also for zero).
inline uint16_t narrow16(Format f, float x) {
  if (std::isnan(x)) return kNaN16;
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const Table& t = table(f);
  const double a = std::fabs(static_cast<double>(x));
  if (std::isinf(x) || a >= t.values.back()) return sign | t.bits.back();
  // First value > a; the candidates are the one before it and it.
  const size_t hi = static_cast<size_t>(std::upper_bound(t.values.begin(), t.values.end(), a) - t.values.begin());
  const size_t lo = hi - 1;
  const double below = a - t.values[lo];
  const double above = t.values[hi] - a;
  size_t pick;
  if (below < above) {
    pick = lo;
  } else if (above < below) {
    pick = hi;
  } else {
    pick = (t.bits[lo] & 1) == 0 ? lo : hi;
  }
  return sign | t.bits[pick];
}

// The contract's fold of one element over ranks 0..n-1 (x holds the n storage bit patterns):
// widen, add in fp32 in rank order (NaN results canonical), round once to storage.
inline uint32_t fold(Format f, const std::vector<uint32_t>& x) {
  auto widen = [&](uint32_t b) { return f == Format::kFP32 ? from_bits32(b) : widen16(f, static_cast<uint16_t>(b)); };
  float acc = widen(x[0]);
  for (size_t r = 1; r < x.size(); ++r) {
    acc = acc + widen(x[r]);
    if (std::isnan(acc)) acc = from_bits32(kNaN32);
  }
  if (f == Format::kFP32) return std::isnan(acc) ? kNaN32 : to_bits32(acc);
  return narrow16(f, acc);
}

}  // namespace exactcoll::reference

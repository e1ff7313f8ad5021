#include "tools/diff/compare.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

namespace exactcoll::diff {
namespace {

// ord(bits): value order as integers; sign-magnitude to two's complement.
int64_t ordered(DType dtype, uint32_t bits) {
  const uint32_t sign = dtype == DType::kFP32 ? 0x80000000u : 0x8000u;
  const int64_t magnitude = static_cast<int64_t>(bits & (sign - 1));
  return (bits & sign) ? -magnitude : magnitude;
}

template <class Load>
CompareResult compare_with(DType dtype, size_t count, Load load) {
  CompareResult r;
  r.count = count;
  for (size_t i = 0; i < count; ++i) {
    uint32_t a = 0, b = 0;
    load(i, &a, &b);
    if (a == b) {
      ++r.equal;
      ++r.ulp_histogram[0];
      if (!is_nan_bits(dtype, a)) {
        const double v = bits_value(dtype, b);
        r.sum_sq_b += v * v;
      }
      continue;
    }
    if (!r.has_first_diff) {
      r.has_first_diff = true;
      r.first_diff = i;
      r.first_a_bits = a;
      r.first_b_bits = b;
    }
    const bool a_nan = is_nan_bits(dtype, a), b_nan = is_nan_bits(dtype, b);
    if (a_nan != b_nan) {
      ++r.nan_mismatch;
      continue;
    }
    if (a_nan) {  // both NaN, different payloads
      ++r.ulp_histogram[0];
      continue;
    }
    const uint64_t ulp = ulp_distance(dtype, a, b);
    ++r.ulp_histogram[ulp_bucket(ulp)];
    if (ulp > r.max_ulp) r.max_ulp = ulp;
    const double va = bits_value(dtype, a), vb = bits_value(dtype, b);
    // inf - inf of equal signs is bitwise equal (handled above); opposite signs give inf.
    const double d = std::fabs(va - vb);
    if (d > r.max_abs_diff) r.max_abs_diff = d;
    r.sum_sq_diff += d * d;
    r.sum_sq_b += vb * vb;
  }
  return r;
}

}  // namespace

int ulp_bucket(uint64_t ulp) {
  if (ulp <= 2) return static_cast<int>(ulp);
  if (ulp <= 4) return 3;
  if (ulp <= 8) return 4;
  if (ulp <= 16) return 5;
  return 6;
}

uint64_t ulp_distance(DType dtype, uint32_t a_bits, uint32_t b_bits) {
  const int64_t d = ordered(dtype, a_bits) - ordered(dtype, b_bits);
  return static_cast<uint64_t>(d < 0 ? -d : d);
}

bool is_nan_bits(DType dtype, uint32_t bits) {
  switch (dtype) {
    case DType::kBF16: return (bits & 0x7FFFu) > 0x7F80u;
    case DType::kFP16: return (bits & 0x7FFFu) > 0x7C00u;
    case DType::kFP32: return (bits & 0x7FFFFFFFu) > 0x7F800000u;
  }
  return false;
}

double bits_value(DType dtype, uint32_t bits) {
  switch (dtype) {
    case DType::kBF16: return bf16_bits_to_float(static_cast<uint16_t>(bits));
    case DType::kFP16: return fp16_bits_to_float(static_cast<uint16_t>(bits));
    case DType::kFP32: return bits_to_float(bits);
  }
  return 0;
}

double CompareResult::relative_l2() const {
  if (sum_sq_b == 0) return sum_sq_diff == 0 ? 0.0 : std::numeric_limits<double>::infinity();
  return std::sqrt(sum_sq_diff / sum_sq_b);
}

CompareResult compare(DType dtype, const void* a, const void* b, size_t count) {
  if (dtype == DType::kFP32) {
    const uint8_t* pa = static_cast<const uint8_t*>(a);
    const uint8_t* pb = static_cast<const uint8_t*>(b);
    return compare_with(dtype, count, [&](size_t i, uint32_t* x, uint32_t* y) {
      std::memcpy(x, pa + 4 * i, 4);
      std::memcpy(y, pb + 4 * i, 4);
    });
  }
  const uint16_t* pa = static_cast<const uint16_t*>(a);
  const uint16_t* pb = static_cast<const uint16_t*>(b);
  return compare_with(dtype, count, [&](size_t i, uint32_t* x, uint32_t* y) {
    *x = pa[i];
    *y = pb[i];
  });
}

std::string describe_bits(DType dtype, uint32_t bits) {
  char buf[64];
  if (dtype == DType::kFP32) {
    std::snprintf(buf, sizeof buf, "0x%08x (%.9g)", bits, bits_value(dtype, bits));
  } else {
    std::snprintf(buf, sizeof buf, "0x%04x (%.9g)", bits, bits_value(dtype, bits));
  }
  return buf;
}

}  // namespace exactcoll::diff

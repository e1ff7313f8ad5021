// Element-wise comparison of two arrays of one storage type: how many elements differ, by how
// many units in the last place, and where the first difference is. Used by `exactcoll diff` and
// `exactcoll layers`.
//
// Definitions (docs/numerics.md):
//   - equal: bitwise equal (so -0 vs +0 and two NaNs with different payloads are not equal).
//   - ULP distance: |ord(a) - ord(b)| where ord maps the storage bits to integers in value order
//     (ord(+x) = bits, ord(-x) = -(bits without sign)), so +0 and -0 are 0 apart, the largest
//     finite value and inf are 1 apart, and a sign change counts every value in between.
//   - nan mismatch: exactly one side is NaN; no distance is defined, counted separately.
//     Both NaN: distance 0 (bitwise equal or not).
//   - max |difference| and the relative L2 drift ||a - b|| / ||b|| are computed in double over
//     the elements where neither side is NaN (an infinite difference makes them inf).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/storage.h"

namespace exactcoll::diff {

// Histogram buckets of ULP distance: 0, 1, 2, 3-4, 5-8, 9-16, >16.
inline constexpr int kUlpBuckets = 7;
inline constexpr const char* kUlpBucketNames[kUlpBuckets] = {"0", "1", "2", "3-4", "5-8", "9-16", ">16"};

// Returns the bucket of a ULP distance.
int ulp_bucket(uint64_t ulp);

// Returns the ULP distance between two storage bit patterns of dtype (neither NaN).
uint64_t ulp_distance(DType dtype, uint32_t a_bits, uint32_t b_bits);

// Returns true when bits are a NaN of dtype.
bool is_nan_bits(DType dtype, uint32_t bits);

// Returns the exact value of a storage bit pattern (NaN stays NaN).
double bits_value(DType dtype, uint32_t bits);

struct CompareResult {
  size_t count = 0;                                 // elements compared
  size_t equal = 0;                                 // bitwise equal
  size_t nan_mismatch = 0;                          // exactly one side NaN
  double max_abs_diff = 0;                          // over elements with no NaN
  uint64_t max_ulp = 0;                             // over elements without a NaN mismatch
  double sum_sq_diff = 0;                           // sum of (a - b)^2 over elements with no NaN
  double sum_sq_b = 0;                              // sum of b^2 over the same elements
  std::array<size_t, kUlpBuckets> ulp_histogram{};  // over count - nan_mismatch elements
  bool has_first_diff = false;
  size_t first_diff = 0;  // flat index of the first element not bitwise equal
  uint32_t first_a_bits = 0, first_b_bits = 0;

  size_t differing() const { return count - equal; }
  double fraction_differing() const { return count == 0 ? 0.0 : static_cast<double>(differing()) / count; }
  // ||a - b|| / ||b||; 0 when both are zero vectors, inf when only b is.
  double relative_l2() const;
  bool identical() const { return equal == count; }
};

// Compares count elements of a and b, both arrays of dtype's storage (uint16_t bits for bf16 and
// fp16, float for fp32).
CompareResult compare(DType dtype, const void* a, const void* b, size_t count);

// Returns "0x3f80 (1)": the bits in hex (4 or 8 digits) and the value.
std::string describe_bits(DType dtype, uint32_t bits);

}  // namespace exactcoll::diff

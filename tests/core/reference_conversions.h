// Independent reference conversions between float and the 16-bit storage formats, for the
// numerics tests only.
//
// Why a second implementation: core/storage.h narrows with integer tricks on the float's bit
// pattern (add 0x7FFF + lsb, then shift). A test that copied that trick would share its bugs. The
// functions here decide the rounding by VALUE instead:
//   1. scale |x| by a power of two so that one storage unit (ulp) of x's binade becomes 1.0
//      (exact: scaling by a power of two in range never rounds);
//   2. round that scaled value to an integer n with the FPU's own round-to-nearest-even (adding
//      2^23 to a float in [0, 2^23) leaves no fraction bits, so the hardware performs the rounding);
//   3. n units of 2^(e - mantissa_bits) is the result; its encoding is ((e + bias) << m) + n - 2^m,
//      which also covers rounding up into the next binade or to infinity (n = 2^(m+1)).
// Infinity, NaN and the exponent clamps are decided on the value (x != x, |x| == inf, e > 15),
// not on bit masks. Widening is computed with std::ldexp from the fields.
//
// The reference file is built with -fno-trapping-math (see BUILD) so that gcc if-converts and
// vectorizes the batch loops; no test reads floating-point exception flags, and rounding (the
// default round-to-nearest-even) is unaffected by that flag.
#pragma once

#include <cstdint>

namespace exactcoll::testing {

// Returns the bf16 bits nearest to the float with bits `input` (ties to even); 0x7FFF for NaN.
uint16_t reference_float_to_bf16(uint32_t input);

// Returns the binary16 bits nearest to the float with bits `input` (ties to even, subnormals
// included, overflow to infinity when |x| >= 65520); 0x7FFF for NaN.
uint16_t reference_float_to_fp16(uint32_t input);

// Batch forms: out[i] = reference_float_to_xx(first + i) for i < count (vectorized; the exhaustive
// tests call these on chunks). Preconditions: first + count <= 2^32.
void reference_float_to_bf16_batch(uint32_t first, uint32_t count, uint16_t* out);
void reference_float_to_fp16_batch(uint32_t first, uint32_t count, uint16_t* out);

// Returns the float bits of the bf16 value `h`: the exact value for every non-NaN (computed from
// the fields with ldexp); for NaN the rule is "the top half of a float", payload and sign kept.
uint32_t reference_bf16_to_float_bits(uint16_t h);

// Returns the float bits of the binary16 value `h`: exact for every non-NaN; 0x7FFFFFFF for NaN.
uint32_t reference_fp16_to_float_bits(uint16_t h);

}  // namespace exactcoll::testing

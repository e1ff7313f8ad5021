// Storage conversions of core/storage.h (the host path) against an independent reference
// (tests/core/reference_conversions.h), exhaustively:
//   - all 2^32 float bit patterns -> bf16 and -> fp16, split into slices so gtest/Bazel shards
//     can run them in parallel;
//   - all 2^16 bf16 and fp16 bit patterns -> float, and the round trip storage -> float -> storage;
//   - named cases derived by hand (ties both ways, +-0, +-inf, subnormals, overflow), which pin
//     core AND the reference to the hand-derived bits, so a shared mistake cannot hide.
#include <cfloat>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "core/storage.h"
#include "gtest/gtest.h"
#include "tests/core/reference_conversions.h"

namespace exactcoll {
namespace {

using testing::reference_bf16_to_float_bits;
using testing::reference_float_to_bf16;
using testing::reference_float_to_bf16_batch;
using testing::reference_float_to_fp16;
using testing::reference_float_to_fp16_batch;
using testing::reference_fp16_to_float_bits;

constexpr uint64_t kAllFloats = uint64_t{1} << 32;
constexpr int kSlices = 8;  // 2^29 inputs per slice
constexpr uint64_t kSliceSize = kAllFloats / kSlices;
constexpr uint32_t kChunk = 4096;  // inputs converted per batch (two 8 KiB buffers stay in L1)
constexpr size_t kMismatchesShown = 8;

struct Mismatch {
  uint32_t input;
  uint16_t core;
  uint16_t reference;
};

std::string describe(const std::vector<Mismatch>& mismatches) {
  std::string text;
  char line[96];
  for (const Mismatch& m : mismatches) {
    std::snprintf(line, sizeof line, "  input 0x%08" PRIx32 ": core 0x%04x, reference 0x%04x\n", m.input, m.core,
                  m.reference);
    text += line;
  }
  return text;
}

// Core's conversions over a chunk, in this translation unit (compiled as every user compiles
// core/storage.h: -O3 -ffp-contract=off, default trapping math).
void core_float_to_bf16_batch(uint32_t first, uint32_t count, uint16_t* out) {
  for (uint32_t i = 0; i < count; ++i) out[i] = float_to_bf16_bits(bits_to_float(first + i));
}
void core_float_to_fp16_batch(uint32_t first, uint32_t count, uint16_t* out) {
  for (uint32_t i = 0; i < count; ++i) out[i] = float_to_fp16_bits(bits_to_float(first + i));
}

using Batch = void (*)(uint32_t first, uint32_t count, uint16_t* out);

// Compares core and reference over inputs [first, end) and returns the number of mismatches;
// keeps the first few in *shown. Counting (not EXPECT per element) keeps the loop vectorizable.
uint64_t count_mismatches(uint64_t first, uint64_t end, Batch core, Batch reference, std::vector<Mismatch>* shown,
                          uint64_t* inputs_compared) {
  static thread_local uint16_t core_out[kChunk];
  static thread_local uint16_t reference_out[kChunk];
  uint64_t mismatches = 0;
  for (uint64_t base = first; base < end; base += kChunk) {
    const uint32_t count = static_cast<uint32_t>(end - base < kChunk ? end - base : kChunk);
    core(static_cast<uint32_t>(base), count, core_out);
    reference(static_cast<uint32_t>(base), count, reference_out);
    uint32_t chunk_mismatches = 0;
    for (uint32_t i = 0; i < count; ++i) chunk_mismatches += core_out[i] != reference_out[i];
    mismatches += chunk_mismatches;
    *inputs_compared += count;
    if (chunk_mismatches != 0) {
      for (uint32_t i = 0; i < count && shown->size() < kMismatchesShown; ++i) {
        if (core_out[i] != reference_out[i]) {
          shown->push_back({static_cast<uint32_t>(base + i), core_out[i], reference_out[i]});
        }
      }
    }
  }
  return mismatches;
}

class ExhaustiveFloatToStorage : public ::testing::TestWithParam<int> {
 protected:
  void run(Batch core, Batch reference) {
    const uint64_t first = static_cast<uint64_t>(GetParam()) * kSliceSize;
    std::vector<Mismatch> shown;
    uint64_t compared = 0;
    const uint64_t mismatches = count_mismatches(first, first + kSliceSize, core, reference, &shown, &compared);
    EXPECT_EQ(compared, kSliceSize);
    EXPECT_EQ(mismatches, 0u) << "inputs 0x" << std::hex << first << " .. 0x" << (first + kSliceSize - 1)
                              << ", first mismatches:\n"
                              << describe(shown);
  }
};

TEST_P(ExhaustiveFloatToStorage, Bf16MatchesReference) { run(core_float_to_bf16_batch, reference_float_to_bf16_batch); }

TEST_P(ExhaustiveFloatToStorage, Fp16MatchesReference) { run(core_float_to_fp16_batch, reference_float_to_fp16_batch); }

INSTANTIATE_TEST_SUITE_P(AllFloatBitPatterns, ExhaustiveFloatToStorage, ::testing::Range(0, kSlices));

// ---- all 2^16 storage values -> float, and back --------------------------------------------------

TEST(WidenAllStorageValues, Bf16ToFloatIsExactAndKeepsNaNPayloads) {
  std::vector<Mismatch> shown;
  int mismatches = 0;
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const uint32_t got = float_to_bits(bf16_bits_to_float(static_cast<uint16_t>(h)));
    const uint32_t want = reference_bf16_to_float_bits(static_cast<uint16_t>(h));
    if (got != want) {
      ++mismatches;
      if (shown.size() < kMismatchesShown) std::printf("bf16 0x%04x: core 0x%08x, reference 0x%08x\n", h, got, want);
    }
  }
  EXPECT_EQ(mismatches, 0);
  // NaN payload and sign survive: 0xFFC1 -> 0xFFC10000 (not canonicalized).
  EXPECT_EQ(float_to_bits(bf16_bits_to_float(0xFFC1)), 0xFFC10000u);
}

TEST(WidenAllStorageValues, Fp16ToFloatIsExactAndCanonicalizesNaN) {
  int mismatches = 0;
  int nans = 0;
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const uint32_t got = float_to_bits(fp16_bits_to_float(static_cast<uint16_t>(h)));
    const uint32_t want = reference_fp16_to_float_bits(static_cast<uint16_t>(h));
    nans += want == kCanonicalNaN32;
    if (got != want) {
      if (++mismatches <= static_cast<int>(kMismatchesShown)) {
        std::printf("fp16 0x%04x: core 0x%08x, reference 0x%08x\n", h, got, want);
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_EQ(nans, 2 * 1023);  // both signs, every non-zero mantissa with exponent 31
}

TEST(RoundTripAllStorageValues, Bf16) {
  int mismatches = 0;
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const bool is_nan = (h & 0x7F80u) == 0x7F80u && (h & 0x7Fu) != 0;
    const uint16_t want = is_nan ? kStorageNaN16 : static_cast<uint16_t>(h);
    const uint16_t got = float_to_bf16_bits(bf16_bits_to_float(static_cast<uint16_t>(h)));
    if (got != want && ++mismatches <= static_cast<int>(kMismatchesShown)) {
      std::printf("bf16 0x%04x -> float -> 0x%04x (want 0x%04x)\n", h, got, want);
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(RoundTripAllStorageValues, Fp16) {
  int mismatches = 0;
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const bool is_nan = (h & 0x7C00u) == 0x7C00u && (h & 0x3FFu) != 0;
    const uint16_t want = is_nan ? kStorageNaN16 : static_cast<uint16_t>(h);
    const uint16_t got = float_to_fp16_bits(fp16_bits_to_float(static_cast<uint16_t>(h)));
    if (got != want && ++mismatches <= static_cast<int>(kMismatchesShown)) {
      std::printf("fp16 0x%04x -> float -> 0x%04x (want 0x%04x)\n", h, got, want);
    }
  }
  EXPECT_EQ(mismatches, 0);
}

// ---- named cases -----------------------------------------------------------------------------------

struct NamedCase {
  const char* name;
  uint32_t input;  // float bits
  uint16_t want;   // storage bits
};

// Each value is derived by hand in its name/comment; both core and the reference must give it.
const NamedCase kBf16Cases[] = {
    {"+0", 0x00000000, 0x0000},
    {"-0", 0x80000000, 0x8000},
    {"+inf", 0x7F800000, 0x7F80},
    {"-inf", 0xFF800000, 0xFF80},
    {"1.0", 0x3F800000, 0x3F80},
    {"1+2^-8: tie between 0x3F80 (even) and 0x3F81 -> down", 0x3F808000, 0x3F80},
    {"1+3*2^-8: tie between 0x3F81 and 0x3F82 (even) -> up", 0x3F818000, 0x3F82},
    {"just below the tie -> down", 0x3F807FFF, 0x3F80},
    {"just above the tie -> up", 0x3F808001, 0x3F81},
    {"-(1+2^-8): tie, to even, sign kept", 0xBF808000, 0xBF80},
    {"-(1+3*2^-8): tie, to even", 0xBF818000, 0xBF82},
    {"(2-2^-8)*2^0: rounds up into the next binade (2.0)", 0x3FFF8000, 0x4000},
    {"bf16 max finite (2-2^-7)*2^127 is exact", 0x7F7F0000, 0x7F7F},
    {"just below the overflow tie stays max finite", 0x7F7F7FFF, 0x7F7F},
    {"(2-2^-8)*2^127: tie, max finite is odd -> inf", 0x7F7F8000, 0x7F80},
    {"FLT_MAX -> inf", 0x7F7FFFFF, 0x7F80},
    {"-FLT_MAX -> -inf", 0xFF7FFFFF, 0xFF80},
    {"smallest float subnormal 2^-149 -> 0", 0x00000001, 0x0000},
    {"-2^-149 -> -0", 0x80000001, 0x8000},
    {"2^-134: half the bf16 unit 2^-133, tie -> 0", 0x00008000, 0x0000},
    {"just above 2^-134 -> smallest bf16 subnormal", 0x00008001, 0x0001},
    {"1.5*2^-133: tie between 1 and 2 units -> 2", 0x00018000, 0x0002},
    {"largest float subnormal -> 2^-126 (0x0080)", 0x007FFFFF, 0x0080},
    {"smallest float normal 2^-126", 0x00800000, 0x0080},
    {"quiet NaN", 0x7FC00000, 0x7FFF},
    {"negative quiet NaN: sign dropped", 0xFFC00000, 0x7FFF},
    {"signalling NaN 0x7F800001", 0x7F800001, 0x7FFF},
    {"NaN with payload in the low half only", 0x7F80FFFF, 0x7FFF},
    {"all-ones NaN", 0xFFFFFFFF, 0x7FFF},
    {"0x7FFFFFFF NaN", 0x7FFFFFFF, 0x7FFF},
};

const NamedCase kFp16Cases[] = {
    {"+0", 0x00000000, 0x0000},
    {"-0", 0x80000000, 0x8000},
    {"+inf", 0x7F800000, 0x7C00},
    {"-inf", 0xFF800000, 0xFC00},
    {"1.0", 0x3F800000, 0x3C00},
    {"1+2^-11: tie between 0x3C00 (even) and 0x3C01 -> down", 0x3F801000, 0x3C00},
    {"1+3*2^-11: tie between 0x3C01 and 0x3C02 (even) -> up", 0x3F803000, 0x3C02},
    {"just above the tie 1+2^-11 -> up", 0x3F801001, 0x3C01},
    {"just below the tie 1+3*2^-11 -> down", 0x3F802FFF, 0x3C01},
    {"-(1+2^-11): tie, to even", 0xBF801000, 0xBC00},
    {"65504 = max finite", 0x477FE000, 0x7BFF},
    {"65520 - 2^-8 (largest float below 65520) -> 65504", 0x477FEFFF, 0x7BFF},
    {"65520: tie, max finite is odd -> inf", 0x477FF000, 0x7C00},
    {"-65520 -> -inf", 0xC77FF000, 0xFC00},
    {"65536 -> inf", 0x47800000, 0x7C00},
    {"FLT_MAX -> inf", 0x7F7FFFFF, 0x7C00},
    {"-FLT_MAX -> -inf", 0xFF7FFFFF, 0xFC00},
    {"smallest normal 2^-14", 0x38800000, 0x0400},
    {"smallest subnormal 2^-24", 0x33800000, 0x0001},
    {"2^-25 = halfway to the smallest subnormal: tie -> 0", 0x33000000, 0x0000},
    {"-2^-25: tie -> -0", 0xB3000000, 0x8000},
    {"just above 2^-25 -> smallest subnormal", 0x33000001, 0x0001},
    {"just below 2^-25 -> 0", 0x32FFFFFF, 0x0000},
    {"2^-26 -> 0", 0x32800000, 0x0000},
    {"1.5*2^-24: tie between 1 and 2 units -> 2", 0x33C00000, 0x0002},
    {"2.5*2^-24: tie between 2 and 3 units -> 2", 0x34200000, 0x0002},
    {"largest subnormal 1023*2^-24", 0x387FC000, 0x03FF},
    {"1023.5*2^-24: tie between 0x03FF and 0x0400 (even) -> up into normal", 0x387FE000, 0x0400},
    {"1022.5*2^-24: tie between 0x03FE (even) and 0x03FF -> down", 0x387FA000, 0x03FE},
    {"smallest float subnormal -> 0", 0x00000001, 0x0000},
    {"quiet NaN", 0x7FC00000, 0x7FFF},
    {"negative quiet NaN: sign dropped", 0xFFC00000, 0x7FFF},
    {"signalling NaN", 0x7F800001, 0x7FFF},
    {"NaN whose top bits would look like fp16 inf", 0x7F802000, 0x7FFF},
    {"all-ones NaN", 0xFFFFFFFF, 0x7FFF},
};

TEST(NamedCases, FloatToBf16) {
  for (const NamedCase& c : kBf16Cases) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(float_to_bf16_bits(bits_to_float(c.input)), c.want) << std::hex << "input 0x" << c.input;
    EXPECT_EQ(reference_float_to_bf16(c.input), c.want) << std::hex << "reference, input 0x" << c.input;
  }
}

TEST(NamedCases, FloatToFp16) {
  for (const NamedCase& c : kFp16Cases) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(float_to_fp16_bits(bits_to_float(c.input)), c.want) << std::hex << "input 0x" << c.input;
    EXPECT_EQ(reference_float_to_fp16(c.input), c.want) << std::hex << "reference, input 0x" << c.input;
  }
}

TEST(NamedCases, FltMaxAndLiterals) {
  // The same facts through C++ literals, so the hex above is not the only witness.
  EXPECT_EQ(float_to_bf16_bits(FLT_MAX), 0x7F80);
  EXPECT_EQ(float_to_fp16_bits(FLT_MAX), 0x7C00);
  EXPECT_EQ(float_to_fp16_bits(65504.0f), 0x7BFF);
  EXPECT_EQ(float_to_bits(65519.99f), 0x477FEFFDu);
  EXPECT_EQ(float_to_fp16_bits(65519.99f), 0x7BFF);
  EXPECT_EQ(float_to_fp16_bits(65520.0f), 0x7C00);
  EXPECT_EQ(float_to_fp16_bits(0x1p-24f), 0x0001);
  EXPECT_EQ(float_to_fp16_bits(0x1p-25f), 0x0000);
  EXPECT_EQ(float_to_fp16_bits(0x1.000002p-25f), 0x0001);
  EXPECT_EQ(bf16_bits_to_float(0x7F7F), 0x1.FEp127f);  // bf16 max finite
  EXPECT_EQ(fp16_bits_to_float(0x7BFF), 65504.0f);
  EXPECT_EQ(fp16_bits_to_float(0x0001), 0x1p-24f);
  EXPECT_EQ(float_to_bits(fp16_bits_to_float(0x8000)), 0x80000000u);  // -0 stays -0
  EXPECT_EQ(float_to_bits(fp16_bits_to_float(0xFE01)), kCanonicalNaN32);
}

TEST(NamedCases, Fp32StorageCanonicalizesNaN) {
  EXPECT_EQ(float_to_bits(round_to<float>(bits_to_float(0xFFC01234u))), kCanonicalNaN32);
  EXPECT_EQ(float_to_bits(round_to<float>(bits_to_float(0x7F800001u))), kCanonicalNaN32);
  EXPECT_EQ(float_to_bits(round_to<float>(bits_to_float(0x80000000u))), 0x80000000u);  // -0 kept
  EXPECT_EQ(float_to_bits(round_to<float>(bits_to_float(0xFF800000u))), 0xFF800000u);  // -inf kept
  EXPECT_EQ(float_to_bits(canonicalize_nan(bits_to_float(0x12345678u))), 0x12345678u);
}

}  // namespace
}  // namespace exactcoll

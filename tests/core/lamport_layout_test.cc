// The Lamport region's size algebra (core/lamport.h): lamport_two_shot_stride against the slices
// of core/collectives.h's two_shot_slice, lamport_slot_bytes_needed / lamport_fits /
// lamport_region_bytes against an independent transcription of what each algorithm writes into a
// slot, and lamport_chunk_elements (the launches a longer message is cut into) exhaustively: for 1..8
// ranks, 2- and 4-byte elements and slots of 16..4096 bytes (in steps of 16) and 1 MiB, every count
// up to the chunk and past it fits or does not exactly as the transcription says, every count up
// to the chunk fits, and the chunk is a multiple of 64 elements; as core/lamport.h promises, the
// chunk is the largest such multiple (0 only where 64 elements do not fit), and a power-of-two
// message that fits a default communicator's slot runs in one launch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "core/collectives.h"
#include "core/lamport.h"
#include "core/registry.h"

namespace exactcoll {
namespace {

constexpr Algorithm kOneShot = Algorithm::kLamportOneShot;
constexpr Algorithm kTwoShot = Algorithm::kLamportTwoShot;

// The slot sizes of the exhaustive tests: 16..4096 bytes in steps of 16, and 1 MiB (a default
// communicator's, lamport_message_bytes).
std::vector<size_t> slot_sizes() {
  std::vector<size_t> out;
  for (size_t s = 16; s <= 4096; s += 16) out.push_back(s);
  out.push_back(size_t{1} << 20);
  return out;
}

// ---- An independent transcription of the layout ---------------------------------------------------
// lamport_one_shot writes the message, padded to whole 16-byte packs, into every peer's slot.
// lamport_two_shot pads the message to whole packs, gives each of ranks 0..n-2 packs / n packs and
// the last rank the rest, and writes two strides (the longest slice) into every slot: the pieces of
// the slot owner's slice, then the sender's folded slice.

size_t packs_of(size_t count, size_t element_bytes) { return (count * element_bytes + 15) / 16; }

size_t expected_stride(size_t count, size_t element_bytes, int n) {
  const size_t packs = packs_of(count, element_bytes);
  const size_t ranks = static_cast<size_t>(n);
  const size_t per = packs / ranks;
  const size_t last = packs - (ranks - 1) * per;  // >= per: the last slice is the longest
  return last * (16 / element_bytes);
}

size_t expected_slot_bytes(Algorithm algorithm, size_t count, size_t element_bytes, int n) {
  if (algorithm == kTwoShot) return 2 * expected_stride(count, element_bytes, n) * element_bytes;
  return packs_of(count, element_bytes) * 16;
}

bool expected_fits(Algorithm algorithm, size_t count, size_t element_bytes, int n, size_t slot_bytes) {
  return expected_slot_bytes(algorithm, count, element_bytes, n) <= slot_bytes;
}

// The region whose layout on n ranks has slots of exactly slot_bytes (a multiple of 16).
size_t region_for_slot(size_t slot_bytes, int n) {
  return static_cast<size_t>(kLamportBuffers) * static_cast<size_t>(n) * slot_bytes;
}

// Does every count first..last fit?
bool all_fit(Algorithm algorithm, size_t first, size_t last, size_t element_bytes, int n, size_t slot_bytes) {
  for (size_t count = first; count <= last; ++count) {
    if (!expected_fits(algorithm, count, element_bytes, n, slot_bytes)) return false;
  }
  return true;
}

std::string where(Algorithm algorithm, int n, size_t element_bytes, size_t slot_bytes) {
  return std::string(algorithm_name(algorithm)) + " n=" + std::to_string(n) +
         " element_bytes=" + std::to_string(element_bytes) + " slot_bytes=" + std::to_string(slot_bytes);
}

// ---- lamport_two_shot_stride ------------------------------------------------------------------------

// The stride is the longest of two_shot_slice(padded count, P, p, n) over p = 0..n-1 (the last),
// for every count up to 40 packs per rank, every pack (8 and 4 elements) and 1..16 ranks; the
// header's examples.
TEST(LamportLayout, TwoShotStrideIsTheLongestSliceOfThePaddedCount) {
  int checked = 0;
  for (int n = 1; n <= 16; ++n) {
    for (const int pack : {8, 4}) {
      const size_t p = static_cast<size_t>(pack);
      for (size_t count = 1; count <= 40 * p * static_cast<size_t>(n) + p; ++count) {
        const size_t padded = (count + p - 1) / p * p;
        size_t longest = 0, covered = 0;
        for (int r = 0; r < n; ++r) {
          const Slice s = two_shot_slice(padded, pack, r, n);
          ASSERT_EQ(s.begin, covered) << "n=" << n << " count=" << count << " slice " << r;
          covered = s.end;
          longest = std::max(longest, s.end - s.begin);
        }
        ASSERT_EQ(covered, padded) << "n=" << n << " count=" << count;
        const size_t stride = lamport_two_shot_stride(count, pack, n);
        ASSERT_EQ(stride, longest) << "n=" << n << " pack=" << pack << " count=" << count;
        ASSERT_EQ(stride, expected_stride(count, 16 / p, n)) << "n=" << n << " pack=" << pack << " count=" << count;
        ASSERT_EQ(stride % p, 0u);
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 65472);  // sum over n = 1..16 of 40 x n x (8 + 4) + 8 + 4
  // core/lamport.h's examples: 4 ranks, 100 bf16 (13 packs: 3, 3, 3 and 4) has a stride of 32;
  // 2 ranks, 16 bf16 (two packs, one each) a stride of 8.
  EXPECT_EQ(lamport_two_shot_stride(100, 8, 4), 32u);
  EXPECT_EQ(lamport_two_shot_stride(16, 8, 2), 8u);
  // Fewer packs than ranks: every slice but the last is empty, the last holds them all.
  EXPECT_EQ(lamport_two_shot_stride(1, 8, 4), 8u);
  EXPECT_EQ(lamport_two_shot_stride(9, 8, 4), 16u);
  EXPECT_EQ(lamport_two_shot_stride(5, 4, 8), 8u);
}

// ---- lamport_slot_bytes_needed, lamport_region_bytes, lamport_fits ----------------------------------

// Bytes per slot and region for every count up to 3000 on 1..16 ranks, and the fit of a call in
// the region sized for it (what the simulator allocates: sim/collectives.cc) and in 16 bytes less
// per slot. lamport_one_shot's agree with the one-shot helpers they replace.
TEST(LamportLayout, SlotAndRegionBytesAreWhatEachAlgorithmWrites) {
  for (int n = 1; n <= 16; ++n) {
    for (const size_t eb : {size_t{2}, size_t{4}}) {
      for (size_t count = 1; count <= 3000; ++count) {
        for (const Algorithm a : {kOneShot, kTwoShot}) {
          const size_t needed = lamport_slot_bytes_needed(a, count, eb, n);
          ASSERT_EQ(needed, expected_slot_bytes(a, count, eb, n)) << where(a, n, eb, 0) << " count=" << count;
          ASSERT_EQ(needed % 16, 0u);
          const size_t region = lamport_region_bytes(a, count, eb, n);
          ASSERT_EQ(region, region_for_slot(needed, n)) << where(a, n, eb, needed) << " count=" << count;
          ASSERT_EQ(lamport_layout(region, n).slot_bytes, needed);
          ASSERT_TRUE(lamport_fits(a, count, eb, n, region)) << where(a, n, eb, needed) << " count=" << count;
          ASSERT_FALSE(lamport_fits(a, count, eb, n, region_for_slot(needed - 16, n)))
              << where(a, n, eb, needed) << " count=" << count;
        }
        ASSERT_EQ(lamport_slot_bytes_needed(kOneShot, count, eb, n), lamport_message_bytes(count, eb));
        ASSERT_EQ(lamport_region_bytes(kOneShot, count, eb, n), lamport_region_bytes(count, eb, n));
        // Two strides never exceed twice the message (the longest slice is at most all of it).
        const size_t two = lamport_slot_bytes_needed(kTwoShot, count, eb, n);
        ASSERT_LE(two, 2 * lamport_message_bytes(count, eb)) << "n=" << n << " count=" << count;
      }
    }
  }
}

// ---- lamport_chunk_elements ----------------------------------------------------------------------------

// Every count from 1 up to the chunk, and a few chunks' worth of 64 past it, fits or does not
// exactly as the transcription says (lamport_fits on a region whose slots are slot_bytes); every
// count up to the chunk fits, for both algorithms; the chunk is a multiple of 64 elements.
TEST(LamportLayout, EveryCountUpToTheChunkFitsAndFitsIsExactPastIt) {
  int configurations = 0;
  uint64_t counts = 0;
  for (int n = 1; n <= 8; ++n) {
    for (const size_t eb : {size_t{2}, size_t{4}}) {
      for (const size_t slot : slot_sizes()) {
        const size_t region = region_for_slot(slot, n);
        ASSERT_EQ(lamport_layout(region, n).slot_bytes, slot);
        for (const Algorithm a : {kOneShot, kTwoShot}) {
          const size_t chunk = lamport_chunk_elements(a, slot, eb, n);
          ASSERT_EQ(chunk % 64, 0u) << where(a, n, eb, slot) << " chunk=" << chunk;
          const size_t past = chunk + 64 * static_cast<size_t>(n) + 64;
          for (size_t count = 1; count <= past; ++count) {
            const bool fits = lamport_fits(a, count, eb, n, region);
            ASSERT_EQ(fits, expected_fits(a, count, eb, n, slot))
                << where(a, n, eb, slot) << " count=" << count << " chunk=" << chunk;
            if (count <= chunk) {
              ASSERT_TRUE(fits) << where(a, n, eb, slot) << " count=" << count << " chunk=" << chunk;
            }
          }
          counts += past;
          ++configurations;
        }
      }
    }
  }
  EXPECT_EQ(configurations, 8 * 2 * 257 * 2);
  std::printf("%d configurations, %llu counts checked\n", configurations, static_cast<unsigned long long>(counts));
}

// lamport_one_shot's chunk is the largest multiple of 64 elements up to which every count fits
// (the slot's elements rounded down to 64), and 0 exactly where 64 elements do not fit.
TEST(LamportLayout, OneShotChunkIsTheLargestMultipleOf64ThatFits) {
  for (int n = 1; n <= 8; ++n) {
    for (const size_t eb : {size_t{2}, size_t{4}}) {
      for (const size_t slot : slot_sizes()) {
        const size_t chunk = lamport_chunk_elements(kOneShot, slot, eb, n);
        EXPECT_EQ(chunk, slot / eb / 64 * 64) << where(kOneShot, n, eb, slot);
        EXPECT_FALSE(all_fit(kOneShot, 1, chunk + 64, eb, n, slot)) << where(kOneShot, n, eb, slot);
        EXPECT_EQ(chunk == 0, !all_fit(kOneShot, 1, 64, eb, n, slot)) << where(kOneShot, n, eb, slot);
      }
    }
  }
}

// What core/lamport.h promises of lamport_two_shot's chunk too: "the most elements such that every
// count up to it fits a slot ..., a multiple of 64 elements ... Returns 0 where not even 64
// elements fit". Checked: no multiple of 64 past the chunk has every count up to it fit, and 0 only
// where some count up to 64 does not fit. Every violation is counted; the first few are printed,
// and those of 1 MiB slots.
TEST(LamportLayout, TwoShotChunkIsTheLargestMultipleOf64ThatFitsAndZeroOnlyWhere64DoNotFit) {
  int not_largest = 0, zero_but_64_fit = 0, configurations = 0;
  std::string examples;
  for (int n = 1; n <= 8; ++n) {
    for (const size_t eb : {size_t{2}, size_t{4}}) {
      for (const size_t slot : slot_sizes()) {
        ++configurations;
        const size_t chunk = lamport_chunk_elements(kTwoShot, slot, eb, n);
        // The safety property (every count up to the chunk fits) is
        // EveryCountUpToTheChunkFitsAndFitsIsExactPastIt's.
        if (!all_fit(kTwoShot, 1, chunk + 64, eb, n, slot)) continue;
        // Every count up to chunk + 64 fits: the chunk is not the largest. How large could it be?
        size_t largest = chunk + 64;
        while (all_fit(kTwoShot, largest + 1, largest + 64, eb, n, slot)) largest += 64;
        ++not_largest;
        if (chunk == 0) ++zero_but_64_fit;
        if (not_largest <= 6 || slot == size_t{1} << 20) {
          examples += "\n  " + where(kTwoShot, n, eb, slot) + ": chunk " + std::to_string(chunk) +
                      ", but every count up to " + std::to_string(largest) + " fits";
        }
      }
    }
  }
  EXPECT_EQ(not_largest, 0) << "of " << configurations << " configurations (" << zero_but_64_fit
                            << " of them return 0 although 64 elements fit):" << examples;
  EXPECT_EQ(zero_but_64_fit, 0);
}

// What the GPU does with these (cuda_backend/communicator.cc, launch_lamport): a Lamport call runs
// in launches of lamport_chunk_elements; auto (DispatchTable::choose_allreduce_auto) and `exactcoll
// tune` take a Lamport algorithm only where lamport_fits, as one launch. On a default communicator
// (lamport_message_bytes 1 MiB: slots of 1 MiB) every power-of-two message of 1 KiB and up that
// fits must then run in one launch: its count must not exceed the chunk.
// A message that lamport_fits runs in one launch (lamport_launch_elements returns it whole): what
// tune measured and auto priced is what runs. For lamport_two_shot the chunk of longer messages
// can be shorter than such a message (a count a few packs shorter has a longer last slice): 2 MiB
// on 4 ranks fits 1 MiB slots, the chunk is 1 048 512 elements. A message that does not fit runs
// in chunks of lamport_chunk_elements.
TEST(LamportLayout, AMessageThatFitsRunsInOneLaunchAndALongerOneInChunks) {
  const size_t slot = size_t{1} << 20;
  std::string problems;
  int fitting = 0, chunked = 0;
  for (const Algorithm a : {kOneShot, kTwoShot}) {
    for (int n = 1; n <= 8; ++n) {
      const size_t region = lamport_region_bytes(slot, 1, n);  // as the communicator sizes it
      ASSERT_EQ(lamport_layout(region, n).slot_bytes, slot);
      for (const size_t eb : {size_t{2}, size_t{4}}) {
        const size_t chunk = lamport_chunk_elements(a, slot, eb, n);
        for (size_t bytes = 1024; bytes <= (size_t{64} << 20); bytes *= 2) {
          const size_t count = bytes / eb;
          const size_t launch = lamport_launch_elements(a, count, eb, n, region);
          const bool fits = lamport_fits(a, count, eb, n, region);
          fitting += fits ? 1 : 0;
          chunked += fits ? 0 : 1;
          if (launch != (fits ? count : chunk)) {
            problems += "\n  " + where(a, n, eb, slot) + ": " + std::to_string(bytes) + " bytes: launches of " +
                        std::to_string(launch) + " elements, want " + std::to_string(fits ? count : chunk);
          }
        }
      }
    }
  }
  EXPECT_GT(fitting, 0);
  EXPECT_GT(chunked, 0);
  EXPECT_TRUE(problems.empty()) << problems;
  // The example of lamport_launch_elements' comment.
  const size_t region4 = lamport_region_bytes(slot, 1, 4);
  EXPECT_EQ(lamport_launch_elements(kTwoShot, size_t{1} << 20, 2, 4, region4), size_t{1} << 20);
  EXPECT_EQ(lamport_chunk_elements(kTwoShot, slot, 2, 4), 1048512u);
}

}  // namespace
}  // namespace exactcoll

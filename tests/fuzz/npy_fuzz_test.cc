// Fuzzing the .npy reader (issue 15): mutated headers and bodies of valid files, through both the
// in-memory parser and the file reader. Every input must either read back as an array whose bytes
// match its shape (and that writes back to the same array), or be refused with an NpyError naming
// the file — never another exception, a crash, a hang or a huge allocation.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_harness.h"
#include "tests/support/command_runner.h"
#include "npy/npy.h"

namespace exactcoll {
namespace {

using Bytes = std::string;

// A valid file: random dtype, a shape of 0..4 small dimensions, random data.
Bytes valid_file(sim::Xoshiro256& rng) {
  const char* dtype = rng.below(2) ? npy::kU16 : npy::kF32;
  std::vector<int64_t> shape(rng.below(5));
  for (auto& d : shape) d = static_cast<int64_t>(rng.below(5));
  size_t bytes = npy::dtype_item_size(dtype);
  for (const int64_t d : shape) bytes *= static_cast<size_t>(d);
  Bytes file = npy::make_header(dtype, shape);
  for (size_t i = 0; i < bytes; ++i) file.push_back(static_cast<char>(rng.next()));
  return file;
}

// Text a header might plausibly hold: the parser's tokens, digits, and bytes it must reject.
const char* const kTokens[] = {"{",
                               "}",
                               "(",
                               ")",
                               ",",
                               ":",
                               "'",
                               "\"",
                               " ",
                               "\n",
                               "\\",
                               "True",
                               "False",
                               "descr",
                               "shape",
                               "fortran_order",
                               "<u2",
                               "<f4",
                               ">u2",
                               "<f8",
                               "0",
                               "1",
                               "9",
                               "-1",
                               "99999999999999999999",
                               "18446744073709551615",
                               "\x00",
                               "\xff",
                               "\x93NUMPY"};

// Applies 1..8 random mutations: byte flips, insertions and deletions (mostly in the header),
// token splices, a rewritten header length, truncation and extension.
void mutate(sim::Xoshiro256& rng, Bytes& file) {
  const int mutations = 1 + static_cast<int>(rng.below(8));
  for (int m = 0; m < mutations; ++m) {
    const size_t header_end = std::min<size_t>(file.size(), 128);
    const size_t at = file.empty() ? 0 : rng.below(rng.below(4) ? std::max<size_t>(header_end, 1) : file.size());
    switch (rng.below(8)) {
      case 0:  // flip a byte
        if (!file.empty()) file[std::min(at, file.size() - 1)] ^= static_cast<char>(1 + rng.below(255));
        break;
      case 1:  // insert a token
        file.insert(std::min(at, file.size()), fuzz::pick(rng, kTokens));
        break;
      case 2:  // delete a run of bytes
        if (!file.empty()) file.erase(std::min(at, file.size() - 1), 1 + rng.below(8));
        break;
      case 3: {  // rewrite the header length (v1: bytes 8-9, v2: 8-11) with something extreme
        const uint32_t lengths[] = {0, 1, 0xFFFF, 0xFFFFFFFF, 0x10000, static_cast<uint32_t>(rng.below(4096))};
        const uint32_t length = fuzz::pick(rng, lengths);
        for (size_t i = 0; i < 4 && 8 + i < file.size(); ++i) file[8 + i] = static_cast<char>(length >> (8 * i));
        break;
      }
      case 4:  // truncate
        file.resize(rng.below(file.size() + 1));
        break;
      case 5:  // extend with junk
        for (uint64_t i = rng.below(100); i > 0; --i) file.push_back(static_cast<char>(rng.next()));
        break;
      case 6:  // set the version bytes
        if (file.size() > 7) {
          file[6] = static_cast<char>(rng.below(4));
          file[7] = static_cast<char>(rng.below(2));
        }
        break;
      default:  // replace a header digit run with a huge number
        if (const size_t digit = file.find_first_of("0123456789", 10); digit != Bytes::npos && digit < header_end) {
          file.replace(digit, 1, "9223372036854775807");
        }
        break;
    }
  }
}

// The outcome of reading one file: the array, or the error text.
struct Outcome {
  bool ok = false;
  npy::NpyArray array;
  std::string error;
};

template <class F>
Outcome outcome_of(F read) {
  Outcome o;
  try {
    o.array = read();
    o.ok = true;
  } catch (const npy::NpyError& e) {
    o.error = e.what();
  }
  return o;
}

TEST(NpyFuzz, MutatedFilesReadBackOrAreRefusedCleanly) {
  const std::string path = test_support::temp_path("fuzz.npy");
  fuzz::SeededRun run("fuzz npy", "EXACTCOLL_FUZZ", 30.0);
  rusage before{};
  getrusage(RUSAGE_SELF, &before);
  uint64_t accepted = 0;
  run.each([&](sim::Xoshiro256& rng, uint64_t) {
    Bytes file = valid_file(rng);
    if (rng.below(8) != 0) mutate(rng, file);
    const Outcome parsed =
        outcome_of([&] { return npy::parse_npy(reinterpret_cast<const uint8_t*>(file.data()), file.size(), path); });
    {
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      out.write(file.data(), static_cast<std::streamsize>(file.size()));
    }
    const Outcome read = outcome_of([&] { return npy::read_npy(path); });
    // The file reader and the in-memory parser agree: the same array, or the same refusal.
    ASSERT_EQ(read.ok, parsed.ok) << "read: " << read.error << "\nparse: " << parsed.error;
    if (!parsed.ok) {
      EXPECT_EQ(read.error, parsed.error);
      EXPECT_EQ(parsed.error.rfind(path + ": ", 0), 0u) << "the message names the file: " << parsed.error;
      return;
    }
    const npy::NpyArray& a = parsed.array;
    ++accepted;
    EXPECT_EQ(read.array.shape, a.shape);
    EXPECT_EQ(read.array.data, a.data);
    EXPECT_EQ(a.data.size(), a.element_count() * a.item_size());
    // What was accepted writes back to an equal array.
    const std::string again = npy::make_header(a.dtype, a.shape) + std::string(a.data.begin(), a.data.end());
    const npy::NpyArray b = npy::parse_npy(reinterpret_cast<const uint8_t*>(again.data()), again.size(), path);
    EXPECT_EQ(b.dtype, a.dtype);
    EXPECT_EQ(b.shape, a.shape);
    EXPECT_EQ(b.data, a.data);
  });
  rusage after{};
  getrusage(RUSAGE_SELF, &after);
  // No input may make the reader hold much: every valid file here is under 4 KiB of data.
  if (fuzz::kRssIsMeaningful) {
    EXPECT_LT(after.ru_maxrss - before.ru_maxrss, 64 << 10)
        << "peak RSS grew by " << (after.ru_maxrss - before.ru_maxrss) << " KiB";
  }
  std::printf("fuzz npy: %llu of %llu inputs read back as arrays, the rest refused\n",
              static_cast<unsigned long long>(accepted), static_cast<unsigned long long>(run.inputs()));
  EXPECT_GT(run.inputs(), 0u);
  unlink(path.c_str());
}

}  // namespace
}  // namespace exactcoll

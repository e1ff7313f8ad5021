// npy: numpy-compatible headers, round trips, every malformed case, atomic writes.
#include "npy/npy.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <future>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/support/command_runner.h"

namespace exactcoll::npy {
namespace {

using test_support::read_file;
using test_support::temp_dir;
using test_support::temp_path;

std::string write_bytes(const std::string& name, const std::string& bytes) {
  const std::string path = temp_path(name);
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

// Returns the message of the NpyError that f throws ("" when it throws none).
template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const NpyError& e) {
    return e.what();
  }
  return "";
}

// A v1.0 file with an arbitrary header dict and data (header padded like numpy).
std::string handmade(const std::string& dict, const std::string& data, int major = 1) {
  std::string out("\x93NUMPY", 6);
  out += static_cast<char>(major);
  out += '\0';
  const size_t prefix = major == 1 ? 10 : 12;
  size_t len = dict.size() + 1;
  len += (64 - (prefix + len) % 64) % 64;
  for (size_t i = 0; i < prefix - 8; ++i) out += static_cast<char>((len >> (8 * i)) & 0xFF);
  out += dict;
  out.append(len - dict.size() - 1, ' ');
  out += '\n';
  return out + data;
}

TEST(NpyHeader, MatchesNumpyByteForByte) {
  // np.save of a (4, 8) uint16 array writes exactly this preamble (numpy >= 1.14: 64-byte alignment).
  const std::string h = make_header("<u2", {4, 8});
  const std::string dict = "{'descr': '<u2', 'fortran_order': False, 'shape': (4, 8), }";
  ASSERT_EQ(h.size(), 128u);
  EXPECT_EQ(h.substr(0, 6), std::string("\x93NUMPY", 6));
  EXPECT_EQ(h[6], 1);
  EXPECT_EQ(h[7], 0);
  EXPECT_EQ(static_cast<uint8_t>(h[8]), 118);  // 'v': 128 - 10
  EXPECT_EQ(h[9], 0);
  EXPECT_EQ(h.substr(10, dict.size()), dict);
  EXPECT_EQ(h.substr(10 + dict.size(), 128 - 10 - dict.size() - 1), std::string(128 - 10 - dict.size() - 1, ' '));
  EXPECT_EQ(h.back(), '\n');
}

TEST(NpyHeader, ShapesAsNumpyWritesThem) {
  EXPECT_EQ(shape_text({}), "()");
  EXPECT_EQ(shape_text({5}), "(5,)");
  EXPECT_EQ(shape_text({2, 3, 4}), "(2, 3, 4)");
  for (const auto& shape : std::vector<std::vector<int64_t>>{{}, {5}, {2, 3, 4}, {1, 2, 3, 4, 5, 6}}) {
    const std::string h = make_header("<f4", shape);
    EXPECT_EQ(h.size() % 64, 0u) << shape_text(shape);
    EXPECT_NE(h.find("'shape': " + shape_text(shape) + ", }"), std::string::npos);
  }
}

TEST(NpyHeader, HugeHeaderUsesVersion2) {
  const std::vector<int64_t> shape(25000, 1);  // "1, " * 25000 > 65535 bytes
  const std::string h = make_header("<u2", shape);
  EXPECT_EQ(h[6], 2);
  EXPECT_EQ(h.size() % 64, 0u);
  const std::string path = temp_path("v2.npy");
  const uint16_t one = 0xBEEF;
  write_npy(path, "<u2", shape, &one, 2);
  const NpyArray a = read_npy(path);
  EXPECT_EQ(a.shape, shape);
  EXPECT_EQ(a.data_as<uint16_t>()[0], 0xBEEF);
}

TEST(NpyRoundTrip, U2AndF4KeepEveryBit) {
  std::vector<uint16_t> u(4 * 8);
  for (size_t i = 0; i < u.size(); ++i) u[i] = static_cast<uint16_t>(0x7FC1 + 977 * i);
  const std::string pu = temp_path("u.npy");
  write_npy(pu, kU16, {4, 8}, u.data(), u.size() * 2);
  const NpyArray a = read_npy(pu);
  EXPECT_EQ(a.dtype, "<u2");
  EXPECT_EQ(a.shape, (std::vector<int64_t>{4, 8}));
  ASSERT_EQ(a.element_count(), 32u);
  ASSERT_EQ(a.item_size(), 2u);
  EXPECT_EQ(std::memcmp(a.data.data(), u.data(), 64), 0);

  // NaN payloads, -0 and subnormals survive: the file is bits, not values.
  const std::vector<uint32_t> f = {0x7FC00001u, 0xFFFFFFFFu, 0x80000000u, 0x00000001u, 0x3F800000u, 0x7F800000u};
  const std::string pf = temp_path("f.npy");
  write_npy(pf, kF32, {2, 1, 3}, f.data(), f.size() * 4);
  const NpyArray b = read_npy(pf);
  EXPECT_EQ(b.dtype, "<f4");
  EXPECT_EQ(b.shape, (std::vector<int64_t>{2, 1, 3}));
  ASSERT_EQ(b.data.size(), 24u);
  EXPECT_EQ(std::memcmp(b.data.data(), f.data(), 24), 0);
}

TEST(NpyRoundTrip, ScalarAndEmpty) {
  const float x = 2.5f;
  const std::string ps = temp_path("scalar.npy");
  write_npy(ps, kF32, {}, &x, 4);
  const NpyArray s = read_npy(ps);
  EXPECT_TRUE(s.shape.empty());
  EXPECT_EQ(s.element_count(), 1u);
  EXPECT_EQ(s.data_as<float>()[0], 2.5f);

  const std::string pe = temp_path("empty.npy");
  write_npy(pe, kU16, {0, 3}, nullptr, 0);
  const NpyArray e = read_npy(pe);
  EXPECT_EQ(e.shape, (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(e.element_count(), 0u);
  EXPECT_TRUE(e.data.empty());
}

TEST(NpyRead, AcceptsOtherKeyOrderQuotesAndSpacing) {
  const std::string data(12, '\x01');
  const std::string path =
      write_bytes("order.npy", handmade("{\"shape\":(3,2),  'descr':\"<u2\" ,'fortran_order':False}", data));
  const NpyArray a = read_npy(path);
  EXPECT_EQ(a.shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(a.dtype, "<u2");
}

TEST(NpyRead, AcceptsVersion2Files) {
  const std::string data(8, '\x02');
  const std::string path =
      write_bytes("v2hand.npy", handmade("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", data, 2));
  const NpyArray a = read_npy(path);
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2}));
  EXPECT_EQ(a.data.size(), 8u);
}

struct Malformed {
  const char* name;
  std::string bytes;
  const char* message_part;
};

TEST(NpyRead, RejectsEveryMalformedCaseWithAClearMessage) {
  const std::string ok_dict = "{'descr': '<u2', 'fortran_order': False, 'shape': (2, 2), }";
  const std::string data8(8, '\0');
  std::string version3 = handmade(ok_dict, data8);
  version3[6] = 3;
  std::string version11 = handmade(ok_dict, data8);
  version11[7] = 1;
  const std::string good = handmade(ok_dict, data8);
  const std::vector<Malformed> cases = {
      {"empty", "", "bad magic"},
      {"bad_magic", "\x93NUMPZ" + good.substr(6), "bad magic"},
      {"text_file", "hello world, not an array", "bad magic"},
      {"version3", version3, "unsupported .npy version 3.0"},
      {"version11", version11, "unsupported .npy version 1.1"},
      {"cut_in_version", good.substr(0, 7), "truncated"},
      {"cut_in_length", good.substr(0, 9), "truncated"},
      {"cut_in_header", good.substr(0, 40), "truncated"},
      {"fortran", handmade("{'descr': '<u2', 'fortran_order': True, 'shape': (2, 2), }", data8),
       "fortran_order is True"},
      {"f8", handmade("{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }", data8), "unsupported dtype '<f8'"},
      {"big_endian", handmade("{'descr': '>u2', 'fortran_order': False, 'shape': (2, 2), }", data8), "big-endian"},
      {"short_data", handmade(ok_dict, std::string(6, '\0')),
       "truncated file: shape (2, 2) of <u2 needs 8 data bytes, the file has 6"},
      {"extra_data", handmade(ok_dict, std::string(10, '\0')), "2 extra"},
      {"no_shape", handmade("{'descr': '<u2', 'fortran_order': False, }", data8), "no 'shape' key"},
      {"no_descr", handmade("{'fortran_order': False, 'shape': (4,), }", data8), "no 'descr' key"},
      {"extra_key", handmade("{'descr': '<u2', 'fortran_order': False, 'shape': (4,), 'x': 1}", data8),
       "unexpected key 'x'"},
      {"not_tuple", handmade("{'descr': '<u2', 'fortran_order': False, 'shape': (4), }", data8), "trailing comma"},
      {"negative_dim", handmade("{'descr': '<u2', 'fortran_order': False, 'shape': (-4,), }", data8), "non-negative"},
      {"not_bool", handmade("{'descr': '<u2', 'fortran_order': 0, 'shape': (4,), }", data8), "True or False"},
      {"no_brace", handmade("'descr': '<u2'", data8), "expected '{'"},
      {"huge_shape",
       handmade("{'descr': '<u2', 'fortran_order': False, 'shape': (99999999999, 99999999999, 99999999999), }", data8),
       "too large"},
  };
  for (const Malformed& c : cases) {
    const std::string path = write_bytes(std::string(c.name) + ".npy", c.bytes);
    const std::string message = error_of([&] { read_npy(path); });
    EXPECT_NE(message.find(c.message_part), std::string::npos)
        << c.name << ": got \"" << message << "\", expected it to contain \"" << c.message_part << "\"";
    EXPECT_EQ(message.rfind(path, 0), 0u) << c.name << ": the message should start with the path: " << message;
  }
}

TEST(NpyRead, MissingFileAndDirectory) {
  EXPECT_NE(error_of([] { read_npy(temp_path("does_not_exist.npy")); }).find("cannot open"), std::string::npos);
  EXPECT_NE(error_of([] { read_npy(temp_dir()); }).find("not a regular file"), std::string::npos);
}

bool leftover_temp_files(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return false;
  bool found = false;
  while (dirent* e = readdir(d)) {
    if (std::string(e->d_name).find(".tmp.") != std::string::npos) found = true;
  }
  closedir(d);
  return found;
}

TEST(NpyWrite, ErrorsLeaveNothingHalfWritten) {
  const std::string dir = temp_path("atomic");
  mkdir(dir.c_str(), 0755);
  const std::string path = dir + "/keep.npy";
  const uint16_t old_bits[2] = {1, 2};
  write_npy(path, kU16, {2}, old_bits, 4);
  const std::string before = read_file(path);

  // Size mismatch, bad dtype, negative dimension: rejected before anything is created.
  const uint16_t v[3] = {7, 8, 9};
  EXPECT_NE(error_of([&] { write_npy(path, kU16, {2}, v, 6); }).find("needs 4 bytes, given 6"), std::string::npos);
  EXPECT_NE(error_of([&] { write_npy(path, "<i8", {1}, v, 8); }).find("unsupported dtype"), std::string::npos);
  EXPECT_NE(error_of([&] { write_npy(path, kU16, {-1}, v, 0); }).find("negative"), std::string::npos);
  EXPECT_EQ(read_file(path), before);

  // Unwritable destination: a missing directory; a path that is a directory (rename fails).
  EXPECT_NE(error_of([&] { write_npy(dir + "/no/such/dir/x.npy", kU16, {3}, v, 6); }).find("cannot create"),
            std::string::npos);
  const std::string subdir = dir + "/is_a_dir.npy";
  mkdir(subdir.c_str(), 0755);
  EXPECT_NE(
      error_of([&] { write_npy(subdir, kU16, {3}, v, 6); }).find("exists and is not a regular file (a directory)"),
      std::string::npos);
  EXPECT_FALSE(leftover_temp_files(dir));

  // A successful overwrite replaces the whole file and leaves no temporary behind.
  write_npy(path, kU16, {3}, v, 6);
  const NpyArray a = read_npy(path);
  EXPECT_EQ(a.shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(a.data_as<uint16_t>()[2], 9);
  EXPECT_FALSE(leftover_temp_files(dir));
}

// Peak resident memory of this process so far, in bytes.
size_t peak_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<size_t>(usage.ru_maxrss) * 1024;
}

// A sparse file of `total_bytes` that starts with `head` (no data blocks are written beyond it).
std::string sparse_file(const std::string& name, const std::string& head, off_t total_bytes) {
  const std::string path = write_bytes(name, head);
  EXPECT_EQ(truncate(path.c_str(), total_bytes), 0) << path;
  return path;
}

TEST(NpyRead, HugeFileWithASmallHeaderIsRefusedBeforeAnyDataIsRead) {
  // Issue 15, item 3: the reader reserved the file's size (64 GiB: std::bad_alloc, an abort in
  // the CLI) and read a 2 GiB file whole (2.1 GB, 26 s) before comparing it with the header.
  const std::string head =
      handmade("{'descr': '<u2', 'fortran_order': False, 'shape': (4, 8), }", std::string(64, '\0'));
  for (const off_t total : {off_t{64} << 30, off_t{2} << 30}) {
    const std::string path = sparse_file("huge_" + std::to_string(total >> 30) + ".npy", head, total);
    const size_t rss_before = peak_rss_bytes();
    const auto start = std::chrono::steady_clock::now();
    const std::string message = error_of([&] { read_npy(path); });
    const auto elapsed = std::chrono::steady_clock::now() - start;
    EXPECT_NE(message.find("data size does not match the shape"), std::string::npos) << message;
    EXPECT_LT(elapsed, std::chrono::seconds(1)) << "the data must not be read";
    EXPECT_LT(peak_rss_bytes() - rss_before, size_t{64} << 20) << "the data must not be held";
  }
}

TEST(NpyRead, HeaderLengthIsBounded) {
  // A version 2.0 header length of 4 GiB - 1: refused from the length alone, nothing allocated.
  std::string bytes("\x93NUMPY\x02\x00\xff\xff\xff\xff", 12);
  const std::string path = sparse_file("long_header.npy", bytes, off_t{5} << 30);
  const size_t rss_before = peak_rss_bytes();
  EXPECT_NE(error_of([&] { read_npy(path); }).find("header of 4294967295 bytes is longer than"), std::string::npos);
  EXPECT_LT(peak_rss_bytes() - rss_before, size_t{64} << 20);
}

TEST(NpyRead, AFifoIsRefusedWithoutBlocking) {
  // Issue 15, item 5: open() of a FIFO blocked until a writer came, before the regular-file check.
  const std::string path = temp_path("fifo.npy");
  unlink(path.c_str());
  ASSERT_EQ(mkfifo(path.c_str(), 0600), 0);
  auto reading = std::async(std::launch::async, [&] { return error_of([&] { read_npy(path); }); });
  if (reading.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
    // Release the blocked reader so that the test can end, then fail.
    const int writer = open(path.c_str(), O_WRONLY | O_NONBLOCK);
    if (writer >= 0) close(writer);
    reading.wait();
    FAIL() << "read_npy blocked on a FIFO";
  }
  EXPECT_NE(reading.get().find("not a regular file"), std::string::npos);
}

TEST(NpyOutputFiles, AnUnwritableOutputIsFoundBeforeAnyWorkAndNothingIsCreated) {
  // Issue 15, item 6: `sim fused_rmsnorm --output o1.npy --residual-output /nonexistent/o2.npy`
  // left o1.npy behind and reported the bad path only after the computation.
  const std::string dir = temp_path("outputs1");
  mkdir(dir.c_str(), 0755);
  const std::string first = dir + "/o1.npy";
  EXPECT_NE(error_of([&] {
              OutputFiles files({first, dir + "/no/such/o2.npy"});
            }).find("cannot create"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              OutputFiles files({first, "/dev/null"});
            }).find("a device, FIFO or socket"),
            std::string::npos);
  EXPECT_NE(error_of([&] { OutputFiles files({first, first}); }).find("named twice"), std::string::npos);
  struct stat st;
  EXPECT_NE(stat(first.c_str(), &st), 0) << "o1.npy must not exist";
  EXPECT_FALSE(leftover_temp_files(dir));
}

TEST(NpyOutputFiles, CommitsAllOrNothing) {
  const std::string dir = temp_path("outputs2");
  mkdir(dir.c_str(), 0755);
  const std::string a = dir + "/a.npy", b = dir + "/b.txt", trace = dir + "/t.txt";
  const uint16_t v[2] = {1, 2};
  struct stat st;
  {
    // Written but never committed (e.g. the second write threw): nothing appears.
    OutputFiles files({a, b});
    files.write_npy(a, kU16, {2}, v, 4);
  }
  EXPECT_NE(stat(a.c_str(), &st), 0);
  EXPECT_FALSE(leftover_temp_files(dir));
  {
    // Only what was written is committed (a failed run keeps its trace, not its outputs).
    OutputFiles files({a, trace});
    files.write(trace, "what happened", 13);
    files.commit();
  }
  EXPECT_NE(stat(a.c_str(), &st), 0);
  EXPECT_EQ(read_file(trace), "what happened");
  {
    OutputFiles files({a, b});
    files.write_npy(a, kU16, {2}, v, 4);
    files.write(b, "text", 4);
    files.commit();
  }
  EXPECT_EQ(read_npy(a).data_as<uint16_t>()[1], 2);
  EXPECT_EQ(read_file(b), "text");
  EXPECT_FALSE(leftover_temp_files(dir));
}

TEST(NpyOutputFiles, AFailedWriteLeavesNothing) {
  // A write that fails mid-way (here: RLIMIT_FSIZE, as a full disk would) throws and leaves no file.
  const std::string dir = temp_path("outputs3");
  mkdir(dir.c_str(), 0755);
  const std::string a = dir + "/a.bin", b = dir + "/b.bin";
  const std::string big(1 << 20, 'x');
  std::string message;
  const pid_t child = fork();
  if (child == 0) {
    signal(SIGXFSZ, SIG_IGN);
    rlimit limit{512 << 10, 512 << 10};
    setrlimit(RLIMIT_FSIZE, &limit);
    try {
      OutputFiles files({a, b});
      files.write(a, "small", 5);
      files.write(b, big.data(), big.size());
      files.commit();
    } catch (const NpyError& e) {
      _exit(std::string(e.what()).find("write failed") != std::string::npos ? 42 : 1);
    }
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 42);
  struct stat st;
  EXPECT_NE(stat(a.c_str(), &st), 0);
  EXPECT_NE(stat(b.c_str(), &st), 0);
  EXPECT_FALSE(leftover_temp_files(dir));
}

}  // namespace
}  // namespace exactcoll::npy

// `exactcoll diff` driven through its command function on temp files: exit codes, the numbers it
// prints, and the comparison statistics behind them.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/support/command_runner.h"
#include "tools/diff/compare.h"
#include "tools/diff/diff_command.h"
#include "npy/npy.h"

namespace exactcoll::diff {
namespace {

using test_support::CommandResult;
using test_support::temp_path;

CommandResult run_diff(const std::vector<std::string>& args) {
  return test_support::run_in_process(diff_main, "diff", args);
}

std::string save_u16(const std::string& name, const std::vector<uint16_t>& v, std::vector<int64_t> shape) {
  const std::string p = temp_path(name);
  npy::write_npy(p, npy::kU16, shape, v.data(), v.size() * 2);
  return p;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(UlpDistance, OrderedIntegerDistance) {
  EXPECT_EQ(ulp_distance(DType::kBF16, 0x3F80, 0x3F81), 1u);
  EXPECT_EQ(ulp_distance(DType::kBF16, 0x3F81, 0x3F80), 1u);
  EXPECT_EQ(ulp_distance(DType::kBF16, 0x3F80, 0x4000), 128u);  // 1.0 and 2.0: one binade
  EXPECT_EQ(ulp_distance(DType::kBF16, 0x0000, 0x8000), 0u);    // +0, -0
  EXPECT_EQ(ulp_distance(DType::kBF16, 0x0001, 0x8001), 2u);    // smallest subnormals across zero
  EXPECT_EQ(ulp_distance(DType::kBF16, 0x7F7F, 0x7F80), 1u);    // max finite, inf
  EXPECT_EQ(ulp_distance(DType::kFP16, 0x3C00, 0x3C01), 1u);
  EXPECT_EQ(ulp_distance(DType::kFP32, 0x3F800000u, 0xBF800000u), 2u * 0x3F800000u);
  EXPECT_EQ(ulp_bucket(0), 0);
  EXPECT_EQ(ulp_bucket(3), 3);
  EXPECT_EQ(ulp_bucket(4), 3);
  EXPECT_EQ(ulp_bucket(5), 4);
  EXPECT_EQ(ulp_bucket(16), 5);
  EXPECT_EQ(ulp_bucket(17), 6);
  EXPECT_TRUE(is_nan_bits(DType::kBF16, 0xFFC1));
  EXPECT_FALSE(is_nan_bits(DType::kBF16, 0xFF80));  // -inf
  EXPECT_TRUE(is_nan_bits(DType::kFP16, 0x7C01));
  EXPECT_FALSE(is_nan_bits(DType::kFP16, 0x7C00));
}

TEST(Compare, CountsEveryKindOfDifference) {
  //                            0       1       2       3       4       5       6       7       8
  const std::vector<uint16_t> a = {0x3F80, 0x3F80, 0x3F80, 0x3F80, 0x0000, 0x7FC0, 0x7FC1, 0x3F80, 0x7F7F};
  const std::vector<uint16_t> b = {0x3F80, 0x3F81, 0x3F83, 0x4000, 0x8000, 0x3F80, 0x7FC2, 0x3F7D, 0x7F80};
  const CompareResult r = compare(DType::kBF16, a.data(), b.data(), a.size());
  EXPECT_EQ(r.count, 9u);
  EXPECT_EQ(r.equal, 1u);
  EXPECT_EQ(r.differing(), 8u);
  EXPECT_EQ(r.nan_mismatch, 1u);  // element 5
  EXPECT_EQ(r.max_ulp, 128u);     // element 3
  // Buckets: 0: elements 0, 4 (+0/-0), 6 (two NaNs); 1: 1, 8; 2: none; 3-4: 2 (3 ULP), 7 (3 ULP);
  // >16: 3.
  const std::array<size_t, kUlpBuckets> expected = {3, 2, 0, 2, 0, 0, 1};
  EXPECT_EQ(r.ulp_histogram, expected);
  EXPECT_TRUE(std::isinf(r.max_abs_diff));  // max finite vs inf
  ASSERT_TRUE(r.has_first_diff);
  EXPECT_EQ(r.first_diff, 1u);
  EXPECT_EQ(r.first_a_bits, 0x3F80u);
  EXPECT_EQ(r.first_b_bits, 0x3F81u);
}

TEST(Compare, RelativeL2AndMaxAbs) {
  const std::vector<float> a = {1.0f, 2.0f, 3.0f, 4.0f};
  const std::vector<float> b = {1.0f, 2.0f, 3.0f, 3.0f};
  const CompareResult r = compare(DType::kFP32, a.data(), b.data(), a.size());
  EXPECT_EQ(r.max_abs_diff, 1.0);
  EXPECT_DOUBLE_EQ(r.relative_l2(), 1.0 / std::sqrt(1.0 + 4.0 + 9.0 + 9.0));
  EXPECT_EQ(r.max_ulp, 0x40800000u - 0x40400000u);
}

TEST(DiffCommand, IdenticalFilesExitZero) {
  const std::vector<uint16_t> v = {0x3F80, 0x7FC1, 0x8000, 0x1234};
  const std::string a = save_u16("same_a.npy", v, {2, 2});
  const std::string b = save_u16("same_b.npy", v, {2, 2});
  const CommandResult r = run_diff({a, b, "--dtype", "bf16"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "elements         4\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "equal            4 (100.000%, bitwise)")) << r.out;
  EXPECT_TRUE(contains(r.out, "identical\n")) << r.out;
  EXPECT_FALSE(contains(r.out, "first difference")) << r.out;
  EXPECT_EQ(r.err, "");  // --dtype given: no note
}

TEST(DiffCommand, DifferencesExitOneAndAreReported) {
  std::vector<uint16_t> a(2 * 8, 0x3F80), b(2 * 8, 0x3F80);
  b[11] = 0x3F82;  // [1, 3]: 2 ULP
  b[14] = 0x3F7C;  // 4 ULP
  const CommandResult r = run_diff({save_u16("d_a.npy", a, {2, 8}), save_u16("d_b.npy", b, {2, 8})});
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_TRUE(contains(r.err, "read as bf16")) << r.err;  // the default-dtype note
  EXPECT_TRUE(contains(r.out, "differing        2 (fraction 0.125)")) << r.out;
  EXPECT_TRUE(contains(r.out, "max ULP          4\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "max |difference| 0.015625\n")) << r.out;  // 1.015625 - 1 = 1 - 0.984375
  EXPECT_TRUE(contains(r.out, "ULP histogram    0:14 1:0 2:1 3-4:1 5-8:0 9-16:0 >16:0")) << r.out;
  EXPECT_TRUE(contains(r.out, "first difference index 11 [1, 3]: A 0x3f80 (1), B 0x3f82 (1.015625)")) << r.out;
  EXPECT_TRUE(contains(r.out, "DIFFERENT")) << r.out;
}

TEST(DiffCommand, Fp16ReadsTheSameBitsDifferently) {
  const std::vector<uint16_t> a = {0x3C00}, b = {0x3C01};
  const CommandResult r = run_diff({save_u16("h_a.npy", a, {1}), save_u16("h_b.npy", b, {1}), "--dtype=fp16"});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "A 0x3c00 (1), B 0x3c01 (1.00097656)")) << r.out;
}

TEST(DiffCommand, Fp32IsInferred) {
  const std::vector<float> a = {1.0f, -0.0f}, b = {1.0f, 0.0f};
  const std::string pa = temp_path("f_a.npy"), pb = temp_path("f_b.npy");
  npy::write_npy(pa, npy::kF32, {2}, a.data(), 8);
  npy::write_npy(pb, npy::kF32, {2}, b.data(), 8);
  const CommandResult r = run_diff({pa, pb});
  EXPECT_EQ(r.code, 1);  // -0 vs +0 is a bitwise difference, 0 ULP
  EXPECT_EQ(r.err, "");
  EXPECT_TRUE(contains(r.out, "dtype            fp32")) << r.out;
  EXPECT_TRUE(contains(r.out, "max ULP          0\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "first difference index 1 [1]: A 0x80000000 (-0), B 0x00000000 (0)")) << r.out;
  EXPECT_EQ(run_diff({pa, pb, "--dtype", "bf16"}).code, 2);
}

TEST(DiffCommand, BadInputExitsTwo) {
  const std::vector<uint16_t> v(8, 0);
  const std::string a = save_u16("bad_a.npy", v, {2, 4});
  const std::string b = save_u16("bad_b.npy", v, {4, 2});
  CommandResult r = run_diff({a, b});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, "shapes differ")) << r.err;

  const std::vector<float> f(8, 0.0f);
  const std::string pf = temp_path("bad_f.npy");
  npy::write_npy(pf, npy::kF32, {2, 4}, f.data(), 32);
  r = run_diff({a, pf});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, "dtypes differ")) << r.err;

  EXPECT_EQ(run_diff({a, a, "--dtype", "fp32"}).code, 2);
  r = run_diff({a, temp_path("missing.npy")});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, "cannot open")) << r.err;
  EXPECT_EQ(run_diff({a}).code, 2);                        // missing argument
  EXPECT_EQ(run_diff({a, b, "--dtype", "int8"}).code, 2);  // bad choice
}

}  // namespace
}  // namespace exactcoll::diff

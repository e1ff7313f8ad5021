#include "tools/diff/diff_command.h"

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "tools/cli.h"
#include "tools/diff/compare.h"
#include "npy/npy.h"

namespace exactcoll::diff {
namespace {

constexpr const char* kCommand = "diff";

// Returns "[1, 2, 3]": the multi-dimensional index of flat index i in a C-order shape.
std::string index_text(size_t i, const std::vector<int64_t>& shape) {
  std::vector<int64_t> idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    const size_t dim = static_cast<size_t>(shape[d]);
    idx[d] = static_cast<int64_t>(i % dim);
    i /= dim;
  }
  std::string s = "[";
  for (size_t d = 0; d < idx.size(); ++d) s += (d ? ", " : "") + std::to_string(idx[d]);
  return s + "]";
}

std::string percent(size_t part, size_t whole) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f%%", whole == 0 ? 0.0 : 100.0 * static_cast<double>(part) / whole);
  return buf;
}

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

}  // namespace

int diff_main(int argc, char** argv) {
  std::string path_a, path_b, dtype_flag;
  cli::ArgParser parser("exactcoll diff A.npy B.npy [--dtype bf16|fp16|fp32]",
                        "Compares two arrays element by element: equal count (bitwise), fraction differing,\n"
                        "max |difference|, max ULP distance, a ULP histogram and the first differing element.\n"
                        "Exit 0 iff identical, 1 if they differ, 2 on bad input.");
  parser.add_positional("A.npy", &path_a, "first array");
  parser.add_positional("B.npy", &path_b, "second array (the reference for the relative L2 difference)");
  parser.add_choice("dtype", &dtype_flag, {"bf16", "fp16", "fp32"},
                    "element type ('<f4' files are fp32; '<u2' files default to bf16)");
  if (auto code = parser.parse(argc, argv)) return *code;

  // 1. Read both files.
  npy::NpyArray a, b;
  try {
    a = npy::read_npy(cli::resolve_path(path_a));
    b = npy::read_npy(cli::resolve_path(path_b));
  } catch (const npy::NpyError& e) {
    return cli::fail(kCommand, e.what());
  }
  // 2. Shapes and dtypes must match; the dtype decides how bits are read.
  if (a.shape != b.shape) {
    return cli::fail(kCommand, "shapes differ: " + path_a + " is " + npy::shape_text(a.shape) + ", " + path_b + " is " +
                                   npy::shape_text(b.shape));
  }
  if (a.dtype != b.dtype) {
    return cli::fail(kCommand, "dtypes differ: " + path_a + " is " + a.dtype + ", " + path_b + " is " + b.dtype);
  }
  DType dtype;
  if (a.dtype == npy::kF32) {
    if (parser.given("dtype") && dtype_flag != "fp32") {
      return cli::fail(kCommand, "--dtype " + dtype_flag + " does not fit '<f4' files (they hold fp32)");
    }
    dtype = DType::kFP32;
  } else {
    if (parser.given("dtype") && dtype_flag == "fp32") {
      return cli::fail(kCommand, "--dtype fp32 does not fit '<u2' files (they hold bf16 or fp16 bits)");
    }
    if (!parser.given("dtype")) {
      std::cerr << "exactcoll diff: note: '<u2' files read as bf16 bits (pass --dtype fp16 for fp16)\n";
    }
    dtype = dtype_flag == "fp16" ? DType::kFP16 : DType::kBF16;
  }

  // 3. Compare and report.
  const CompareResult r = compare(dtype, a.data.data(), b.data.data(), a.element_count());
  std::cout << "dtype            " << dtype_name(dtype) << ", shape " << npy::shape_text(a.shape) << "\n"
            << "elements         " << r.count << "\n"
            << "equal            " << r.equal << " (" << percent(r.equal, r.count) << ", bitwise)\n"
            << "differing        " << r.differing() << " (fraction " << number(r.fraction_differing()) << ")\n"
            << "nan mismatch     " << r.nan_mismatch << "\n"
            << "max |difference| " << number(r.max_abs_diff) << "\n"
            << "max ULP          " << r.max_ulp << "\n"
            << "relative L2      " << number(r.relative_l2()) << "\n"
            << "ULP histogram   ";
  for (int k = 0; k < kUlpBuckets; ++k) std::cout << " " << kUlpBucketNames[k] << ":" << r.ulp_histogram[k];
  std::cout << "\n";
  if (r.has_first_diff) {
    std::cout << "first difference index " << r.first_diff << " " << index_text(r.first_diff, a.shape) << ": A "
              << describe_bits(dtype, r.first_a_bits) << ", B " << describe_bits(dtype, r.first_b_bits) << "\n";
  }
  std::cout << (r.identical() ? "identical\n" : "DIFFERENT\n");
  return r.identical() ? cli::kExitOk : cli::kExitDiffer;
}

namespace {
const cli::Registrar kRegistrar({kCommand, "compare two .npy arrays: equal count, ULP histogram, first difference",
                                 diff_main});
}  // namespace

}  // namespace exactcoll::diff

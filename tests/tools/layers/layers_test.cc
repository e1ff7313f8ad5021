// tools/layers: the two-stream simulation, the `layers` command (table, CSV, SVG, PNG, bad input)
// and the chart renderers.
#include <png.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "sim/fused/random.h"
#include "sim/fused/reference.h"
#include "tests/support/command_runner.h"
#include "tools/cli.h"
#include "tools/diff/compare.h"
#include "tools/layers/layers.h"
#include "tools/layers/plot.h"
#include "npy/npy.h"

namespace exactcoll::layers {
namespace {

using fused::Contract;

using test_support::CommandResult;
using test_support::file_exists;
using test_support::read_file;
using test_support::temp_path;

LayersOptions small(Contract c, int ranks = 4) {
  LayersOptions o;
  o.layers = 6;
  o.ranks = ranks;
  o.rows = 4;
  o.hidden = 512;
  o.contract = c;
  o.seed = 5;
  return o;
}

TEST(Layers, CanonicalAgainstItselfIsZeroEverywhere) {
  for (const LayerRow& r : simulate_layers(small(Contract::kCanonical))) {
    EXPECT_EQ(r.fraction_differing, 0.0) << r.layer;
    EXPECT_EQ(r.max_ulp, 0u) << r.layer;
    EXPECT_EQ(r.relative_l2, 0.0) << r.layer;
    EXPECT_EQ(r.out_fraction_differing, 0.0) << r.layer;
  }
}

TEST(Layers, ContractsThatCoincideShowNoDrift) {
  // One rank: no adds, so rounding after each add changes nothing; two ranks: a + b == b + a.
  for (const LayerRow& r : simulate_layers(small(Contract::kBf16Accumulate, 1))) EXPECT_EQ(r.max_ulp, 0u);
  for (const LayerRow& r : simulate_layers(small(Contract::kRotatedTwoShot, 2))) EXPECT_EQ(r.max_ulp, 0u);
}

TEST(Layers, F32ResidualDriftsAndCompounds) {
  const auto rows = simulate_layers(small(Contract::kF32Residual));
  ASSERT_EQ(rows.size(), 6u);
  std::printf(
      "f32_residual: layer 1 %.1f%% of residual elements differ (%.0f%% of them by 1-4 ULP), layer 6 %.1f%%; "
      "relative L2 drift %.3e -> %.3e\n",
      100 * rows[0].fraction_differing, 100 * rows[0].within_4ulp, 100 * rows[5].fraction_differing,
      rows[0].relative_l2, rows[5].relative_l2);
  EXPECT_GT(rows[0].fraction_differing, 0.10);
  EXPECT_LT(rows[0].fraction_differing, 0.40);
  EXPECT_GT(rows[5].fraction_differing, rows[0].fraction_differing);
  EXPECT_GT(rows[5].relative_l2, rows[0].relative_l2);
  // Deterministic: the same seed gives the same table; another seed another one.
  const auto again = simulate_layers(small(Contract::kF32Residual));
  EXPECT_EQ(again[5].relative_l2, rows[5].relative_l2);
  LayersOptions other = small(Contract::kF32Residual);
  other.seed = 6;
  EXPECT_NE(simulate_layers(other)[5].relative_l2, rows[5].relative_l2);
}

TEST(Layers, BadOptionsAreErrors) {
  LayersOptions o = small(Contract::kF32Residual);
  o.hidden = 500;  // not a multiple of 8
  EXPECT_THROW(simulate_layers(o), std::invalid_argument);
  o = small(Contract::kF32Residual);
  o.ranks = 0;
  EXPECT_THROW(simulate_layers(o), std::invalid_argument);
}

// ---- The command -------------------------------------------------------------------------------------

CommandResult run_layers(const std::vector<std::string>& args) {
  for (const auto& c : cli::registered_commands()) {
    if (c.name == "layers") return test_support::run_in_process(c.run, "layers", args);
  }
  ADD_FAILURE() << "the layers command is not registered";
  return {-1, "", ""};
}

TEST(LayersCommand, PrintsTableWritesCsvSvgPng) {
  const std::string csv = temp_path("l.csv"), svg = temp_path("l.svg"), png = temp_path("l.png");
  const std::vector<std::string> common = {"--layers", "3", "--ranks", "4", "--rows", "2", "--hidden", "256"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = common;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  CommandResult r = run_layers(with({"--csv", csv, "--plot", svg}));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("canonical vs f32_residual, bf16, 4 ranks, 2 rows, hidden 256, 3 layers, seed 1 (the default"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("\n    3 "), std::string::npos) << r.out;
  const std::string table = read_file(csv);
  EXPECT_EQ(std::count(table.begin(), table.end(), '\n'), 4) << table;
  EXPECT_EQ(table.rfind("layer,residual_fraction_differing,", 0), 0u) << table;
  const std::string chart = read_file(svg);
  EXPECT_EQ(chart.rfind("<?xml", 0), 0u);
  EXPECT_NE(chart.find("<polyline"), std::string::npos);
  EXPECT_NE(chart.find("relative L2 drift"), std::string::npos);
  EXPECT_NE(chart.find("</svg>"), std::string::npos);

  r = run_layers(with({"--plot", png, "--seed", "9"}));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.find("the default"), std::string::npos);
  const std::string bytes = read_file(png);
  ASSERT_GT(bytes.size(), 8u);
  EXPECT_EQ(std::memcmp(bytes.data(), "\x89PNG\r\n\x1a\n", 8), 0);
  // Decode it again: the size is the figure's and the series colour is there.
  png_image image;
  std::memset(&image, 0, sizeof image);
  image.version = PNG_IMAGE_VERSION;
  ASSERT_TRUE(png_image_begin_read_from_memory(&image, bytes.data(), bytes.size())) << image.message;
  image.format = PNG_FORMAT_RGB;
  EXPECT_EQ(image.width, 860u);
  EXPECT_EQ(image.height, 34u + 2 * 300u);
  std::vector<uint8_t> rgb(PNG_IMAGE_SIZE(image));
  ASSERT_TRUE(png_image_finish_read(&image, nullptr, rgb.data(), 0, nullptr)) << image.message;
  size_t red = 0;
  for (size_t i = 0; i + 2 < rgb.size(); i += 3) red += rgb[i] == 0xD6 && rgb[i + 1] == 0x27 && rgb[i + 2] == 0x28;
  EXPECT_GT(red, 100u);
}

TEST(LayersCommand, BadInputExitsTwoAndWritesNothing) {
  const std::string plot = temp_path("bad.jpg"), csv = temp_path("bad.csv");
  EXPECT_EQ(run_layers({"--plot", plot}).code, 2);
  EXPECT_FALSE(file_exists(plot));
  CommandResult r = run_layers({"--hidden", "4100", "--layers", "1", "--csv", csv});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("not a positive multiple"), std::string::npos) << r.err;
  EXPECT_FALSE(file_exists(csv));
  EXPECT_EQ(run_layers({"--contract", "fast"}).code, 2);
  EXPECT_EQ(run_layers({"--ranks", "0"}).code, 2);
  // An unwritable output is bad input, found before any work (issue 15, item 6: it was exit 3
  // after the whole computation).
  r = run_layers({"--layers", "1", "--rows", "1", "--hidden", "64", "--csv", temp_path("no/such/dir.csv")});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("cannot create"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "") << "nothing may run before the outputs are known to be writable";
  // The plot cannot be written: the CSV, written first, must not be left behind either.
  r = run_layers(
      {"--layers", "1", "--rows", "1", "--hidden", "64", "--csv", csv, "--plot", temp_path("no/such/p.svg")});
  EXPECT_EQ(r.code, 2);
  EXPECT_FALSE(file_exists(csv));
}

TEST(LayersCommand, EpsAndSizesAreCheckedBeforeAnyWork) {
  // Issue 15, item 7: --eps nan, -1 and inf were accepted (nan made every output NaN, exit 0).
  for (const char* eps : {"nan", "-1", "inf", "1e39"}) {
    const CommandResult r = run_layers({"--layers", "1", "--rows", "1", "--hidden", "64", "--eps", eps});
    EXPECT_EQ(r.code, 2) << eps;
    EXPECT_NE(r.err.find("--eps must be a finite number >= 0"), std::string::npos) << r.err;
  }
  EXPECT_EQ(run_layers({"--layers", "1", "--rows", "1", "--hidden", "64", "--eps", "0"}).code, 0);
  // Issue 15, item 2: --rows 1048576 --hidden 1048576 (each inside its range) died of std::bad_alloc.
  const CommandResult r = run_layers({"--rows", "1048576", "--hidden", "1048576", "--layers", "1"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("GiB, more than the"), std::string::npos) << r.err;
}

// ---- Captured partial sums (--input) -------------------------------------------------------------------

// The model of tools/layers/layers.h for captured partial sums, written out: both runs add layer l's
// given partial sums x_all[(l - 1) * layer_stride ...] to their own residual stream (canonical and
// o.contract), from h_0 and w_l of the seed; each layer compares the two as the table does.
template <class T>
std::vector<LayerRow> replay_by_hand(const LayersOptions& o, const std::vector<T>& x_all, size_t layer_stride) {
  const size_t count = static_cast<size_t>(o.rows) * o.hidden;
  const std::vector<uint8_t> start = start_residual(o);
  std::vector<T> canonical(count), alternative(count), weight(static_cast<size_t>(o.hidden));
  EXPECT_EQ(start.size(), count * sizeof(T));
  std::memcpy(canonical.data(), start.data(), count * sizeof(T));
  alternative = canonical;
  std::vector<LayerRow> rows;
  for (int l = 1; l <= o.layers; ++l) {
    const std::vector<uint8_t> w = layer_weight(o, l);
    EXPECT_EQ(w.size(), weight.size() * sizeof(T));
    std::memcpy(weight.data(), w.data(), w.size());
    fused::FusedProblem<T> p;
    p.ranks = o.ranks, p.rows = o.rows, p.hidden = o.hidden, p.eps = o.eps;
    p.x = x_all.data() + static_cast<size_t>(l - 1) * layer_stride;
    p.weight = weight.data();
    std::vector<T> h_c(count), out_c(count), h_a(count), out_a(count);
    p.residual = canonical.data();
    fused::fused_reference<T>(Contract::kCanonical, p, h_c.data(), out_c.data());
    p.residual = alternative.data();
    fused::fused_reference<T>(o.contract, p, h_a.data(), out_a.data());
    const diff::CompareResult h = diff::compare(o.dtype, h_a.data(), h_c.data(), count);
    const diff::CompareResult out = diff::compare(o.dtype, out_a.data(), out_c.data(), count);
    LayerRow r;
    r.layer = l;
    r.fraction_differing = h.fraction_differing();
    r.max_ulp = h.max_ulp;
    r.relative_l2 = h.relative_l2();
    r.out_fraction_differing = out.fraction_differing();
    r.out_max_ulp = out.max_ulp;
    r.nan_mismatch = h.nan_mismatch;
    rows.push_back(r);
    canonical.swap(h_c);
    alternative.swap(h_a);
  }
  return rows;
}

void expect_same_rows(const std::vector<LayerRow>& got, const std::vector<LayerRow>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].layer, want[i].layer) << what;
    EXPECT_EQ(got[i].fraction_differing, want[i].fraction_differing) << what << " layer " << want[i].layer;
    EXPECT_EQ(got[i].max_ulp, want[i].max_ulp) << what << " layer " << want[i].layer;
    EXPECT_EQ(got[i].relative_l2, want[i].relative_l2) << what << " layer " << want[i].layer;
    EXPECT_EQ(got[i].out_fraction_differing, want[i].out_fraction_differing) << what << " layer " << want[i].layer;
    EXPECT_EQ(got[i].out_max_ulp, want[i].out_max_ulp) << what << " layer " << want[i].layer;
    EXPECT_EQ(got[i].nan_mismatch, want[i].nan_mismatch) << what << " layer " << want[i].layer;
  }
}

// Partial sums ~ N(0, 1) rounded to T, `sets` sets of [ranks, rows, H].
template <class T>
std::vector<T> random_partial_sums(const LayersOptions& o, int sets, uint64_t seed) {
  fused::SplitMix64 rng(seed);
  std::vector<T> x(static_cast<size_t>(sets) * o.ranks * o.rows * o.hidden);
  for (T& v : x) v = round_to<T>(rng.normal());
  return x;
}

// Writes x as the .npy `layers --input` reads: bits '<u2' for bf16/fp16, '<f4' for fp32.
template <class T>
std::string save_partial_sums(const std::string& name, const std::vector<T>& x, std::vector<int64_t> shape) {
  const std::string path = temp_path(name);
  npy::write_npy(path, sizeof(T) == 4 ? npy::kF32 : npy::kU16, shape, x.data(), x.size() * sizeof(T));
  return path;
}

template <class T>
void check_captured_against_direct_computation(DType dtype, Contract contract) {
  LayersOptions o = small(contract);
  o.layers = 4;
  o.rows = 3;
  o.hidden = 64;
  o.dtype = dtype;
  const std::string what = std::string(dtype_name(dtype)) + " " + fused::contract_name(contract);
  // [layers, ranks, rows, H]: every layer its own partial sums.
  const std::vector<T> x = random_partial_sums<T>(o, o.layers, 21);
  const size_t per_layer = static_cast<size_t>(o.ranks) * o.rows * o.hidden;
  const std::vector<LayerRow> want = replay_by_hand(o, x, per_layer);
  bool drifts = false;
  for (const LayerRow& r : want) drifts = drifts || r.max_ulp > 0;
  EXPECT_TRUE(drifts) << what << ": the check needs a contract that differs from canonical here";
  LayersOptions with_file = o;
  with_file.partial_sums = std::span(reinterpret_cast<const uint8_t*>(x.data()), x.size() * sizeof(T));
  expect_same_rows(simulate_layers(with_file), want, what + " [layers, ranks, rows, H]");
  // [ranks, rows, H]: one set for every layer.
  const std::vector<T> one(x.begin(), x.begin() + static_cast<std::ptrdiff_t>(per_layer));
  with_file.partial_sums = std::span(reinterpret_cast<const uint8_t*>(one.data()), one.size() * sizeof(T));
  expect_same_rows(simulate_layers(with_file), replay_by_hand(o, one, 0), what + " [ranks, rows, H]");
  // Neither size: refused.
  with_file.partial_sums = with_file.partial_sums.first(with_file.partial_sums.size() - sizeof(T));
  EXPECT_THROW(simulate_layers(with_file), std::invalid_argument) << what;

  // The command reads the file into the same computation: its CSV holds the rows computed above.
  const std::string input = save_partial_sums(std::string("captured_") + dtype_name(dtype) + ".npy", x,
                                              {o.layers, o.ranks, o.rows, o.hidden});
  const std::string csv = temp_path(std::string("captured_") + dtype_name(dtype) + ".csv");
  const CommandResult r = run_layers({"--input", input, "--dtype", dtype_name(dtype), "--contract",
                                      fused::contract_name(contract), "--seed", "5", "--csv", csv});
  ASSERT_EQ(r.code, 0) << what << ": " << r.err;
  EXPECT_NE(r.out.find(std::string(", 4 ranks, 3 rows, hidden 64, 4 layers, partial sums from ") + input +
                       " (4, 4, 3, 64), seed 5 for the residual stream's start and the weights\n"),
            std::string::npos)
      << r.out;
  std::istringstream lines(read_file(csv));
  std::string line;
  std::getline(lines, line);  // the header
  for (const LayerRow& w : want) {
    ASSERT_TRUE(std::getline(lines, line)) << what;
    std::istringstream fields(line);
    std::vector<double> v;
    for (std::string f; std::getline(fields, f, ',');) v.push_back(std::strtod(f.c_str(), nullptr));
    ASSERT_EQ(v.size(), 8u) << line;
    // layer, residual fraction, within 4 ULP, max ULP, relative L2, out fraction, out max ULP, NaN
    // mismatches; the fractions and the drift printed with 9 significant digits.
    EXPECT_EQ(v[0], w.layer) << line;
    EXPECT_NEAR(v[1], w.fraction_differing, 1e-8) << line;
    EXPECT_EQ(v[3], static_cast<double>(w.max_ulp)) << line;
    EXPECT_NEAR(v[4], w.relative_l2, 1e-8 * w.relative_l2) << line;
    EXPECT_NEAR(v[5], w.out_fraction_differing, 1e-8) << line;
    EXPECT_EQ(v[6], static_cast<double>(w.out_max_ulp)) << line;
    EXPECT_EQ(v[7], static_cast<double>(w.nan_mismatch)) << line;
  }
  EXPECT_FALSE(std::getline(lines, line)) << what << ": more rows than layers";
}

TEST(LayersInput, CapturedPartialSumsGiveTheDirectComputation) {
  check_captured_against_direct_computation<bf16>(DType::kBF16, Contract::kF32Residual);
  check_captured_against_direct_computation<fp16>(DType::kFP16, Contract::kBf16Accumulate);
  check_captured_against_direct_computation<float>(DType::kFP32, Contract::kRotatedTwoShot);
}

TEST(LayersInput, OneSetForEveryLayerEqualsTheSetRepeated) {
  LayersOptions o = small(Contract::kF32Residual);
  o.layers = 3;
  const std::vector<bf16> one = random_partial_sums<bf16>(o, 1, 8);
  std::vector<bf16> repeated;
  for (int l = 0; l < o.layers; ++l) repeated.insert(repeated.end(), one.begin(), one.end());
  const std::string a = save_partial_sums("one_set.npy", one, {o.ranks, o.rows, o.hidden});
  const std::string b = save_partial_sums("repeated.npy", repeated, {o.layers, o.ranks, o.rows, o.hidden});
  const std::string csv_a = temp_path("one_set.csv"), csv_b = temp_path("repeated.csv");
  const CommandResult ra = run_layers({"--input", a, "--layers", "3", "--csv", csv_a});
  const CommandResult rb = run_layers({"--input", b, "--csv", csv_b});
  ASSERT_EQ(ra.code, 0) << ra.err;
  ASSERT_EQ(rb.code, 0) << rb.err;
  EXPECT_EQ(read_file(csv_a), read_file(csv_b));
  EXPECT_NE(read_file(csv_a).find("\n3,"), std::string::npos) << read_file(csv_a);
  // Against itself every row is 0, captured partial sums or not.
  const CommandResult canonical = run_layers({"--input", b, "--contract", "canonical"});
  ASSERT_EQ(canonical.code, 0) << canonical.err;
  EXPECT_NE(canonical.out.find("after 3 layers: 0.00% of the residual stream differs"), std::string::npos)
      << canonical.out;
}

TEST(LayersInput, BadInputIsOneClearLineAndExitTwo) {
  LayersOptions o = small(Contract::kF32Residual);
  o.layers = 2;
  o.rows = 2;
  o.hidden = 64;
  const std::vector<bf16> x = random_partial_sums<bf16>(o, 2, 3);
  const std::string good = save_partial_sums("good.npy", x, {2, o.ranks, 2, 64});
  const std::vector<float> xf(x.size(), 1.0f);
  const std::string f32 = save_partial_sums("f32.npy", xf, {2, o.ranks, 2, 64});
  const std::string flat = save_partial_sums("flat.npy", x, {static_cast<int64_t>(x.size())});
  const std::string rank2 = save_partial_sums("rank2.npy", x, {2 * o.ranks * 2, 64});
  const std::string rank5 = save_partial_sums("rank5.npy", x, {1, 2, o.ranks, 2, 64});
  const std::string ranks17 = save_partial_sums("ranks17.npy", std::vector<bf16>(17 * 8), {17, 1, 8});
  const std::string no_rows = save_partial_sums("no_rows.npy", std::vector<bf16>(), {2, 4, 0, 8});
  const std::string h60 = save_partial_sums("h60.npy", std::vector<bf16>(4 * 60), {4, 1, 60});
  const std::string malformed = temp_path("malformed.npy");
  std::ofstream(malformed, std::ios::binary) << "\x93NUMPY\x01\x00garbage";
  const std::string csv = temp_path("never.csv");
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const Case cases[] = {
      {{"--input", temp_path("missing.npy")}, "--input " + temp_path("missing.npy") + ": cannot open"},
      {{"--input", malformed}, "--input " + malformed},
      {{"--input", temp_path("")}, "not a regular file"},  // a directory
      {{"--input", f32}, "holds '<f4' but --dtype bf16 needs '<u2'"},
      {{"--input", good, "--dtype", "fp32"}, "holds '<u2' but --dtype fp32 needs '<f4'"},
      {{"--input", flat}, "it must be [layers, ranks, rows, H] or [ranks, rows, H]"},
      {{"--input", rank2}, "has shape (16, 64); it must be [layers, ranks, rows, H] or [ranks, rows, H]"},
      {{"--input", rank5}, "has shape (1, 2, 4, 2, 64); it must be"},
      {{"--input", ranks17}, "has shape (17, 1, 8): ranks 17, outside 1..16"},
      {{"--input", no_rows}, "has shape (2, 4, 0, 8): rows 0, outside 1..1048576"},
      {{"--input", h60}, "has shape (4, 1, 60): H 60 is not a multiple of the bf16 pack (8 elements)"},
      {{"--input", good, "--layers", "3"},
       "--layers 3 disagrees with --input " + good + ", whose shape (2, 4, 2, 64) has layers 2"},
      {{"--input", good, "--ranks", "2"}, "--ranks 2 disagrees with --input " + good},
      {{"--input", good, "--rows", "4"}, "--rows 4 disagrees with --input " + good},
      {{"--input", good, "--hidden", "128"}, "--hidden 128 disagrees with --input " + good},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = c.args;
    args.insert(args.end(), {"--csv", csv});
    const CommandResult r = run_layers(args);
    std::string joined;
    for (const std::string& a : c.args) joined += a + " ";
    EXPECT_EQ(r.code, 2) << joined << "\n" << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << joined << "\nstderr: " << r.err;
    EXPECT_EQ(r.err.rfind("exactcoll layers: ", 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "one line: " << r.err;
    EXPECT_EQ(r.out, "") << joined;
    EXPECT_FALSE(file_exists(csv)) << joined;
  }
  // Size flags that agree with the file are no conflict; --layers is free with [ranks, rows, H].
  EXPECT_EQ(run_layers({"--input", good, "--layers", "2", "--ranks", "4", "--rows", "2", "--hidden", "64"}).code, 0);
  const std::string four =
      save_partial_sums("four.npy", std::vector<bf16>(x.begin(), x.begin() + 4 * 2 * 64), {4, 2, 64});
  const CommandResult free_layers = run_layers({"--input", four, "--layers", "5"});
  EXPECT_EQ(free_layers.code, 0) << free_layers.err;
  EXPECT_NE(free_layers.out.find("after 5 layers"), std::string::npos) << free_layers.out;
}

TEST(LayersCommand, UsageLineListsEveryFlag) {
  const CommandResult help = run_layers({"--help"});
  ASSERT_EQ(help.code, 0);
  const std::string usage = help.out.substr(0, help.out.find('\n'));
  ASSERT_EQ(usage.rfind("usage: exactcoll layers ", 0), 0u) << usage;
  std::istringstream lines(help.out);
  int flags = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("  --", 0) != 0) continue;
    const std::string name = line.substr(2, line.find(' ', 2) - 2);  // "--name" (npos - 2: to the end)
    if (name == "--help") continue;
    ++flags;
    EXPECT_NE(usage.find("[" + name + " "), std::string::npos) << name << " is missing from: " << usage;
  }
  EXPECT_EQ(flags, 11) << help.out;  // --eps and --input among them
  EXPECT_NE(usage.find("[--eps E]"), std::string::npos) << usage;
  EXPECT_NE(usage.find("[--input FILE.npy]"), std::string::npos) << usage;
}

// ---- The renderers ------------------------------------------------------------------------------------

// The legend sits between a panel's title and its plot area: no line of data is above its
// baseline, so it hides none (it once stood inside the plot area's top-left corner, over the lines).
TEST(Plot, TheLegendIsOutsideThePlotArea) {
  plot::Figure f;
  f.title = "legend";
  // Lines that reach the top of the plot area at the left and across it, as the percentages do.
  f.panels.push_back({"p",
                      "layer",
                      "percent",
                      plot::Scale::kLinear,
                      {plot::Series{"first series", {1, 2, 3, 60}, {100, 90, 95, 100}, 0xD62728},
                       plot::Series{"second series", {1, 2, 3, 60}, {98, 99, 100, 99}, 0x1F77B4}}});
  const std::string svg = plot::render_svg(f);
  auto number_after = [](const std::string& text, size_t at, const std::string& key) {
    return std::strtod(text.c_str() + text.find(key, at) + key.size(), nullptr);
  };
  double top_point = 1e9;
  for (size_t at = svg.find(" points=\""); at != std::string::npos; at = svg.find(" points=\"", at + 1)) {
    std::istringstream points(svg.substr(at + 9, svg.find('"', at + 9) - at - 9));
    for (std::string xy; points >> xy;) {
      top_point = std::min(top_point, std::strtod(xy.c_str() + xy.find(',') + 1, nullptr));
    }
  }
  ASSERT_LT(top_point, 1e9) << svg;
  for (const char* name : {">first series<", ">second series<"}) {
    const size_t text = svg.find(name);
    ASSERT_NE(text, std::string::npos) << svg;
    const size_t open = svg.rfind("<text", text);
    const double baseline = number_after(svg, open, "y=\"");
    EXPECT_LT(baseline, top_point) << name << " at y " << baseline << ", a line at y " << top_point;
    EXPECT_GT(baseline, number_after(svg, svg.rfind("<text", svg.find(">p<")), "y=\"")) << "below the panel's title";
  }
}

TEST(Plot, FontCoversWhatChartsPrint) {
  for (char c : std::string("0123456789.-+%_():/= abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ,?")) {
    EXPECT_TRUE(plot::font_has_glyph(c)) << "'" << c << "'";
  }
  EXPECT_FALSE(plot::font_has_glyph('#'));
}

TEST(Plot, LogScaleAndEscaping) {
  plot::Figure f;
  f.title = "a < b & c";
  f.panels.push_back({"p", "x", "y", plot::Scale::kAuto, {plot::Series{"s", {1, 2, 3}, {1e-5, 1e-3, 1e-1}, 0x00FF00}}});
  const std::string svg = plot::render_svg(f);
  EXPECT_NE(svg.find("a &lt; b &amp; c"), std::string::npos);
  EXPECT_NE(svg.find("(log scale)"), std::string::npos);
  EXPECT_NE(svg.find(">1e-5<"), std::string::npos);
  EXPECT_NE(svg.find(">1e-1<"), std::string::npos);
  // A zero breaks a log-scale line instead of plotting log(0); auto picks linear then.
  f.panels[0].series[0].y = {0, 1e-3, 1e-1};
  EXPECT_EQ(plot::render_svg(f).find("(log scale)"), std::string::npos);
}

}  // namespace
}  // namespace exactcoll::layers

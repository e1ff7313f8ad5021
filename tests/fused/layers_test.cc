// tools/layers: the two-stream simulation, the `layers` command (table, CSV, SVG, PNG, bad input)
// and the chart renderers.
#include <png.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/support/command_runner.h"
#include "tools/cli.h"
#include "tools/layers/layers.h"
#include "tools/layers/plot.h"

namespace exactcoll::layers {
namespace {

using fused::FusedContract;

using test_support::CommandResult;
using test_support::file_exists;
using test_support::read_file;
using test_support::temp_path;

LayersOptions small(FusedContract c, int ranks = 4) {
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
  for (const LayerRow& r : simulate_layers(small(FusedContract::kCanonical))) {
    EXPECT_EQ(r.fraction_differing, 0.0) << r.layer;
    EXPECT_EQ(r.max_ulp, 0u) << r.layer;
    EXPECT_EQ(r.relative_l2, 0.0) << r.layer;
    EXPECT_EQ(r.out_fraction_differing, 0.0) << r.layer;
  }
}

TEST(Layers, ContractsThatCoincideShowNoDrift) {
  // One rank: no adds, so rounding after each add changes nothing; two ranks: a + b == b + a.
  for (const LayerRow& r : simulate_layers(small(FusedContract::kBf16Accumulate, 1))) EXPECT_EQ(r.max_ulp, 0u);
  for (const LayerRow& r : simulate_layers(small(FusedContract::kRotatedTwoShot, 2))) EXPECT_EQ(r.max_ulp, 0u);
}

TEST(Layers, F32ResidualDriftsAndCompounds) {
  const auto rows = simulate_layers(small(FusedContract::kF32Residual));
  ASSERT_EQ(rows.size(), 6u);
  std::printf("f32_residual: layer 1 %.1f%% of residual elements differ (%.0f%% of them by 1-4 ULP), layer 6 %.1f%%; "
              "relative L2 drift %.3e -> %.3e\n",
              100 * rows[0].fraction_differing, 100 * rows[0].within_4ulp, 100 * rows[5].fraction_differing,
              rows[0].relative_l2, rows[5].relative_l2);
  EXPECT_GT(rows[0].fraction_differing, 0.10);
  EXPECT_LT(rows[0].fraction_differing, 0.40);
  EXPECT_GT(rows[5].fraction_differing, rows[0].fraction_differing);
  EXPECT_GT(rows[5].relative_l2, rows[0].relative_l2);
  // Deterministic: the same seed gives the same table; another seed another one.
  const auto again = simulate_layers(small(FusedContract::kF32Residual));
  EXPECT_EQ(again[5].relative_l2, rows[5].relative_l2);
  LayersOptions other = small(FusedContract::kF32Residual);
  other.seed = 6;
  EXPECT_NE(simulate_layers(other)[5].relative_l2, rows[5].relative_l2);
}

TEST(Layers, BadOptionsAreErrors) {
  LayersOptions o = small(FusedContract::kF32Residual);
  o.hidden = 500;  // not a multiple of 8
  EXPECT_THROW(simulate_layers(o), std::invalid_argument);
  o = small(FusedContract::kF32Residual);
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
  r = run_layers({"--layers", "1", "--rows", "1", "--hidden", "64", "--csv", csv, "--plot", temp_path("no/such/p.svg")});
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

// ---- The renderers ------------------------------------------------------------------------------------

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

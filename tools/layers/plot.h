// Line charts rendered to SVG (text) or PNG (raster, encoded with libpng), for `exactcoll layers`.
// One layout, two back ends: the chart is laid out once as lines and text, then drawn by either.
//
// Example:
//   plot::Figure f{"drift", {plot::Panel{"relative L2 drift", "layer", "drift", plot::Scale::kAuto,
//                  {plot::Series{"f32_residual", xs, ys, 0xD62728}}}}};
//   std::string svg = plot::render_svg(f);
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace exactcoll::plot {

// kAuto: logarithmic when every plotted value is positive and they span more than two decades.
enum class Scale { kLinear, kLog, kAuto };

struct Series {
  std::string name;
  std::vector<double> x, y;  // same length; non-finite points (and, on a log scale, non-positive
                             // ones) break the line
  uint32_t rgb = 0x1F77B4;
};

struct Panel {
  std::string title;
  std::string x_label;
  std::string y_label;
  Scale y_scale = Scale::kAuto;
  std::vector<Series> series;
};

// Panels are stacked vertically, each panel_height pixels tall.
struct Figure {
  std::string title;
  std::vector<Panel> panels;
  int width = 860;
  int panel_height = 300;
};

// Returns the SVG document.
std::string render_svg(const Figure& figure);

// Returns the PNG file's bytes (RGB, 8 bits). Text is drawn with a built-in 5x7 bitmap font of
// upper-case letters, digits and common punctuation (lower case is drawn as upper case).
// Throws std::runtime_error when libpng fails.
std::vector<uint8_t> render_png(const Figure& figure);

// Returns true when the built-in font has a glyph for c (after upper-casing).
bool font_has_glyph(char c);

}  // namespace exactcoll::plot

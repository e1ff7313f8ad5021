#include "tools/layers/plot.h"

#include <png.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace exactcoll::plot {
namespace {

// ---- Layout: a chart as lines, polylines and text --------------------------------------------------

enum class Anchor { kStart, kMiddle, kEnd };

struct Line {
  double x1, y1, x2, y2;
  uint32_t rgb;
  double width;
};
struct Polyline {
  std::vector<std::pair<double, double>> points;
  uint32_t rgb;
  double width;
};
struct Text {
  double x, y;  // baseline point
  std::string text;
  int size;  // pixels
  Anchor anchor;
  bool vertical;  // rotated 90 degrees counter-clockwise
  uint32_t rgb;
};
struct Drawing {
  int width = 0, height = 0;
  std::vector<Line> lines;
  std::vector<Polyline> polylines;
  std::vector<Text> texts;
};

constexpr uint32_t kBlack = 0x000000, kGrid = 0xDDDDDD, kGray = 0x444444;
constexpr int kTitleHeight = 34;
constexpr double kLeft = 96, kRight = 24, kTop = 36, kBottom = 56;
constexpr int kTickSize = 11, kLabelSize = 14, kTitleSize = 16;
// The legend: rows of (sample line, name) between a panel's title and its plot area, outside the
// data. kLegendCharWidth is a generous width of a legend character (the PNG font's is 6 pixels,
// a sans-serif SVG font's about 7), so that names never run into each other.
constexpr int kLegendSize = kTickSize + 1;
constexpr double kLegendRow = 18, kLegendSample = 28, kLegendGap = 6, kLegendSpacing = 24, kLegendCharWidth = 7.5;

std::string format_number(double v) {
  char buf[32];
  if (v == 0) return "0";
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

// Returns a step of 1, 2 or 5 times a power of ten giving about `target` intervals over range.
double nice_step(double range, int target) {
  const double raw = range / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  return (norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10) * mag;
}

bool use_log(const Panel& panel) {
  if (panel.y_scale != Scale::kAuto) return panel.y_scale == Scale::kLog;
  double lo = INFINITY, hi = 0;
  for (const Series& s : panel.series) {
    for (double y : s.y) {
      if (!std::isfinite(y)) continue;
      if (y <= 0) return false;
      lo = std::min(lo, y);
      hi = std::max(hi, y);
    }
  }
  return hi > 0 && hi / lo > 100;
}

// Lays the legend out in rows centred over [x0, x1], the first row's baseline at `baseline`, and
// returns the number of rows.
int layout_legend(const Panel& panel, double x0, double x1, double baseline, Drawing* d) {
  // 1. Items into rows, each row as wide as fits.
  std::vector<std::vector<size_t>> rows(1);
  std::vector<double> widths(1, 0);
  for (size_t i = 0; i < panel.series.size(); ++i) {
    const double w = kLegendSample + kLegendGap + kLegendCharWidth * static_cast<double>(panel.series[i].name.size());
    const double with_spacing = rows.back().empty() ? w : widths.back() + kLegendSpacing + w;
    if (!rows.back().empty() && with_spacing > x1 - x0) {
      rows.emplace_back();
      widths.push_back(0);
    }
    widths.back() = rows.back().empty() ? w : widths.back() + kLegendSpacing + w;
    rows.back().push_back(i);
  }
  // 2. Each row centred.
  for (size_t r = 0; r < rows.size(); ++r) {
    double x = std::max(x0, (x0 + x1 - widths[r]) / 2);
    const double y = baseline + kLegendRow * static_cast<double>(r);
    for (size_t i : rows[r]) {
      const Series& s = panel.series[i];
      d->lines.push_back({x, y - 4, x + kLegendSample, y - 4, s.rgb, 2});
      d->texts.push_back({x + kLegendSample + kLegendGap, y, s.name, kLegendSize, Anchor::kStart, false, kBlack});
      x += kLegendSample + kLegendGap + kLegendCharWidth * static_cast<double>(s.name.size()) + kLegendSpacing;
    }
  }
  return panel.series.empty() ? 0 : static_cast<int>(rows.size());
}

void layout_panel(const Panel& panel, double top, const Figure& figure, Drawing* d) {
  const double px0 = kLeft, px1 = figure.width - kRight;
  d->texts.push_back({(px0 + px1) / 2, top + 22, panel.title, kLabelSize, Anchor::kMiddle, false, kBlack});
  // The legend under the title, above the plot area: it never hides a line.
  const int legend_rows = layout_legend(panel, px0, px1, top + kTop + 6, d);
  const double py0 = top + kTop + kLegendRow * legend_rows, py1 = top + figure.panel_height - kBottom;

  // 1. Data ranges.
  const bool log_y = use_log(panel);
  double xmin = INFINITY, xmax = -INFINITY, ymin = INFINITY, ymax = -INFINITY;
  for (const Series& s : panel.series) {
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i]) || (log_y && s.y[i] <= 0)) continue;
      xmin = std::min(xmin, s.x[i]);
      xmax = std::max(xmax, s.x[i]);
      const double y = log_y ? std::log10(s.y[i]) : s.y[i];
      ymin = std::min(ymin, y);
      ymax = std::max(ymax, y);
    }
  }
  if (!std::isfinite(xmin)) xmin = 0, xmax = 1;
  if (xmax == xmin) xmin -= 1, xmax += 1;
  if (!std::isfinite(ymin)) ymin = 0, ymax = 1;
  if (log_y) {
    ymin = std::floor(ymin);
    ymax = std::ceil(ymax);
    if (ymax == ymin) ymax += 1;
  } else {
    ymin = std::min(ymin, 0.0);
    if (ymax <= ymin) ymax = ymin + 1;
    const double step = nice_step(ymax - ymin, 5);
    ymax = std::ceil(ymax / step) * step;
  }
  auto sx = [&](double x) { return px0 + (x - xmin) / (xmax - xmin) * (px1 - px0); };
  auto sy = [&](double y) { return py1 - (y - ymin) / (ymax - ymin) * (py1 - py0); };

  // 2. Grid, ticks and tick labels.
  const double xstep = std::max(1.0, nice_step(xmax - xmin, 8));
  for (double x = std::ceil(xmin / xstep) * xstep; x <= xmax + 1e-9; x += xstep) {
    d->lines.push_back({sx(x), py0, sx(x), py1, kGrid, 1});
    d->lines.push_back({sx(x), py1, sx(x), py1 + 5, kBlack, 1});
    d->texts.push_back({sx(x), py1 + 19, format_number(x), kTickSize, Anchor::kMiddle, false, kGray});
  }
  if (log_y) {
    for (double e = ymin; e <= ymax + 1e-9; e += 1) {
      d->lines.push_back({px0, sy(e), px1, sy(e), kGrid, 1});
      d->lines.push_back({px0 - 5, sy(e), px0, sy(e), kBlack, 1});
      char buf[16];
      std::snprintf(buf, sizeof buf, "1e%d", static_cast<int>(e));
      d->texts.push_back({px0 - 8, sy(e) + 4, buf, kTickSize, Anchor::kEnd, false, kGray});
    }
  } else {
    const double ystep = nice_step(ymax - ymin, 5);
    for (int k = 0;; ++k) {
      const double y = std::ceil(ymin / ystep) * ystep + k * ystep;
      if (y > ymax + ystep * 1e-6) break;
      const double shown = std::fabs(y) < ystep * 1e-6 ? 0.0 : y;
      d->lines.push_back({px0, sy(y), px1, sy(y), kGrid, 1});
      d->lines.push_back({px0 - 5, sy(y), px0, sy(y), kBlack, 1});
      d->texts.push_back({px0 - 8, sy(y) + 4, format_number(shown), kTickSize, Anchor::kEnd, false, kGray});
    }
  }
  // 3. Axes and their labels.
  d->lines.push_back({px0, py1, px1, py1, kBlack, 1});
  d->lines.push_back({px0, py0, px0, py1, kBlack, 1});
  d->texts.push_back({(px0 + px1) / 2, py1 + 42, panel.x_label, kLabelSize, Anchor::kMiddle, false, kBlack});
  d->texts.push_back(
      {28, (py0 + py1) / 2, panel.y_label + (log_y ? " (log scale)" : ""), kLabelSize, Anchor::kMiddle, true, kBlack});
  // 4. The series.
  for (const Series& s : panel.series) {
    Polyline run{{}, s.rgb, 2};
    auto flush = [&] {
      if (run.points.size() == 1) {  // a lone point: a short tick so it shows
        run.points.push_back({run.points[0].first + 1, run.points[0].second});
      }
      if (!run.points.empty()) d->polylines.push_back(run);
      run.points.clear();
    };
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i]) || (log_y && s.y[i] <= 0)) {
        flush();
        continue;
      }
      run.points.push_back({sx(s.x[i]), sy(log_y ? std::log10(s.y[i]) : s.y[i])});
    }
    flush();
  }
}

Drawing layout(const Figure& figure) {
  Drawing d;
  d.width = figure.width;
  d.height = kTitleHeight + figure.panel_height * static_cast<int>(figure.panels.size());
  d.texts.push_back({figure.width / 2.0, 24, figure.title, kTitleSize, Anchor::kMiddle, false, kBlack});
  for (size_t i = 0; i < figure.panels.size(); ++i) {
    layout_panel(figure.panels[i], kTitleHeight + static_cast<double>(i) * figure.panel_height, figure, &d);
  }
  return d;
}

// ---- SVG ------------------------------------------------------------------------------------------------

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string color(uint32_t rgb) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "#%06x", rgb & 0xFFFFFF);
  return buf;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

// ---- Raster -----------------------------------------------------------------------------------------------

// 5x7 glyphs, '#' = ink. Upper case, digits, punctuation.
struct Glyph {
  char c;
  const char* rows[7];
};
constexpr Glyph kFont[] = {
    {' ', {"     ", "     ", "     ", "     ", "     ", "     ", "     "}},
    {'A', {" ### ", "#   #", "#   #", "#####", "#   #", "#   #", "#   #"}},
    {'B', {"#### ", "#   #", "#   #", "#### ", "#   #", "#   #", "#### "}},
    {'C', {" ### ", "#   #", "#    ", "#    ", "#    ", "#   #", " ### "}},
    {'D', {"#### ", "#   #", "#   #", "#   #", "#   #", "#   #", "#### "}},
    {'E', {"#####", "#    ", "#    ", "#### ", "#    ", "#    ", "#####"}},
    {'F', {"#####", "#    ", "#    ", "#### ", "#    ", "#    ", "#    "}},
    {'G', {" ### ", "#   #", "#    ", "# ###", "#   #", "#   #", " ####"}},
    {'H', {"#   #", "#   #", "#   #", "#####", "#   #", "#   #", "#   #"}},
    {'I', {" ### ", "  #  ", "  #  ", "  #  ", "  #  ", "  #  ", " ### "}},
    {'J', {"  ###", "   # ", "   # ", "   # ", "   # ", "#  # ", " ##  "}},
    {'K', {"#   #", "#  # ", "# #  ", "##   ", "# #  ", "#  # ", "#   #"}},
    {'L', {"#    ", "#    ", "#    ", "#    ", "#    ", "#    ", "#####"}},
    {'M', {"#   #", "## ##", "# # #", "# # #", "#   #", "#   #", "#   #"}},
    {'N', {"#   #", "#   #", "##  #", "# # #", "#  ##", "#   #", "#   #"}},
    {'O', {" ### ", "#   #", "#   #", "#   #", "#   #", "#   #", " ### "}},
    {'P', {"#### ", "#   #", "#   #", "#### ", "#    ", "#    ", "#    "}},
    {'Q', {" ### ", "#   #", "#   #", "#   #", "# # #", "#  # ", " ## #"}},
    {'R', {"#### ", "#   #", "#   #", "#### ", "# #  ", "#  # ", "#   #"}},
    {'S', {" ####", "#    ", "#    ", " ### ", "    #", "    #", "#### "}},
    {'T', {"#####", "  #  ", "  #  ", "  #  ", "  #  ", "  #  ", "  #  "}},
    {'U', {"#   #", "#   #", "#   #", "#   #", "#   #", "#   #", " ### "}},
    {'V', {"#   #", "#   #", "#   #", "#   #", "#   #", " # # ", "  #  "}},
    {'W', {"#   #", "#   #", "#   #", "# # #", "# # #", "# # #", " # # "}},
    {'X', {"#   #", "#   #", " # # ", "  #  ", " # # ", "#   #", "#   #"}},
    {'Y', {"#   #", "#   #", " # # ", "  #  ", "  #  ", "  #  ", "  #  "}},
    {'Z', {"#####", "    #", "   # ", "  #  ", " #   ", "#    ", "#####"}},
    {'0', {" ### ", "#   #", "#  ##", "# # #", "##  #", "#   #", " ### "}},
    {'1', {"  #  ", " ##  ", "  #  ", "  #  ", "  #  ", "  #  ", " ### "}},
    {'2', {" ### ", "#   #", "    #", "   # ", "  #  ", " #   ", "#####"}},
    {'3', {"#####", "   # ", "  #  ", "   # ", "    #", "#   #", " ### "}},
    {'4', {"   # ", "  ## ", " # # ", "#  # ", "#####", "   # ", "   # "}},
    {'5', {"#####", "#    ", "#### ", "    #", "    #", "#   #", " ### "}},
    {'6', {"  ## ", " #   ", "#    ", "#### ", "#   #", "#   #", " ### "}},
    {'7', {"#####", "    #", "   # ", "  #  ", " #   ", " #   ", " #   "}},
    {'8', {" ### ", "#   #", "#   #", " ### ", "#   #", "#   #", " ### "}},
    {'9', {" ### ", "#   #", "#   #", " ####", "    #", "   # ", " ##  "}},
    {'.', {"     ", "     ", "     ", "     ", "     ", " ##  ", " ##  "}},
    {',', {"     ", "     ", "     ", "     ", " ##  ", "  #  ", " #   "}},
    {'-', {"     ", "     ", "     ", "#####", "     ", "     ", "     "}},
    {'+', {"     ", "  #  ", "  #  ", "#####", "  #  ", "  #  ", "     "}},
    {'%', {"##   ", "##  #", "   # ", "  #  ", " #   ", "#  ##", "   ##"}},
    {'_', {"     ", "     ", "     ", "     ", "     ", "     ", "#####"}},
    {'(', {"   # ", "  #  ", " #   ", " #   ", " #   ", "  #  ", "   # "}},
    {')', {" #   ", "  #  ", "   # ", "   # ", "   # ", "  #  ", " #   "}},
    {':', {"     ", " ##  ", " ##  ", "     ", " ##  ", " ##  ", "     "}},
    {'/', {"     ", "    #", "   # ", "  #  ", " #   ", "#    ", "     "}},
    {'=', {"     ", "     ", "#####", "     ", "#####", "     ", "     "}},
    {'?', {" ### ", "#   #", "    #", "   # ", "  #  ", "     ", "  #  "}},
};

const Glyph* find_glyph(char c) {
  const char u = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (const Glyph& g : kFont) {
    if (g.c == u) return &g;
  }
  return nullptr;
}

class Canvas {
 public:
  Canvas(int w, int h) : w_(w), h_(h), rgb_(static_cast<size_t>(w) * h * 3, 0xFF) {}
  void dot(int x, int y, uint32_t rgb) {
    if (x < 0 || y < 0 || x >= w_ || y >= h_) return;
    uint8_t* p = &rgb_[(static_cast<size_t>(y) * w_ + x) * 3];
    p[0] = static_cast<uint8_t>(rgb >> 16), p[1] = static_cast<uint8_t>(rgb >> 8), p[2] = static_cast<uint8_t>(rgb);
  }
  // A line of the given width: squares of side `width` stamped along a Bresenham path.
  void line(double x1, double y1, double x2, double y2, uint32_t rgb, double width) {
    int ax = static_cast<int>(std::lround(x1)), ay = static_cast<int>(std::lround(y1));
    const int bx = static_cast<int>(std::lround(x2)), by = static_cast<int>(std::lround(y2));
    const int dx = std::abs(bx - ax), dy = -std::abs(by - ay);
    const int stepx = ax < bx ? 1 : -1, stepy = ay < by ? 1 : -1;
    const int side = std::max(1, static_cast<int>(std::lround(width)));
    int err = dx + dy;
    for (;;) {
      for (int i = 0; i < side; ++i)
        for (int j = 0; j < side; ++j) dot(ax + i - side / 2, ay + j - side / 2, rgb);
      if (ax == bx && ay == by) break;
      const int e2 = 2 * err;
      if (e2 >= dy) err += dy, ax += stepx;
      if (e2 <= dx) err += dx, ay += stepy;
    }
  }
  void text(const Text& t) {
    const int scale = t.size >= 13 ? 2 : 1;
    const int advance = 6 * scale;
    const int length = static_cast<int>(t.text.size()) * advance - scale;
    const int shift = t.anchor == Anchor::kStart ? 0 : t.anchor == Anchor::kMiddle ? length / 2 : length;
    const int x0 = static_cast<int>(std::lround(t.x)), y0 = static_cast<int>(std::lround(t.y));
    for (size_t k = 0; k < t.text.size(); ++k) {
      const Glyph* g = find_glyph(t.text[k]);
      if (g == nullptr) g = find_glyph('?');
      for (int gy = 0; gy < 7; ++gy) {
        for (int gx = 0; gx < 5; ++gx) {
          if (g->rows[gy][gx] != '#') continue;
          for (int i = 0; i < scale; ++i) {
            for (int j = 0; j < scale; ++j) {
              // Along the text: u; across (down from the top of the glyph): v.
              const int u = static_cast<int>(k) * advance + gx * scale + i - shift;
              const int v = (gy - 7) * scale + j;
              if (t.vertical) {
                dot(x0 + v, y0 - u, t.rgb);
              } else {
                dot(x0 + u, y0 + v, t.rgb);
              }
            }
          }
        }
      }
    }
  }
  const std::vector<uint8_t>& rgb() const { return rgb_; }

 private:
  int w_, h_;
  std::vector<uint8_t> rgb_;
};

}  // namespace

bool font_has_glyph(char c) { return find_glyph(c) != nullptr; }

std::string render_svg(const Figure& figure) {
  const Drawing d = layout(figure);
  std::string s = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" +
                  std::to_string(d.width) + "\" height=\"" + std::to_string(d.height) + "\" viewBox=\"0 0 " +
                  std::to_string(d.width) + " " + std::to_string(d.height) +
                  "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n"
                  "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n";
  for (const Line& l : d.lines) {
    s += "<line x1=\"" + num(l.x1) + "\" y1=\"" + num(l.y1) + "\" x2=\"" + num(l.x2) + "\" y2=\"" + num(l.y2) +
         "\" stroke=\"" + color(l.rgb) + "\" stroke-width=\"" + num(l.width) + "\"/>\n";
  }
  for (const Polyline& p : d.polylines) {
    s += "<polyline fill=\"none\" stroke=\"" + color(p.rgb) + "\" stroke-width=\"" + num(p.width) +
         "\" stroke-linejoin=\"round\" points=\"";
    for (size_t i = 0; i < p.points.size(); ++i) {
      if (i > 0) s += ' ';
      s += num(p.points[i].first);
      s += ',';
      s += num(p.points[i].second);
    }
    s += "\"/>\n";
  }
  for (const Text& t : d.texts) {
    const char* anchor = t.anchor == Anchor::kStart ? "start" : t.anchor == Anchor::kMiddle ? "middle" : "end";
    s += "<text x=\"" + num(t.x) + "\" y=\"" + num(t.y) + "\" font-size=\"" + std::to_string(t.size) +
         "\" text-anchor=\"" + anchor + "\" fill=\"" + color(t.rgb) + "\"";
    if (t.vertical) s += " transform=\"rotate(-90 " + num(t.x) + " " + num(t.y) + ")\"";
    s += '>';
    s += xml_escape(t.text);
    s += "</text>\n";
  }
  s += "</svg>\n";
  return s;
}

std::vector<uint8_t> render_png(const Figure& figure) {
  const Drawing d = layout(figure);
  Canvas canvas(d.width, d.height);
  for (const Line& l : d.lines) canvas.line(l.x1, l.y1, l.x2, l.y2, l.rgb, l.width);
  for (const Polyline& p : d.polylines) {
    for (size_t i = 1; i < p.points.size(); ++i) {
      canvas.line(p.points[i - 1].first, p.points[i - 1].second, p.points[i].first, p.points[i].second, p.rgb, p.width);
    }
  }
  for (const Text& t : d.texts) canvas.text(t);

  // libpng's simplified API: no setjmp, errors reported in image.message.
  png_image image;
  std::memset(&image, 0, sizeof image);
  image.version = PNG_IMAGE_VERSION;
  image.width = static_cast<png_uint_32>(d.width);
  image.height = static_cast<png_uint_32>(d.height);
  image.format = PNG_FORMAT_RGB;
  png_alloc_size_t bytes = 0;
  if (!png_image_write_to_memory(&image, nullptr, &bytes, 0, canvas.rgb().data(), 0, nullptr)) {
    throw std::runtime_error(std::string("libpng: ") + image.message);
  }
  std::vector<uint8_t> out(bytes);
  if (!png_image_write_to_memory(&image, out.data(), &bytes, 0, canvas.rgb().data(), 0, nullptr)) {
    throw std::runtime_error(std::string("libpng: ") + image.message);
  }
  out.resize(bytes);
  png_image_free(&image);
  return out;
}

}  // namespace exactcoll::plot

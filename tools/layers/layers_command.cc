// `exactcoll layers`: how far an alternative rounding contract drifts from the canonical one over
// a residual stream of L layers (tools/layers/layers.h describes the model), on synthetic partial
// sums or on captured ones (--input).
#include <cstdio>
#include <iostream>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "sim/fused/reference.h"
#include "tools/cli.h"
#include "tools/layers/layers.h"
#include "tools/layers/plot.h"
#include "npy/npy.h"
#include "tools/sim/sim_flags.h"

namespace exactcoll::layers {
namespace {

constexpr const char* kCommand = "layers";
constexpr int64_t kDefaultSeed = 1;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string format(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

plot::Figure make_figure(const LayersOptions& o, const std::vector<LayerRow>& rows, const std::string& input) {
  const std::string name = fused::contract_name(o.contract);
  plot::Series drift{name + " vs canonical", {}, {}, 0xD62728};
  plot::Series frac{name + ": residual", {}, {}, 0xD62728};
  plot::Series frac_out{name + ": normed output", {}, {}, 0x1F77B4};
  for (const LayerRow& r : rows) {
    drift.x.push_back(r.layer);
    drift.y.push_back(r.relative_l2);
    frac.x.push_back(r.layer);
    frac.y.push_back(100.0 * r.fraction_differing);
    frac_out.x.push_back(r.layer);
    frac_out.y.push_back(100.0 * r.out_fraction_differing);
  }
  plot::Figure f;
  // With --input, the file's name instead of its sizes (the title has one line of about 70 characters).
  f.title = name + " vs canonical" +
            (input.empty() ? ": " + std::string(dtype_name(o.dtype)) + ", " + std::to_string(o.ranks) + " ranks, " +
                                 std::to_string(o.rows) + " rows, H " + std::to_string(o.hidden)
                           : " on " + input.substr(input.find_last_of('/') + 1) + ": " + dtype_name(o.dtype)) +
            ", seed " + std::to_string(o.seed);
  f.panels.push_back(
      {"relative L2 drift of the residual stream", "layer", "relative L2 drift", plot::Scale::kAuto, {drift}});
  f.panels.push_back(
      {"elements that differ from canonical", "layer", "percent of elements", plot::Scale::kLinear, {frac, frac_out}});
  return f;
}

// Reads the captured partial sums of `--input` into *array and sets o's sizes from its shape.
// Returns "" or what is wrong, in one line: an unreadable or malformed file (npy::read_npy checks
// the size before allocating), a dtype other than --dtype's (o->dtype), a shape other than
// [layers, ranks, rows, H] or [ranks, rows, H], a dimension out of range, an H the pack does not
// divide, or a size flag on the command line that disagrees with the shape.
std::string read_partial_sums(const std::string& path, const std::string& dtype_text, const cli::ArgParser& parser,
                              npy::NpyArray* array, LayersOptions* o) {
  try {
    *array = npy::read_npy(cli::resolve_path(path));
  } catch (const npy::NpyError& e) {
    return std::string("--input ") + e.what();
  }
  const std::string want = o->dtype == DType::kFP32 ? npy::kF32 : npy::kU16;
  const std::string shape = npy::shape_text(array->shape);
  if (array->dtype != want) {
    return "--input " + path + " holds '" + array->dtype + "' but --dtype " + dtype_text + " needs '" + want +
           "' (bf16 and fp16 as uint16 bit patterns, fp32 as float32)";
  }
  const size_t rank = array->shape.size();
  if (rank != 3 && rank != 4) {
    return "--input " + path + " has shape " + shape +
           "; it must be [layers, ranks, rows, H] or [ranks, rows, H] (the same partial sums every layer)";
  }
  // Each dimension in its range, and a size flag given beside the file saying what the file says.
  const struct {
    const char* name;
    int* option;
    int64_t value;  // -1: not in the shape ([ranks, rows, H] leaves --layers free)
    int64_t most;
  } sizes[] = {{"layers", &o->layers, rank == 4 ? array->shape[0] : -1, 100000},
               {"ranks", &o->ranks, array->shape[rank - 3], 16},
               {"rows", &o->rows, array->shape[rank - 2], 1 << 20},
               {"hidden", &o->hidden, array->shape[rank - 1], 1 << 20}};
  for (const auto& d : sizes) {
    if (d.value == -1) continue;
    if (d.value < 1 || d.value > d.most) {
      return "--input " + path + " has shape " + shape + ": " + d.name + " " + std::to_string(d.value) +
             ", outside 1.." + std::to_string(d.most);
    }
    if (parser.given(d.name) && *d.option != d.value) {
      return std::string("--") + d.name + " " + std::to_string(*d.option) + " disagrees with --input " + path +
             ", whose shape " + shape + " has " + d.name + " " + std::to_string(d.value) + " (leave --" + d.name +
             " out: the file sets it)";
    }
    *d.option = static_cast<int>(d.value);
  }
  const int pack = o->dtype == DType::kFP32 ? Storage<float>::kPack : Storage<bf16>::kPack;
  if (o->hidden % pack != 0) {
    return "--input " + path + " has shape " + shape + ": H " + std::to_string(o->hidden) +
           " is not a multiple of the " + dtype_text + " pack (" + std::to_string(pack) + " elements)";
  }
  return "";
}

// The command's flags, as given (make_parser binds them).
struct LayersFlags {
  int64_t layers = 60, ranks = 4, rows = 16, hidden = 4096, seed = kDefaultSeed;
  double eps = 1e-6;
  std::string contract_text = "f32_residual", dtype_text = "bf16", plot_path, csv_path, input_path;
};

cli::ArgParser make_parser(LayersFlags* f) {
  cli::ArgParser parser(
      "exactcoll layers [--layers L] [--ranks N] [--rows R] [--hidden H] [--input FILE.npy] [--contract X] "
      "[--dtype D] [--eps E] [--seed S] [--plot FILE.svg|FILE.png] [--csv FILE]",
      "Runs a residual stream through L layers of (partial sums -> fused all-reduce + residual add + RMSNorm)\n"
      "twice from the same start, once under the canonical contract and once under X, and prints per layer\n"
      "the fraction of residual elements that differ, their max ULP distance and the relative L2 drift.\n"
      "Each layer's partial sums are a deterministic pseudo-random mix of the previous normed output\n"
      "(tools/layers/layers.h), or with --input captured ones: [layers, ranks, rows, H] (layer l's rank r\n"
      "at [l-1, r]) or [ranks, rows, H] (the same every layer), bf16/fp16 as '<u2' bits, fp32 as '<f4';\n"
      "both runs then take the same partial sums, the shape sets the sizes, and --seed makes the residual\n"
      "stream's start and the weights. The defaults are the AITER case: 4 ranks, 16 rows, H 4096, f32_residual.");
  parser.add_int("layers", &f->layers, "number of layers (with --input [layers, ...]: its first dimension)");
  parser.add_int("ranks", &f->ranks, "world size (1..16)");
  parser.add_int("rows", &f->rows, "tokens per step");
  parser.add_int("hidden", &f->hidden, "hidden size H (a multiple of the pack: 8 for bf16/fp16, 4 for fp32)");
  parser.add_string("input", &f->input_path,
                    "captured partial sums .npy, [layers, ranks, rows, H] or [ranks, rows, H], instead of the "
                    "synthetic ones");
  parser.add_choice("contract", &f->contract_text, contract_name_list(), "the contract compared with canonical");
  parser.add_choice("dtype", &f->dtype_text, {"bf16", "fp16", "fp32"}, "storage type (and the --input file's)");
  parser.add_int("seed", &f->seed, "seed of every pseudo-random number");
  parser.add_double("eps", &f->eps, "RMSNorm epsilon");
  parser.add_string("plot", &f->plot_path, "write a chart of drift against layer (.svg or .png)");
  parser.add_string("csv", &f->csv_path, "write the table as CSV");
  return parser;
}

// Step 1 of layers_main: validates every flag before anything is computed and makes *o (with
// --input, from the file, read into *input). Returns nullopt to go on, or the exit code to return
// now (the message printed).
std::optional<int> check_flags(const cli::ArgParser& parser, const LayersFlags& f, LayersOptions* o_out,
                               npy::NpyArray* input) {
  const int64_t layers = f.layers, ranks = f.ranks, rows = f.rows, hidden = f.hidden, seed = f.seed;
  const double eps = f.eps;
  const std::string& plot_path = f.plot_path;
  LayersOptions& o = *o_out;
  if (layers < 1 || layers > 100000) return cli::fail(kCommand, "--layers must be in 1..100000");
  if (ranks < 1 || ranks > 16) return cli::fail(kCommand, "--ranks must be in 1..16");
  if (rows < 1 || rows > 1 << 20) return cli::fail(kCommand, "--rows must be in 1..1048576");
  if (hidden < 1 || hidden > 1 << 20) return cli::fail(kCommand, "--hidden must be in 1..1048576");
  if (seed < 0) return cli::fail(kCommand, "--seed must be >= 0");
  if (!plot_path.empty() && !ends_with(plot_path, ".svg") && !ends_with(plot_path, ".png")) {
    return cli::fail(kCommand, "--plot wants a file name ending in .svg or .png, got '" + plot_path + "'");
  }
  if (const std::string problem = fused::check_eps(eps); !problem.empty()) return cli::fail(kCommand, problem);
  o.layers = static_cast<int>(layers);
  o.ranks = static_cast<int>(ranks);
  o.rows = static_cast<int>(rows);
  o.hidden = static_cast<int>(hidden);
  o.seed = static_cast<uint64_t>(seed);
  o.eps = static_cast<float>(eps);
  o.dtype = f.dtype_text == "fp32" ? DType::kFP32 : f.dtype_text == "fp16" ? DType::kFP16 : DType::kBF16;
  fused::parse_contract(f.contract_text, &o.contract);
  if (parser.given("input")) {
    if (const std::string problem = read_partial_sums(f.input_path, f.dtype_text, parser, input, &o);
        !problem.empty()) {
      return cli::fail(kCommand, problem);
    }
    o.partial_sums = input->data;
  }
  {
    // Both runs' residual streams and outputs, the partial sums of every rank and the reference's
    // work arrays: about (ranks + 10) row blocks of floats (beside the --input file, read already).
    const uint64_t bytes =
        static_cast<uint64_t>(o.rows) * static_cast<uint64_t>(o.hidden) * 4 * static_cast<uint64_t>(o.ranks + 10);
    if (const std::string problem = cli::check_memory(bytes, "--rows x --hidden x --ranks"); !problem.empty()) {
      return cli::fail(kCommand, problem);
    }
  }
  return std::nullopt;
}

// Step 3 of layers_main: prints the run's line, the table and the last layer's drift. Returns the
// table as CSV.
std::string print_table(const cli::ArgParser& parser, const LayersFlags& f, const LayersOptions& o,
                        const npy::NpyArray& input, const std::vector<LayerRow>& table) {
  const bool from_file = parser.given("input");
  std::cout << "exactcoll layers: canonical vs " << f.contract_text << ", " << f.dtype_text << ", " << o.ranks
            << " ranks, " << o.rows << " rows, hidden " << o.hidden << ", " << o.layers << " layers, "
            << (from_file ? "partial sums from " + f.input_path + " " + npy::shape_text(input.shape) + ", " : "")
            << "seed " << o.seed << (parser.given("seed") ? "" : " (the default; --seed N for another)")
            << (from_file ? " for the residual stream's start and the weights" : "") << "\n";
  if (o.contract == fused::Contract::kCanonical) {
    std::cout << "(canonical against itself: every row must show 0)\n";
  }
  std::cout << "layer  residual differing  of which 1-4 ULP  max ULP  relative L2 drift  out differing  out max ULP\n";
  std::string csv =
      "layer,residual_fraction_differing,residual_within_4ulp,residual_max_ulp,relative_l2_drift,"
      "out_fraction_differing,out_max_ulp,residual_nan_mismatch\n";
  for (const LayerRow& r : table) {
    char line[200];
    std::snprintf(line, sizeof line, "%5d  %17.2f%%  %15.2f%%  %7llu  %17.4e  %12.2f%%  %11llu\n", r.layer,
                  100.0 * r.fraction_differing, 100.0 * r.within_4ulp, static_cast<unsigned long long>(r.max_ulp),
                  r.relative_l2, 100.0 * r.out_fraction_differing, static_cast<unsigned long long>(r.out_max_ulp));
    std::cout << line;
    std::snprintf(line, sizeof line, "%d,%.9g,%.9g,%llu,%.9g,%.9g,%llu,%zu\n", r.layer, r.fraction_differing,
                  r.within_4ulp, static_cast<unsigned long long>(r.max_ulp), r.relative_l2, r.out_fraction_differing,
                  static_cast<unsigned long long>(r.out_max_ulp), r.nan_mismatch);
    csv += line;
  }
  const LayerRow& last = table.back();
  std::cout << "after " << last.layer << " layers: " << format("%.2f", 100.0 * last.fraction_differing)
            << "% of the residual stream differs from canonical, relative L2 drift " << format("%.4e", last.relative_l2)
            << "\n";
  return csv;
}

int layers_main(int argc, char** argv) {
  LayersFlags f;
  cli::ArgParser parser = make_parser(&f);
  if (auto code = parser.parse(argc, argv)) return *code;

  // 1. Validate everything before computing anything.
  LayersOptions o;
  npy::NpyArray input;
  if (const auto code = check_flags(parser, f, &o, &input)) return *code;
  const bool from_file = parser.given("input");
  // The CSV and the plot, reserved before any work: an unwritable path is bad input (exit 2).
  const std::string csv_file = f.csv_path.empty() ? "" : cli::resolve_path(f.csv_path);
  const std::string plot_file = f.plot_path.empty() ? "" : cli::resolve_path(f.plot_path);
  const auto files = tools::reserve_outputs(kCommand, {csv_file, plot_file});
  if (!files) return cli::kExitUsage;

  // 2. Simulate.
  std::vector<LayerRow> table;
  try {
    table = simulate_layers(o);
  } catch (const std::invalid_argument& e) {
    return cli::fail(kCommand, e.what());
  }

  // 3. Print, then write the CSV and the plot (each atomically).
  const std::string csv = print_table(parser, f, o, input, table);
  try {
    if (!csv_file.empty()) files->write(csv_file, csv.data(), csv.size());
    if (!plot_file.empty()) {
      const plot::Figure figure = make_figure(o, table, from_file ? f.input_path : "");
      if (ends_with(f.plot_path, ".svg")) {
        const std::string svg = plot::render_svg(figure);
        files->write(plot_file, svg.data(), svg.size());
      } else {
        const std::vector<uint8_t> png = plot::render_png(figure);
        files->write(plot_file, png.data(), png.size());
      }
    }
    files->commit();
    if (!f.csv_path.empty()) std::cout << "wrote " << f.csv_path << "\n";
    if (!f.plot_path.empty()) std::cout << "wrote " << f.plot_path << "\n";
  } catch (const std::exception& e) {
    return cli::fail(kCommand, e.what(), cli::kExitFailure);
  }
  return cli::kExitOk;
}

const cli::Registrar kRegistrar({kCommand, "drift of an alternative rounding contract over L layers (table, CSV, plot)",
                                 layers_main});

}  // namespace
}  // namespace exactcoll::layers

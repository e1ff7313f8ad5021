#include "cuda_backend/fused/fused_table.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <tuple>

#include "core/contract.h"
#include "core/fused_rmsnorm_kernels.h"
#include "core/signal.h"
#include "cuda_backend/fused/fused_kernel_args.h"
#include "cuda_backend/tsv.h"

namespace exactcoll::cuda::fused {

extern const char kEmbeddedFusedSm90Table[];  // generated from tuning/fused_sm90.tsv (BUILD)

namespace {

// The RMSNorm tree of a row of `hidden` elements of dtype (contract::make_rmsnorm_tree; all zero
// for an H that is not a positive multiple of the pack).
contract::RmsNormTree rmsnorm_tree(int hidden, DType dtype) {
  contract::RmsNormTree tree;
  switch (dtype) {
    case DType::kBF16: contract::make_rmsnorm_tree<bf16>(hidden, &tree); break;
    case DType::kFP16: contract::make_rmsnorm_tree<fp16>(hidden, &tree); break;
    case DType::kFP32: contract::make_rmsnorm_tree<float>(hidden, &tree); break;
  }
  return tree;
}

// The RMSNorm tree's lane count for H, at least 64 threads.
int tree_threads(int hidden, DType dtype) { return std::max(64, rmsnorm_tree(hidden, dtype).lanes); }

}  // namespace

std::optional<FusedAlgorithm> parse_fused_algorithm(const std::string& name) {
  return parse_fused_algorithm_name(name, kOnGpu);
}

std::vector<FusedAlgorithm> fused_ipc_algorithms() {
  std::vector<FusedAlgorithm> out;
  for (const FusedAlgorithmInfo& e : kFusedAlgorithmInfos) {
    if (e.picked_by_auto && (e.runs_on & kOnGpu) != 0) out.push_back(e.algorithm);
  }
  return out;
}

bool is_fused_kernel(FusedAlgorithm a) { return info(a).one_kernel; }

bool is_lamport_fused(FusedAlgorithm a) {
  return a == FusedAlgorithm::kLamportOneStage || a == FusedAlgorithm::kLamportTwoStage;
}

LaunchConfig default_fused_grid(FusedAlgorithm algo, int rows, int hidden, DType dtype, int world_size) {
  LaunchConfig g;
  g.threads = tree_threads(hidden, dtype);
  const int n = std::max(1, world_size);
  const bool all_rows = info(algo).rows_per_block_all;
  const int per_block_rows = all_rows ? rows : (rows + n - 1) / n;
  int blocks = per_block_rows;
  if (is_lamport_fused(algo)) {
    // One row of 1 024 lanes (and at most as many packs) runs on a thread-block cluster of
    // kLamportRowCluster blocks of 128 threads (lamport_register_blocks); other rows on one block
    // of their lanes (docs/benchmarks.md, "lamport_one_stage on thread-block clusters").
    const contract::RmsNormTree tree = rmsnorm_tree(hidden, dtype);
    if (rows == 1 && tree.lanes == 1024 && tree.num_packs <= tree.lanes) g.threads = tree.lanes / kLamportRowCluster;
    // Every block pushes a share of the whole message (core/fused_rmsnorm.h): enough blocks that
    // each stores at most kLamportPushBytesPerBlock of x into every peer, even at 1 row.
    const uint64_t bytes = static_cast<uint64_t>(std::max(rows, 0)) * static_cast<uint64_t>(hidden) * dtype_size(dtype);
    const uint64_t push_blocks = (bytes + kLamportPushBytesPerBlock - 1) / kLamportPushBytesPerBlock;
    blocks = static_cast<int>(
        std::max<uint64_t>(static_cast<uint64_t>(std::max(blocks, 0)), std::min<uint64_t>(push_blocks, kMaxBlocks)));
  }
  g.blocks = std::clamp(blocks, 1, kMaxBlocks);
  return is_lamport_fused(algo) ? lamport_launch_grid(g, hidden, dtype) : g;
}

LaunchConfig lamport_launch_grid(LaunchConfig grid, int hidden, DType dtype) {
  const contract::RmsNormTree tree = rmsnorm_tree(hidden, dtype);
  grid.cluster = std::max(1, lamport_register_blocks(grid.threads, tree, kMaxClusterBlocks));
  const int whole = (grid.blocks + grid.cluster - 1) / grid.cluster * grid.cluster;
  grid.blocks = std::min(whole, kMaxBlocks / grid.cluster * grid.cluster);
  return grid;
}

LaunchConfig residual_rmsnorm_grid(int rows, int hidden, DType dtype) {
  return LaunchConfig{std::clamp(rows, 1, 8192), tree_threads(hidden, dtype)};
}

FusedTable::FusedTable(std::vector<FusedTableRow> rows) : rows_(std::move(rows)) {
  sort_rows_by(rows_, [](const FusedTableRow& r) { return std::tie(r.arch, r.world_size, r.row_bytes, r.rows); });
}

FusedTable FusedTable::parse(const std::string& text, const std::string& name) {
  std::vector<FusedTableRow> rows;
  for_each_measured_row<FusedTableError>(text, name, 9, [&](const TsvLine& line, const std::string& measured_on) {
    const std::vector<std::string>& fields = line.fields;
    auto bad = [&](const std::string& what) { return FusedTableError(line.error(what)); };
    FusedTableRow row;
    row.arch = fields[0];
    if (row.arch.empty()) throw bad("empty arch");
    const auto ws = parse_long_field(fields[1]);
    if (!ws || *ws < 1 || *ws > kMaxRanks) throw bad("world_size must be 1.." + std::to_string(kMaxRanks));
    row.world_size = static_cast<int>(*ws);
    const auto row_bytes = parse_unsigned_field(fields[2]);
    if (!row_bytes || *row_bytes == 0 || *row_bytes % 16 != 0 || fields[2][0] == '-') {
      throw bad("row_bytes must be a positive multiple of 16");
    }
    row.row_bytes = *row_bytes;
    const auto r = parse_long_field(fields[3]);
    if (!r || *r < 1 || *r > (1L << 30)) throw bad("rows must be a positive whole number");
    row.rows = static_cast<int>(*r);
    const auto algo = parse_fused_algorithm(fields[4]);
    const auto allowed = fused_ipc_algorithms();
    if (!algo || std::find(allowed.begin(), allowed.end(), *algo) == allowed.end()) {
      throw bad("algorithm '" + fields[4] + "' is not one of " +
                joined_names(kFusedAlgorithmInfos, ", ", [](const FusedAlgorithmInfo& e) {
                  return e.picked_by_auto && (e.runs_on & kOnGpu) != 0;
                }));
    }
    row.algo = *algo;
    const auto blocks = parse_long_field(fields[5]);
    if (!blocks || *blocks < 0 || *blocks > 8192) throw bad("blocks must be 0..8192");
    const auto threads = parse_long_field(fields[6]);
    if (!threads || *threads < 0 || *threads > 1024 || *threads % 32 != 0) {
      throw bad("threads must be a multiple of 32 in 0..1024");
    }
    if (is_fused_kernel(row.algo) && (*blocks < 1 || *blocks > kMaxBlocks || *threads < 64)) {
      throw bad("a fused kernel needs 1.." + std::to_string(kMaxBlocks) + " blocks and 64..1024 threads");
    }
    row.grid = LaunchConfig{static_cast<int>(*blocks), static_cast<int>(*threads)};
    const auto time_us = parse_double_field(fields[7]);
    if (!time_us || !(*time_us > 0)) throw bad("time_us must be a positive number");
    row.time_us = *time_us;
    row.measured_on = measured_on;
    rows.push_back(row);
  });
  return FusedTable(std::move(rows));
}

const FusedTable& FusedTable::embedded() {
  static const FusedTable table = parse(kEmbeddedFusedSm90Table, "cuda_backend/fused/tuning/fused_sm90.tsv (embedded)");
  return table;
}

FusedTable FusedTable::from_environment() {
  const char* path = std::getenv("EXACTCOLL_FUSED_TABLE");
  if (path == nullptr || *path == '\0') return embedded();
  std::ifstream file(path);
  if (!file)
    throw FusedTableError(std::string("cannot open fused dispatch table ") + path + " (from EXACTCOLL_FUSED_TABLE)");
  std::stringstream text;
  text << file.rdbuf();
  return parse(text.str(), path);
}

FusedChoice FusedTable::default_choice(int world_size, int rows, int hidden, DType dtype, FusedAlgorithm requested) {
  FusedChoice c;
  if (requested == FusedAlgorithm::kAuto) {
    const uint64_t bytes = static_cast<uint64_t>(rows) * static_cast<uint64_t>(hidden) * dtype_size(dtype);
    c.algo = rows <= 16                       ? FusedAlgorithm::kPushOneStage
             : bytes <= (uint64_t{256} << 10) ? FusedAlgorithm::kOneStageReg
                                              : FusedAlgorithm::kGatherNorm;
  } else {
    c.algo = requested;
  }
  c.grid = is_fused_kernel(c.algo) ? default_fused_grid(c.algo, rows, hidden, dtype, world_size)
                                   : residual_rmsnorm_grid(rows, hidden, dtype);
  return c;
}

FusedChoice FusedTable::choose(const std::string& arch, int world_size, int rows, int hidden, DType dtype,
                               FusedAlgorithm requested, const std::function<bool(FusedAlgorithm)>& allowed) const {
  if (requested != FusedAlgorithm::kAuto) return default_choice(world_size, rows, hidden, dtype, requested);
  // 1. Rows of this (arch, world size) whose algorithm is allowed; none -> heuristic.
  std::vector<const FusedTableRow*> mine;
  for (const auto& r : rows_) {
    if (r.arch == arch && r.world_size == world_size && (!allowed || allowed(r.algo))) mine.push_back(&r);
  }
  if (mine.empty()) return default_choice(world_size, rows, hidden, dtype, requested);
  // 2. The measured row size: the smallest >= this one's, else the largest.
  const uint64_t row_bytes = static_cast<uint64_t>(hidden) * dtype_size(dtype);
  uint64_t size = 0;
  for (const auto* r : mine) {
    if (r->row_bytes >= row_bytes && (size == 0 || r->row_bytes < size)) size = r->row_bytes;
  }
  if (size == 0) {
    for (const auto* r : mine) size = std::max(size, r->row_bytes);
  }
  // 3. The measured row count: the smallest >= rows, else the largest.
  int count = 0;
  for (const auto* r : mine) {
    if (r->row_bytes == size && r->rows >= rows && (count == 0 || r->rows < count)) count = r->rows;
  }
  if (count == 0) {
    for (const auto* r : mine) {
      if (r->row_bytes == size) count = std::max(count, r->rows);
    }
  }
  // 4. The fastest there. Its grid applies only to the measured problem itself; other problems
  //    get the algorithm's default grid for their own rows.
  const FusedTableRow* best = nullptr;
  for (const auto* r : mine) {
    if (r->row_bytes == size && r->rows == count && (best == nullptr || r->time_us < best->time_us)) best = r;
  }
  FusedChoice c = default_choice(world_size, rows, hidden, dtype, best->algo);
  c.from_table = true;
  if (best->row_bytes == row_bytes && best->rows == rows && is_fused_kernel(best->algo)) c.grid = best->grid;
  return c;
}

std::string FusedTable::to_text(const std::vector<std::string>& header_comments) const {
  std::ostringstream os;
  write_tsv_header(
      os, header_comments,
      {"arch", "world_size", "row_bytes", "rows", "algo", "blocks", "threads", "time_us", kMeasuredOnColumn});
  for (const auto& r : rows_) {
    os << r.arch << '\t' << r.world_size << '\t' << r.row_bytes << '\t' << r.rows << '\t'
       << fused_algorithm_name(r.algo) << '\t' << r.grid.blocks << '\t' << r.grid.threads << '\t'
       << format_time_us(r.time_us);
    end_measured_row(os, r.measured_on);
  }
  return os.str();
}

}  // namespace exactcoll::cuda::fused

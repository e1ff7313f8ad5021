#include "cuda_backend/dispatch_table.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <tuple>

#include "core/collectives.h"
#include "core/lamport.h"
#include "core/push.h"
#include "cuda_backend/tsv.h"

namespace exactcoll::cuda {

extern const char kEmbeddedSm90Table[];  // generated from tuning/sm90.tsv (BUILD: embedded_table)

std::optional<Algorithm> parse_algorithm(const std::string& name) { return parse_algorithm_name(name, kOnGpu); }

std::vector<Algorithm> ipc_algorithms(Op op) {
  std::vector<Algorithm> out;
  for (const AlgorithmInfo& e : kAlgorithmInfos) {
    if (e.picked_by_auto && (e.runs_on & kOnGpu) != 0 && implements(e.algorithm, op)) out.push_back(e.algorithm);
  }
  return out;
}

DispatchTable::DispatchTable(std::vector<TableRow> rows) : rows_(std::move(rows)) {
  sort_rows_by(rows_, [](const TableRow& r) { return std::tie(r.arch, r.world_size, r.op, r.bytes); });
}

DispatchTable DispatchTable::parse(const std::string& text, const std::string& name) {
  std::vector<TableRow> rows;
  for_each_measured_row<TableError>(text, name, 9, [&](const TsvLine& line, const std::string& measured_on) {
    const std::vector<std::string>& fields = line.fields;
    auto bad = [&](const std::string& what) { return TableError(line.error(what)); };
    TableRow row;
    row.arch = fields[0];
    const auto ws = parse_long_field(fields[1]);
    if (!ws || *ws < 1 || *ws > kMaxRanks) throw bad("world_size must be 1.." + std::to_string(kMaxRanks));
    row.world_size = static_cast<int>(*ws);
    const auto op = parse_op(fields[2]);
    if (!op) throw bad("unknown op '" + fields[2] + "'");
    row.op = *op;
    const auto bytes = parse_unsigned_field(fields[3]);
    if (!bytes || *bytes == 0) throw bad("bytes must be a positive whole number");
    row.bytes = *bytes;
    const auto algo = parse_algorithm(fields[4]);
    const auto allowed = ipc_algorithms(row.op);
    if (!algo || std::find(allowed.begin(), allowed.end(), *algo) == allowed.end()) {
      throw bad("algorithm '" + fields[4] + "' is not an IPC algorithm of " + fields[2]);
    }
    row.algo = *algo;
    const auto blocks = parse_long_field(fields[5]);
    if (!blocks || *blocks < 1 || *blocks > kMaxBlocks) throw bad("blocks must be 1.." + std::to_string(kMaxBlocks));
    const auto threads = parse_long_field(fields[6]);
    if (!threads || *threads < 64 || *threads > 1024 || *threads % 32 != 0) {
      throw bad("threads must be a multiple of 32 in 64..1024");
    }
    row.grid = LaunchConfig{static_cast<int>(*blocks), static_cast<int>(*threads)};
    const auto time_us = parse_double_field(fields[7]);
    if (!time_us || !(*time_us > 0)) throw bad("time_us must be a positive number");
    row.time_us = *time_us;
    row.measured_on = measured_on;
    rows.push_back(row);
  });
  return DispatchTable(std::move(rows));
}

const DispatchTable& DispatchTable::embedded() {
  static const DispatchTable table = parse(kEmbeddedSm90Table, "cuda_backend/tuning/sm90.tsv (embedded)");
  return table;
}

DispatchTable DispatchTable::from_environment() {
  const char* path = std::getenv("EXACTCOLL_TABLE");
  if (path == nullptr || *path == '\0') return embedded();
  std::ifstream file(path);
  if (!file) throw TableError(std::string("cannot open dispatch table ") + path + " (from EXACTCOLL_TABLE)");
  std::stringstream text;
  text << file.rdbuf();
  return parse(text.str(), path);
}

Choice DispatchTable::default_choice(int world_size, Op op, uint64_t bytes, Algorithm requested) {
  Choice c;
  if (requested == Algorithm::kAuto) {
    if (op == Op::kAllReduce) {
      const bool small = bytes <= (world_size <= 2 ? (uint64_t{1} << 20) : (uint64_t{512} << 10));
      c.algo = small ? Algorithm::kOneShot : Algorithm::kTwoShot;
    } else {
      c.algo = Algorithm::kDirect;
    }
  } else {
    c.algo = requested;
  }
  // Packs of 16 bytes each block's threads stride over: one_shot folds the whole message, the
  // others a 1/n slice per rank (all-gather copies n inputs of `bytes`).
  uint64_t packs = bytes / 16 + 1;
  if (c.algo == Algorithm::kTwoShot || op == Op::kReduceScatter) packs = packs / static_cast<uint64_t>(world_size) + 1;
  if (op == Op::kAllGather) packs *= static_cast<uint64_t>(world_size);
  c.grid.threads = 512;
  const uint64_t blocks = (packs + 511) / 512;
  c.grid.blocks = static_cast<int>(std::clamp<uint64_t>(blocks, 1, kMaxBlocks));
  return c;
}

uint64_t DispatchTable::measured_size(const std::string& arch, int world_size, Op op, uint64_t bytes) const {
  uint64_t at_least = 0, largest = 0;
  for (const auto& r : rows_) {
    if (r.world_size != world_size || r.op != op || r.arch != arch) continue;
    largest = std::max(largest, r.bytes);
    if (r.bytes >= bytes && (at_least == 0 || r.bytes < at_least)) at_least = r.bytes;
  }
  return at_least != 0 ? at_least : largest;
}

const TableRow* DispatchTable::fastest_row(const std::string& arch, int world_size, Op op, uint64_t size,
                                           Algorithm requested) const {
  const TableRow* best = nullptr;
  for (const auto& r : rows_) {
    if (r.world_size != world_size || r.op != op || r.bytes != size || r.arch != arch) continue;
    if (requested != Algorithm::kAuto && r.algo != requested) continue;
    if (best == nullptr || r.time_us < best->time_us) best = &r;
  }
  return best;
}

Choice DispatchTable::choose(const std::string& arch, int world_size, Op op, uint64_t bytes,
                             Algorithm requested) const {
  // No allocation: this runs on every eager call. Rows are few (tens per world size).
  // 1. The measured size: the smallest >= bytes, else the largest; no rows -> heuristic.
  const uint64_t size = measured_size(arch, world_size, op, bytes);
  if (size == 0) return default_choice(world_size, op, bytes, requested);
  // 2. Among that size's rows: the requested algorithm, or the fastest for auto.
  const TableRow* best = fastest_row(arch, world_size, op, size, requested);
  if (best == nullptr) return default_choice(world_size, op, bytes, requested);
  return Choice{best->algo, best->grid, true};
}

bool push_fits(uint64_t count, int elem_bytes, int world_size, uint64_t scratch_bytes) {
  return push_scratch_elements(count, 16 / elem_bytes, world_size) * static_cast<uint64_t>(elem_bytes) <= scratch_bytes;
}

uint64_t push_chunk_elements(int elem_bytes, int world_size, uint64_t scratch_bytes) {
  const uint64_t limit = scratch_bytes / static_cast<uint64_t>(elem_bytes) / (2 * static_cast<uint64_t>(world_size));
  return std::max<uint64_t>(64, limit / 64 * 64);
}

Choice DispatchTable::choose_allreduce_auto(const std::string& arch, int world_size, uint64_t count, int elem_bytes,
                                            uint64_t scratch_bytes, uint64_t lamport_region_bytes) const {
  const uint64_t bytes = count * static_cast<uint64_t>(elem_bytes);
  const Choice best = choose(arch, world_size, Op::kAllReduce, bytes, Algorithm::kAuto);
  // The heuristic (no rows) never picks a push or a Lamport algorithm.
  if (!best.from_table) return best;
  const bool push_whole = push_fits(count, elem_bytes, world_size, scratch_bytes);
  auto lamport_whole = [&](Algorithm algo) {
    return lamport_fits(algo, count, static_cast<size_t>(elem_bytes), world_size, lamport_region_bytes);
  };
  // As measured where every algorithm runs as measured (a Lamport algorithm beyond its slot only
  // matters when it is the fastest).
  if (push_whole && (!is_lamport_algorithm(best.algo) || lamport_whole(best.algo))) return best;
  const uint64_t chunk = push_whole ? count : push_chunk_elements(elem_bytes, world_size, scratch_bytes);
  const uint64_t chunks = (count + chunk - 1) / chunk;
  const TableRow* cheapest = nullptr;
  double cheapest_us = 0;
  for (Algorithm algo : ipc_algorithms(Op::kAllReduce)) {
    if (is_lamport_algorithm(algo) && !lamport_whole(algo)) continue;
    const bool chunked = is_push_algorithm(algo) && !push_whole;
    const uint64_t at = chunked ? chunk * static_cast<uint64_t>(elem_bytes) : bytes;
    const TableRow* row =
        fastest_row(arch, world_size, Op::kAllReduce, measured_size(arch, world_size, Op::kAllReduce, at), algo);
    if (row == nullptr) continue;
    const double us = row->time_us * static_cast<double>(chunked ? chunks : 1);
    if (cheapest == nullptr || us < cheapest_us) cheapest = row, cheapest_us = us;
  }
  if (cheapest != nullptr) return Choice{cheapest->algo, cheapest->grid, true};
  if (!is_push_algorithm(best.algo) && !is_lamport_algorithm(best.algo)) return best;
  const bool two_shot = best.algo == Algorithm::kPushTwoShot || best.algo == Algorithm::kLamportTwoShot;
  return choose(arch, world_size, Op::kAllReduce, bytes, two_shot ? Algorithm::kTwoShot : Algorithm::kOneShot);
}

std::string DispatchTable::to_text(const std::vector<std::string>& header_comments) const {
  std::ostringstream os;
  write_tsv_header(os, header_comments,
                   {"arch", "world_size", "op", "bytes", "algo", "blocks", "threads", "time_us", kMeasuredOnColumn});
  for (const auto& r : rows_) {
    os << r.arch << '\t' << r.world_size << '\t' << op_name(r.op) << '\t' << r.bytes << '\t' << algorithm_name(r.algo)
       << '\t' << r.grid.blocks << '\t' << r.grid.threads << '\t' << format_time_us(r.time_us);
    end_measured_row(os, r.measured_on);
  }
  return os.str();
}

}  // namespace exactcoll::cuda

#include "tools/gpu/part_files.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>

#include "tools/cli.h"
#include "npy/npy.h"

namespace exactcoll::gpu {

PartFiles::PartFiles(Worker& worker, const std::string& output_path, const std::string& tag) : worker_(worker) {
  std::string dir = "/tmp";
  if (!output_path.empty()) {
    const std::string path = cli::resolve_path(output_path);
    const size_t slash = path.rfind('/');
    dir = slash == std::string::npos ? "." : path.substr(0, slash == 0 ? 1 : slash);
  }
  const std::string token = worker_.all_gather("part_token", std::to_string(::getpid()))[0];
  prefix_ = dir + "/.exactcoll_" + tag + "_" + token + "_rank";
}

std::string PartFiles::path(int rank) const { return prefix_ + std::to_string(rank) + ".part"; }

void PartFiles::write(const std::vector<uint8_t>& bytes) {
  npy::write_file_atomic(path(worker_.rank()), bytes.data(), bytes.size());
  worker_.barrier("parts");
}

std::optional<std::vector<uint8_t>> PartFiles::read(int rank, size_t size) const {
  std::ifstream f(path(rank), std::ios::binary);
  std::vector<uint8_t> piece((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (piece.size() != size) return std::nullopt;
  return piece;
}

void PartFiles::finish() {
  worker_.barrier("assembled");
  std::remove(path(worker_.rank()).c_str());
}

}  // namespace exactcoll::gpu

// Reading and writing NumPy .npy files (format versions 1.0 and 2.0), strictly.
//
// exactcoll exchanges tensors as .npy: bf16 and fp16 are stored as their uint16 bit patterns
// ('<u2'), fp32 as '<f4'. Only C order ("fortran_order": False) and little-endian data are
// accepted; shapes may have any rank, including 0 (a scalar) and zero-sized dimensions.
//
// Every malformed file is an NpyError whose message names the file and what is wrong (bad magic,
// unsupported version, Fortran order, dtype, a header that does not parse, a data size that does
// not match the shape, a truncated file). Writing is atomic: the bytes go to FILE.tmp.<pid>, are
// fsynced and renamed over FILE; on any error the temporary file is removed and FILE is untouched.
// A command with several outputs reserves them together (OutputFiles) and commits all or none.
//
// Example:
//   npy::write_npy("x.npy", "<u2", {4, 8}, bits.data(), bits.size() * 2);
//   npy::NpyArray a = npy::read_npy("x.npy");   // a.dtype == "<u2", a.shape == {4, 8}
//   const uint16_t* v = a.data_as<uint16_t>();
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <utility>
#include <stdexcept>
#include <string>
#include <vector>

namespace exactcoll::npy {

// The dtype descriptors exactcoll reads and writes.
inline constexpr const char* kU16 = "<u2";  // bf16 / fp16 bit patterns
inline constexpr const char* kF32 = "<f4";  // fp32

class NpyError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct NpyArray {
  std::string dtype;           // "<u2" or "<f4"
  std::vector<int64_t> shape;  // C order; empty for a scalar
  std::vector<uint8_t> data;   // element_count() * item_size() bytes, little-endian

  // Returns the product of the shape (1 for a scalar).
  size_t element_count() const;
  // Returns the bytes per element of dtype (2 or 4).
  size_t item_size() const;
  // Returns the data as an array of T. Preconditions: sizeof(T) == item_size().
  template <class T>
  const T* data_as() const {
    return reinterpret_cast<const T*>(data.data());
  }
  template <class T>
  T* data_as() {
    return reinterpret_cast<T*>(data.data());
  }
};

// Returns the bytes per element of a supported dtype descriptor; throws NpyError otherwise
// (naming the descriptor and the supported ones).
size_t dtype_item_size(const std::string& dtype);

// Returns "(4, 8)", "(4,)" or "()" — the shape as numpy writes it.
std::string shape_text(const std::vector<int64_t>& shape);

// Returns the whole .npy preamble for dtype and shape: magic, version, header length and the
// header text "{'descr': '<u2', 'fortran_order': False, 'shape': (4, 8), }" padded with spaces
// and a final '\n' so that the data starts at a multiple of 64 bytes (what numpy writes).
// Version 1.0 unless the header needs more than 65535 bytes, then 2.0.
std::string make_header(const std::string& dtype, const std::vector<int64_t>& shape);

// Parses a whole .npy file held in memory. `name` is used in error messages (usually the path).
NpyArray parse_npy(const uint8_t* bytes, size_t size, const std::string& name);

// Reads path. Throws NpyError when the file cannot be opened, is not a regular file (a FIFO is
// refused without blocking), is malformed, or its size disagrees with its header (checked before
// any data is read or allocated), or when memory for its data cannot be had.
NpyArray read_npy(const std::string& path);

// Writes an array atomically. Preconditions (checked, NpyError): dtype supported, every dimension
// >= 0, bytes == element count * item size. Throws NpyError on any I/O failure, leaving neither
// the temporary file nor a partial `path` behind (an existing `path` is kept unchanged).
void write_npy(const std::string& path, const std::string& dtype, const std::vector<int64_t>& shape, const void* data,
               size_t bytes);

// Writes bytes to path atomically (temp file, fsync, rename), for single output files (CSV, SVG,
// PNG, traces). Throws NpyError on failure, leaving nothing behind.
void write_file_atomic(const std::string& path, const void* data, size_t bytes);

// The output files of one command, all or nothing. The constructor creates a temporary file
// (PATH.tmp.<pid>) beside every path, so an unwritable destination is an error before any work
// is done; write() or write_npy() fills one (written, fsynced, closed); commit() renames every
// written one into place. Whatever is not committed — after a failed write, an exception, or an
// early return — is removed by the destructor: a command never leaves a partial set of outputs.
// Example:
//   npy::OutputFiles files({out_path, residual_path});   // throws NpyError: "o.npy: cannot create ..."
//   ... compute ...
//   files.write_npy(out_path, npy::kU16, shape, out.data(), out.size());
//   files.write_npy(residual_path, npy::kU16, shape, ro.data(), ro.size());
//   files.commit();
class OutputFiles {
 public:
  // Reserves every non-empty path. Throws NpyError naming the first path that cannot be created,
  // that names an existing directory, device or FIFO (never replaced), or that is named twice.
  explicit OutputFiles(const std::vector<std::string>& paths);
  ~OutputFiles();
  OutputFiles(const OutputFiles&) = delete;
  OutputFiles& operator=(const OutputFiles&) = delete;

  // Writes the whole content of `path`. Preconditions: path was reserved and is written once.
  // Throws NpyError on an I/O failure (e.g. a full disk).
  void write(const std::string& path, const void* data, size_t bytes);
  // As write_npy() below, into the reserved `path`.
  void write_npy(const std::string& path, const std::string& dtype, const std::vector<int64_t>& shape, const void* data,
                 size_t bytes);
  // Renames every written file into place; reserved files never written are dropped (a failed
  // run still commits its traces, not its outputs). Throws NpyError when a rename fails, after
  // removing the files it had already renamed.
  void commit();

 private:
  struct Pending {
    std::string path;
    std::string temporary;
    int fd = -1;
    bool written = false;
  };
  Pending& find(const std::string& path);
  void write_pieces(const std::string& path, std::initializer_list<std::pair<const void*, size_t>> pieces);
  void discard();

  std::vector<Pending> pending_;
};

}  // namespace exactcoll::npy

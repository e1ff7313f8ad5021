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
//
// Example:
//   npy::write_npy("x.npy", "<u2", {4, 8}, bits.data(), bits.size() * 2);
//   npy::NpyArray a = npy::read_npy("x.npy");   // a.dtype == "<u2", a.shape == {4, 8}
//   const uint16_t* v = a.data_as<uint16_t>();
#pragma once

#include <cstddef>
#include <cstdint>
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

// Reads path. Throws NpyError when the file cannot be opened or is malformed.
NpyArray read_npy(const std::string& path);

// Writes an array atomically. Preconditions (checked, NpyError): dtype supported, every dimension
// >= 0, bytes == element count * item size. Throws NpyError on any I/O failure, leaving neither
// the temporary file nor a partial `path` behind (an existing `path` is kept unchanged).
void write_npy(const std::string& path, const std::string& dtype, const std::vector<int64_t>& shape,
               const void* data, size_t bytes);

// Writes bytes to path atomically (temp file, fsync, rename); the building block of write_npy,
// exposed for other output files (CSV, SVG, PNG, traces). Throws NpyError on failure.
void write_file_atomic(const std::string& path, const void* data, size_t bytes);

}  // namespace exactcoll::npy

#include "npy/npy.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string_view>

namespace exactcoll::npy {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicSize = 6;
constexpr size_t kAlign = 64;
// The longest header read (1 MiB): a bound on what a lying header length can make the reader
// allocate. Real headers are far shorter (numpy's own reader refuses more than 10000 bytes unless
// told otherwise); make_header's version 2.0 headers for shapes of tens of thousands of
// dimensions stay below it.
constexpr size_t kMaxHeaderBytes = 1 << 20;
constexpr size_t kMaxPreambleBytes = kMagicSize + 2 + 4 + kMaxHeaderBytes;

[[noreturn]] void fail(const std::string& name, const std::string& what) { throw NpyError(name + ": " + what); }

std::string errno_text() { return std::strerror(errno); }

// Returns text with non-printable bytes escaped, cut to `limit` characters, for messages.
std::string printable(std::string_view text, size_t limit = 80) {
  std::string out;
  for (size_t i = 0; i < text.size() && i < limit; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7F) {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  if (text.size() > limit) out += "...";
  return out;
}

// A recursive-descent parser for the header: a Python dict literal whose values are strings,
// booleans or tuples of non-negative integers, e.g.
//   {'descr': '<u2', 'fortran_order': False, 'shape': (4, 8), }
class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& name) : text_(text), name_(name) {}

  struct Header {
    std::optional<std::string> descr;
    std::optional<bool> fortran_order;
    std::optional<std::vector<int64_t>> shape;
  };

  Header parse() {
    Header h;
    skip_space();
    expect('{');
    skip_space();
    while (peek() != '}') {
      const std::string key = parse_string();
      skip_space();
      expect(':');
      skip_space();
      if (key == "descr") {
        if (h.descr) error("key 'descr' appears twice");
        h.descr = parse_string();
      } else if (key == "fortran_order") {
        if (h.fortran_order) error("key 'fortran_order' appears twice");
        h.fortran_order = parse_bool();
      } else if (key == "shape") {
        if (h.shape) error("key 'shape' appears twice");
        h.shape = parse_shape();
      } else {
        error("unexpected key '" + printable(key) + "' (a .npy header has descr, fortran_order, shape)");
      }
      skip_space();
      if (peek() == ',') {
        ++pos_;
        skip_space();
      } else if (peek() != '}') {
        error("expected ',' or '}'");
      }
    }
    ++pos_;
    skip_space();
    if (pos_ != text_.size()) error("unexpected text after the closing '}'");
    if (!h.descr) error("no 'descr' key");
    if (!h.fortran_order) error("no 'fortran_order' key");
    if (!h.shape) error("no 'shape' key");
    return h;
  }

 private:
  [[noreturn]] void error(const std::string& what) {
    fail(name_, "malformed header at byte " + std::to_string(pos_) + " of \"" + printable(text_) + "\": " + what);
  }
  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  void skip_space() {
    while (pos_ < text_.size() &&
           (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' || text_[pos_] == '\r'))
      ++pos_;
  }
  void expect(char c) {
    if (peek() != c) error(std::string("expected '") + c + "'");
    ++pos_;
  }
  std::string parse_string() {
    const char quote = peek();
    if (quote != '\'' && quote != '"') error("expected a quoted string");
    ++pos_;
    const size_t begin = pos_;
    while (pos_ < text_.size() && text_[pos_] != quote) {
      if (text_[pos_] == '\\') error("escapes in header strings are not supported");
      ++pos_;
    }
    if (pos_ >= text_.size()) error("unterminated string");
    std::string s(text_.substr(begin, pos_ - begin));
    ++pos_;
    return s;
  }
  bool parse_bool() {
    if (text_.substr(pos_, 4) == "True") {
      pos_ += 4;
      return true;
    }
    if (text_.substr(pos_, 5) == "False") {
      pos_ += 5;
      return false;
    }
    error("expected True or False");
  }
  std::vector<int64_t> parse_shape() {
    std::vector<int64_t> shape;
    expect('(');
    skip_space();
    bool trailing_comma = false;
    while (peek() != ')') {
      if (peek() < '0' || peek() > '9') error("expected a non-negative dimension");
      int64_t v = 0;
      while (peek() >= '0' && peek() <= '9') {
        const int digit = peek() - '0';
        if (v > (std::numeric_limits<int64_t>::max() - digit) / 10) error("dimension too large");
        v = v * 10 + digit;
        ++pos_;
      }
      shape.push_back(v);
      skip_space();
      trailing_comma = false;
      if (peek() == ',') {
        ++pos_;
        skip_space();
        trailing_comma = true;
      } else if (peek() != ')') {
        error("expected ',' or ')' in the shape");
      }
    }
    // Python: (4) is the integer 4, not a tuple; numpy always writes (4,).
    if (shape.size() == 1 && !trailing_comma) error("a one-dimensional shape needs a trailing comma: (n,)");
    ++pos_;
    return shape;
  }

  std::string_view text_;
  const std::string& name_;
  size_t pos_ = 0;
};

// Returns the product of the dimensions, or nullopt when it overflows size_t once multiplied by
// item_size.
std::optional<size_t> checked_bytes(const std::vector<int64_t>& shape, size_t item_size) {
  size_t total = item_size;
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    const size_t ud = static_cast<size_t>(d);
    if (ud != 0 && total > std::numeric_limits<size_t>::max() / ud) return std::nullopt;
    total *= ud;
  }
  return total;
}

uint32_t read_le(const uint8_t* p, int bytes) {
  uint32_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

size_t dtype_item_size(const std::string& dtype) {
  if (dtype == kU16) return 2;
  if (dtype == kF32) return 4;
  if (!dtype.empty() && dtype[0] == '>') {
    throw NpyError("big-endian dtype '" + printable(dtype) + "' is not supported (exactcoll reads '<u2' and '<f4')");
  }
  throw NpyError("unsupported dtype '" + printable(dtype) +
                 "' (exactcoll reads '<u2' for bf16/fp16 bit patterns and '<f4' for fp32)");
}

size_t NpyArray::element_count() const {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

size_t NpyArray::item_size() const { return dtype_item_size(dtype); }

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";
  s += ")";
  return s;
}

std::string make_header(const std::string& dtype, const std::vector<int64_t>& shape) {
  dtype_item_size(dtype);  // validates
  for (int64_t d : shape) {
    if (d < 0) throw NpyError("negative dimension in shape " + shape_text(shape));
  }
  const std::string dict = "{'descr': '" + dtype + "', 'fortran_order': False, 'shape': " + shape_text(shape) + ", }";
  // Version 1.0: 6 magic + 2 version + 2 length bytes; 2.0 has a 4-byte length.
  for (int major = 1; major <= 2; ++major) {
    const size_t prefix = kMagicSize + 2 + (major == 1 ? 2 : 4);
    const size_t unpadded = prefix + dict.size() + 1;  // +1 for the final '\n'
    const size_t total = (unpadded + kAlign - 1) / kAlign * kAlign;
    const size_t header_len = total - prefix;
    if (major == 1 && header_len > 0xFFFF) continue;
    std::string out(kMagic, kMagicSize);
    out += static_cast<char>(major);
    out += static_cast<char>(0);
    for (int i = 0; i < (major == 1 ? 2 : 4); ++i) out += static_cast<char>((header_len >> (8 * i)) & 0xFF);
    out += dict;
    out.append(header_len - dict.size() - 1, ' ');
    out += '\n';
    return out;
  }
  throw NpyError("shape " + shape_text(shape) + " makes a header too long for .npy");
}

namespace {

// What the preamble (magic, version, header) of a .npy file says: where the data starts and how
// many bytes of it the shape calls for. Parsed from the first bytes alone, so that a reader can
// check the file's size against the header before it reads (or allocates) any data.
struct Preamble {
  std::string dtype;
  std::vector<int64_t> shape;
  size_t data_offset = 0;     // bytes before the data
  size_t expected_bytes = 0;  // data bytes the shape calls for
};

// Returns the preamble held in bytes[0, size) (which may be only the file's beginning).
// Throws NpyError naming `name` when it is malformed or when the file ends inside it.
Preamble parse_preamble(const uint8_t* bytes, size_t size, const std::string& name) {
  // 1. Magic and version.
  if (size < kMagicSize || std::memcmp(bytes, kMagic, kMagicSize) != 0) {
    fail(name, "not a .npy file (bad magic: the file does not start with \\x93NUMPY)");
  }
  if (size < kMagicSize + 2) fail(name, "truncated file: it ends inside the version bytes");
  const int major = bytes[kMagicSize];
  const int minor = bytes[kMagicSize + 1];
  if ((major != 1 && major != 2) || minor != 0) {
    fail(name, "unsupported .npy version " + std::to_string(major) + "." + std::to_string(minor) +
                   " (exactcoll reads 1.0 and 2.0)");
  }
  // 2. Header length and text.
  const int len_bytes = major == 1 ? 2 : 4;
  const size_t prefix = kMagicSize + 2 + static_cast<size_t>(len_bytes);
  if (size < prefix) fail(name, "truncated file: it ends inside the header length");
  const size_t header_len = read_le(bytes + kMagicSize + 2, len_bytes);
  if (header_len > kMaxHeaderBytes) {
    fail(name, "header of " + std::to_string(header_len) + " bytes is longer than the " +
                   std::to_string(kMaxHeaderBytes) + " bytes any shape exactcoll reads needs");
  }
  if (size - prefix < header_len) {
    fail(name, "truncated file: the header should be " + std::to_string(header_len) + " bytes, the file has " +
                   std::to_string(size - prefix) + " after the preamble");
  }
  const std::string_view text(reinterpret_cast<const char*>(bytes + prefix), header_len);
  const HeaderParser::Header h = HeaderParser(text, name).parse();
  // 3. The header's meaning.
  if (*h.fortran_order) fail(name, "fortran_order is True; exactcoll reads only C-order arrays");
  Preamble p;
  p.dtype = *h.descr;
  size_t item_size = 0;
  try {
    item_size = dtype_item_size(p.dtype);
  } catch (const NpyError& e) {
    fail(name, e.what());
  }
  p.shape = *h.shape;
  const std::optional<size_t> expected = checked_bytes(p.shape, item_size);
  if (!expected) fail(name, "shape " + shape_text(p.shape) + " is too large");
  p.data_offset = prefix + header_len;
  p.expected_bytes = *expected;
  return p;
}

// Throws NpyError unless the file holds exactly the data bytes the preamble calls for.
void check_data_size(const Preamble& p, size_t have, const std::string& name) {
  if (have < p.expected_bytes) {
    fail(name, "truncated file: shape " + shape_text(p.shape) + " of " + p.dtype + " needs " +
                   std::to_string(p.expected_bytes) + " data bytes, the file has " + std::to_string(have));
  }
  if (have > p.expected_bytes) {
    fail(name, "data size does not match the shape: " + shape_text(p.shape) + " of " + p.dtype + " needs " +
                   std::to_string(p.expected_bytes) + " data bytes, the file has " + std::to_string(have) + " (" +
                   std::to_string(have - p.expected_bytes) + " extra)");
  }
}

// Returns a vector of `bytes` bytes, or throws NpyError (not std::bad_alloc) when memory is short.
std::vector<uint8_t> allocate_data(size_t bytes, const std::string& name) {
  try {
    return std::vector<uint8_t>(bytes);
  } catch (const std::bad_alloc&) {
    fail(name, "not enough memory to hold its " + std::to_string(bytes) + " data bytes");
  } catch (const std::length_error&) {
    fail(name, "not enough memory to hold its " + std::to_string(bytes) + " data bytes");
  }
}

// Closes fd when it goes out of scope.
struct FdCloser {
  int fd;
  ~FdCloser() { ::close(fd); }
};

// Reads up to `bytes` bytes at `offset` of fd into out; returns how many it got (fewer only at the
// end of the file). Throws NpyError on a read error.
size_t read_at(int fd, uint64_t offset, uint8_t* out, size_t bytes, const std::string& name) {
  size_t got = 0;
  while (got < bytes) {  // every pass reads at least one byte, retries after EINTR, or ends
    const ssize_t n = ::pread(fd, out + got, bytes - got, static_cast<off_t>(offset + got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(name, "read failed: " + errno_text());
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  return got;
}

}  // namespace

NpyArray parse_npy(const uint8_t* bytes, size_t size, const std::string& name) {
  const Preamble p = parse_preamble(bytes, size, name);
  check_data_size(p, size - p.data_offset, name);
  NpyArray a;
  a.dtype = p.dtype;
  a.shape = p.shape;
  a.data.assign(bytes + p.data_offset, bytes + size);
  return a;
}

NpyArray read_npy(const std::string& path) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise block until a writer appears, before
  // the regular-file check below could refuse it. Regular files ignore the flag.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw NpyError(path + ": cannot open: " + errno_text());
  const FdCloser closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0) throw NpyError(path + ": cannot stat: " + errno_text());
  if (!S_ISREG(st.st_mode)) throw NpyError(path + ": not a regular file");
  const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);
  // 1. The preamble, from at most its largest possible size: nothing is sized by the file yet.
  std::vector<uint8_t> head(static_cast<size_t>(std::min<uint64_t>(file_bytes, kMaxPreambleBytes)));
  head.resize(read_at(fd, 0, head.data(), head.size(), path));
  const Preamble p = parse_preamble(head.data(), head.size(), path);
  // 2. The file's size against the header, before any data is read or allocated.
  check_data_size(p, static_cast<size_t>(file_bytes - p.data_offset), path);
  // 3. Exactly the data the shape calls for; a file that shrank meanwhile is truncated.
  NpyArray a;
  a.dtype = p.dtype;
  a.shape = p.shape;
  a.data = allocate_data(p.expected_bytes, path);
  const size_t got = read_at(fd, p.data_offset, a.data.data(), a.data.size(), path);
  check_data_size(p, got, path);
  return a;
}

namespace {

// Returns the preamble of an array of dtype and shape holding `bytes` data bytes. Throws NpyError
// naming path when the dtype is unsupported or the shape and the byte count disagree.
std::string npy_header(const std::string& path, const std::string& dtype, const std::vector<int64_t>& shape,
                       size_t bytes) {
  size_t item_size = 0;
  try {
    item_size = dtype_item_size(dtype);
  } catch (const NpyError& e) {
    throw NpyError(path + ": " + e.what());
  }
  const std::optional<size_t> expected = checked_bytes(shape, item_size);
  if (!expected) throw NpyError(path + ": shape " + shape_text(shape) + " is negative or too large");
  if (bytes != *expected) {
    throw NpyError(path + ": shape " + shape_text(shape) + " of " + dtype + " needs " + std::to_string(*expected) +
                   " bytes, given " + std::to_string(bytes));
  }
  return make_header(dtype, shape);
}

}  // namespace

OutputFiles::OutputFiles(const std::vector<std::string>& paths) {
  try {
    for (const std::string& path : paths) {
      if (path.empty()) continue;
      for (const Pending& earlier : pending_) {
        if (earlier.path == path) throw NpyError(path + ": named twice as an output");
      }
      // An existing directory, device or FIFO is never replaced (renaming over /dev/null as root
      // would replace the device node).
      struct stat st;
      if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
        throw NpyError(path + ": exists and is not a regular file (" +
                       (S_ISDIR(st.st_mode) ? "a directory" : "a device, FIFO or socket") + "); not replacing it");
      }
      Pending p;
      p.path = path;
      p.temporary = path + ".tmp." + std::to_string(::getpid());
      p.fd = ::open(p.temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (p.fd < 0) throw NpyError(path + ": cannot create " + p.temporary + ": " + errno_text());
      pending_.push_back(std::move(p));
    }
  } catch (...) {
    discard();
    throw;
  }
}

OutputFiles::~OutputFiles() { discard(); }

void OutputFiles::discard() {
  for (Pending& p : pending_) {
    if (p.fd >= 0) ::close(p.fd);
    p.fd = -1;
    if (!p.temporary.empty()) ::unlink(p.temporary.c_str());
  }
  pending_.clear();
}

OutputFiles::Pending& OutputFiles::find(const std::string& path) {
  for (Pending& p : pending_) {
    if (p.path == path) return p;
  }
  throw std::logic_error("OutputFiles: '" + path + "' was not named when the outputs were reserved");
}

void OutputFiles::write(const std::string& path, const void* data, size_t bytes) {
  write_pieces(path, {{data, bytes}});
}

void OutputFiles::write_pieces(const std::string& path, std::initializer_list<std::pair<const void*, size_t>> pieces) {
  Pending& p = find(path);
  if (p.written) throw std::logic_error("OutputFiles: '" + path + "' written twice");
  for (const auto& [data, size] : pieces) {
    const uint8_t* at = static_cast<const uint8_t*>(data);
    size_t left = size;
    while (left > 0) {  // every pass writes at least one byte, retries after EINTR, or throws
      const ssize_t put = ::write(p.fd, at, left);
      if (put < 0 && errno == EINTR) continue;
      if (put <= 0) throw NpyError(path + ": write failed: " + errno_text());
      at += put;
      left -= static_cast<size_t>(put);
    }
  }
  if (::fsync(p.fd) != 0) throw NpyError(path + ": fsync failed: " + errno_text());
  const int fd = p.fd;
  p.fd = -1;
  if (::close(fd) != 0) throw NpyError(path + ": close failed: " + errno_text());
  p.written = true;
}

void OutputFiles::write_npy(const std::string& path, const std::string& dtype, const std::vector<int64_t>& shape,
                            const void* data, size_t bytes) {
  const std::string header = npy_header(path, dtype, shape, bytes);
  write_pieces(path, {{header.data(), header.size()}, {data, bytes}});
}

void OutputFiles::commit() {
  std::vector<const Pending*> renamed;
  for (Pending& p : pending_) {
    if (!p.written) continue;
    if (::rename(p.temporary.c_str(), p.path.c_str()) != 0) {
      const std::string e = errno_text();
      // All or nothing: the files already renamed into place go too.
      for (const Pending* done : renamed) ::unlink(done->path.c_str());
      throw NpyError(p.path + ": cannot rename " + p.temporary + " into place: " + e);
    }
    p.temporary.clear();  // nothing left to remove
    renamed.push_back(&p);
  }
  discard();  // the temporaries of files never written
}

void write_file_atomic(const std::string& path, const void* data, size_t bytes) {
  OutputFiles files({path});
  files.write(path, data, bytes);
  files.commit();
}

void write_npy(const std::string& path, const std::string& dtype, const std::vector<int64_t>& shape, const void* data,
               size_t bytes) {
  npy_header(path, dtype, shape, bytes);  // argument errors first, so that they create nothing at all
  OutputFiles files({path});
  files.write_npy(path, dtype, shape, data, bytes);
  files.commit();
}

}  // namespace exactcoll::npy

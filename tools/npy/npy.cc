#include "tools/npy/npy.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
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
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' || text_[pos_] == '\r')) ++pos_;
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

NpyArray parse_npy(const uint8_t* bytes, size_t size, const std::string& name) {
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
  if (size - prefix < header_len) {
    fail(name, "truncated file: the header should be " + std::to_string(header_len) + " bytes, the file has " +
                   std::to_string(size - prefix) + " after the preamble");
  }
  const std::string_view text(reinterpret_cast<const char*>(bytes + prefix), header_len);
  const HeaderParser::Header h = HeaderParser(text, name).parse();
  // 3. The header's meaning.
  if (*h.fortran_order) fail(name, "fortran_order is True; exactcoll reads only C-order arrays");
  NpyArray a;
  a.dtype = *h.descr;
  size_t item_size = 0;
  try {
    item_size = dtype_item_size(a.dtype);
  } catch (const NpyError& e) {
    fail(name, e.what());
  }
  a.shape = *h.shape;
  const std::optional<size_t> expected = checked_bytes(a.shape, item_size);
  if (!expected) fail(name, "shape " + shape_text(a.shape) + " is too large");
  // 4. The data: exactly the bytes the shape calls for.
  const size_t have = size - prefix - header_len;
  if (have < *expected) {
    fail(name, "truncated file: shape " + shape_text(a.shape) + " of " + a.dtype + " needs " +
                   std::to_string(*expected) + " data bytes, the file has " + std::to_string(have));
  }
  if (have > *expected) {
    fail(name, "data size does not match the shape: " + shape_text(a.shape) + " of " + a.dtype + " needs " +
                   std::to_string(*expected) + " data bytes, the file has " + std::to_string(have) +
                   " (" + std::to_string(have - *expected) + " extra)");
  }
  a.data.assign(bytes + prefix + header_len, bytes + size);
  return a;
}

NpyArray read_npy(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw NpyError(path + ": cannot open: " + errno_text());
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const std::string e = errno_text();
    ::close(fd);
    throw NpyError(path + ": cannot stat: " + e);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw NpyError(path + ": not a regular file");
  }
  std::vector<uint8_t> bytes;
  bytes.reserve(static_cast<size_t>(st.st_size));
  uint8_t buf[1 << 16];
  for (;;) {
    const ssize_t got = ::read(fd, buf, sizeof buf);
    if (got < 0) {
      if (errno == EINTR) continue;
      const std::string e = errno_text();
      ::close(fd);
      throw NpyError(path + ": read failed: " + e);
    }
    if (got == 0) break;
    bytes.insert(bytes.end(), buf, buf + got);
  }
  ::close(fd);
  return parse_npy(bytes.data(), bytes.size(), path);
}

namespace {

struct Piece {
  const void* data;
  size_t bytes;
};

// Writes the pieces, in order, to path.tmp.<pid>, fsyncs, renames over path.
void write_pieces_atomic(const std::string& path, std::initializer_list<Piece> pieces) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw NpyError(path + ": cannot create " + tmp + ": " + errno_text());
  auto abandon = [&](const std::string& what) {
    const std::string e = errno_text();
    ::close(fd);
    ::unlink(tmp.c_str());
    throw NpyError(path + ": " + what + ": " + e);
  };
  for (const Piece& piece : pieces) {
    const uint8_t* p = static_cast<const uint8_t*>(piece.data);
    size_t left = piece.bytes;
    while (left > 0) {
      const ssize_t put = ::write(fd, p, left);
      if (put < 0) {
        if (errno == EINTR) continue;
        abandon("write failed");
      }
      p += put;
      left -= static_cast<size_t>(put);
    }
  }
  if (::fsync(fd) != 0) abandon("fsync failed");
  if (::close(fd) != 0) {
    const std::string e = errno_text();
    ::unlink(tmp.c_str());
    throw NpyError(path + ": close failed: " + e);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string e = errno_text();
    ::unlink(tmp.c_str());
    throw NpyError(path + ": cannot rename " + tmp + " into place: " + e);
  }
}

}  // namespace

void write_file_atomic(const std::string& path, const void* data, size_t bytes) {
  write_pieces_atomic(path, {Piece{data, bytes}});
}

void write_npy(const std::string& path, const std::string& dtype, const std::vector<int64_t>& shape,
               const void* data, size_t bytes) {
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
  const std::string header = make_header(dtype, shape);
  write_pieces_atomic(path, {Piece{header.data(), header.size()}, Piece{data, bytes}});
}

}  // namespace exactcoll::npy

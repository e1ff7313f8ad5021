#include "sim/overlap/matmul.h"

#include <Eigen/Core>
#include <cstdint>
#include <cstring>
#include <stdexcept>

namespace exactcoll::overlap {
namespace {

using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

template <class T>
T load(const void* data, size_t i) {
  T x;
  std::memcpy(&x, static_cast<const char*>(data) + i * sizeof(T), sizeof(T));
  return x;
}

template <class T>
void store_rounded(const RowMajor& acc, void* c) {
  const size_t total = static_cast<size_t>(acc.size());
  const float* src = acc.data();
  char* dst = static_cast<char*>(c);
  for (size_t i = 0; i < total; ++i) {
    const T out = round_to<T>(src[i]);
    std::memcpy(dst + i * sizeof(T), &out, sizeof(T));
  }
}

}  // namespace

double element_value(DType dtype, const void* data, size_t i) {
  return with_storage_type(dtype,
                           [&](auto tag) { return static_cast<double>(to_float(load<decltype(tag)>(data, i))); });
}

std::vector<float> widen_all(DType dtype, const void* data, size_t count) {
  std::vector<float> out(count);
  with_storage_type(dtype, [&](auto tag) {
    for (size_t i = 0; i < count; ++i) out[i] = to_float(load<decltype(tag)>(data, i));
  });
  return out;
}

void matmul_rounded(DType dtype, const float* a, size_t rows, size_t k, const float* b, size_t n, void* c) {
  if (rows == 0 || k == 0 || n == 0) throw std::invalid_argument("matmul_rounded: empty shape");
  const Eigen::Map<const RowMajor> A(a, static_cast<Eigen::Index>(rows), static_cast<Eigen::Index>(k));
  const Eigen::Map<const RowMajor> B(b, static_cast<Eigen::Index>(k), static_cast<Eigen::Index>(n));
  RowMajor acc(static_cast<Eigen::Index>(rows), static_cast<Eigen::Index>(n));
  acc.noalias() = A * B;
  with_storage_type(dtype, [&](auto tag) { store_rounded<decltype(tag)>(acc, c); });
}

double dot_reference(DType dtype, const void* a, size_t row, size_t k, const void* b, size_t n, size_t col) {
  double sum = 0;
  for (size_t l = 0; l < k; ++l) sum += element_value(dtype, a, row * k + l) * element_value(dtype, b, l * n + col);
  return sum;
}

}  // namespace exactcoll::overlap

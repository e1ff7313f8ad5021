#include "cuda_backend/linear/matmul_args.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

namespace exactcoll::cuda::linear {

namespace {

// What the messages call the batch count and the strides.
struct Names {
  const char* batch;
  const char* stride_a;
  const char* stride_b;
  const char* stride_c;
};

// s.batch entries of A and B, c_batch of C (c_batch == s.batch for a plain product; the pairs for a
// pair product, whose s.batch counts the leaves).
void check_operands(const void* a, const void* b, const void* c, DType dtype, const MatmulShape& s, int64_t c_batch,
                    const Names& names) {
  if (dtype != DType::kBF16 && dtype != DType::kFP16) {
    throw MatmulRefused(std::string("dtype must be bf16 or fp16 (fp32 accumulation, output rounded once), got ") +
                        dtype_name(dtype));
  }
  const auto in = [](const char* name, int64_t v, int64_t low, int64_t high) {
    if (v < low || v > high) {
      throw MatmulRefused(std::string(name) + " must be " + std::to_string(low) + ".." + std::to_string(high) +
                          ", got " + std::to_string(v));
    }
  };
  in("m", s.m, 0, kMaxDim);
  in("k", s.k, 1, kMaxDim);
  in("n", s.n, 1, kMaxDim);
  in(names.batch, c_batch, 1, c_batch == s.batch ? kMaxBatch : kMaxBatch / 2);
  in("lda", s.lda, s.k, kMaxDim);
  in("ldb", s.ldb, s.n, kMaxDim);
  in("ldc", s.ldc, s.n, kMaxDim);
  if (s.stride_a < 0 || s.stride_b < 0 || s.stride_c < 0) {
    throw MatmulRefused(std::string("strides must be >= 0, got ") + names.stride_a + "=" + std::to_string(s.stride_a) +
                        " " + names.stride_b + "=" + std::to_string(s.stride_b) + " " + names.stride_c + "=" +
                        std::to_string(s.stride_c));
  }
  if (s.m == 0) return;
  if (c_batch > 1 && s.stride_c < (s.m - 1) * s.ldc + s.n) {
    throw MatmulRefused(std::string(names.stride_c) + " " + std::to_string(s.stride_c) + " makes the " +
                        (c_batch == s.batch ? "batches'" : "pairs'") + " outputs overlap (at least " +
                        std::to_string((s.m - 1) * s.ldc + s.n) + " for m=" + std::to_string(s.m) +
                        " ldc=" + std::to_string(s.ldc) + " n=" + std::to_string(s.n) + ")");
  }
  if (a == nullptr) throw MatmulRefused("a is NULL");
  if (b == nullptr) throw MatmulRefused("b is NULL");
  if (c == nullptr) throw MatmulRefused("c is NULL");
  constexpr int64_t kAlign = 16;
  const int64_t size = dtype_size(dtype);
  const std::pair<const char*, const void*> pointers[] = {{"a", a}, {"b", b}, {"c", c}};
  for (const auto& [name, p] : pointers) {
    if (reinterpret_cast<uintptr_t>(p) % kAlign != 0) {
      throw MatmulRefused(std::string(name) + " must be 16-byte aligned (the pinned configuration's requirement)");
    }
  }
  // C's span (first to last element of every batch entry, byte addresses) must not meet A's or B's:
  // the product reads A and B while it writes C. The spans are bounds: operands interleaved
  // inside one buffer without sharing an element are refused too (the header says so).
  const auto span = [&](const void* p, int64_t entries, int64_t batch_stride, int64_t rows, int64_t ld, int64_t cols) {
    const auto first = reinterpret_cast<uintptr_t>(p);
    const int64_t last = (entries - 1) * batch_stride + (rows - 1) * ld + cols;  // elements, exclusive
    return std::pair<uintptr_t, uintptr_t>{first, first + static_cast<uintptr_t>(last * size)};
  };
  const auto c_span = span(c, c_batch, s.stride_c, s.m, s.ldc, s.n);
  const std::pair<const char*, std::pair<uintptr_t, uintptr_t>> operands[] = {
      {"a", span(a, s.batch, s.stride_a, s.m, s.lda, s.k)}, {"b", span(b, s.batch, s.stride_b, s.k, s.ldb, s.n)}};
  for (const auto& [name, operand] : operands) {
    if (c_span.first < operand.second && operand.first < c_span.second) {
      throw MatmulRefused(std::string("c overlaps ") + name + " (the product reads " + name +
                          " while it writes c: give c memory of its own)");
    }
  }
  // A stride matters only where there are two entries: A's and B's with two leaves or batch entries, C's with two.
  const std::pair<const char*, int64_t> extents[] = {{"lda", s.lda},
                                                     {"ldb", s.ldb},
                                                     {"ldc", s.ldc},
                                                     {s.batch > 1 ? names.stride_a : nullptr, s.stride_a},
                                                     {s.batch > 1 ? names.stride_b : nullptr, s.stride_b},
                                                     {c_batch > 1 ? names.stride_c : nullptr, s.stride_c}};
  for (const auto& [name, v] : extents) {
    if (name == nullptr) continue;
    if ((v * size) % kAlign != 0) {
      throw MatmulRefused(std::string(name) + " = " + std::to_string(v) + " elements is not a multiple of 16 bytes (" +
                          std::to_string(kAlign / size) + " elements)");
    }
  }
}

}  // namespace

void check_call(const void* a, const void* b, const void* c, DType dtype, const MatmulShape& s) {
  check_operands(a, b, c, dtype, s, s.batch, {"batch", "stride_a", "stride_b", "stride_c"});
}

void check_pairs_call(const void* a, const void* b, const void* c, DType dtype, const PairShape& p) {
  if (p.pairs < 1 || p.pairs > kMaxBatch / 2) {
    throw MatmulRefused("pairs must be 1.." + std::to_string(kMaxBatch / 2) + ", got " + std::to_string(p.pairs));
  }
  MatmulShape leaves;
  leaves.m = p.m, leaves.k = p.k, leaves.n = p.n, leaves.batch = 2 * p.pairs;
  leaves.lda = p.lda, leaves.ldb = p.ldb, leaves.ldc = p.ldc;
  leaves.stride_a = p.stride_a_leaf, leaves.stride_b = p.stride_b_leaf, leaves.stride_c = p.stride_c_pair;
  check_operands(a, b, c, dtype, leaves, p.pairs, {"pairs", "stride_a_leaf", "stride_b_leaf", "stride_c_pair"});
}

InvariantKernel invariant_kernel() {
  const char* text = std::getenv("EXACTCOLL_INVARIANT_MATMUL");
  if (text == nullptr || *text == '\0' || std::strcmp(text, "tiles") == 0) return InvariantKernel::kTiles;
  if (std::strcmp(text, "cublaslt") == 0) return InvariantKernel::kCublasLt;
  throw MatmulRefused(std::string("EXACTCOLL_INVARIANT_MATMUL must be tiles or cublaslt, got ") + text);
}

}  // namespace exactcoll::cuda::linear

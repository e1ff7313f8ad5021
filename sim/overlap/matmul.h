// The simulator's matrix products for the overlap schedules: row-major C = A @ B with float
// accumulation (Eigen's float GEMM), each output rounded once to the storage type by the
// contract's conversion (core/storage.h). Also a float64 reference for tolerance checks.
//
// The bits of an Eigen product depend on its blocking, which depends on the shapes; the overlap
// simulator therefore multiplies the same row blocks (those of the plan's ProductGrouping) in the
// pipelined and in the unpipelined schedule, so both give the same bits. Products are compared
// with the float64 reference within a tolerance only.
#pragma once

#include <cstddef>
#include <vector>

#include "core/storage.h"

namespace exactcoll::overlap {

// Returns the `count` elements at `data` (storage bit patterns of dtype) widened exactly to float.
std::vector<float> widen_all(DType dtype, const void* data, size_t count);

// c[i*n + j] = round_to<dtype>(sum over l of a[i*k + l] * b[l*n + j]), the sum in float by Eigen.
// a: rows x k floats, b: k x n floats, c: rows x n elements of dtype. Preconditions: dtype is bf16
// or fp16 or fp32; rows, k, n >= 1.
void matmul_rounded(DType dtype, const float* a, size_t rows, size_t k, const float* b, size_t n, void* c);

// Returns sum over l of A[row][l] * B[l][col] in float64, from storage bit patterns (a: rows of k
// elements, b: k x n elements).
double dot_reference(DType dtype, const void* a, size_t row, size_t k, const void* b, size_t n, size_t col);

// Returns element i of data (storage bits of dtype) as double.
double element_value(DType dtype, const void* data, size_t i);

}  // namespace exactcoll::overlap

// Inputs of the fused all-reduce + residual + RMSNorm for `exactcoll gpu fused_rmsnorm`, `verify`
// and `bench`: deterministic in (seed, H, ranks, dtype, row, rank), each row of each rank from its
// own random stream, so that every rank can make every rank's x (the simulator needs them all), or
// only its own, or a few rows of everyone's (bench's reference check), and get the same bits.
//
// Values: finite values of random sign, exponent and mantissa (x with a wider exponent range than
// the residual; weights in [0.5, 2)). With `specials`, about half of the rows carry one kind of
// adversarial value each, so that the other rows stay finite and their bits stay meaningful:
//   a NaN with a payload in some rank's x; +inf or -inf in the residual; +inf on rank 0 and -inf
//   on the last rank at the same element (the fold gives NaN); the largest finite value on every
//   rank (the fold overflows to inf); a row of zeros of both signs and subnormals (ss is tiny: eps
//   decides; no flush to zero anywhere);
// and in every third problem (by seed) the weight holds a NaN, an inf and a -0 (whole columns).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/storage.h"
#include "tools/cli.h"
#include "npy/npy.h"

namespace exactcoll::gpu {

// The fused op's input flags, the same in `sim fused_rmsnorm` and `gpu fused_rmsnorm`: the files,
// or the shape of random inputs, the epsilon and the residual output's file.
struct FusedInputFlags {
  std::string input, residual, weight, residual_output;
  int64_t rows = 0, hidden = 0;
  bool specials = false;
  double eps = 1e-6;
};

// Adds --input --residual --weight --rows --hidden --specials --eps --residual-output to parser,
// stored in *flags (which must outlive the parse).
void add_fused_input_flags(cli::ArgParser& parser, FusedInputFlags* flags);

struct FusedInputs {
  int ranks = 0, rows = 0, hidden = 0;
  DType dtype = DType::kBF16;
  std::vector<std::vector<uint8_t>> x;  // per rank: [rows, H] storage bits, little-endian (may be empty)
  std::vector<uint8_t> residual;        // [rows, H]
  std::vector<uint8_t> weight;          // [H]
  size_t count() const { return static_cast<size_t>(rows) * static_cast<size_t>(hidden); }
};

// Returns the problem: x of every rank, or of `only_rank` alone (the others empty) when
// only_rank >= 0. Preconditions: ranks >= 1, rows >= 0, hidden >= 1.
FusedInputs make_fused_inputs(DType dtype, int ranks, int rows, int hidden, uint64_t seed, bool specials,
                              int only_rank = -1);

// Returns rows `row_list` of the problem above (the same bits, every rank's x), as a problem of
// row_list.size() rows. Preconditions: each listed row < rows.
FusedInputs make_fused_rows(DType dtype, int ranks, int hidden, uint64_t seed, bool specials,
                            const std::vector<int>& row_list);

// One of a fused problem's arrays as read from a .npy file, with the file's name for messages.
struct NamedArray {
  const std::string& path;
  const npy::NpyArray& array;
};

// Checks a fused problem read from files (`exactcoll sim fused_rmsnorm` and `gpu fused_rmsnorm`
// --input/--residual/--weight): each array holds `dtype` (bf16 and fp16 as '<u2', fp32 as '<f4'),
// x is [ranks, rows, H], the residual [rows, H], the weight [H], rows and H are in 1..2^24, and H
// is a multiple of the dtype's pack. Returns "" or what is wrong, naming the file (and
// `ranks_flag`, e.g. "--nproc", when x's rank count differs).
// Example: check_fused_arrays(DType::kBF16, 2, "--ranks", {x_path, x}, {r_path, r}, {w_path, w}).
std::string check_fused_arrays(DType dtype, int64_t ranks, const std::string& ranks_flag, NamedArray x,
                               NamedArray residual, NamedArray weight);

// Reads the fused problem from flags.input, flags.residual and flags.weight, checks it as
// check_fused_arrays does, and fills *in with every rank's x, or with only_rank's (the others
// empty) when only_rank >= 0. Returns "" or what is wrong (an unreadable file too), naming the file.
// Preconditions: the three paths are given.
// Example: read_fused_files(flags, DType::kBF16, 4, "--ranks", -1, &in)
std::string read_fused_files(const FusedInputFlags& flags, DType dtype, int64_t ranks, const std::string& ranks_flag,
                             int only_rank, FusedInputs* in);

}  // namespace exactcoll::gpu

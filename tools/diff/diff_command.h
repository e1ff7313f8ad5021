// `exactcoll diff A.npy B.npy [--dtype bf16|fp16|fp32]`: compares two arrays element by element.
//
// Prints element count, equal count (bitwise), fraction differing, NaN mismatches, max |difference|,
// max ULP distance, a ULP histogram, the relative L2 difference ||A - B|| / ||B||, and the first
// differing index with both values' bits and values.
// Exit codes: 0 iff the arrays are bitwise identical; 1 if they differ; 2 on bad input (an
// unreadable or malformed file, different shapes or dtypes, a --dtype that does not fit the file).
//
// The dtype: '<f4' is fp32; '<u2' holds bf16 or fp16 bits and needs --dtype (bf16 is assumed,
// with a note on stderr, when it is not given).
#pragma once

namespace exactcoll::diff {

// The command's entry point (argv[0] = "diff"). Writes the report to stdout, errors to stderr.
int diff_main(int argc, char** argv);

}  // namespace exactcoll::diff

/* The C API on the CPU simulator: four ranks' bf16 inputs in, the contract's bits out, the same on
 * every algorithm (and what the GPUs give for the same inputs).
 *   bazel run //examples/c:sim_allreduce
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "exactcoll/exactcoll.h"

enum { kRanks = 4, kCount = 10 };

int main(void) {
  /* bf16 bit patterns: rank r holds 1 + r/8 in every element, except 2^-8 in rank 3's element 0. */
  uint16_t input[kRanks * kCount];
  for (int r = 0; r < kRanks; ++r) {
    for (int i = 0; i < kCount; ++i) input[r * kCount + i] = (uint16_t)(0x3F80 + 16 * r); /* 1 + r/8 */
  }
  input[3 * kCount] = 0x3B80; /* 2^-8 */

  const int algos[] = {EXACTCOLL_ALGO_ONE_SHOT, EXACTCOLL_ALGO_TWO_SHOT, EXACTCOLL_ALGO_PUSH_TWO_SHOT};
  uint16_t first[kRanks * kCount];
  for (int a = 0; a < 3; ++a) {
    uint16_t output[kRanks * kCount];
    exactcoll_call_info info;
    exactcoll_call_info_init(&info);
    if (exactcoll_sim_collective(EXACTCOLL_OP_ALLREDUCE, algos[a], EXACTCOLL_BF16, kRanks, kCount, input, output, NULL,
                                 &info) != EXACTCOLL_OK) {
      fprintf(stderr, "sim_allreduce: %s\n", exactcoll_last_error());
      return 1;
    }
    printf("%-13s rank 0: 0x%04x 0x%04x ...  (ran %s)\n", exactcoll_algo_name(algos[a]), output[0], output[1],
           exactcoll_algo_name(info.algo));
    if (a == 0) {
      memcpy(first, output, sizeof first);
    } else if (memcmp(first, output, sizeof first) != 0) {
      fprintf(stderr, "sim_allreduce: %s gave other bits than one_shot\n", exactcoll_algo_name(algos[a]));
      return 1;
    }
  }

  /* A bad argument is an error with a message, never a crash. */
  if (exactcoll_sim_collective(EXACTCOLL_OP_REDUCE_SCATTER, EXACTCOLL_ALGO_AUTO, EXACTCOLL_BF16, kRanks, 10, input,
                               first, NULL, NULL) != EXACTCOLL_ERROR_INVALID_ARGUMENT) {
    return 1;
  }
  printf("as expected: %s\n", exactcoll_last_error());
  printf("libexactcoll %s: same bits on every algorithm\n", exactcoll_version_string());
  return 0;
}

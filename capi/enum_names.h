// The names of the C header's enum values, indexed by value. The library's own enums are reached
// by name (sim::parse_algorithm, cuda::parse_algorithm, ...), so a C value and the library value of
// the same name can never drift apart; tests/capi/enum_names_test.cc checks every name parses.
#pragma once

#include <cstddef>
#include <string>

#include "capi/api_support.h"

namespace exactcoll::capi {

inline constexpr const char* kDtypeNames[] = {"bf16", "fp16", "fp32"};
inline constexpr const char* kOpNames[] = {"allreduce", "reduce_scatter", "allgather"};
inline constexpr const char* kAlgoNames[] = {"auto",   "one_shot",    "two_shot", "push_one_shot",   "push_two_shot",
                                             "direct", "copy_engine", "nccl",     "lamport_one_shot"};
inline constexpr const char* kFusedAlgoNames[] = {"auto",           "one_stage",  "two_stage",
                                                  "push_one_stage", "unfused",    "one_stage_reg",
                                                  "gather_norm",    "nccl_split", "lamport_one_stage"};
inline constexpr const char* kContractNames[] = {"canonical", "f32_residual", "bf16_accumulate", "rotated_two_shot"};

// Returns names[value], or nullptr when value is outside the table.
template <size_t N>
const char* name_of(const char* const (&names)[N], int value) {
  return value >= 0 && static_cast<size_t>(value) < N ? names[value] : nullptr;
}

// Returns the value whose name is `name`, or -1.
template <size_t N>
int value_of(const char* const (&names)[N], const std::string& name) {
  for (size_t i = 0; i < N; ++i) {
    if (name == names[i]) return static_cast<int>(i);
  }
  return -1;
}

// "a, b, c": the names, for error messages.
template <size_t N>
std::string name_list(const char* const (&names)[N]) {
  std::string text;
  for (size_t i = 0; i < N; ++i) text += (i ? ", " : "") + std::string(names[i]);
  return text;
}

// The name of value, or INVALID_ARGUMENT naming `what` and listing the valid names.
template <size_t N>
const char* checked_name(const char* const (&names)[N], int value, const char* what) {
  const char* name = name_of(names, value);
  if (name == nullptr) {
    bad_argument(std::string(what) + " " + std::to_string(value) + " is outside 0.." + std::to_string(N - 1) + " (" +
                 name_list(names) + ")");
  }
  return name;
}

}  // namespace exactcoll::capi

// The names of the C header's enum values, indexed by value: the registry's tables
// (core/registry.h), whose values are the C values (python/tests/test_api.py checks each against
// the header), and the dtypes.
#pragma once

#include <cstddef>
#include <string>

#include "capi/api_support.h"
#include "core/registry.h"

namespace exactcoll::capi {

inline constexpr const char* kDtypeNames[] = {"bf16", "fp16", "fp32"};
inline constexpr const auto& kOpNames = kOpInfos;
inline constexpr const auto& kAlgoNames = kAlgorithmInfos;
inline constexpr const auto& kFusedAlgoNames = kFusedAlgorithmInfos;
inline constexpr const auto& kContractNames = kContractInfos;

// A table entry's name: the entry itself (dtypes) or its `name` (the registry's tables).
inline const char* entry_name(const char* name) { return name; }
template <class Entry>
const char* entry_name(const Entry& e) {
  return e.name;
}

// Returns names[value], or nullptr when value is outside the table.
template <class Entry, size_t N>
const char* name_of(const Entry (&names)[N], int value) {
  return value >= 0 && static_cast<size_t>(value) < N ? entry_name(names[value]) : nullptr;
}

// Returns the value whose name is `name`, or -1.
template <class Entry, size_t N>
int value_of(const Entry (&names)[N], const std::string& name) {
  for (size_t i = 0; i < N; ++i) {
    if (name == entry_name(names[i])) return static_cast<int>(i);
  }
  return -1;
}

// "a, b, c": the names, for error messages.
template <class Entry, size_t N>
std::string name_list(const Entry (&names)[N]) {
  std::string text;
  for (size_t i = 0; i < N; ++i) {
    if (i) text.append(", ");
    text.append(entry_name(names[i]));
  }
  return text;
}

// The name of value, or INVALID_ARGUMENT naming `what` and listing the valid names.
template <class Entry, size_t N>
const char* checked_name(const Entry (&names)[N], int value, const char* what) {
  const char* name = name_of(names, value);
  if (name == nullptr) {
    bad_argument(std::string(what) + " " + std::to_string(value) + " is outside 0.." + std::to_string(N - 1) + " (" +
                 name_list(names) + ")");
  }
  return name;
}

}  // namespace exactcoll::capi

// The median of timing samples, for the benchmarks (GPU and simulator alike).
#pragma once

#include <algorithm>
#include <vector>

namespace exactcoll::stats {

// Returns the median of `values` (the mean of the middle two for an even count), or 0 when empty.
// Example: median({3, 1, 2, 10}) == 2.5.
inline double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t m = values.size() / 2;
  return values.size() % 2 ? values[m] : 0.5 * (values[m - 1] + values[m]);
}

}  // namespace exactcoll::stats

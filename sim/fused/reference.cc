#include "sim/fused/reference.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>

#include "core/collectives.h"  // two_shot_slice: the slice boundaries are part of rotated_two_shot

namespace exactcoll::fused {

const char* contract_name(FusedContract c) {
  switch (c) {
    case FusedContract::kCanonical: return "canonical";
    case FusedContract::kF32Residual: return "f32_residual";
    case FusedContract::kBf16Accumulate: return "bf16_accumulate";
    case FusedContract::kRotatedTwoShot: return "rotated_two_shot";
  }
  return "?";
}

bool parse_contract(const std::string& name, FusedContract* c) {
  for (FusedContract k : kAllContracts) {
    if (name == contract_name(k)) {
      *c = k;
      return true;
    }
  }
  return false;
}

std::vector<std::string> contract_names() {
  std::vector<std::string> out;
  for (FusedContract k : kAllContracts) out.push_back(contract_name(k));
  return out;
}

std::string check_eps(double eps) {
  if (std::isfinite(eps) && eps >= 0 && eps <= static_cast<double>(std::numeric_limits<float>::max())) return "";
  char text[64];
  std::snprintf(text, sizeof text, "%g", eps);
  return std::string("--eps must be a finite number >= 0 (RMSNorm's epsilon, held as a float), got ") + text;
}

// Host arithmetic is IEEE single precision, built with -ffp-contract=off: each + and * below is one
// rounding, as the contract says. NaN payloads may differ from the GPU's in intermediates, but
// every stored value goes through round_to, which makes every NaN the canonical pattern.
float reference_sum_squares(const float* v, int hidden, int pack) {
  const int num_packs = hidden / pack;
  const int active = num_packs < 1024 ? num_packs : 1024;
  const int lanes = 32 * ((active + 31) / 32);
  const int groups = lanes / 32;
  auto butterfly = [](float* a) {
    for (int off = 16; off >= 1; off /= 2) {
      float next[32];
      for (int l = 0; l < 32; ++l) next[l] = a[l] + a[l ^ off];
      for (int l = 0; l < 32; ++l) a[l] = next[l];
    }
  };
  float group_value[32] = {};
  for (int g = 0; g < groups; ++g) {
    float lane_value[32];
    for (int l = 0; l < 32; ++l) {
      float acc = 0.0f;
      for (int p = g * 32 + l; p < num_packs; p += lanes) {
        for (int e = 0; e < pack; ++e) {
          const float x = v[p * pack + e];
          acc = acc + x * x;
        }
      }
      lane_value[l] = acc;
    }
    butterfly(lane_value);
    group_value[g] = lane_value[0];
  }
  butterfly(group_value);
  return group_value[0];
}

template <class T>
void fused_reference(FusedContract c, const FusedProblem<T>& problem, T* residual_out, T* out) {
  const int n = problem.ranks, rows = problem.rows, H = problem.hidden;
  const int pack = Storage<T>::kPack;
  if (n < 1) throw std::invalid_argument("ranks must be >= 1");
  if (rows < 0) throw std::invalid_argument("rows must be >= 0");
  if (H <= 0 || H % pack != 0) {
    throw std::invalid_argument("hidden size " + std::to_string(H) + " is not a positive multiple of the " +
                                Storage<T>::kName + " pack (" + std::to_string(pack) + " elements)");
  }
  const size_t count = static_cast<size_t>(rows) * H;
  auto x = [&](int r, size_t i) { return to_float(problem.x[static_cast<size_t>(r) * count + i]); };
  std::vector<float> norm_input(H);  // the values the norm reads: float(ro), or rf
  for (int row = 0; row < rows; ++row) {
    const size_t base = static_cast<size_t>(row) * H;
    for (int j = 0; j < H; ++j) {
      const size_t i = base + j;
      const float res = to_float(problem.residual[i]);
      float acc = 0.0f;
      switch (c) {
        case FusedContract::kCanonical:
        case FusedContract::kF32Residual:
          acc = x(0, i);
          for (int r = 1; r < n; ++r) acc = acc + x(r, i);
          break;
        case FusedContract::kBf16Accumulate:
          acc = x(0, i);
          for (int r = 1; r < n; ++r) acc = to_float(round_to<T>(acc + x(r, i)));
          break;
        case FusedContract::kRotatedTwoShot: {
          int owner = 0;
          for (int p = 0; p < n; ++p) {
            const Slice s = two_shot_slice(count, pack, p, n);
            if (i >= s.begin && i < s.end) owner = p;
          }
          acc = x(owner, i);
          for (int k = 1; k < n; ++k) acc = acc + x((owner + k) % n, i);
          break;
        }
      }
      if (c == FusedContract::kF32Residual) {
        const float rf = acc + res;
        residual_out[i] = round_to<T>(rf);
        norm_input[j] = rf;
      } else {
        const float s = to_float(round_to<T>(acc));
        residual_out[i] = round_to<T>(s + res);
        norm_input[j] = to_float(residual_out[i]);
      }
    }
    const float ss = reference_sum_squares(norm_input.data(), H, pack);
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(H) + problem.eps);
    for (int j = 0; j < H; ++j) out[base + j] = round_to<T>((norm_input[j] * inv) * to_float(problem.weight[j]));
  }
}

template void fused_reference<bf16>(FusedContract, const FusedProblem<bf16>&, bf16*, bf16*);
template void fused_reference<fp16>(FusedContract, const FusedProblem<fp16>&, fp16*, fp16*);
template void fused_reference<float>(FusedContract, const FusedProblem<float>&, float*, float*);

}  // namespace exactcoll::fused

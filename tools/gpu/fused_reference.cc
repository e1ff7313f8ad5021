#include "tools/gpu/fused_reference.h"

#include <cstring>
#include <stdexcept>
#include <string>

#include "sim/fused/fused_sim.h"
#include "sim/fused/reference.h"
#include "sim/world.h"

namespace exactcoll::gpu {
namespace {

template <class T>
FusedOutputs reference_typed(const FusedInputs& in, float eps, Contract contract) {
  const size_t count = in.count();
  std::vector<T> x(count * static_cast<size_t>(in.ranks)), residual(count), weight(static_cast<size_t>(in.hidden)),
      ro(count), out(count);
  for (int r = 0; r < in.ranks; ++r)
    std::memcpy(x.data() + static_cast<size_t>(r) * count, in.x[r].data(), count * sizeof(T));
  std::memcpy(residual.data(), in.residual.data(), count * sizeof(T));
  std::memcpy(weight.data(), in.weight.data(), weight.size() * sizeof(T));
  fused::FusedProblem<T> p;
  p.ranks = in.ranks, p.rows = in.rows, p.hidden = in.hidden, p.eps = eps;
  p.x = x.data(), p.residual = residual.data(), p.weight = weight.data();
  fused::fused_reference<T>(contract, p, ro.data(), out.data());
  FusedOutputs o;
  o.residual_out.resize(count * sizeof(T));
  o.out.resize(count * sizeof(T));
  std::memcpy(o.residual_out.data(), ro.data(), o.residual_out.size());
  std::memcpy(o.out.data(), out.data(), o.out.size());
  return o;
}

}  // namespace

std::vector<FusedOutputs> simulate_fused(sim::World& world, FusedAlgorithm algo, const FusedInputs& in, float eps,
                                         int blocks, Contract contract) {
  if (!info(contract).library_contract) {
    throw std::invalid_argument(
        std::string("simulate_fused: the fused kernels fold under the library's contracts, not ") +
        contract_name(contract));
  }
  const size_t bytes = in.count() * static_cast<size_t>(dtype_size(in.dtype));
  std::vector<FusedOutputs> outputs(static_cast<size_t>(in.ranks));
  fused::FusedSpec spec;
  spec.algo = algo;
  spec.dtype = in.dtype;
  spec.rows = in.rows;
  spec.hidden = in.hidden;
  spec.eps = eps;
  spec.blocks = blocks;
  spec.contract = contract;
  fused::FusedIo io;
  for (int r = 0; r < in.ranks; ++r) {
    FusedOutputs& o = outputs[static_cast<size_t>(r)];
    o.residual_out.resize(bytes);
    o.out.resize(bytes);
    io.x.push_back(in.x[static_cast<size_t>(r)].data());
    io.residual.push_back(in.residual.data());
    io.weight.push_back(in.weight.data());
    io.residual_out.push_back(o.residual_out.data());
    io.out.push_back(o.out.data());
  }
  fused::run_fused(world, spec, io);
  return outputs;
}

FusedOutputs reference_fused(const FusedInputs& in, float eps, Contract contract) {
  return with_storage_type(in.dtype, [&](auto tag) { return reference_typed<decltype(tag)>(in, eps, contract); });
}

}  // namespace exactcoll::gpu

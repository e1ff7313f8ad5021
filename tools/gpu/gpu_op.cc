#include "tools/gpu/gpu_op.h"

#include <iostream>
#include <sstream>

#include "cuda_backend/cuda_check.h"
#include "cuda_backend/kernel_args.h"
#include "sim/reference.h"
#include "tools/gpu/device_util.h"

namespace exactcoll::gpu {

// What GPU outputs are compared with (the library's sim/reference.h).
using sim::bits_hex;
using sim::compare_bits;
using sim::Comparison;

std::vector<Variant> verify_variants(bool forced_grids, int max_blocks, bool chunked) {
  std::vector<Variant> variants = {{"staged", false, false, false, std::nullopt},
                                   {"registered", true, false, false, std::nullopt},
                                   {"graph", true, true, false, std::nullopt}};
  if (forced_grids) {
    variants.push_back({"grid3x64", false, false, false, cuda::LaunchConfig{3, 64}});
    variants.push_back(
        {"grid" + std::to_string(max_blocks) + "x1024", true, false, false, cuda::LaunchConfig{max_blocks, 1024}});
  }
  if (chunked) variants.push_back({"chunked", false, false, true, std::nullopt});
  return variants;
}

CallReport run_checked(const Enqueue& enqueue, const Variant& v, const std::vector<DeviceOutput>& outputs, int replays,
                       ApiComm& comm, cudaStream_t stream,
                       const std::function<void(int replay, const std::vector<Bytes>& got)>& got) {
  CallReport report;
  bool reported = false;
  auto call = [&] {
    const CallReport r = enqueue(v, stream);
    if (!reported) report = r, reported = true;
  };
  // 1. A graph is captured once (capture enqueues nothing that runs).
  std::optional<CapturedGraph> graph;
  if (v.graph) graph.emplace(stream, call);
  for (int replay = 0; replay < replays; ++replay) {
    // 2. Poison.
    for (const DeviceOutput& o : outputs) {
      const int byte = o.poison ^ (replay * 0x3C);
      EXC_CUDA_CHECK(cudaMemsetAsync(o.device, byte, o.bytes(), stream));
    }
    // 3. Launch; 4. wait and check.
    if (graph) {
      graph->launch(stream);
    } else {
      call();
    }
    comm.check(stream);
    // 5. Copy back.
    std::vector<Bytes> results;
    for (const DeviceOutput& o : outputs) {
      results.emplace_back(o.bytes());
      EXC_CUDA_CHECK(cudaMemcpy(results.back().data(), o.device, results.back().size(), cudaMemcpyDeviceToHost));
    }
    got(replay, results);
  }
  return report;
}

void VerifyLedger::record(const std::string& key, const std::string& what, DType dtype,
                          const std::vector<DeviceOutput>& outputs, const std::vector<Bytes>& got,
                          const std::vector<const Bytes*>& sim, const std::vector<const Bytes*>& ref,
                          const std::function<std::string(size_t index)>& where) {
  Tally& t = tallies_[key];
  ++t.runs;
  std::vector<Comparison> vs_sim, vs_ref;
  uint64_t sim_bad = 0, ref_bad = 0;
  for (size_t i = 0; i < outputs.size(); ++i) {
    vs_sim.push_back(compare_bits(dtype, got[i].data(), sim[i]->data(), outputs[i].count));
    vs_ref.push_back(compare_bits(dtype, got[i].data(), ref[i]->data(), outputs[i].count));
    t.compared += outputs[i].count;
    sim_bad += vs_sim.back().mismatches;
    ref_bad += vs_ref.back().mismatches;
  }
  t.sim_mismatches += sim_bad;
  t.reference_mismatches += ref_bad;
  if (sim_bad + ref_bad == 0 || shown_++ >= show_) return;
  // The first output that differs, and there the simulator's comparison first.
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Comparison& c = vs_sim[i].mismatches > 0 ? vs_sim[i] : vs_ref[i];
    if (c.mismatches == 0) continue;
    std::ostringstream os;
    os << "MISMATCH rank " << rank_ << ": " << what << ": " << sim_bad << " elements differ from the simulator, "
       << ref_bad << " from the reference; first in " << outputs[i].name << " at " << where(c.first) << ": gpu "
       << bits_hex(dtype, c.got_bits) << ", expected " << bits_hex(dtype, c.want_bits) << "\n";
    std::cerr << os.str();
    return;
  }
}

std::string check_grid_flags(int64_t blocks, int64_t threads, int max_blocks) {
  if (blocks < 0 || blocks > max_blocks) {
    return "--blocks must be 1.." + std::to_string(max_blocks) + ", got " + std::to_string(blocks);
  }
  if (threads != 0 && (threads < 64 || threads > 1024 || threads % 32 != 0)) {
    return "--threads must be a multiple of 32 in 64..1024, got " + std::to_string(threads);
  }
  return "";
}

std::string check_comm_contract(const ApiComm& comm, Contract want) {
  const int got = comm.properties().contract;
  if (got == static_cast<int>(want)) return "";
  const char* name = exactcoll_contract_name(got);
  return std::string("the communicator folds under ") + (name != nullptr ? name : std::to_string(got).c_str()) +
         ", not the requested " + contract_name(want) + " (a bug in passing --contract on)";
}

size_t buffer_bytes_for(int64_t buffer_mib) {
  return buffer_mib > 0 ? static_cast<size_t>(buffer_mib) << 20 : cuda::CommunicatorOptions{}.buffer_bytes;
}

std::string check_buffer_mib(const cli::ArgParser& parser, int64_t buffer_mib) {
  if (!parser.given("buffer-mib") || (buffer_mib >= 1 && buffer_mib <= 65536)) return "";
  return "--buffer-mib must be 1..65536, got " + std::to_string(buffer_mib);
}

}  // namespace exactcoll::gpu

// The node kernels of the multi-node algorithms: core/multinode_kernels.h instantiated with the
// device context (cuda_backend/device_ctx.cuh), the run-time world size (a node's ranks), once per
// library contract: node_fold folds under the context's (canonical: the carry chain's fold; tree:
// the node subtrees, with the compile-time world size inside node_tree_fold).
#include "core/multinode_kernels.h"
#include "cuda_backend/kernels.cuh"
#include "cuda_backend/multinode/node_kernels.h"

namespace exactcoll::cuda {

template <class T, Contract kFold>
__global__ void __launch_bounds__(1024) node_kernel(const __grid_constant__ NodeKernelArgs<T> a) {
  enter_after_previous_grid();
  __shared__ int aborted;
  if (threadIdx.x == 0) aborted = 0;
  __syncthreads();  // node_fold may start without a barrier, so order the store here
  DeviceCtx<T, 0, kFold> ctx(a.ipc, &aborted);
  if (a.kind == NodeKernel::kFold) {
    multinode::node_fold<T>(ctx, a.fold);
  } else if (a.kind == NodeKernel::kGather) {
    multinode::node_gather<T>(ctx, a.gather);
  } else if (a.kind == NodeKernel::kGatherInputs) {
    multinode::node_gather_inputs<T>(ctx, a.gather_inputs);
  } else {
    multinode::node_tree_combine<T>(ctx, a.combine);
  }
}

template <class T>
cudaError_t launch_node_kernel(const NodeKernelArgs<T>& args, LaunchConfig cfg, cudaStream_t stream) {
  if (args.ipc.contract == static_cast<int32_t>(Contract::kTree)) {
    return launch_kernel(node_kernel<T, Contract::kTree>, args, cfg, stream);
  }
  return launch_kernel(node_kernel<T, Contract::kCanonical>, args, cfg, stream);
}

template cudaError_t launch_node_kernel<bf16>(const NodeKernelArgs<bf16>&, LaunchConfig, cudaStream_t);
template cudaError_t launch_node_kernel<fp16>(const NodeKernelArgs<fp16>&, LaunchConfig, cudaStream_t);
template cudaError_t launch_node_kernel<float>(const NodeKernelArgs<float>&, LaunchConfig, cudaStream_t);

}  // namespace exactcoll::cuda

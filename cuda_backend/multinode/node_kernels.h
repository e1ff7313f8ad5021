// Host entry point of the multi-node algorithms' node kernels (core/multinode_kernels.h on the
// device context): one launch of node_fold, node_gather, node_gather_inputs or node_tree_combine
// over the node's IPC-linked ranks, under the contract of ipc.contract (KernelArgs: canonical or
// tree). Host code includes this with the CUDA runtime headers only.
#pragma once

#include <cuda_runtime_api.h>

#include "core/multinode_kernels.h"
#include "cuda_backend/kernel_args.h"

namespace exactcoll::cuda {

enum class NodeKernel : int { kFold = 0, kGather = 1, kGatherInputs = 2, kCombine = 3 };

// One launch: the node communicator's arguments (rank = local rank, world_size = ranks of the
// node, peers' staging buffers as inputs and scratch as scratch, output = this rank's output) and
// the step's own arguments. ipc.contract picks the kernel's contract (node_fold's fold).
template <class T>
struct NodeKernelArgs {
  KernelArgs ipc;
  NodeKernel kind = NodeKernel::kFold;
  multinode::NodeFoldArgs<T> fold;
  multinode::NodeGatherArgs gather;
  multinode::NodeGatherInputsArgs gather_inputs;
  multinode::NodeCombineArgs combine;
};

// Launches one node kernel on stream; returns the launch's error. Defined for bf16, fp16, float
// (node_kernels.cu).
template <class T>
cudaError_t launch_node_kernel(const NodeKernelArgs<T>& args, LaunchConfig cfg, cudaStream_t stream);

}  // namespace exactcoll::cuda

"""Bit comparisons the GPU examples share (tp_block_check.py, multinode_check.py, soak.py,
hf_llama_check.py): a
tensor's storage bits, every rank's bits gathered, and how many elements differ."""

import numpy as np
import torch
import torch.distributed as dist


def bits(t):
    """A tensor's storage bits as numpy: uint16 for bf16/fp16, float32 for fp32."""
    t = t.detach().cpu().contiguous()
    return t.numpy() if t.dtype == torch.float32 else t.view(torch.int16).numpy().view(np.uint16)


def gather_bits(t):
    """Every rank's bits of t, stacked [ranks, ...], on every rank."""
    parts = [None] * dist.get_world_size()
    dist.all_gather_object(parts, bits(t))
    return np.stack(parts)


def differing(got, want):
    """Elements whose bits differ; every element when the shapes or dtypes differ (a count, so sums
    of it never hide a mismatch)."""
    got, want = np.ascontiguousarray(got), np.ascontiguousarray(want)
    if got.shape != want.shape or got.dtype != want.dtype:
        return max(got.size, want.size, 1)
    view = np.uint32 if got.dtype == np.float32 else np.uint16
    return int((got.view(view) != want.view(view)).sum())

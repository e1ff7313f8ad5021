"""cc_library that exists only when the CUDA toolkit was found (host code calling the runtime)."""

load("@local_cuda//:defs.bzl", "CUDA_AVAILABLE")

def gpu_cc_library(name, **kwargs):
    """A cc_library of host code that includes CUDA headers. Defines nothing without CUDA."""
    if not CUDA_AVAILABLE:
        return
    native.cc_library(name = name, **kwargs)

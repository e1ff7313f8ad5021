"""Repository rule that finds the CUDA toolkit: $CUDA_PATH, else /usr/local/cuda.

It always creates the repository. When no nvcc is found, `defs.bzl` says CUDA_AVAILABLE = False and
the BUILD file defines no targets, so the project's GPU macros (//third_party/cuda:cuda.bzl) leave
every GPU target out and CPU-only machines build and test everything else.
"""

def _cuda_configure_impl(rctx):
    cuda_path = rctx.os.environ.get("CUDA_PATH", "/usr/local/cuda")
    nvcc = rctx.path(cuda_path + "/bin/nvcc")
    available = nvcc.exists and rctx.path(cuda_path + "/lib64/libcudart_static.a").exists
    if available:
        rctx.symlink(cuda_path + "/include", "include")
        rctx.symlink(cuda_path + "/lib64", "lib64")
        lib64 = str(rctx.path(cuda_path + "/lib64").realpath)
        rctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

# CUDA runtime headers (host compiles of code that calls the runtime).
cc_library(
    name = "cuda_headers",
    hdrs = glob(["include/**"]),
    includes = ["include"],
)

# Static cudart: binaries need no libcudart.so on the GPU machine.
cc_library(
    name = "cudart_static",
    linkopts = ["-L{lib64}", "-l:libcudart_static.a", "-ldl", "-lrt", "-lpthread"],
    deps = [":cuda_headers"],
)

cc_library(
    name = "cublas",
    linkopts = ["-L{lib64}", "-lcublasLt", "-lcublas", "-Wl,-rpath,{lib64}"],
    deps = [":cuda_headers"],
)

cc_library(
    name = "nccl",
    linkopts = ["-L{lib64}", "-lnccl"],
    deps = [":cuda_headers"],
)
""".format(lib64 = lib64))
    else:
        rctx.file("BUILD", "# No CUDA toolkit found at %s: GPU targets are left out.\n" % cuda_path)
    rctx.file("defs.bzl", "CUDA_AVAILABLE = %s\nCUDA_PATH = %r\nNVCC = %r\n" % (
        "True" if available else "False",
        cuda_path,
        str(nvcc) if available else "",
    ))

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = ["CUDA_PATH"],
    local = True,
)

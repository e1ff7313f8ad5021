"""nvcc rule and GPU-target macros.

`cuda_library` compiles `.cu` files with nvcc for sm_90 plus compute_90 PTX and returns CcInfo, so
plain cc_library / cc_binary / cc_test targets depend on it. Without a CUDA toolkit
(@local_cuda//:defs.bzl says CUDA_AVAILABLE = False) the macros define nothing.
"""

load("@local_cuda//:defs.bzl", "CUDA_AVAILABLE", "NVCC")
load("@bazel_tools//tools/cpp:toolchain_utils.bzl", "find_cpp_toolchain")

# Device code follows the rounding contract: no FMA contraction (-fmad=false), IEEE division and
# square root (the nvcc defaults, restated so that nobody adds -use_fast_math by accident).
_NVCC_FLAGS = [
    "-std=c++20",
    "-O3",
    "-gencode",
    "arch=compute_90,code=[sm_90,compute_90]",
    "-fmad=false",
    "-prec-div=true",
    "-prec-sqrt=true",
    "-ftz=false",
    "--expt-relaxed-constexpr",
    "-Xcompiler",
    "-fPIC,-ffp-contract=off,-Wall,-Wextra,-Werror",
    "-Werror",
    "all-warnings",
    "-DEXACTCOLL_HAS_CUDA=1",
]

def _cuda_objects_impl(ctx):
    cc_toolchain = find_cpp_toolchain(ctx)
    dep_infos = [d[CcInfo] for d in ctx.attr.deps]
    dep_ctx = cc_common.merge_cc_infos(cc_infos = dep_infos).compilation_context

    include_flags = ["-I.", "-I" + ctx.bin_dir.path, "-I" + ctx.genfiles_dir.path]
    for inc in dep_ctx.includes.to_list() + dep_ctx.quote_includes.to_list() + dep_ctx.system_includes.to_list():
        include_flags.append("-I" + inc)
    define_flags = ["-D" + d for d in dep_ctx.defines.to_list()]
    inputs = depset(ctx.files.srcs + ctx.files.hdrs, transitive = [dep_ctx.headers])

    objects = []
    for src in ctx.files.srcs:
        obj = ctx.actions.declare_file("_objs/%s/%s.o" % (ctx.label.name, src.basename))
        ctx.actions.run(
            executable = NVCC,
            arguments = _NVCC_FLAGS + ctx.attr.copts + include_flags + define_flags + ["-c", src.path, "-o", obj.path],
            inputs = inputs,
            outputs = [obj],
            mnemonic = "Nvcc",
            progress_message = "nvcc %s" % src.short_path,
            use_default_shell_env = True,
        )
        objects.append(obj)

    archive = ctx.actions.declare_file("lib%s_cuda.a" % ctx.label.name)
    ctx.actions.run(
        executable = cc_toolchain.ar_executable,
        arguments = ["rcs", archive.path] + [o.path for o in objects],
        inputs = objects,
        outputs = [archive],
        mnemonic = "CudaArchive",
    )

    feature_configuration = cc_common.configure_features(ctx = ctx, cc_toolchain = cc_toolchain)
    library = cc_common.create_library_to_link(
        actions = ctx.actions,
        feature_configuration = feature_configuration,
        cc_toolchain = cc_toolchain,
        static_library = archive,
        alwayslink = True,
    )
    linker_input = cc_common.create_linker_input(owner = ctx.label, libraries = depset([library]))
    own = CcInfo(
        compilation_context = cc_common.create_compilation_context(headers = depset(ctx.files.hdrs)),
        linking_context = cc_common.create_linking_context(linker_inputs = depset([linker_input])),
    )
    return [
        DefaultInfo(files = depset([archive])),
        cc_common.merge_cc_infos(direct_cc_infos = [own], cc_infos = dep_infos),
    ]

_cuda_objects = rule(
    implementation = _cuda_objects_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".cu"]),
        "hdrs": attr.label_list(allow_files = [".h", ".cuh"]),
        "deps": attr.label_list(providers = [CcInfo]),
        "copts": attr.string_list(),
        "_cc_toolchain": attr.label(default = Label("@bazel_tools//tools/cpp:current_cc_toolchain")),
    },
    toolchains = ["@bazel_tools//tools/cpp:toolchain_type"],
    fragments = ["cpp"],
)

def cuda_library(name, srcs = [], hdrs = [], deps = [], copts = [], **kwargs):
    """A library of .cu sources compiled by nvcc. Defines nothing when CUDA is absent."""
    if not CUDA_AVAILABLE:
        return
    _cuda_objects(name = name, srcs = srcs, hdrs = hdrs, deps = deps + ["@local_cuda//:cudart_static"], copts = copts, **kwargs)

def if_cuda(if_true, if_false = []):
    """Chooses at load time whether the CUDA toolkit was found."""
    return if_true if CUDA_AVAILABLE else if_false

def cuda_cc_test(name, tags = [], **kwargs):
    """A cc_test that needs a GPU: tagged `gpu` (run with --config=gpu); absent without CUDA."""
    if not CUDA_AVAILABLE:
        return
    native.cc_test(name = name, tags = tags + ["gpu"], **kwargs)

def cuda_cc_binary(name, **kwargs):
    if not CUDA_AVAILABLE:
        return
    native.cc_binary(name = name, **kwargs)

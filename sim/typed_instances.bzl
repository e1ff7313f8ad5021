"""typed_instances: one source compiled once per storage type and library contract.

The simulator instantiates every kernel template for bf16, fp16 and fp32, under the canonical and
the tree contract, at every compile-time world size, traced and not. One translation unit holding
all of them was the build's longest action (fused_sim.cc: 5-8 minutes under ASan on CI's 2 cores);
six of them compile in parallel. The source sees its pair as two macros and ends with one explicit
instantiation:

    template void f<EXACTCOLL_INSTANCE_T, Contract::EXACTCOLL_INSTANCE_CONTRACT>(...);
"""

# Storage types: (name in the target, C++ type).
STORAGE_TYPES = [
    ("bf16", "bf16"),
    ("fp16", "fp16"),
    ("fp32", "float"),
]

# The library's contracts: (name in the target, exactcoll::Contract enumerator).
LIBRARY_CONTRACTS = [
    ("canonical", "kCanonical"),
    ("tree", "kTree"),
]

def typed_instances(name, src, private_hdrs, deps):
    """Declares one private cc_library per (storage type, contract): name_<type>_<contract>.

    Args:
      name: prefix of the libraries' names.
      src: the source compiled into each of them.
      private_hdrs: headers the source includes from its own package.
      deps: the libraries' dependencies.

    Returns:
      The libraries' labels, for the deps of the library that declares what they define.
    """
    labels = []
    for type_name, cpp_type in STORAGE_TYPES:
        for contract_name, contract in LIBRARY_CONTRACTS:
            library = "%s_%s_%s" % (name, type_name, contract_name)
            native.cc_library(
                name = library,
                srcs = [src] + private_hdrs,
                local_defines = [
                    "EXACTCOLL_INSTANCE_T=" + cpp_type,
                    "EXACTCOLL_INSTANCE_CONTRACT=" + contract,
                ],
                visibility = ["//visibility:private"],
                deps = deps,
            )
            labels.append(":" + library)
    return labels

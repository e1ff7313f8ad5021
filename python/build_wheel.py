#!/usr/bin/env python3
"""Builds the exactcoll wheel (run by //python:wheel): the Python package, libexactcoll.so beside it,
and the C header, with the dist-info that pip needs. Standard library only; deterministic (fixed
timestamps and order), so the same inputs give the same bytes.

The version comes from the C header's EXACTCOLL_VERSION_* macros, the one place it is written; the
output file name must carry it (pip reads the version from the name), and a mismatch fails the
build rather than shipping a wheel that lies about its version.

The tag is py3-none-linux_x86_64: the Python side is pure Python over ctypes (any CPython >= 3.9,
any torch), the library is x86-64 Linux (glibc 2.35 and libstdc++ of GCC 11 or later).
"""

import argparse
import base64
import hashlib
import pathlib
import re
import sys
import zipfile

_EPOCH = (1980, 1, 1, 0, 0, 0)
_TAG = "py3-none-linux_x86_64"


def header_version(header_text):
    parts = []
    for name in ("MAJOR", "MINOR", "PATCH"):
        match = re.search(rf"#define EXACTCOLL_VERSION_{name} (\d+)", header_text)
        if not match:
            sys.exit(f"build_wheel: EXACTCOLL_VERSION_{name} is not in the header")
        parts.append(match.group(1))
    return ".".join(parts)


def metadata(version):
    return (f"Metadata-Version: 2.1\n"
            f"Name: exactcoll\n"
            f"Version: {version}\n"
            f"Summary: Collectives whose every output bit is fixed by a written rounding contract\n"
            f"Requires-Python: >=3.9\n"
            f"Requires-Dist: numpy\n"
            f"\n"
            f"exactcoll: all-reduce, reduce-scatter, all-gather and fused all-reduce + residual + RMSNorm\n"
            f"with the same bits on every algorithm, size, batch, world size and backend.\n"
            f"exactcoll.sim runs the CPU simulator on numpy arrays; exactcoll.torch runs the GPU\n"
            f"collectives on a torch.distributed process group (torch >= 2.4 for torch.compile).\n")


def record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True, help="the wheel to write (exactcoll-<version>-<tag>.whl)")
    parser.add_argument("--header", required=True, help="include/exactcoll/exactcoll.h")
    parser.add_argument("--library", required=True, help="libexactcoll.so")
    parser.add_argument("sources", nargs="+", help="the package's .py files (python/exactcoll/*.py)")
    args = parser.parse_args()

    header = pathlib.Path(args.header).read_bytes()
    version = header_version(header.decode())
    expected = f"exactcoll-{version}-{_TAG}.whl"
    if pathlib.Path(args.out).name != expected:
        sys.exit(f"build_wheel: the header says version {version}, so the wheel must be named {expected}, "
                 f"not {pathlib.Path(args.out).name} (update python/BUILD)")

    files = []  # (name in the wheel, bytes, mode)
    for source in sorted(args.sources, key=lambda p: pathlib.Path(p).name):
        files.append((f"exactcoll/{pathlib.Path(source).name}", pathlib.Path(source).read_bytes(), 0o644))
    files.append(("exactcoll/libexactcoll.so", pathlib.Path(args.library).read_bytes(), 0o755))
    files.append(("exactcoll/include/exactcoll/exactcoll.h", header, 0o644))
    dist_info = f"exactcoll-{version}.dist-info"
    files.append((f"{dist_info}/METADATA", metadata(version).encode(), 0o644))
    files.append((f"{dist_info}/WHEEL", (f"Wheel-Version: 1.0\nGenerator: exactcoll build_wheel.py\n"
                                         f"Root-Is-Purelib: false\nTag: {_TAG}\n").encode(), 0o644))
    files.append((f"{dist_info}/top_level.txt", b"exactcoll\n", 0o644))
    record = "\n".join([record_line(name, data) for name, data, _ in files] + [f"{dist_info}/RECORD,,", ""])
    files.append((f"{dist_info}/RECORD", record.encode(), 0o644))

    with zipfile.ZipFile(args.out, "w", compression=zipfile.ZIP_DEFLATED) as wheel:
        for name, data, mode in files:
            info = zipfile.ZipInfo(name, date_time=_EPOCH)
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            wheel.writestr(info, data)


if __name__ == "__main__":
    main()

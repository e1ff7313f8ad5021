#!/usr/bin/env bash
# Installs, with apt-get, whatever the build needs and this Debian 12 machine lacks. Idempotent:
# installs nothing when everything is present. Sourced by tools/demo.sh, tools/test.sh and .ci/run.
set -euo pipefail

exactcoll_missing_packages() {
  local missing=()
  command -v bazel >/dev/null 2>&1 || missing+=(bazel-bootstrap)
  [ -d /usr/share/bazel/rules/java ] || missing+=(bazel-rules-java)
  # g++ brings libasan8 and libubsan1 (through gcc-12 -> libgcc-12-dev): --config=asan needs no more.
  command -v g++ >/dev/null 2>&1 || missing+=(g++)
  [ -f /usr/include/eigen3/Eigen/Core ] || missing+=(libeigen3-dev)
  [ -f /usr/include/boost/asio.hpp ] || missing+=(libboost-dev)
  [ -f /usr/include/gtest/gtest.h ] || missing+=(libgtest-dev)
  [ -f /usr/include/gmock/gmock.h ] || missing+=(libgmock-dev)
  [ -f /usr/include/benchmark/benchmark.h ] || missing+=(libbenchmark-dev)
  [ -f /usr/include/png.h ] || missing+=(libpng-dev)
  # CI's format check (tools/format.sh --check) against .clang-format.
  command -v clang-format >/dev/null 2>&1 || missing+=(clang-format)
  # The Python package's tests: Debian's python3 with numpy, and pip to install the wheel.
  [ -x /usr/bin/python3 ] || missing+=(python3)
  /usr/bin/python3 -c "import numpy" >/dev/null 2>&1 || missing+=(python3-numpy)
  /usr/bin/python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
  # torch (Debian's, CPU only) for the torch-facing Python tests that need no GPU.
  /usr/bin/python3 -c "import torch" >/dev/null 2>&1 || missing+=(python3-torch)
  echo "${missing[@]:-}"
}

exactcoll_ensure_deps() {
  local missing
  missing=$(exactcoll_missing_packages)
  if [ -n "${missing// /}" ]; then
    echo "exactcoll: installing missing Debian packages: $missing" >&2
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq $missing >&2
  fi
}

exactcoll_ensure_deps

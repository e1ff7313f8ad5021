#!/usr/bin/env bash
# The whole test suite on a CPU-only machine: installs what is missing, builds every target (the
# CUDA ones too when a toolkit is present) and runs every test not tagged `gpu`.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/ensure_deps.sh
exec bazel test //... "$@"

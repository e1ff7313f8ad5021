#!/usr/bin/env bash
# The main job, on CPU: the AITER case (bf16, hidden 4096, 4 ranks) through `exactcoll layers`,
# canonical contract against f32_residual (the fused kernels' bug class that AITER PR 2586 fixed):
# the per-layer drift is printed and plotted to out/aiter_drift.svg.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/ensure_deps.sh
mkdir -p out
exec bazel run //tools:exactcoll -- layers --contract f32_residual --plot out/aiter_drift.svg "$@"

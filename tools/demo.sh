#!/usr/bin/env bash
# The main job, on CPU: a small all-reduce of 4 simulated ranks under the rounding contract.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/ensure_deps.sh
exec bazel run //tools:exactcoll -- sim allreduce --ranks 4 --dtype bf16 --count 16 --seed 1 "$@"

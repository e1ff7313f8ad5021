#!/usr/bin/env bash
# Runs ce_sm_probe on all visible GPUs (CUDA_VISIBLE_DEVICES as given), then on GPUs 0,1 only.
# Output goes to the terminal and, when $OUT is set, also to "$OUT/probe.log".
# Arguments are passed to the probe (e.g. --gate or --stagger-us 20).
# Each run is capped by `timeout` on top of the probe's own 30 s watchdog, in case the process
# itself cannot exit (e.g. a stuck driver call the watchdog cannot see).
set -uo pipefail

# The binary: $PROBE, default .gpubin/probe/ce_sm_probe (built here, carried to the GPU machine:
# docs/contributing.md).
probe="${PROBE:-.gpubin/probe/ce_sm_probe}"
log=/dev/null
if [[ -n "${OUT:-}" ]]; then
  mkdir -p "$OUT"
  log="$OUT/probe.log"
  : >"$log"
fi

probe_args=("$@")
status=0
run_probe() {
  local label="$1"
  shift
  echo "=== ce_sm_probe ${probe_args[*]} on $label ${*:-} ===" | tee -a "$log"
  env "$@" timeout -k 5 120 "$probe" "${probe_args[@]}" 2>&1 | tee -a "$log"
  local rc=${PIPESTATUS[0]}
  echo "=== $label: exit $rc ===" | tee -a "$log"
  if [[ $rc -ne 0 ]]; then status=$rc; fi
}

nvidia-smi -L 2>&1 | tee -a "$log"
run_probe "all visible GPUs"
run_probe "two GPUs" CUDA_VISIBLE_DEVICES=0,1
exit "$status"

# Sourced by the device scripts that run phases on a lent GPU machine (device_run_backend.sh,
# device_run_tree.sh, device_run_compare.sh): the environment every phase needs (no NVLink
# multicast, the carried library, the wheel installed into /tmp/site), and three helpers over
# $PHASES and $LOGS:
#   has PHASE                 whether PHASE is in the comma list $PHASES
#   run NAME TIMEOUT CMD...   CMD into $LOGS/NAME.log under a timeout, pass/fail recorded, its
#                             last $RUN_TAIL_LINES lines (default 3) printed
#   record NAME TEXT          one row of the table the script prints last ("${rows[@]}")
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=$PWD/.gpubin:${LD_LIBRARY_PATH:-} PYTHONUNBUFFERED=1
has() { [[ ",$PHASES," == *",$1,"* ]]; }
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpubin/exactcoll-*.whl && export PYTHONPATH=/tmp/site
declare -a rows
record() { rows+=("$(printf '%-34s %s' "$1" "$2")"); }
run() {
  local name=$1 limit=$2
  shift 2
  timeout "$limit" "$@" > "$LOGS/$name.log" 2>&1
  local code=$?
  record "$name" "$([ $code -eq 0 ] && echo pass || echo "FAIL (exit $code)")"
  tail -n "${RUN_TAIL_LINES:-3}" "$LOGS/$name.log"
}

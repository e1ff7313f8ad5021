#!/usr/bin/env bash
# Two builds of the GPU commands, the same bits: runs `gpu <op>` for every op, algorithm and call
# variant (staged, --registered, --graph) with an OLD and a NEW exactcoll_gpu, and compares the
# sha256s their summary lines end with. A refactor of the commands must change none of them.
#   usage: tools/gpu/same_bits_check.sh OLD NEW [nproc ...]    (default nproc: 1 2; ranks above
#   the GPU count share GPUs). DTYPES (default "bf16 fp32") and VARIANTS (default "staged
#   registered graph") narrow the cases; each case is two jobs of about a second or two.
# Prints a PASS/FAIL line per case and a count last; exit 1 when any case differs or fails.
set -uo pipefail
OLD=$1
NEW=$2
shift 2
NPROCS=${*:-1 2}
export NCCL_NVLS_ENABLE=0
fail=0
pass=0
sha() { timeout 120 "$@" 2>&1 | grep -o 'sha256 [0-9a-f]*' | tr '\n' ' '; }
check() {  # check LABEL ARGS...: the same command with both binaries
  local label=$1
  shift
  local a b
  a=$(sha "$OLD" "$@")
  b=$(sha "$NEW" "$@")
  if [ -n "$a" ] && [ "$a" = "$b" ]; then
    pass=$((pass + 1))
  else
    echo "FAIL $label: old '$a' new '$b'"
    fail=$((fail + 1))
  fi
}
for n in $NPROCS; do
  for d in ${DTYPES:-bf16 fp32}; do
    for variant in ${VARIANTS:-staged registered graph}; do
      v=""
      [ "$variant" = staged ] || v="--$variant"
      for a in one_shot two_shot push_one_shot push_two_shot lamport_one_shot lamport_two_shot auto; do
        check "allreduce n=$n $d $a $v" gpu allreduce --nproc "$n" --dtype "$d" --count 4099 --seed 7 --algo "$a" $v
      done
      check "reduce_scatter n=$n $d $v" gpu reduce_scatter --nproc "$n" --dtype "$d" --count $((4096 * n)) --seed 7 $v
      for a in direct copy_engine auto; do
        check "allgather n=$n $d $a $v" gpu allgather --nproc "$n" --dtype "$d" --count 1001 --seed 7 --algo "$a" $v
      done
      for a in one_stage one_stage_reg push_one_stage lamport_one_stage lamport_two_stage two_stage gather_norm unfused auto; do
        check "fused_rmsnorm n=$n $d $a $v" gpu fused_rmsnorm --nproc "$n" --dtype "$d" --rows 7 --hidden 4096 \
          --seed 3 --specials --algo "$a" $v
      done
    done
  done
  echo "same_bits n=$n done: $pass equal so far, $fail differ or failed"
done
echo "same_bits: $pass cases give the same sha256s, $fail differ or failed"
[ "$fail" = 0 ]

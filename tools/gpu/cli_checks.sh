# Sourced by the device scripts (tools/gpu/device_run.sh's cli phase, device_run_allreduce.sh):
# the CLI sanity checks, each printed as a PASS or FAIL line. Needs B (exactcoll_gpu), S
# (exactcoll_sim), OUT (cli.log is appended there) and a scratch folder as $1; sets status=1 on a
# FAIL. Extra "same" checks a script wants can follow with the same function.
#   same OP RANKS DTYPE GPU_ONLY_FLAGS -- SHARED_FLAGS...: `exactcoll gpu` and `exactcoll sim` on the
#   same inputs print the same sha256.
same() {
  local op=$1 n=$2 d=$3 extra=$4; shift 5
  local a b
  a=$($S sim "$op" --ranks "$n" --dtype "$d" "$@" 2>&1 | grep -o 'sha256 [0-9a-f]*')
  b=$(timeout 120 $B gpu "$op" --nproc "$n" --dtype "$d" $extra "$@" 2>&1 | tee -a "$OUT/cli.log" | grep -o 'sha256 [0-9a-f]*')
  if [ -n "$a" ] && [ "$a" = "$b" ]; then echo "PASS gpu $op $n $d $extra $* ($a)"; else echo "FAIL gpu $op $n $d $extra $*: sim '$a' gpu '$b'"; status=1; fi
}

# gpu against sim for every op, the .npy round trip, the NCCL label and a bad input's exit code.
cli_checks() {
  local dir=$1
  same allreduce 2 bf16 "" -- --count 100003 --seed 5
  same allreduce 4 fp16 "" -- --count 777 --seed 6 --algo two_shot
  same allreduce 3 fp32 "--registered --graph" -- --count 65537 --seed 11
  same reduce_scatter 3 fp32 "" -- --count 3003 --seed 7
  same allgather 4 bf16 "--registered --graph" -- --count 4097 --seed 8
  # The tree contract: the communicator's bits against `sim --contract tree` on the same inputs.
  same allreduce 4 bf16 "" -- --count 100003 --seed 5 --contract tree
  same allreduce 3 fp16 "--registered --graph" -- --count 777 --seed 6 --algo push_one_shot --contract tree
  same reduce_scatter 4 fp32 "" -- --count 4000 --seed 7 --contract tree
  $S sim allgather --ranks 2 --dtype bf16 --count 5000 --seed 9 --output "$dir/x.npy" > /dev/null
  $S sim allreduce --ranks 2 --dtype bf16 --input "$dir/x.npy" --output "$dir/s.npy" > /dev/null
  timeout 120 $B gpu allreduce --nproc 2 --dtype bf16 --input "$dir/x.npy" --output "$dir/g.npy" >> "$OUT/cli.log" 2>&1
  if cmp "$dir/s.npy" "$dir/g.npy"; then echo "PASS gpu --input/--output: the .npy equals sim's byte for byte"; else echo "FAIL npy"; status=1; fi
  timeout 120 $B gpu allreduce --nproc 4 --dtype bf16 --count 1000 --algo nccl 2>&1 | tee -a "$OUT/cli.log" | grep -q "NOT bit-exact" \
    && echo "PASS --algo nccl is labelled not bit-exact" || { echo "FAIL nccl label"; status=1; }
  timeout 120 $B gpu allreduce --nproc 3 --dtype bf16 --input "$dir/x.npy" --output "$dir/bad.npy" >> "$OUT/cli.log" 2>&1
  local rc=$?
  if [ $rc = 2 ] && [ ! -e "$dir/bad.npy" ]; then echo "PASS a [2, …] input on 3 ranks: exit 2, no output"; else echo "FAIL bad input rc=$rc"; status=1; fi
  rm -f "$dir"/x.npy "$dir"/s.npy "$dir"/g.npy "$dir"/bad.npy
}

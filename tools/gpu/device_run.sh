#!/usr/bin/env bash
# One call on a lent GPU machine (no Bazel there): environment check, GPU tests, verify, tune and
# bench with binaries built here and carried in .gpubin/ (exactcoll_gpu, the GPU subset of the CLI,
# and collectives_gpu_test). Logs and the tuned table go to $OUT; a short table is printed last.
#   usage: tools/gpu/device_run.sh [phases]   phases: env,test,verify,tune,bench,extra,cli (default
#   env..bench; extra = all-reduce without programmatic launch at small sizes, and the
#   reduce_scatter / allgather tables; cli = `exactcoll gpu` against `exactcoll sim` (needs
#   .gpubin/exactcoll_sim from //tools/sim:exactcoll_sim): same sha256, same .npy bytes, bad input)
#   build first: bazel build //tools/gpu:exactcoll_gpu //tests/cuda_backend:collectives_gpu_test, then copy
#   both binaries from bazel-bin/ into .gpubin/ (ignored by git; name it in the device call's carry).
set -uo pipefail
PHASES=${1:-env,test,verify,tune,bench}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
B=.gpubin/exactcoll_gpu
has() { [[ ",$PHASES," == *",$1,"* ]]; }
status=0
if has env; then
  { date -u; nvidia-smi -L; nvidia-smi topo -m; ls -la /usr/lib/x86_64-linux-gnu/libnccl.so.2;
    ls /usr/lib/x86_64-linux-gnu/ | grep -i -E "cublas" | head -3; nproc; $B --help | head -3; } > "$OUT/env.log" 2>&1
  head -8 "$OUT/env.log"
fi
if has test; then
  timeout 600 .gpubin/collectives_gpu_test > "$OUT/test_verify.log" 2>&1 || status=1
  tail -4 "$OUT/test_verify.log"
fi
if has verify; then
  for n in ${VERIFY_NPROC:-2 3 4}; do
    timeout 600 $B verify --nproc "$n" --max-count "${VERIFY_MAX_COUNT:-1048579}" >> "$OUT/test_verify.log" 2>&1 || status=1
    grep -E "^verify|MISMATCH|error|never arrived" "$OUT/test_verify.log" | tail -3
  done
fi
if has tune; then
  cp cuda_backend/tuning/sm90.tsv "$OUT/sm90.tsv"
  for n in ${TUNE_NPROC:-2 4}; do
    timeout 600 $B tune --nproc "$n" --ops allreduce --output "$OUT/sm90.tsv" ${TUNE_FLAGS:-} >> "$OUT/tune.log" 2>&1 || status=1
    timeout 600 $B tune --nproc "$n" --ops reduce_scatter,allgather --output "$OUT/sm90.tsv" --quick \
      >> "$OUT/tune.log" 2>&1 || status=1
  done
  tail -2 "$OUT/tune.log"
fi
if has bench; then
  TABLE=$OUT/sm90.tsv
  [ -f "$TABLE" ] || TABLE=cuda_backend/tuning/sm90.tsv
  for n in ${BENCH_NPROC:-2 4}; do
    for op in ${BENCH_OPS:-allreduce}; do
      table_flag="--table $TABLE"  # the collectives' dispatch table; the fused op reads its own
      [ "$op" = fused_rmsnorm ] && table_flag=""
      timeout 600 $B bench --nproc "$n" --op "$op" $table_flag --json "$OUT/bench_${op}_$n.json" \
        >> "$OUT/bench.log" 2>&1 || status=1
    done
  done
  grep -A 20 "summary" "$OUT/bench.log" | grep -v "^--"
fi
if has extra; then
  TABLE=$OUT/sm90.tsv
  [ -f "$TABLE" ] || TABLE=cuda_backend/tuning/sm90.tsv
  for n in ${BENCH_NPROC:-2 4}; do
    timeout 300 $B bench --nproc "$n" --table "$TABLE" --no-pdl --no-eager --rows 1,4,16,64,256 >> "$OUT/extra.log" 2>&1 || status=1
    for op in reduce_scatter allgather; do
      timeout 300 $B bench --nproc "$n" --op "$op" --table "$TABLE" --no-eager --rows 1,4,16,64,256,1024,4096 \
        >> "$OUT/extra.log" 2>&1 || status=1
    done
  done
  grep -E "^# exactcoll|^ +[0-9]+ +[0-9.]+ +[0-9.]+ " "$OUT/extra.log" | head -60
fi
if has cli; then
  S=.gpubin/exactcoll_sim
  . tools/gpu/cli_checks.sh
  cli_checks "$OUT" 2>&1 | tee "$OUT/cli_summary.log"
  grep -q "^FAIL" "$OUT/cli_summary.log" && status=1
fi
exit $status

#!/usr/bin/env bash
# One call on a lent 4-GPU machine (no Bazel there) for issue 26 (inputs read where they lie,
# Lamport in `auto`, the fused op against the split, the comparison users run).
#   usage: tools/gpu/device_run_zero_copy.sh [phases]   phases (default check,verify,tune,bench,compare4):
#     check     python/tests/gpu_graph_in_place_check.py on 4 and 2 GPUs (every op and algorithm:
#               eager, in place, captured before and after register_graph_buffers, new input
#               values; bits against the staged communicator and the numpy contract); check2: on 2 only
#     eager     on EAGER_NPROC GPUs (default 2): that check (its eager-in-place cases included), again
#               under PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (every eager call stages), and
#               python/examples/bench_eager.py (eager in place vs staged vs NCCL), and again at the
#               small sizes with EXACTCOLL_EAGER_MIN_BYTES=0 (every size in place)
#     verify    exactcoll verify --nproc 4 (every op, algorithm and variant against the simulator)
#     tune      exactcoll tune --ops allreduce up to TUNE_MAX_BYTES (default 2 MiB, where
#               lamport_two_shot fits a default communicator's slots on 4 GPUs) on 4 and 2 GPUs,
#               merged into a copy of cuda_backend/tuning/sm90.tsv: $OUT/sm90.tsv (TUNE_NPROC: the GPU
#               counts, default "4 2")
#     bench     exactcoll bench --op allreduce on BENCH_NPROC GPUs with that table (BENCH_ALGOS, default
#               auto, both Lamport algorithms, push_one_shot, push_two_shot, two_shot, nccl; BENCH_ROWS,
#               default 1 .. 4096 rows of 8192 bf16)
#     probe     tools/gpu/probes/run_probe.sh: ce_sm_probe (carried as .gpubin/probe/ce_sm_probe) on 4 and 2 GPUs:
#               NVLink bandwidth by copy engine, by SM loads and stores, and both at once
#     fused     exactcoll bench --op fused_rmsnorm on 4 and 2 GPUs (H 2880, 4096, 8192) with
#               --write-table: $OUT/fused_table_N.tsv
#     sweep     lamport_one_stage by thread-block cluster size (1, 2, 4, 8 blocks a row) at H 2880, 4096 and
#               8192, 1, 16 and 64 rows, on SWEEP_NPROC GPUs (default 4 2) and on one GPU
#     grid16    lamport_two_stage at 16 rows of H 8192 on 4 GPUs by grid (a one-row fused table per grid:
#               128x1024 16x1024 32x512 64x128 128x128 128x256), three rounds, beside the split
#     argrid    an all-reduce algorithm by grid (ARGRID_ALGO, default lamport_two_shot; ARGRID_GRIDS, default
#               16x1024 32x512 64x256 64x512 96x256 128x256 128x512; a one-row table per grid and size)
#               at ARGRID_ROWS rows of 8192 bf16 (default 32 64: 512 KB, 1 MB) on ARGRID_NPROC GPUs
#               (default 4), two rounds, with NCCL beside it
#     spread    lamport_one_stage at 1 row of H 8192 (a cluster of 8 blocks) in 8 fresh processes on 4 GPUs
#               and 8 on one GPU: `auto` (a one-row table naming that kernel and grid) and
#               lamport_one_stage in the same process, beside the split, 100 replays: does the time
#               spread between processes or between graphs, with peers or without
#     lead      the bench's two timings side by side (each replay behind an untimed one, the default,
#               and --launch-in-span), three rounds alternating: all-reduce at 16 KB, 512 KB, 4 MB and
#               64 MB (auto, both Lamport algorithms, NCCL) and the fused op at 1 and 16 rows of H
#               8192 (auto, lamport_one_stage, the split) on 4 GPUs; lamport_one_shot at 16 KB on one
#               GPU with no peer
#     floor     tools/gpu/probes/launch_floor_probe.cu (carried as .gpubin/probe/launch_floor_probe): one
#               kernel behind the previous one in a graph by dependent loads in its prologue, and one
#               NVLink store-to-poll between GPUs 0 and 1
#     step      tools/gpu/probes/lamport_step_probe.cu (carried as .gpubin/probe/lamport_step_probe): a
#               small lamport_one_shot's kernel step by step (clock64 after each step), its variants,
#               on 1 GPU and on GPUs 0 and 1
#     ab        exactcoll binaries side by side, three rounds alternating: AB_BINARIES (default "new base":
#               new is .gpubin/exactcoll, this tree; NAME is .gpubin/exactcoll_NAME, e.g. base, a build
#               of the commit before the change): all-reduce at AB_AR_ROWS rows of 8192 bf16 (default
#               1,2,32,64: 16 KB, 32 KB, 512 KB and 1 MB; AB_AR_ALGOS, default auto and both Lamport
#               algorithms) and the fused op at 1 and 16 rows of H 8192 (auto, lamport_one_stage, the
#               split), on each of AB_NPROC's GPU counts (default "4 2 1")
#     compare4 / compare2   python/examples/compare_collectives.py on 4 / 2 GPUs (--quick with QUICK=1)
#     compare4long  the same on 4 GPUs with 100 ops per graph (--graph-ops 100 --quick --no-pinned)
#     profile   nsys per-kernel times inside the graphs: lamport_one_shot at 16 KB, two_shot at 64 MB (4 GPUs)
#     solo      one GPU, one rank: the kernels without peers, and ncu sections of the fused kernels at 1 row
#   FUSED_TABLE: a fused table the compare phases run with ($EXACTCOLL_FUSED_TABLE; default: embedded)
#   MACHINE (e.g. nvidia-h100-x4): the tables' measured_on machine (default: the GPU's name and world size)
#   BENCH_NPROC / VERIFY_NPROC (default 4): the bench / verify GPU counts; FUSED_WRITE=0: no fused table;
#   VERIFY_FLAGS: verify's flags instead of --max-count $VERIFY_MAX_COUNT (e.g. --ops fused_rmsnorm)
#   build first: bazel build //tools:exactcoll //python:wheel; copy bazel-bin/tools/exactcoll,
#   bazel-bin/python/exactcoll-*.whl and /usr/lib/x86_64-linux-gnu/libpng16.so.16 into .gpubin/.
# Logs go to $OUT/logs/ as each phase ends, packed into $OUT/logs.tgz at the end; a table is printed last.
set -uo pipefail
PHASES=${1:-check,verify,tune,bench,compare4}
OUT=${OUT:-/tmp/out}
LOGS=$OUT/logs  # under $OUT: what ran comes back even when the call runs out of time
mkdir -p "$LOGS"
RUN_TAIL_LINES=3
source tools/gpu/device_phases.sh  # has, run, record; the environment and the wheel
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > "$LOGS/gpus.txt" 2>&1
B=.gpubin/exactcoll
if has check; then
  run graph_check_4 120 torchrun --nproc-per-node 4 python/tests/gpu_graph_in_place_check.py
fi
if has check || has check2; then
  CUDA_VISIBLE_DEVICES=0,1 run graph_check_2 100 torchrun --nproc-per-node 2 python/tests/gpu_graph_in_place_check.py
fi
if has eager; then
  n=${EAGER_NPROC:-2}
  devices=$(seq -s, 0 $((n - 1)))
  CUDA_VISIBLE_DEVICES=$devices run "eager_check_$n" 150 torchrun --nproc-per-node "$n" \
    python/tests/gpu_graph_in_place_check.py
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True CUDA_VISIBLE_DEVICES=$devices run "eager_check_expandable_$n" 150 \
    torchrun --nproc-per-node "$n" python/tests/gpu_graph_in_place_check.py
  CUDA_VISIBLE_DEVICES=$devices run "bench_eager_$n" 200 torchrun --nproc-per-node "$n" python/examples/bench_eager.py
  # Where the threshold belongs: every size read in place.
  EXACTCOLL_EAGER_MIN_BYTES=0 CUDA_VISIBLE_DEVICES=$devices run "bench_eager_all_$n" 200 torchrun --nproc-per-node "$n" \
    python/examples/bench_eager.py --sizes-mib 0.25,0.5,1,2,4
fi
if has verify; then
  for n in ${VERIFY_NPROC:-4}; do
    CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((n - 1))) run "verify_$n" 200 $B verify --nproc "$n" \
      ${VERIFY_FLAGS:---max-count ${VERIFY_MAX_COUNT:-262147}}
  done
fi
if has tune; then
  cp cuda_backend/tuning/sm90.tsv "$OUT/sm90.tsv"
  for n in ${TUNE_NPROC:-4 2}; do
    CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((n - 1))) run "tune_$n" 180 $B tune --nproc "$n" --ops allreduce \
      --max-bytes "${TUNE_MAX_BYTES:-2097152}" --output "$OUT/sm90.tsv" ${MACHINE:+--machine "$MACHINE"} ${TUNE_FLAGS:-}
  done
fi
if has bench; then
  TABLE=$OUT/sm90.tsv
  [ -f "$TABLE" ] || TABLE=cuda_backend/tuning/sm90.tsv
  for n in ${BENCH_NPROC:-4}; do
    CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((n - 1))) run "bench_$n" 150 $B bench --nproc "$n" --op allreduce \
      --table "$TABLE" --no-eager --rows "${BENCH_ROWS:-1,2,32,64,256,1024,4096}" \
      --algos "${BENCH_ALGOS:-auto,lamport_one_shot,lamport_two_shot,push_one_shot,push_two_shot,two_shot,nccl}"
    grep -A 14 "summary" "$LOGS/bench_$n.log" | head -20
  done
fi
if has fused; then
  for n in 4 2; do
    CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((n - 1))) run "fused_$n" 200 $B bench --nproc "$n" --op fused_rmsnorm \
      --hidden 2880,4096,8192 --rows "${FUSED_ROWS:-1,16,64,256,512}" --no-eager --no-bound \
      $([ "${FUSED_WRITE:-1}" = 1 ] && echo --write-table "$OUT/fused_table_$n.tsv" ${MACHINE:+--machine "$MACHINE"})
    grep -A 12 "summary" "$LOGS/fused_$n.log" | head -16
  done
fi
if has probe; then
  run probe 120 bash tools/gpu/probes/run_probe.sh
  tail -n 40 "$LOGS/probe.log"
fi
if has sweep; then
  # lamport_one_stage by thread-block cluster size C (a row held by C blocks of lanes / C threads;
  # C = 1: one block of the row's lanes): a fused table per C whose lamport_one_stage rows give that
  # grid (the blocks of the eighth session's table: 3 / 4 / 8 at 1 row of H 2880 / 4096 / 8192, 45 /
  # 64 / 64 at 16 rows, 128 at 64; C capped where lanes / C would drop below 64 threads or a warp's
  # multiple), so that auto runs it beside the split; H 2880, 4096 and 8192 at 1, 16 and 64 rows on
  # SWEEP_NPROC GPUs (default 4 2), two rounds; and one GPU with no peer, 1 row of H 8192.
  sweep_table() {  # C world_size: the table on stdout
    local c=$1 n=$2 h lanes cc blocks
    for h in 2880:384:3:45 4096:512:4:64 8192:1024:8:64; do
      IFS=: read -r hidden lanes b1 b16 <<< "$h"
      cc=$c
      while (( lanes / cc < 64 || (lanes / cc) % 32 != 0 )); do cc=$((cc / 2)); done
      for rows_blocks in "1 $b1" "16 $b16" "64 128"; do
        set -- $rows_blocks
        printf 'sm90\t%d\t%d\t%d\tlamport_one_stage\t%d\t%d\t1\n' "$n" $((hidden * 2)) "$1" "$2" $((lanes / cc))
      done
    done
  }
  for c in 1 2 4 8; do
    sweep_table $c 1 > "$LOGS/cluster_c${c}_n1.tsv"
    EXACTCOLL_FUSED_TABLE=$LOGS/cluster_c${c}_n1.tsv CUDA_VISIBLE_DEVICES=0 run "cluster_solo_c$c" 60 $B bench \
      --nproc 1 --op fused_rmsnorm --hidden 8192 --rows 1 --algos auto,unfused --no-eager --no-bound
  done
  for n in ${SWEEP_NPROC:-4 2}; do
    for round in 1 2; do
      for c in 1 2 4 8; do
        sweep_table $c "$n" > "$LOGS/cluster_c${c}_n$n.tsv"
        EXACTCOLL_FUSED_TABLE=$LOGS/cluster_c${c}_n$n.tsv CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((n - 1))) \
          run "cluster_n${n}_c${c}_r$round" 100 $B bench --nproc "$n" --op fused_rmsnorm --hidden 2880,4096,8192 \
          --rows 1,16,64 --algos auto,unfused --no-eager --no-bound
      done
    done
  done
fi
if has profile; then
  # Where the time of one op goes, by kernel, inside the CUDA graphs (nsys, when the machine has it):
  # lamport_one_shot at 16 KB and two_shot at 64 MB on 4 GPUs.
  if command -v nsys > /dev/null; then
    for case in "lamport_one_shot 1" "two_shot 4096"; do
      set -- $case
      run "nsys_$1" 120 nsys profile --trace=cuda --cuda-graph-trace=node --trace-fork-before-exec=true \
        -o "$LOGS/nsys_$1" --force-overwrite true $B bench --nproc 4 --op allreduce --rows "$2" --algos "$1" \
        --no-eager --no-bound --replays 10
      nsys stats --report cuda_gpu_kern_sum --format csv "$LOGS/nsys_$1.nsys-rep" > "$LOGS/nsys_$1_kernels.csv" 2>&1
      nsys stats --report cuda_gpu_trace --format csv "$LOGS/nsys_$1.nsys-rep" 2>/dev/null | head -400 \
        > "$LOGS/nsys_$1_trace.csv"
      rm -f "$LOGS/nsys_$1.nsys-rep" "$LOGS/nsys_$1.sqlite"
      head -6 "$LOGS/nsys_$1_kernels.csv"
    done
  else
    record profile "skipped (no nsys on this machine)"
  fi
fi
if has solo; then
  # One GPU, one rank (nothing to wait for, so ncu's kernel replay works): what the kernels cost
  # without peers (lamport_one_shot, push_one_shot; lamport_one_stage, the split and its parts at 1
  # row of H 8192), then ncu's sections for the one-block fused kernel and the Lamport all-reduce.
  run solo_allreduce 60 $B bench --nproc 1 --op allreduce --rows 1,32 --algos lamport_one_shot,push_one_shot \
    --no-eager --no-bound
  run solo_fused 60 $B bench --nproc 1 --op fused_rmsnorm --hidden 8192 --rows 1 \
    --algos lamport_one_stage,push_one_stage,unfused,allreduce,norm --no-eager --no-bound
  for algo in lamport_one_stage push_one_stage; do
    run "ncu_$algo" 150 ncu --clock-control none --target-processes all --graph-profiling node \
      --kernel-name regex:fused --launch-skip 5 --launch-count 1 \
      --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
      --section SchedulerStats $B bench --nproc 1 --op fused_rmsnorm --hidden 8192 --rows 1 --algos "$algo" \
      --no-eager --no-bound --no-check --replays 2 --warmup 1
  done
  run ncu_lamport_one_shot 150 ncu --clock-control none --target-processes all --graph-profiling node \
    --kernel-name regex:collective --launch-skip 5 --launch-count 1 --section SpeedOfLight --section LaunchStats \
    --section WarpStateStats $B bench --nproc 1 --op allreduce --rows 1 --algos lamport_one_shot --no-eager \
    --no-bound --no-check --replays 2 --warmup 1
fi
if has grid16; then
  mkdir -p "$OUT/grid16"
  for round in 1 2 3; do
    for g in 128x1024 16x1024 32x512 64x128 128x128 128x256; do
      printf 'sm90\t4\t16384\t16\tlamport_two_stage\t%d\t%d\t1\n' "${g%x*}" "${g#*x}" > "$OUT/grid16/$g.tsv"
      EXACTCOLL_FUSED_TABLE=$OUT/grid16/$g.tsv run "grid16_${g}_r$round" 60 $B bench --nproc 4 --op fused_rmsnorm \
        --hidden 8192 --rows 16 --algos auto,unfused --no-eager --no-bound
    done
  done
  grep -h -A3 summary "$LOGS"/grid16_*.log | grep -E '^ +[0-9]'
fi
if has argrid; then
  mkdir -p "$LOGS/argrid"
  n=${ARGRID_NPROC:-4}
  algo=${ARGRID_ALGO:-lamport_two_shot}
  for round in 1 2; do
    for g in ${ARGRID_GRIDS:-16x1024 32x512 64x256 64x512 96x256 128x256 128x512}; do
      for r in ${ARGRID_ROWS:-32 64}; do
        printf 'sm90\t%d\tallreduce\t%d\t%s\t%d\t%d\t1\n' "$n" $((r * 16384)) "$algo" "${g%x*}" "${g#*x}"
      done > "$LOGS/argrid/$g.tsv"
      CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((n - 1))) run "argrid_${g}_r$round" 60 $B bench --nproc "$n" --op allreduce \
        --table "$LOGS/argrid/$g.tsv" --rows "$(echo ${ARGRID_ROWS:-32 64} | tr ' ' ,)" --no-eager --no-bound \
        --algos "$algo,nccl" --json "$LOGS/argrid/${g}_r$round.json"
    done
  done
  python3 - "$LOGS/argrid" <<'PY'
import collections, glob, json, re, sys
times = collections.defaultdict(list)
for f in sorted(glob.glob(sys.argv[1] + "/*.json")):
    grid = re.match(r".*/(\d+x\d+)_r\d+\.json", f).group(1)
    for r in json.load(open(f))["results"]:
        times[(r["bytes"], r["algo"], grid if r["algo"] != "nccl" else "")].append(r["time_us"])
print("argrid: us per op, two rounds each (#wrong in the logs)")
for key in sorted(times, key=lambda k: (k[0], k[1], [int(x) for x in k[2].split("x")] if k[2] else [])):
    print(f"  {key[0]:>9} B {key[1]:18} {key[2]:9} " + " ".join(f"{t:.2f}" for t in times[key]))
PY
fi
if has spread; then
  mkdir -p "$OUT/spread"
  printf 'sm90\t%d\t16384\t1\tlamport_one_stage\t8\t128\t1\n' 4 1 > "$OUT/spread/cluster8.tsv"
  for n in 4 1; do
    for round in 1 2 3 4 5 6 7 8; do
      CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((n - 1))) EXACTCOLL_FUSED_TABLE=$OUT/spread/cluster8.tsv \
        run "spread_n${n}_r$round" 60 $B bench --nproc "$n" --op fused_rmsnorm --hidden 8192 --rows 1 \
        --algos auto,lamport_one_stage,unfused --no-eager --no-bound --replays 100 \
        --json "$OUT/spread/n${n}_r$round.json"
    done
  done
  python3 - "$OUT/spread" <<'PY'
import glob, json, sys
for n in (4, 1):
    print(f"spread, {n} GPU(s): auto (cluster8 table) / lamport_one_stage / unfused, us, one line a process")
    for f in sorted(glob.glob(f"{sys.argv[1]}/n{n}_r*.json")):
        t = {r["algo"]: r["time_us"] for r in json.load(open(f))["results"] if r["mode"] == "graph"}
        print("  " + " / ".join(f"{t.get(a, float('nan')):.2f}" for a in ("auto", "lamport_one_stage", "unfused")))
PY
fi
if has floor; then
  run floor 120 timeout -k 5 110 .gpubin/probe/launch_floor_probe
  cat "$LOGS/floor.log"
fi
if has step; then
  run step 120 timeout -k 5 110 .gpubin/probe/lamport_step_probe
  grep -v "^    " "$LOGS/step.log"
fi
if has ab; then
  mkdir -p "$LOGS/ab"  # in the logs archive: a call returns only so many files
  binaries=(${AB_BINARIES:-new base})
  for round in 1 2 3; do
    for binary in "${binaries[@]}"; do
      exe=$B
      [ "$binary" = new ] || exe=.gpubin/exactcoll_$binary
      for n in ${AB_NPROC:-4 2 1}; do
        devices=$(seq -s, 0 $((n - 1)))
        CUDA_VISIBLE_DEVICES=$devices run "ab_ar_${binary}_n${n}_r$round" 60 $exe bench --nproc "$n" --op allreduce \
          --rows ${AB_AR_ROWS:-1,2,32,64} --no-eager --no-bound --algos ${AB_AR_ALGOS:-auto,lamport_one_shot,lamport_two_shot} \
          --json "$LOGS/ab/ar_${binary}_n${n}_r$round.json"
        CUDA_VISIBLE_DEVICES=$devices run "ab_fused_${binary}_n${n}_r$round" 60 $exe bench --nproc "$n" \
          --op fused_rmsnorm --hidden 8192 --rows 1,16 --no-eager --no-bound --algos auto,lamport_one_stage,unfused \
          --json "$LOGS/ab/fused_${binary}_n${n}_r$round.json"
      done
    done
  done
  python3 - "$LOGS/ab" "${binaries[@]}" <<'PY'
import collections, glob, json, re, sys
binaries = sys.argv[2:]
times = collections.defaultdict(list)
wrong = unchecked = 0
for f in sorted(glob.glob(sys.argv[1] + "/*.json")):
    kind, binary = re.match(r".*/(ar|fused)_(\w+)_n\d+_r\d+\.json", f).groups()
    for r in json.load(open(f))["results"]:
        times[(kind, r["ranks"], r["bytes"], r["algo"], binary)].append(r["time_us"])
        if r["wrong"] is None:
            unchecked += 1
        else:
            wrong += r["wrong"]
print(f"ab: us per op, three rounds each ({' | '.join(binaries)}); #wrong over every result {wrong}, unchecked {unchecked}")
for key in sorted({k[:4] for k in times}):
    row = [" ".join(f"{t:.2f}" for t in times[key + (binary,)]) for binary in binaries]
    print(f"  {key[0]:5} n={key[1]} {key[2]:>9} B {key[3]:18} " + " | ".join(f"{r:17}" for r in row))
PY
fi
if has lead; then
  mkdir -p "$OUT/lead"
  for round in 1 2 3; do
    for timing in lead span; do
      span=()
      [ "$timing" = span ] && span=(--launch-in-span)
      run "lead_ar_${timing}_r$round" 60 $B bench --nproc 4 --op allreduce --rows 1,32 --no-eager \
        --no-bound --algos auto,lamport_one_shot,lamport_two_shot,nccl "${span[@]}" \
        --json "$OUT/lead/ar_${timing}_r$round.json"
      run "lead_arlarge_${timing}_r$round" 60 $B bench --nproc 4 --op allreduce --rows 256,4096 --no-eager \
        --no-bound --algos auto,nccl "${span[@]}" --json "$OUT/lead/arlarge_${timing}_r$round.json"
      run "lead_fused_${timing}_r$round" 60 $B bench --nproc 4 --op fused_rmsnorm --hidden 8192 --rows 1,16 \
        --no-eager --no-bound --algos auto,lamport_one_stage,unfused "${span[@]}" \
        --json "$OUT/lead/fused_${timing}_r$round.json"
      CUDA_VISIBLE_DEVICES=0 run "lead_solo_${timing}_r$round" 60 $B bench --nproc 1 --op allreduce --rows 1 \
        --no-eager --no-bound --algos lamport_one_shot "${span[@]}" --json "$OUT/lead/solo_${timing}_r$round.json"
    done
  done
  python3 - "$OUT/lead" <<'PY'
import collections, glob, json, re, sys
times = collections.defaultdict(list)
for f in sorted(glob.glob(sys.argv[1] + "/*.json")):
    kind, timing = re.match(r".*/(\w+?)_(lead|span)_r\d+\.json", f).groups()
    for r in json.load(open(f))["results"]:
        times[(kind, r["ranks"], r["bytes"], r["algo"], timing)].append(r["time_us"])
print("lead: us per op, three rounds each (behind an untimed launch | --launch-in-span)")
for key in sorted({k[:4] for k in times}):
    row = [" ".join(f"{t:.2f}" for t in times[key + (timing,)]) for timing in ("lead", "span")]
    print(f"  {key[0]:5} n={key[1]} {key[2]:>9} B {key[3]:18} {row[0]:28} | {row[1]}")
PY
fi
quick=()
[ "${QUICK:-0}" = 1 ] && quick=(--quick)
[ -n "${FUSED_TABLE:-}" ] && export EXACTCOLL_FUSED_TABLE=$FUSED_TABLE
for n in 4 2; do
  if has "compare$n"; then
    CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((n - 1))) run "compare_$n" "${COMPARE_TIMEOUT:-240}" torchrun \
      --nproc-per-node "$n" python/examples/compare_collectives.py --out "$LOGS/compare_$n" --child-timeout 120 \
      "${quick[@]}"
    [ -f "$LOGS/compare_$n/results.json" ] && cp "$LOGS/compare_$n/results.json" "$OUT/compare_$n.json"
  fi
done
if has compare4long; then
  # 100 ops per graph (a decode graph's one or two all-reduces per layer), the fewer sizes, no pinned NCCL.
  run compare_4_ops100 "${COMPARE_TIMEOUT:-240}" torchrun --nproc-per-node 4 python/examples/compare_collectives.py \
    --out "$LOGS/compare_4_ops100" --graph-ops 100 --quick --no-pinned
fi

echo "== device_run_zero_copy: $(date -u +%FT%TZ), $(nvidia-smi -L | head -1 | cut -c1-40)"
for n in 4 2; do
  [ -f "$LOGS/compare_$n.log" ] && sed -n '/^compare_collectives results:/,$p' "$LOGS/compare_$n.log" | head -80
done
[ -f "$LOGS/compare_4_ops100.log" ] && sed -n '/^compare_collectives results:/,/^### Bits/p' "$LOGS/compare_4_ops100.log"
grep -h "gpu_graph_in_place_check\|FAIL" "$LOGS"/graph_check_*.log "$LOGS"/eager_check_*.log 2>/dev/null | head -12
for f in "$LOGS"/bench_eager_*.log; do [ -f "$f" ] && sed -n '/^| op /,$p' "$f"; done
printf '%s\n' "${rows[@]}"
# One archive instead of many files (what comes back from a device call is counted by file); a call
# that runs out of time leaves the logs folder as it was.
tar -czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$LOGS"

#!/usr/bin/env bash
# The false-alarm table of every op of any shape on one GPU (benchmarks/shaped_false_alarms.py),
# run from the repo root on a machine with one GPU and 16 cores:
#     bash benchmarks/gpu_false_alarms.sh [DEADLINE]        (seconds, default 480)
# One background process per (op, dtype) of gradcheck_bi.ops.SHAPED × fp64, fp32, bf16, each
# `--device cuda --n $N --deadline DEADLINE` on one thread, its rows in $OUT/fa/<op>-<dtype>.json
# and its progress in the .log beside it; then the merged table (benchmarks/merge_false_alarms.py,
# exit 1 on any false alarm). A process draws no configuration past DEADLINE seconds from its
# start (the smallest defect, measured first, included), and its row counts the ones it
# completed; the smallest defect stops at a quarter of DEADLINE and says so. Environment:
#   N=200                  configurations per op and dtype
#   ROWS="op:dtype …"      the CUDA rows to run (default: every op × fp64 fp32 bf16); to run
#                          a row again (more shards, a longer deadline), give it alone with a
#                          new OUT: the merge refuses the same shard twice
#   SHARDS="op:dtype:K …"  split a row's N configurations over K processes (--shard I/K;
#                          files <op>-<dtype>-s<I>.json); the default splits the fused linear
#                          cross-entropy, whose correct kernel walks the rows in Python
#                          (8.6 and 3.9 s a configuration in fp64 and fp32 on one CPU core)
#   CPU_OPS="op:dtype …"   the same rows also with --device cpu (files <op>-<dtype>-cpu*.json),
#                          for CPU rows too slow for a small machine
#   OUT=out
set -u
DEADLINE=${1:-480}
N=${N:-200}
OUT=${OUT:-out}
SHARDS=${SHARDS:-"fused_linear_cross_entropy:fp64:6 fused_linear_cross_entropy:fp32:3"}
CPU_OPS=${CPU_OPS:-}
LIMIT=$((DEADLINE + 100))  # a process past this is killed: its row is missing, and said so
mkdir -p "$OUT/fa"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
OPS=$(python -c "from gradcheck_bi.ops import SHAPED; print(' '.join(SHAPED))") || exit 2
shards() {  # op dtype: its K (1 unless SHARDS names it)
  local s
  for s in $SHARDS; do
    [[ $s == "$1:$2:"* ]] && { echo "${s##*:}"; return; }
  done
  echo 1
}
pids=()
start() {  # device op dtype: one process per shard, in the background
  local device=$1 op=$2 dtype=$3 k i name
  k=$(shards "$op" "$dtype")
  for ((i = 0; i < k; i++)); do
    name=$op-$dtype
    [[ $device == cpu ]] && name+=-cpu
    ((k > 1)) && name+=-s$i
    timeout "$LIMIT" python benchmarks/shaped_false_alarms.py --ops "$op" --dtypes "$dtype" \
      --device "$device" --n "$N" --deadline "$DEADLINE" --shard "$i/$k" \
      --json "$OUT/fa/$name.json" >"$OUT/fa/$name.log" 2>&1 &
    pids+=($!)
  done
}
if [[ -z ${ROWS:-} ]]; then
  ROWS=$(for op in $OPS; do printf '%s ' "$op:fp64" "$op:fp32" "$op:bf16"; done)
fi
t0=$SECONDS
for row in $ROWS; do
  start cuda "${row%%:*}" "${row##*:}"
done
for row in $CPU_OPS; do
  start cpu "${row%%:*}" "${row##*:}"
done
echo "${#pids[@]} processes, deadline $DEADLINE s, N $N, commit $(git describe --always --dirty 2>/dev/null || echo unknown)"
for p in "${pids[@]}"; do wait "$p"; done
echo "all done in $((SECONDS - t0)) s"
for log in "$OUT"/fa/*.log; do  # a process that left no rows: its last lines
  [[ -s ${log%.log}.json ]] || { echo "=== no rows from $log:"; tail -5 "$log"; }
done
python benchmarks/merge_false_alarms.py "$OUT"/fa/*.json

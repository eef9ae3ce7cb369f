#!/usr/bin/env bash
# Issue 20, more GPU evidence in one call on a lent H200 (no timing is read: runs in parallel):
# the family's false alarms on CUDA (200 random configurations per op, fp32/bf16/fp16), Liger's
# fused add in bf16 through its named adapter (casting mode llama) and as a raw Function in
# casting mode gemma (zero glue: recognised from its parameter names, --kernel-arg only for
# the mode), each over cases/family.toml and the default sweep; a count by check and status
# of every JSON report.
#   OUT=/some/dir WHL=.whl bash benchmarks/gpu_family_extras.sh
set -u
WHL=${WHL:-.whl}
python3 -m pip install -q --no-deps --no-index --target /tmp/site "$WHL"/liger_kernel-*.whl
export PYTHONPATH=$PWD:/tmp/site
raw=liger_kernel.ops.fused_add_rms_norm:LigerFusedAddRMSNormFunction
gemma=(--kernel "$raw" --kernel-arg casting_mode=gemma --kernel-arg in_place=false)
run() {  # run NAME ARGS...
  local name=$1; shift
  local t0=$(date +%s%N)
  timeout 420 python3 -m gradcheck_bi run --device cuda --no-progress "$@" > "$OUT/$name.txt" 2> "$OUT/$name.err"
  echo "exit $? wall $(( ($(date +%s%N) - t0) / 1000000 )) ms :: gradcheck-bi run --device cuda $*" >> "$OUT/$name.err"
}
alarms() {  # alarms DTYPE
  timeout 480 python3 benchmarks/op_false_alarms.py 200 --dtypes "$1" --device cuda \
    > "$OUT/false_alarms_$1.txt" 2> "$OUT/false_alarms_$1.err"
  echo "exit $?" >> "$OUT/false_alarms_$1.err"
}
for dt in fp32 bf16 fp16; do alarms $dt & done
run family_liger_fused_add_bf16 --case cases/family.toml --kernel liger:fused_add --dtype bf16 --format json &
run default_liger_fused_add_bf16 --kernel liger:fused_add --dtype bf16 --format text &
run family_gemma_fused_add_bf16 --case cases/family.toml "${gemma[@]}" --dtype bf16 --format json &
run default_gemma_fused_add_bf16 "${gemma[@]}" --dtype bf16 --format text &
run family_gemma_fused_add_fp32 --case cases/family.toml "${gemma[@]}" --dtype fp32 --format json &
wait
python3 - "$OUT" <<'PY' > "$OUT/counts.txt"
import collections, json, pathlib, sys
for p in sorted(pathlib.Path(sys.argv[1]).glob("family_*.txt")):
    try:
        results = json.loads(p.read_text())["results"]
    except Exception as e:
        print(p.stem, "unreadable:", e); continue
    c = collections.Counter((r["check"], r["status"]) for r in results)
    print(p.stem, len(results), "results:", ", ".join(f"{k[0]} {k[1]} {v}" for k, v in sorted(c.items())))
PY

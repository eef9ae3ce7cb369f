#!/usr/bin/env bash
# Losses on a GPU in one call (≤ 9 minutes; every command under `timeout`), run from the
# repo root:   bash benchmarks/gpu_losses.sh
# wheels/ (not in the repo) holds liger_kernel-0.8.5-py3-none-any.whl. Prints, per command,
# the tail of its table and its exit code and seconds; JSON reports go to $OUT.
#   1. Liger 0.8.5's LigerCrossEntropyFunction by zero glue, fp32 and bf16, as it is (it
#      writes its gradient into the logits: a mutation fail) and with --allow-mutation logits;
#   2. LigerFusedLinearCrossEntropyFunction by zero glue, fp32 and bf16;
#   3. every loss mutant of tests/kernels on cuda fp32 (the bf16 rounding one in bf16):
#      caught where it shows, passing at its blind control (benchmarks/gpu_loss_mutants.py).
set -u
OUT=${OUT:-out}
LIMIT=${LIMIT:-55}  # seconds per Liger run: 6 runs + the mutants (150 s) stay under 9 min
mkdir -p "$OUT"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
python -m pip install -q --no-deps wheels/liger_kernel-0.8.5-py3-none-any.whl 2>&1 \
  | grep -v WARNING | tail -1
CE=liger_kernel.ops.cross_entropy:LigerCrossEntropyFunction
FLCE=liger_kernel.ops.fused_linear_cross_entropy:LigerFusedLinearCrossEntropyFunction
one() {  # a name, then run's arguments: the failures and the verdict, exit code, seconds
  local name=$1; shift
  echo "=== $name: gradcheck-bi run $*"
  local t0=$SECONDS
  timeout "$LIMIT" python -m gradcheck_bi run "$@" --no-progress --format json \
    --output "$OUT/$name.json" >/dev/null 2>"$OUT/$name.err"
  local rc=$?
  python - "$OUT/$name.json" <<'EOF' 2>/dev/null || tail -4 "$OUT/$name.err"
import collections, json, sys
report = json.load(open(sys.argv[1]))
results = report["results"]
print(" ", dict(collections.Counter(r["status"] for r in results)), len(results), "results")
for r in [r for r in results if r["status"] != "pass"][:8]:
    print("  ", r["status"], r["check"], r.get("layout", ""), r.get("details", {}).get(
        "variant", ""), "|", (r.get("message") or "")[:150])
EOF
  echo "=== $name: exit $rc in $((SECONDS - t0)) s"
}
one liger_ce_fp32 --kernel "$CE" --device cuda --dtype fp32
one liger_ce_bf16 --kernel "$CE" --device cuda --dtype bf16
one liger_ce_fp32_mut --kernel "$CE" --device cuda --dtype fp32 --allow-mutation logits
one liger_ce_bf16_mut --kernel "$CE" --device cuda --dtype bf16 --allow-mutation logits
one liger_flce_fp32 --kernel "$FLCE" --device cuda --dtype fp32
one liger_flce_bf16 --kernel "$FLCE" --device cuda --dtype bf16
echo "=== loss mutants of tests/kernels on cuda"
t0=$SECONDS
timeout 150 python benchmarks/gpu_loss_mutants.py --device cuda --dtype fp32 2>&1 | tail -24
echo "=== loss mutants: exit ${PIPESTATUS[0]} in $((SECONDS - t0)) s"

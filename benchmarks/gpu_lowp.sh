#!/usr/bin/env bash
# Issue 13 on the lent GPU: the bf16/fp16 audit of real kernels and the false-alarm run.
#   OUT=/some/dir WHL=/path/to/.whl bash benchmarks/gpu_lowp.sh
# * Megatron-Core 0.19.2's BatchInvariantRMSNormFn, as shipped and with the fix's two changes
#   (the +1 of zero_centered_gamma after the fp32 cast in the forward; the variance term of dx
#   without the second weight) applied to a scratch copy in /tmp — never to this repository;
# * Liger-Kernel 0.8.5's RMSNorm per casting mode (llama, gemma, none) in bf16 and fp16;
# * the bundled kernels in bf16 on CUDA, and 200 random bf16/fp16 configurations of the
#   correct kernels (benchmarks/gpu_false_alarms.py).
# Writes at most six files to $OUT (the lent box returns eight).
set -u
WHL=${WHL:-.whl}
python3 -m pip install -q --no-deps --no-index --target /tmp/site "$WHL"/liger_kernel-0.8.5-py3-none-any.whl
python3 -m zipfile -e "$WHL"/megatron_core-0.19.2-*.whl /tmp/mcore
SRC=/tmp/mcore/megatron/core/transformer/custom_layers/batch_invariant_kernels.py
python3 - "$SRC" /tmp/megatron_fixed.py <<'PY'
import re, sys
s = open(sys.argv[1]).read()
# Forward: add 1 to the fp32 weight under zero_centered_gamma (the first w_fp32 assignment).
fwd = re.search(r"\n( +)w_fp32 = weight\.to\([^\n]*\n", s)
assert fwd is not None
pad = fwd.group(1)
s = (s[:fwd.end()] + f"{pad}if zero_centered_gamma:\n{pad}    w_fp32 = w_fp32 + 1.0\n"
     + s[fwd.end():])
# Backward: the variance term's coefficient is r³, not w·r³.
assert s.count("(w_fp32 * r3)") == 1
s = s.replace("(w_fp32 * r3)", "r3")
open(sys.argv[2], "w").write(s)
PY
export PYTHONPATH=$PWD:/tmp/site
MEG=$SRC:BatchInvariantRMSNormFn
FIX=/tmp/megatron_fixed.py:BatchInvariantRMSNormFn
G=(python3 -m gradcheck_bi run --device cuda --no-progress)
mkdir -p /tmp/j
summ() {  # summ FILE.json: per kernel/dtype/check the statuses, then each distinct diagnosis
  python3 - "$1" <<'PY'
import collections, json, sys
d = json.load(open(sys.argv[1]))
c = collections.Counter((r["kernel"].rsplit("/", 1)[-1], r["dtype"], r["check"], r["status"])
                        for r in d["results"])
for k, n in sorted(c.items()):
    print(" ".join(k), n)
seen = collections.Counter()
for r in d["results"]:
    if r["status"] == "fail":
        key = (r["check"], r["message"].split(" (worst")[0].split(", median")[0][:90])
        seen[key] += 1
        if seen[key] == 1:
            s = "x".join(map(str, r["shape"]))
            print(f"- {r['check']} {s} x·{r['input_scale']:g} γ·{r['weight_scale']:g} "
                  f"γ={r['weight']} zcg={r['zero_centered_gamma']}: {r['message']}")
PY
}
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
} > "$OUT/env.txt" 2>&1

"${G[@]}" --kernel "$FIX" --kernel "$MEG" --dtype bf16 --format markdown > "$OUT/megatron_bf16.md" 2>&1 &
"${G[@]}" --case cases/ci.toml --kernel "$FIX" --dtype bf16 --format json --output /tmp/j/meg_ci_bf16.json > /dev/null 2>&1 &
"${G[@]}" --kernel liger --kernel liger:gemma --kernel liger:none --dtype bf16 --format markdown > "$OUT/liger_bf16.md" 2>&1 &
for k in liger liger:gemma liger:none; do
  for dt in bf16 fp16; do
    "${G[@]}" --case cases/ci.toml --kernel "$k" --dtype $dt --format json --output "/tmp/j/ci_${k/:/_}_$dt.json" > /dev/null 2>&1 &
  done
done
"${G[@]}" --dtype bf16 --format markdown > "$OUT/bundled_bf16.md" 2>&1 &
wait
if [ -z "${SKIP_FALSE_ALARMS:-}" ]; then  # SKIP_FALSE_ALARMS=1: only the kernels' audits
  timeout 400 python3 benchmarks/gpu_false_alarms.py 200 --dtype bf16 --dtype fp16 \
    > "$OUT/false_alarms.md" 2> /tmp/j/fa.err
  echo "exit $?" >> "$OUT/false_alarms.md"
fi
for f in /tmp/j/*.json; do echo "== $(basename "$f")"; summ "$f"; done > "$OUT/ci_summaries.txt" 2>&1
tail -n 2 /tmp/j/fa.err >> "$OUT/env.txt" 2> /dev/null
tail -n 5 "$OUT"/*.md "$OUT/ci_summaries.txt" | head -150

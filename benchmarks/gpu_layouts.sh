#!/usr/bin/env bash
# Issue 21 on the lent GPU: the bundled kernels, Megatron-Core's Function (from its wheel),
# Liger's RMSNorm (in_place=False, and liger:inplace whose declared write into grad_output
# must show as a note) and torch's rms_norm under every memory layout, fp32 and bf16.
#   OUT=/some/dir WHL=.whl bash benchmarks/gpu_layouts.sh
set -u
WHL=${WHL:-.whl}
python3 -m pip install -q --no-deps --no-index --target /tmp/site "$WHL"/liger_kernel-0.8.5-py3-none-any.whl
python3 -m zipfile -e "$WHL"/megatron_core-0.19.2-*.whl /tmp/mcore
export PYTHONPATH=$PWD:/tmp/site
MEG=/tmp/mcore/megatron/core/transformer/custom_layers/batch_invariant_kernels.py:BatchInvariantRMSNormFn
LAY=contiguous,x-strided,x-transposed,x-offset,weight-strided,weight-offset,grad-strided,grad-transposed,grad-offset
KERNELS=before,after,torch,liger,liger:inplace,$MEG
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/layouts.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$OUT/layouts.txt"
git log -1 --format='commit %h %cd' >> "$OUT/layouts.txt" 2>/dev/null || true
for dt in fp32 bf16; do
  t0=$(date +%s)
  timeout 280 python3 -m gradcheck_bi run --device cuda --dtype "$dt" --kernel "$KERNELS" \
      --layout "$LAY" --shape 4,8,512 --shape 2,2,3,256 --check forward,dx,dw \
      --no-progress --format json --output "$OUT/layouts_$dt.json" > "$OUT/layouts_$dt.log" 2>&1
  echo "== $dt: exit $? in $(( $(date +%s) - t0 )) s" >> "$OUT/layouts.txt"
  tail -n 12 "$OUT/layouts_$dt.log" >> "$OUT/layouts.txt"
  python3 - "$OUT/layouts_$dt.json" >> "$OUT/layouts.txt" <<'PY'
import json, sys
from collections import Counter
doc = json.load(open(sys.argv[1]))
rows = Counter()
for r in doc["results"]:
    k = r["kernel"].rsplit("/", 1)[-1]
    ok = "as expected" if r["as_expected"] else "NOT as expected"
    rows[(k, r["layout"], r["status"], ok)] += 1
for (k, lay, st, ok), n in sorted(rows.items()):
    print(f"{k:45s} {lay:16s} {st:12s} {ok:16s} {n}")
notes = sorted({m for r in doc["results"] for m in r.get("details", {}).get("declared_mutation", [])})
print("declared mutations noted:", notes)
PY
done

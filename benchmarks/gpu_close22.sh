#!/usr/bin/env bash
# Issue 22, session 7, one call on a lent H200: what a fresh Liger process spends before
# gradcheck-bi runs (imports, -X importtime by top-level package), the CLI's own start, and
# the fp16 false alarms of all three family ops after the tie rule (13da0e6).
#   bash benchmarks/gpu_close22.sh OUTDIR
set -u
out=${1:?OUTDIR}
export PYTHONPATH=.
{
  echo "## bytecode: dont_write_bytecode=$(python3 -c 'import sys; print(sys.flags.dont_write_bytecode)') PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE:-unset}"
  echo "## fresh-process import times (s), 3 each"
  for mod in torch gradcheck_bi.cli.commands liger_kernel.ops.rms_norm liger_kernel.utils peft transformers torch._dynamo; do
    for i in 1 2 3; do
      /usr/bin/time -f "$mod %e" python3 -c "import $mod" 2>&1 | tail -1
    done
  done
  echo "## -X importtime of liger_kernel.ops.rms_norm: largest cumulative, top-level packages"
  python3 -X importtime -c "import liger_kernel.ops.rms_norm" 2> "$out/imp.txt"
  grep "import time" "$out/imp.txt" | awk -F'|' '{name=$3; gsub(/^ +/, "", name); split(name, p, "."); if (!(p[1] in best) || $2+0 > best[p[1]]) best[p[1]] = $2+0} END {for (k in best) printf "%8.3f s  %s\n", best[k]/1e6, k}' | sort -rn | head -15
  echo "## gradcheck-bi --help, fresh process, 3 runs"
  for i in 1 2 3; do /usr/bin/time -f "help %e" python3 -m gradcheck_bi --help > /dev/null; done 2>&1
  echo "## fp16 false alarms, three family ops, CUDA"
  timeout 360 python3 benchmarks/op_false_alarms.py 200 --dtypes fp16 --device cuda 2>/dev/null
  echo "exit $?"
} > "$out/close22.md" 2>&1

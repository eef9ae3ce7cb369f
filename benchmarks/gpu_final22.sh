#!/usr/bin/env bash
# Issue 22's after-measurement on a lent H200, one call: Liger's default run (after, and
# before from OLD_TREE), the autotuned stand-in (autotuner keys), then the fp16 layer norm
# false alarms after the tie fix (no timing read from that one).
#   bash benchmarks/gpu_final22.sh OUTDIR OLD_TREE
set -u
out=${1:?OUTDIR}; old=${2:?OLD_TREE}
export PYTHONPATH=.
auto=benchmarks/kernels/autotuned_rmsnorm.py:AutotunedRMSNorm
{
  echo "## Liger, default run, after"
  timeout 230 python3 benchmarks/gpu_run_profile.py --reps 5 -- --kernel liger
  echo "## Liger, default run, before ($old)"
  timeout 130 python3 benchmarks/gpu_run_profile.py --reps 3 --root "$old" -- --kernel liger
  echo "## Autotuned stand-in, default run"
  timeout 110 python3 benchmarks/gpu_run_profile.py --reps 2 -- --kernel $auto
  echo "## fp16 false alarms, layer_norm, CUDA"
  timeout 100 python3 benchmarks/op_false_alarms.py 200 --dtypes fp16 --ops layer_norm \
    --device cuda 2>/dev/null
  echo "exit $?"
} 2>&1 | tee "$out/final22.md"

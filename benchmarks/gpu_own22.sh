#!/usr/bin/env bash
# Issue 22, session 7: where gradcheck-bi's own time goes on an H200 (one call).
# Liger's default run broken down (first run, then a second run in the same process) with
# cProfile, its aten ops and host syncs by part, and the bundled kernels' default run.
#   bash benchmarks/gpu_own22.sh OUTDIR
set -u
out=${1:?OUTDIR}
export PYTHONPATH=.
{
  echo "## Liger, default run, first run in the process"
  timeout 120 python3 benchmarks/gpu_run_profile.py --no-fresh --cprofile 45 -- --kernel liger
  echo "## Liger, default run, second run in the process"
  timeout 120 python3 benchmarks/gpu_run_profile.py --no-fresh --warm-run --cprofile 45 -- --kernel liger
  echo "## Liger, ops and syncs"
  timeout 120 python3 benchmarks/run_ops.py --top 40 -- --kernel liger
  echo "## bundled kernels, default run"
  timeout 120 python3 benchmarks/gpu_run_profile.py --no-fresh --warm-run --cprofile 30
  echo "exit $?"
} > "$out/own22.md" 2>&1

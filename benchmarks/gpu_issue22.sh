#!/usr/bin/env bash
# Issue 22 on a lent H200, one call: time to verdict on other people's kernels.
#   bash benchmarks/gpu_issue22.sh OUTDIR [OLD_TREE]
# OLD_TREE: a directory holding an older gradcheck_bi/ (the "before"; e.g. `git archive`).
set -u
out=${1:?OUTDIR}; old=${2:-}
export PYTHONPATH=.
auto=benchmarks/kernels/autotuned_rmsnorm.py:AutotunedRMSNorm
{
  echo "## Liger, default run"
  timeout 240 python3 benchmarks/gpu_run_profile.py --reps 5 -- --kernel liger
  echo "## Liger, default run, FD sums through torch ops (GRADCHECK_BI_BACKEND=torch)"
  GRADCHECK_BI_BACKEND=torch timeout 60 python3 benchmarks/gpu_run_profile.py --no-fresh \
    -- --kernel liger | grep -v "^| _Guarded\|^| Liger"
  echo "## Autotuned stand-in, default run"
  timeout 120 python3 benchmarks/gpu_run_profile.py --reps 2 -- --kernel $auto
  if [ -n "$old" ]; then
    echo "## Autotuned stand-in, default run, before ($old)"
    timeout 90 python3 benchmarks/gpu_run_profile.py --reps 1 --root "$old" -- --kernel $auto
  fi
  echo "## cases/ci.toml on Liger, every target replaced by cuda/fp32, cold cache"
  cache=$(mktemp -d)
  start=$(date +%s%N)
  TRITON_CACHE_DIR=$cache TRITON_PRINT_AUTOTUNING=1 timeout 150 python3 -m gradcheck_bi run \
    --case cases/ci.toml --kernel liger --device cuda --no-progress 2>&1 | tail -n 2
  code=${PIPESTATUS[0]}
  echo "exit $code, $(( ($(date +%s%N) - start) / 1000000 )) ms, \
$(find "$cache" -name '*.cubin' | wc -l) kernels compiled"
} 2>&1 | tee "$out/issue22.md"

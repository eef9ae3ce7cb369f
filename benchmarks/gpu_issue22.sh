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
  if [ -n "$old" ]; then
    echo "## Liger, default run, in-process breakdown, before ($old)"
    timeout 60 python3 benchmarks/gpu_run_profile.py --no-fresh --root "$old" -- --kernel liger \
      | grep -v "^| _Guarded\|^| Liger"
  fi
  echo "## Liger, default run, cProfile (times inflated by the profiler)"
  timeout 60 python3 benchmarks/gpu_run_profile.py --no-fresh --cprofile 40 -- --kernel liger \
    | sed -n '/^cProfile/,$p'
  echo "## Autotuned stand-in, default run"
  timeout 120 python3 benchmarks/gpu_run_profile.py --reps 2 -- --kernel $auto
  echo "## cases/ci.toml on Liger, every target replaced by cuda/fp32, cold cache"
  cache=$(mktemp -d)
  start=$(date +%s%N)
  TRITON_CACHE_DIR=$cache TRITON_PRINT_AUTOTUNING=1 timeout 150 python3 -m gradcheck_bi run \
    --case cases/ci.toml --kernel liger --device cuda --no-progress 2>&1 | tail -n 2
  code=${PIPESTATUS[0]}
  echo "exit $code, $(( ($(date +%s%N) - start) / 1000000 )) ms, \
$(find "$cache" -name '*.cubin' | wc -l) kernels compiled"
} 2>&1 | tee "$out/issue22.md"

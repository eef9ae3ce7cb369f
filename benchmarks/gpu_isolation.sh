#!/usr/bin/env bash
# What the isolation costs on a GPU (default run, Liger, the Triton GEMM): whole fresh
# processes, GRADCHECK_BI_ISOLATE=1 against =0, paired; under 8 minutes on an H200.
#   bash benchmarks/gpu_isolation.sh      (from the repo root)
# Needs wheels/liger_kernel-0.8.5-py3-none-any.whl where liger_kernel is not installed.
set -u
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
nproc; uptime
WHEEL=wheels/liger_kernel-0.8.5-py3-none-any.whl
if ! python -c "import liger_kernel" 2>/dev/null; then
  if [ -f "$WHEEL" ]; then python -m pip install -q --no-deps "$WHEEL"
  else echo "no $WHEEL and no liger_kernel installed: the liger run measures a missing library"; fi
fi
python -c "import torch, triton, importlib.metadata as m
try: liger = m.version('liger-kernel')
except m.PackageNotFoundError: liger = 'absent'
print('torch', torch.__version__, 'triton', triton.__version__, 'liger-kernel', liger)"
timeout 470 python benchmarks/gpu_isolation.py --pairs 3 --budget 430 "$@"
echo "exit $?"

#!/usr/bin/env bash
# Issue 20's GPU evidence in half precision, on a lent H200, one call: Liger's fused add +
# RMSNorm and LayerNorm and torch's layer_norm in bf16 and fp16 (cases/family.toml with every
# target replaced by cuda/DTYPE, and the default run, which adds the strided layouts), our own
# correct kernels of tests/kernels in bf16, then the gated norm's check/forward-floor ratio.
#   OUT=/some/dir WHL=.whl bash benchmarks/gpu_family_lowp.sh
# Runs in parallel (correctness only; no timing is read from them). Each run's stdout goes to
# $OUT/NAME.txt, its stderr, wall time and exit code to $OUT/NAME.err.
set -u
WHL=${WHL:-.whl}
python3 -m pip install -q --no-deps --no-index --target /tmp/site "$WHL"/liger_kernel-*.whl
export PYTHONPATH=$PWD:/tmp/site
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/env.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$OUT/env.txt"
echo "tree ${REV:-unknown}" >> "$OUT/env.txt"

jobs_file=$(mktemp)
for dt in bf16 fp16; do
  for k in liger:fused_add liger:layer_norm torch:layer_norm; do
    n=${k//[:.]/_}
    echo "family_${n}_${dt} --case cases/family.toml --kernel $k --dtype $dt --format json" >> "$jobs_file"
    echo "default_${n}_${dt} --kernel $k --dtype $dt --format markdown" >> "$jobs_file"
  done
  for k in tests/kernels/fused_add_rms_norm.py tests/kernels/layer_norm.py tests/kernels/rms_norm_gated.py; do
    echo "own_$(basename "$k" .py)_${dt} --kernel $k --dtype $dt --format markdown" >> "$jobs_file"
  done
done
run_one() {
  local name=$1; shift
  local t0=$(date +%s%N)
  timeout 300 python3 -m gradcheck_bi run --device cuda --no-progress "$@" > "$OUT/$name.txt" 2> "$OUT/$name.err"
  local code=$?
  echo "exit $code wall $(( ($(date +%s%N) - t0) / 1000000 )) ms :: gradcheck-bi run --device cuda $*" >> "$OUT/$name.err"
}
export -f run_one; export OUT
xargs -P 12 -L 1 bash -c 'run_one "$@"' _ < "$jobs_file"
# The gated norm's check against its forward floor at (64, 8192) fp32, alone on the GPU.
timeout 150 python3 benchmarks/ops_floor.py --device cuda --dtype fp32 --shape 64,8192 --reps 3 \
  --op rms_norm_gated > "$OUT/ops_floor_gated.txt" 2> "$OUT/ops_floor_gated.err"
echo "exit $?" >> "$OUT/ops_floor_gated.err"

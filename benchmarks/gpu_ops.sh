#!/usr/bin/env bash
# Issue 20's GPU items, on a lent H200 (not run by the session that wrote it): Liger's fused
# add + RMSNorm and LayerNorm, torch's layer_norm, and the check/forward-floor ratio per op.
# Run from a copy of the tree, with Liger's wheel in $WHL:
#   OUT=/some/dir WHL=/path/to/.whl bash benchmarks/gpu_ops.sh
# Each run's stdout goes to $OUT/NAME.txt, its stderr, wall time and exit code to NAME.err.
set -u
WHL=${WHL:-.whl}
python3 -m pip install -q --no-deps --no-index --target /tmp/site "$WHL"/liger_kernel-*.whl
export PYTHONPATH=$PWD:/tmp/site
CUDA=(--device cuda --no-progress)

r() {  # r NAME ARGS...: one gradcheck-bi run
  local name=$1; shift
  local t0=$(date +%s%N)
  timeout 540 python3 -m gradcheck_bi run "${CUDA[@]}" "$@" > "$OUT/$name.txt" 2> "$OUT/$name.err"
  local code=$?
  echo "exit $code wall $(( ($(date +%s%N) - t0) / 1000000 )) ms :: gradcheck-bi run ${CUDA[*]} $*" >> "$OUT/$name.err"
}

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/env.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$OUT/env.txt"

# The family gate and the default sweep, fp32 (every check of each op).
for k in liger:fused_add liger:layer_norm torch:layer_norm torch:nn.LayerNorm; do
  n=${k//[:.]/_}
  r "family_${n}_fp32" --case cases/family.toml --kernel "$k" --dtype fp32 --format json
  r "default_${n}_fp32" --kernel "$k" --dtype fp32 --format markdown
done
# bf16: not built for these ops yet — expected exit 3 with the note line saying so.
r liger_fused_add_bf16 --kernel liger:fused_add --dtype bf16 --format json
# Our own correct kernels compiled paths are torch ops: they run on CUDA as they are.
for k in tests/kernels/fused_add_rms_norm.py tests/kernels/layer_norm.py tests/kernels/rms_norm_gated.py; do
  n=$(basename "$k" .py)
  r "own_${n}_fp32" --kernel "$k" --dtype fp32 --format json
done
# The check/forward-floor ratio per op at (64, 8192) fp32 (goal: ≤ 2×, as RMSNorm's).
python3 benchmarks/ops_floor.py --device cuda --dtype fp32 --shape 64,8192 --reps 3 \
  > "$OUT/ops_floor.txt" 2> "$OUT/ops_floor.err"

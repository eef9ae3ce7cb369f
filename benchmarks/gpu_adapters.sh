#!/usr/bin/env bash
# Issue 12 on the lent GPU: Liger-Kernel through the named adapter and Megatron-Core's file
# through PATH.py:ATTR, from the offline wheels in .whl/. Run from a copy of the tree:
#   OUT=/some/dir WHL=/path/to/.whl bash benchmarks/gpu_adapters.sh
# Every run's stdout goes to $OUT/NAME.txt, its stderr, wall time and exit code to NAME.err.
set -u
WHL=${WHL:-.whl}
python3 -m pip install -q --no-deps --no-index --target /tmp/site "$WHL"/liger_kernel-0.8.5-py3-none-any.whl
python3 -m zipfile -e "$WHL"/megatron_core-0.19.2-*.whl /tmp/mcore
export PYTHONPATH=$PWD:/tmp/site
MEG=/tmp/mcore/megatron/core/transformer/custom_layers/batch_invariant_kernels.py:BatchInvariantRMSNormFn
CUDA=(--device cuda --no-progress)

r() {  # r NAME ARGS...: one gradcheck-bi run
  local name=$1; shift
  local t0=$(date +%s%N)
  timeout 420 python3 -m gradcheck_bi run "${CUDA[@]}" "$@" > "$OUT/$name.txt" 2> "$OUT/$name.err"
  local code=$?
  local ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  echo "exit $code wall ${ms} ms :: gradcheck-bi run ${CUDA[*]} $*" >> "$OUT/$name.err"
}

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/env.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$OUT/env.txt"

# The shipped gate per casting mode, fp32 and bf16 (bf16 runs what the tool runs there).
for k in liger liger:gemma liger:none; do
  n=${k/:/_}
  r "ci_${n}_fp32" --case cases/ci.toml --kernel "$k" --dtype fp32 --format json &
  r "ci_${n}_bf16" --case cases/ci.toml --kernel "$k" --dtype bf16 --format json &
done
r ci_megatron_fp32 --case cases/ci.toml --kernel "$MEG" --dtype fp32 --format json &
# The default sweep, as the README shows it.
r default_liger_fp32 --kernel liger --dtype fp32 --format table --output "$OUT/default_liger_fp32.table" &
r default_megatron_fp32 --kernel "$MEG" --dtype fp32 --format table --output "$OUT/default_megatron_fp32.table" &
wait
r default_liger_module --kernel liger:module --dtype fp32 --format json &
r default_liger_megatron --kernel liger:megatron --dtype fp32 --format json &
r default_liger_bf16 --kernel liger --kernel liger:gemma --kernel liger:none --dtype bf16 --format markdown &
# fp64: the forward runs (llama/gemma compute in fp32), the backward has no fp64 kernel.
r fp64_liger --kernel liger --kernel liger:gemma --kernel liger:none --dtype fp64 --format json &
# More than 32768 rows of D <= 256 take Liger's 16-row block kernel, not the row kernel.
r bigbatch_liger --kernel liger --dtype fp32 --check batch_invariance --shape 40000,128 --zcg off --weight randn --format markdown &
r bigbatch_liger_rowmode --kernel liger --kernel-arg row_mode=true --dtype fp32 --check batch_invariance --shape 40000,128 --zcg off --weight randn --format markdown &
wait
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_named.py tests/test_adapters.py > "$OUT/pytest.txt" 2>&1
echo "pytest exit $?" >> "$OUT/pytest.txt"
tail -n 3 "$OUT"/*.err
tail -n 3 "$OUT/pytest.txt"

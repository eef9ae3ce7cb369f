#!/usr/bin/env bash
# Ops of any shape on a GPU: the gemm op's kernels with zero flags but --device/--dtype.
#   bash benchmarks/gpu_gemm.sh kernels|mutants|ratio   (PYTHONPATH=. , from the repo root)
# MEG: Megatron-Core's batch_invariant_kernels.py (not in this repo: extract it from the
# megatron-core wheel); OUT: where the JSON reports go.
set -u
part=${1:-kernels}
MEG=${MEG:-wheels/x/megatron/core/transformer/custom_layers/batch_invariant_kernels.py}
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
one() {  # one name, then run's arguments
  local name=$1; shift
  echo "=== gradcheck-bi run $*"
  local t0=$SECONDS
  timeout 280 python -m gradcheck_bi run "$@" --format json --output "$OUT/$name.json" 2>&1
  echo "=== exit $? in $((SECONDS - t0)) s"
}
case $part in
kernels)
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  for dt in fp32 bf16; do
    one "megatron_$dt" --kernel "$MEG:BatchInvariantTEGemmFn" --device cuda --dtype $dt
    one "triton_$dt" --kernel tests/kernels/gemm_triton.py:GemmTritonFn --device cuda --dtype $dt
    one "torch_$dt" --kernel tests/kernels/gemm.py:GemmFn --device cuda --dtype $dt
  done ;;
mutants)
  for m in DbiasFirstRow DbFirstRow DaFirstSlice CotangentAsContiguous SmallDefectNN SplitKBelow32Rows; do
    one "mutant_$m" --kernel "tests/kernels/gemm_mutants.py:$m" --device cuda --dtype fp32
  done ;;
ratio)
  python benchmarks/gemm_ratio.py "${@:2}" ;;
esac

#!/usr/bin/env bash
# Losses and the GEMM on a GPU, zero flags but --device/--dtype (run from the repo root):
#   bash benchmarks/gpu_losses.sh
# wheels/ (not in the repo) holds liger_kernel-0.8.5-py3-none-any.whl and Megatron-Core's
# batch_invariant_kernels.py (wheels/x/…, extracted from the megatron-core 0.19.2 wheel).
set -u
MEG=${MEG:-wheels/x/megatron/core/transformer/custom_layers/batch_invariant_kernels.py}
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
python -m pip install -q --no-deps wheels/liger_kernel-0.8.5-py3-none-any.whl 2>&1 | grep -v WARNING | tail -1
one() {  # one name, then run's arguments
  local name=$1; shift
  echo "=== gradcheck-bi run $*"
  local t0=$SECONDS
  timeout 200 python -m gradcheck_bi run "$@" --format json --output "$OUT/$name.json" 2>&1 \
    | grep -v "^note:" | tail -25
  echo "=== exit ${PIPESTATUS[0]} in $((SECONDS - t0)) s"
}
one liger_ce_fp32 --kernel liger_kernel.ops.cross_entropy:LigerCrossEntropyFunction --device cuda --dtype fp32
one liger_ce_bf16 --kernel liger_kernel.ops.cross_entropy:LigerCrossEntropyFunction --device cuda --dtype bf16
[ -n "${WITH_MEGATRON:-}" ] && one megatron_fp32 --kernel "$MEG:BatchInvariantTEGemmFn" --device cuda --dtype fp32
echo "=== big vocabulary"
timeout 300 python benchmarks/ce_big.py --kernel torch.nn.functional:cross_entropy --shape 4096,128256 --device cuda --dtype fp32 --checks dlogits 2>&1 | tail -8

#!/usr/bin/env bash
# Fifteen entry points of three real Triton libraries on a GPU, zero flags but device and dtype:
# Liger-Kernel 0.8.5, fla-core 0.6.0, Megatron-Core 0.19.2 (its batch_invariant_kernels.py).
#   bash benchmarks/gpu_entry_points.sh        (from the repo root; PYTHONPATH=. is set here)
# wheels/ (not in the repo) holds liger_kernel-0.8.5, fla_core-0.6.0 and einops wheels and
# wheels/x/megatron/… extracted from the megatron-core wheel. Three lanes of five commands,
# each under LIMIT seconds (5 × 80 s fits one 10-minute device call); after every command the
# reports so far are packed into $OUT/entries.tgz, so a cut call still returns them.
set -u
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
O=${OUT:-out}; mkdir -p "$O/j"
LIMIT=${LIMIT:-80}
python -m pip install -q --no-deps wheels/liger_kernel-0.8.5-py3-none-any.whl \
  wheels/fla_core-0.6.0-py3-none-any.whl wheels/einops-*.whl 2>&1 | grep -v WARNING | tail -1
MEG=wheels/x/megatron/core/transformer/custom_layers/batch_invariant_kernels.py
one() {  # name kernel
  local t0=$SECONDS
  timeout "$LIMIT" python -m gradcheck_bi run --kernel "$2" --device cuda --dtype "${DTYPE:-fp32}" \
    --no-progress --format json --output "$O/j/$1.json" >/dev/null 2>"$O/j/$1.err"
  echo "$1 | $2 | exit $? | $((SECONDS - t0)) s" >> "$O/j/summary.txt"
  (cd "$O" && tar czf entries.tgz.part j && mv entries.tgz.part entries.tgz)
}
( one liger_rms liger_kernel.ops.rms_norm:LigerRMSNormFunction
  one liger_ln liger_kernel.ops.layer_norm:LigerLayerNormFunction
  one liger_fadd liger_kernel.ops.fused_add_rms_norm:LigerFusedAddRMSNormFunction
  one liger_geglu liger_kernel.ops.geglu:LigerGELUMulFunction
  one liger_swiglu liger_kernel.ops.swiglu:LigerSiLUMulFunction ) &
( one meg_rms "$MEG:BatchInvariantRMSNormFn"
  one meg_gemm "$MEG:BatchInvariantTEGemmFn"
  one liger_ce liger_kernel.ops.cross_entropy:LigerCrossEntropyFunction
  one fla_swiglu fla.modules.activations:swiglu
  one fla_rms fla.modules.norm.layernorm:rms_norm ) &
( one fla_l2 fla.modules.norm.l2norm:l2norm
  one fla_ln fla.modules.norm.layernorm:layer_norm
  one fla_gated_fn fla.modules.norm.layernorm_gated:rmsnorm_fn
  one fla_gated fla.modules.norm.fused_norm_gate:rms_norm_gated
  one liger_flce liger_kernel.ops.fused_linear_cross_entropy:LigerFusedLinearCrossEntropyFunction ) &
wait
cat "$O/j/summary.txt"

#!/usr/bin/env bash
# The GPU's time figures in one call (≤ 9 minutes; every command under `timeout`), from the
# repo root:   bash benchmarks/gpu_floors.sh
#   1. cross-entropy at (4096, 128256) fp32 as a user runs it: a fresh `gradcheck-bi run`,
#      wall time and host peak memory (/usr/bin/time), GPU peak (ce_big.py, one process);
#   2. its dlogits check against the forward floor (ce_ratio.py);
#   3. rms_norm and every op's gradient checks against their floors at (64, 8192),
#      (64, 16384), (256, 8192) fp32 (ops_floor.py);
#   4. the Triton GEMM's dA at (64, 4096, 4096) fp32 against its floor (gemm_ratio.py).
# Prints each command's output and its exit code and seconds.
set -u
. "$(dirname "$0")/gpu_step.sh"
step 120 /usr/bin/time -f "wall %e s, host peak RSS %M KiB" python -m gradcheck_bi run \
  --kernel torch.nn.functional:cross_entropy --shape 4096,128256 --device cuda --dtype fp32 \
  --no-progress --format text
step 90 python benchmarks/ce_big.py --shape 4096,128256 --device cuda --dtype fp32
step 90 python benchmarks/ce_ratio.py --shape 4096,128256
for shape in 64,8192 64,16384 256,8192; do
  step 60 python benchmarks/ops_floor.py --device cuda --shape "$shape" --reps 3 --op rms_norm
done
step 150 python benchmarks/gemm_ratio.py --runs 2

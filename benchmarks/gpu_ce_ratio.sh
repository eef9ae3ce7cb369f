#!/usr/bin/env bash
# Cross-entropy's dlogits check at (4096, 128256) fp32 against its forward floor, one call
# (≤ 5 minutes; every command under `timeout`), from the repo root:
#   bash benchmarks/gpu_ce_ratio.sh
#   1. that the directions' one-op write (fp64 factors into an fp32 tensor) runs on CUDA;
#   2. ce_ratio.py: the check twice in one process, the second timed, against Σ calls × each
#      call's median time alone (docs/shaped_ops.md, "Against its forward floor"), then one
#      more run under cProfile: where the time above the floor goes.
# Prints each command's output, its exit code and seconds.
set -u
. "$(dirname "$0")/gpu_step.sh"
step 60 python -c "
import torch
x = torch.randn(64, 4096, device='cuda')
a = torch.randn(64, 1, dtype=torch.float64, device='cuda')
b = torch.randn(4096, dtype=torch.float64, device='cuda')
t = torch.empty_like(x)
torch.addcmul(x, a, b, value=1e-3, out=t)
want = (x.double() + 1e-3 * a * b).float()
print('addcmul into fp32 on cuda: elements differing from x + h·(a bᵀ) rounded once:',
      int((t != want).sum()), 'of', t.numel())"
step 200 python benchmarks/ce_ratio.py --shape 4096,128256 --profile 25

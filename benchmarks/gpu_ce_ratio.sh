#!/usr/bin/env bash
# Cross-entropy's dlogits check at (4096, 128256) fp32 against its forward floor, one call
# (≤ 5 minutes; every command under `timeout`), from the repo root:
#   bash benchmarks/gpu_ce_ratio.sh
#   1. that the directions' one-op write (fp64 factors into an fp32 tensor) runs on CUDA;
#   2. the fused direction level (gradcheck_bi/fd/_triton_directions.py) compiled: its
#      writes against addcmul's, its projection against a dot over what it wrote;
#   3. ce_ratio.py: the check twice in one process, the second timed, against Σ calls × each
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
step 90 python -c "
import torch
from gradcheck_bi.fd import _triton_directions as td
g = torch.Generator(device='cuda').manual_seed(0)
x0 = torch.randn(512, 32000, device='cuda', generator=g)
d = torch.randn(512, 32000, dtype=torch.float64, device='cuda', generator=g)
a = torch.randn(512, 1, dtype=torch.float64, device='cuda', generator=g)
b = torch.randn(32000, dtype=torch.float64, device='cuda', generator=g)
v, x = 1e-3, torch.empty_like(x0)
td.level(x0, (v * a).reshape(-1), b, x)
xp = x.clone()
p = td.level(x0, (v * a).reshape(-1), b, x, d)
dp = int((xp != torch.addcmul(x0, a, b, value=v, out=torch.empty_like(x0))).sum())
dm = int((x != torch.addcmul(x0, a, b, value=-v, out=torch.empty_like(x0))).sum())
step = (xp.double() - x.double()).reshape(-1)
rel = float((p - torch.dot(d.reshape(-1), step)).abs() / torch.dot(d.abs().reshape(-1), step.abs()))
print('fused level on cuda: elements differing from addcmul', dp, '(x+)', dm, '(x-) of',
      x.numel(), '; projection off the dot over what it wrote by', f'{rel:.1e}', 'of Σ|terms|')"
step 200 python benchmarks/ce_ratio.py --shape 4096,128256 --profile 25

"""The four checks: forward, dx, dw, batch_invariance → a measured error and its tolerance.

Each check takes a kernel (a :class:`~gradcheck_bi.kernels.registry.KernelSpec`) and one
:class:`Config` — device, dtype, shape, eps, seed, γ control, zero_centered_gamma — and
returns a :class:`Measurement`: the max abs error, the tolerance it is held to, where the
worst element is, and what produced the number (reference, stencil, step, noise floor).

* ``forward`` — ``y`` against an independent fp64 reference with the effective weight γ.
* ``dx`` / ``dw`` — the analytic backward against central differences of the kernel's own
  forward (:mod:`gradcheck_bi.fd`); the tolerance is a multiple of the noise floor
  estimated from the forward alone.
* ``batch_invariance`` — rows computed alone vs. inside batches of other sizes, ``y`` and
  ``dx`` compared bitwise; plus ``y``, ``dx``, ``dw`` bitwise equal run to run.

Controls are defined on the effective weight γ: under ``zero_centered_gamma`` the stored
parameter is ``γ - 1``, so γ = ones stays the blind control in both modes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from gradcheck_bi import fd
from gradcheck_bi.kernels.reduction import row_sum
from gradcheck_bi.kernels.rmsnorm import compute_dtype, reference_forward

DTYPES = {
    "fp64": torch.float64,
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}
HALF_DTYPES = ("bf16", "fp16")
# Tolerance = SAFETY × the estimated finite-difference noise floor (see fd.py).
FD_SAFETY = 4.0
# Batch sizes a probe row is placed into, capped so a batch stays under this many elements.
BATCH_SIZES = (3, 8, 64, 512, 4096)
MAX_BATCH_ELEMENTS = 1 << 22


@dataclass(frozen=True)
class Config:
    """One point of a sweep: what to check, where, on which data."""

    check: str
    device: str = "cpu"
    dtype: str = "fp64"
    shape: tuple[int, ...] = (2, 8, 256)
    eps: float = 1e-6
    seed: int = 0
    weight: str = "randn"
    zcg: bool = False
    input_scale: float = 1.0
    weight_scale: float = 1.0
    atol: float | None = None
    rtol: float | None = None
    stencil: str = "central-4"
    step_rel: float | None = None
    max_memory: int = fd.DEFAULT_MAX_MEMORY
    # "full": every element of dx; "directional": ⟨dx, v⟩ along random unit v per row.
    mode: str = "full"
    directions: int = 8

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]


@dataclass
class Measurement:
    """What a check measured: the error, the tolerance and how to trust them."""

    max_abs_err: float
    tolerance: float
    passed: bool
    worst: list[int] | None = None  # index of the worst element in the checked tensor
    message: str = ""
    details: dict[str, Any] = field(default_factory=dict)


class Unsupported(Exception):
    """The check cannot run here (no GPU, a dtype the method cannot use, a refusing kernel)."""


def make_inputs(cfg: Config) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x, stored weight, upstream grad g)`` for a config, drawn in fp64 from its seed.

    The draw depends only on seed, shape and scales, never on kernel, check, zcg or device,
    so every kernel and control sees the same ``x`` and ``g``.
    """
    gen = torch.Generator().manual_seed(cfg.seed)
    d = cfg.shape[-1]
    x = torch.randn(cfg.shape, generator=gen, dtype=torch.float64) * cfg.input_scale
    g = torch.randn(cfg.shape, generator=gen, dtype=torch.float64)
    gamma_randn = torch.randn(d, generator=gen, dtype=torch.float64) * cfg.weight_scale
    gamma = {
        "randn": gamma_randn,
        "ones": torch.ones(d, dtype=torch.float64),
        "zeros": torch.zeros(d, dtype=torch.float64),
    }[cfg.weight]
    w = gamma - 1 if cfg.zcg else gamma
    dt, dev = cfg.torch_dtype, torch.device(cfg.device)
    return x.to(dev, dt), w.to(dev, dt), g.to(dev, dt)


def _apply(fn: Any, x: torch.Tensor, w: torch.Tensor, cfg: Config) -> torch.Tensor:
    y = fn.apply(x, w, cfg.eps, cfg.zcg)
    if not isinstance(y, torch.Tensor):
        raise TypeError(f"forward returned {type(y).__name__}, expected a tensor")
    if y.shape != x.shape:
        raise ValueError(f"forward returned shape {tuple(y.shape)} for x of {tuple(x.shape)}")
    # The contract is y in x.dtype. A y in another dtype would be measured against a noise
    # floor computed for x.dtype: half the points fail, half pass, and no message says why.
    if y.dtype != x.dtype:
        raise TypeError(f"forward returned {y.dtype} for x of {x.dtype}; expected y in x.dtype")
    return y


def analytic_grads(
    fn: Any, x: torch.Tensor, w: torch.Tensor, g: torch.Tensor, cfg: Config
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(y, dx, dw)`` from the kernel's own forward and hand-written backward."""
    xr = x.detach().clone().requires_grad_(True)
    wr = w.detach().clone().requires_grad_(True)
    y = _apply(fn, xr, wr, cfg)
    # Σ(y·g) backpropagates exactly g into the kernel's backward (1·g is exact) and, unlike
    # y.backward(g), does not make torch import sympy to check shapes (~0.3 s per process).
    (y * g).sum().backward()
    for name, grad, ref in (("dx", xr.grad, xr), ("dw", wr.grad, wr)):
        if grad is None:
            raise ValueError(f"backward returned no gradient for {name}")
        if grad.shape != ref.shape:
            raise ValueError(
                f"backward returned {name} of shape {tuple(grad.shape)}, "
                f"expected {tuple(ref.shape)}"
            )
    assert xr.grad is not None and wr.grad is not None
    return y.detach(), xr.grad.detach(), wr.grad.detach()


def _locate(err: torch.Tensor) -> tuple[float, list[int]]:
    flat = int(torch.argmax(torch.nan_to_num(err, nan=math.inf)).item())
    worst = float(err.reshape(-1)[flat].item())
    idx: list[int] = []
    for size in reversed(err.shape):  # (torch.unravel_index would import sympy: ~0.3 s)
        flat, i = divmod(flat, size)
        idx.append(i)
    idx.reverse()
    return worst, idx


def _nonfinite(name: str, t: torch.Tensor) -> str:
    bad = int((~torch.isfinite(t)).sum().item())
    return f"{name} has {bad} non-finite element(s)" if bad else ""


def _verdict(err: torch.Tensor, tol: float, scale: float, cfg: Config,
             notes: Sequence[str], details: dict[str, Any]) -> Measurement:
    if cfg.atol is not None:
        tol = cfg.atol
    if cfg.rtol is not None:
        tol += cfg.rtol * scale
    max_err, worst = _locate(err)
    problems = [n for n in notes if n]
    passed = not problems and math.isfinite(max_err) and max_err <= tol
    return Measurement(max_err, tol, passed, worst, "; ".join(problems), details)


def check_forward(fn: Any, cfg: Config) -> Measurement:
    """``y`` vs. ``x · rsqrt(mean(x²) + eps) · γ`` computed independently in fp64.

    Tolerance: the output's rounding plus a summation bound for the compute dtype,
    ``max|ref| · (u_out + u_c · (4 + 2·log2(D)))``.
    """
    x, w, _ = make_inputs(cfg)
    with torch.no_grad():
        y = _apply(fn, x, w, cfg)
    ref = reference_forward(x, w, cfg.eps, cfg.zcg)
    err = (y.to(torch.float64) - ref).abs()
    scale = float(ref.abs().max())
    u_out = fd.unit_roundoff(y.dtype)
    u_c = fd.unit_roundoff(compute_dtype(x.dtype))
    tol = scale * (u_out + u_c * (4 + 2 * math.log2(cfg.shape[-1] + 1)))
    details = {"reference": "fp64 torch, effective weight γ", "max_abs_ref": scale}
    return _verdict(err, tol, scale, cfg, [_nonfinite("y", y)], details)


def _fd_stencil(cfg: Config) -> fd.Stencil:
    if cfg.dtype in HALF_DTYPES:
        raise Unsupported(
            f"finite differences of a {cfg.dtype} forward sit on a noise floor near 1e-1; "
            "check gradients in fp32 or fp64 (forward and batch_invariance run in every dtype)"
        )
    return fd.STENCILS[cfg.stencil]


def check_dx(fn: Any, cfg: Config) -> Measurement:
    """Analytic ``dx`` vs. row-coloured central differences of the kernel's own forward."""
    stencil = _fd_stencil(cfg)
    x, w, g = make_inputs(cfg)
    _, dx, _ = analytic_grads(fn, x, w, g, cfg)
    if cfg.mode == "directional":
        return _check_dx_directional(fn, cfg, stencil, x, w, g, dx)
    if cfg.mode != "full":
        raise ValueError(f"unknown mode {cfg.mode!r}; expected 'full' or 'directional'")
    est = fd.input_grad(
        lambda t: _apply(fn, t, w, cfg), x, g, cfg.eps, stencil, cfg.step_rel, cfg.max_memory
    )
    err = (dx.to(torch.float64) - est.grad).abs()
    notes = [_nonfinite("analytic dx", dx), _nonfinite("finite-difference dx", est.grad)]
    return _fd_verdict(err, est, float(est.grad.abs().max()), cfg, notes)


def _check_dx_directional(fn: Any, cfg: Config, stencil: fd.Stencil, x: torch.Tensor,
                          w: torch.Tensor, g: torch.Tensor, dx: torch.Tensor) -> Measurement:
    """``⟨dx, v⟩`` vs. central differences along ``cfg.directions`` random unit ``v`` per row.

    The worst index is ``[direction, *row]``; no single element of dx is checked.
    """
    est = fd.directional_input_grad(
        lambda t: _apply(fn, t, w, cfg), x, g, cfg.eps, cfg.directions, cfg.seed, stencil,
        cfg.step_rel, cfg.max_memory,
    )
    analytic = row_sum(dx.to(torch.float64).unsqueeze(0) * est.directions)
    err = (analytic - est.projection).abs()
    details = {
        "mode": "directional",
        "directions": cfg.directions,
        "projections_checked": int(est.projection.numel()),
        "coverage": f"dx projected on {cfg.directions} random unit direction(s) per row; "
                    "individual dx elements were not checked",
    }
    notes = [_nonfinite("analytic dx", dx), _nonfinite("finite-difference projection",
                                                        est.projection)]
    return _fd_verdict(err, est, float(est.projection.abs().max()), cfg, notes, details)


def _fd_verdict(err: torch.Tensor, est: fd.FDEstimate | fd.DirectionalEstimate, scale: float,
                cfg: Config, notes: Sequence[str],
                extra: dict[str, Any] | None = None) -> Measurement:
    """Hold ``err`` to ``FD_SAFETY`` × the estimate's largest noise floor."""
    floor = float(est.noise_floor.max())
    details = {**_fd_details(est, floor), **(extra or {})}
    return _verdict(err, FD_SAFETY * floor, scale, cfg, notes, details)


def check_dw(fn: Any, cfg: Config) -> Measurement:
    """Analytic ``dw`` vs. central differences of the forward in the weight."""
    stencil = _fd_stencil(cfg)
    x, w, g = make_inputs(cfg)
    _, _, dw = analytic_grads(fn, x, w, g, cfg)
    est = fd.weight_grad(lambda v: _apply(fn, x, v, cfg), w, x, g, stencil)
    err = (dw.to(torch.float64) - est.grad).abs()
    notes = [_nonfinite("analytic dw", dw), _nonfinite("finite-difference dw", est.grad)]
    return _fd_verdict(err, est, float(est.grad.abs().max()), cfg, notes)


def _fd_details(est: fd.FDEstimate | fd.DirectionalEstimate, floor: float) -> dict[str, Any]:
    steps = est.step.reshape(-1)
    return {
        "stencil": est.stencil.name,
        "step_min": float(steps.min()),
        "step_max": float(steps.max()),
        "noise_floor": floor,
        "safety": FD_SAFETY,
        "forward_calls": est.forward_calls,
    }


def _bitwise_diff(a: torch.Tensor, b: torch.Tensor) -> tuple[int, float, list[int] | None]:
    """(number of elements whose bits differ, max |a - b|, index of the first such element)."""
    ia = a.contiguous().view(_int_view(a.dtype))
    ib = b.contiguous().view(_int_view(b.dtype))
    differ = ia != ib
    n = int(differ.sum().item())
    if n == 0:
        return 0, 0.0, None
    diff = (a.to(torch.float64) - b.to(torch.float64)).abs()
    first = torch.nonzero(differ)[0].tolist()
    return n, float(torch.nan_to_num(diff[differ], nan=math.inf).max().item()), first


def _int_view(dtype: torch.dtype) -> torch.dtype:
    return {8: torch.int64, 4: torch.int32, 2: torch.int16}[dtype.itemsize]


def batch_sizes(n_cols: int) -> list[int]:
    """The batch sizes a probe row is placed in: fixed, capped by ``MAX_BATCH_ELEMENTS``."""
    return [b for b in BATCH_SIZES if b * n_cols <= MAX_BATCH_ELEMENTS] or [2]


def check_batch_invariance(fn: Any, cfg: Config) -> Measurement:
    """Rows alone vs. in batches of other sizes (``y``, ``dx``) and run-to-run (y, dx, dw).

    Every comparison is bitwise; the reported error is the largest abs difference among
    elements whose bits differ (0 when all are identical), the tolerance is 0.
    """
    x, w, g = make_inputs(cfg)
    n_cols = cfg.shape[-1]
    x2, g2 = x.reshape(-1, n_cols), g.reshape(-1, n_cols)
    n_rows = x2.shape[0]
    probes = sorted({0, n_rows // 2, n_rows - 1})
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    failures: list[str] = []
    worst_err, worst_at = 0.0, None
    compared = 0

    def compare(label: str, a: torch.Tensor, b: torch.Tensor, row: int) -> None:
        nonlocal worst_err, worst_at, compared
        compared += 1
        n, err, first = _bitwise_diff(a, b)
        if n:
            failures.append(f"{label}: {n} of {a.numel()} elements differ (max {err:.3e})")
            if err >= worst_err:
                worst_err, worst_at = err, [row, *(first or [])[-1:]]

    y_full, dx_full, dw_full = analytic_grads(fn, x, w, g, cfg)
    y_again, dx_again, dw_again = analytic_grads(fn, x, w, g, cfg)
    compare("y run to run", y_full, y_again, 0)
    compare("dx run to run", dx_full, dx_again, 0)
    compare("dw run to run", dw_full, dw_again, 0)
    yf, dxf = y_full.reshape(-1, n_cols), dx_full.reshape(-1, n_cols)

    alone = {}
    for p in probes:
        y_one, dx_one, _ = analytic_grads(fn, x2[p : p + 1], w, g2[p : p + 1], cfg)
        alone[p] = (y_one[0], dx_one[0])
        compare(f"y row {p} alone vs in shape {cfg.shape}", y_one[0], yf[p], p)
        compare(f"dx row {p} alone vs in shape {cfg.shape}", dx_one[0], dxf[p], p)
    for size in batch_sizes(n_cols):
        # One batch per size holds every probe row: at the end (often a partial tile), in the
        # middle and at the start; the rest is fresh random rows of the same scale.
        positions = [size - 1, size // 2, 0][: len(probes)]
        bx = (torch.randn(size, n_cols, generator=gen, dtype=torch.float64)
              * cfg.input_scale).to(x.device, x.dtype)
        bg = torch.randn(size, n_cols, generator=gen, dtype=torch.float64).to(g.device, g.dtype)
        for p, at in zip(probes, positions, strict=True):
            bx[at], bg[at] = x2[p], g2[p]
        yb, dxb, _ = analytic_grads(fn, bx, w, bg, cfg)
        for p, at in zip(probes, positions, strict=True):
            compare(f"y row {p} alone vs at {at} in a batch of {size}", alone[p][0], yb[at], p)
            compare(f"dx row {p} alone vs at {at} in a batch of {size}", alone[p][1], dxb[at], p)

    details = {"comparisons": compared, "batch_sizes": batch_sizes(n_cols), "probe_rows": probes}
    msg = "; ".join(failures[:3]) + (f"; and {len(failures) - 3} more" if len(failures) > 3 else "")
    return Measurement(worst_err, 0.0, not failures, worst_at, msg, details)


CHECK_FUNCTIONS = {
    "forward": check_forward,
    "dx": check_dx,
    "dw": check_dw,
    "batch_invariance": check_batch_invariance,
}


def run_check(fn: Any, cfg: Config) -> Measurement:
    """Run the check named by ``cfg.check``. Raises :class:`Unsupported` where it cannot run."""
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise Unsupported("--device cuda asked for, but no CUDA GPU is visible here")
    return CHECK_FUNCTIONS[cfg.check](fn, cfg)


def with_check(cfg: Config, check: str) -> Config:
    return replace(cfg, check=check)


"""What a kernel's forward computes: one call at a small random fp64 point, compared with the
fp64 reference of every op and variant its parameters allow.

A **variant** (:class:`Variant`) is an op (:mod:`gradcheck_bi.ops`) with its optional parts
decided: a weight or none, a bias or none, ``γ = w`` or ``γ = 1 + w`` (zero-centred, built
in), and the options the kernel fixes instead of taking (the gated norm's group size and gate
order). The parts a kernel has are facts of its signature or its module (a ``bias`` parameter,
a ``(D,)`` weight); the call decides what is left: which op, whether an optional bias is used,
γ or 1 + γ, which groups and gate order. The probe is one call with every tensor the kernel
takes drawn at random (a weight away from 1, a bias away from 0), so that any two variants
differ by O(1) in the output; a variant **matches** when the output is within
:data:`MATCH` of its reference relative to the reference's largest element (a kernel computing
in fp32 inside stays ~1e-7 away, one in bf16 ~1e-2).

>>> import torch
>>> seen = probe(lambda v: torch.nn.functional.layer_norm(v["x"], v["shape"], v["weight"],
...                                                       v["bias"], v["eps"]),
...              frozenset({"x", "weight", "bias"}))
>>> seen.match().words
'layer_norm'
>>> seen.match("rms_norm") is None
True
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from gradcheck_bi import gpu
from gradcheck_bi.kernels.adapting import sandbox
from gradcheck_bi.kernels.calling.refusal import refusal
from gradcheck_bi.ops import ROWS
from gradcheck_bi.vocab import first_line

# Within this of a variant's reference (max |y − ref| / max |ref|) the output matches it: a
# few bf16 roundings (a kernel computing in bf16 inside). Any two candidate variants differ
# by at least 0.155 at the probe's point (measured over every role set: two gated norms with
# a bias, groups of 4 or the whole row), 7.8 times this.
MATCH = 2e-2
PROBE_ROWS, PROBE_D = 3, 8
_EPS = 1e-5


@dataclass(frozen=True)
class Variant:
    """An op with its optional parts decided (``options``: the values it fixes)."""

    op: str
    weight: bool = True
    bias: bool = False
    zcg: bool = False  # computes with γ = 1 + w
    options: tuple[tuple[str, Any], ...] = ()

    @property
    def words(self) -> str:
        """``layer_norm without bias``, ``rms_norm with a bias, γ = 1 + w``, …"""
        op = ROWS[self.op]
        parts = []
        if op.has("weight") and not self.weight:
            parts.append("without weight")
        if op.has("bias") and self.bias != (not op.param("bias").optional):
            parts.append("with a bias" if self.bias else "without bias")
        if self.zcg:
            parts.append("γ = 1 + w")
        options = dict(self.options)
        if options.get("group_size") is not None:
            parts.append(f"groups of {options['group_size']}")
        if options.get("norm_before_gate") is False:
            parts.append("gate before the norm")
        parts += [f"{k}={v}" for k, v in self.options if k in op.defaults()
                  and v != op.defaults()[k]]
        return self.op + (" " + ", ".join(parts) if parts else "")

    def reference(self, drawn: dict[str, torch.Tensor], d: int) -> torch.Tensor:
        """Its fp64 output at the drawn tensors (its first output)."""
        op = ROWS[self.op]
        params = {}
        if op.has("weight"):
            w = drawn["weight"] if self.weight else torch.ones_like(drawn["weight"])
            params["weight"] = w + 1 if self.zcg and self.weight else w
        if op.has("bias") and (self.bias or not op.param("bias").optional):
            params["bias"] = drawn["bias"] if self.bias else torch.zeros_like(drawn["bias"])
        options = {"eps": _EPS, "group_size": None, "norm_before_gate": True,
                   **op.defaults(), **dict(self.options)}
        return op.reference({n: drawn[n] for n in op.inputs}, params, options)[op.outputs[0]]


def _groups(d: int) -> tuple[int | None, ...]:
    return (None, *(g for g in range(2, d) if d % g == 0))


def candidates(roles: frozenset[str], ops: tuple[str, ...] | None = None,
               d: int = PROBE_D) -> list[Variant]:
    """Every variant of ``ops`` (all by default) that a kernel taking ``roles`` may compute:
    its inputs among them, a weight exactly where it takes one; a bias it takes used or not;
    γ or 1 + γ unless a zcg keyword or offset says; each value of an option it does not
    take."""
    out = []
    for op in (ROWS[n] for n in ops or tuple(ROWS)):
        if not set(op.inputs) <= roles:
            continue
        weight = op.has("weight") and "weight" in roles
        biases = (False, True) if op.has("bias") and "bias" in roles else (False,)
        zcgs = (False, True) if weight and not {"zcg", "offset"} & roles else (False,)
        fixed = [[(name, v) for v in (_groups(d) if name == "group_size" else values)]
                 for name, values in op.fixable.items() if name not in roles]
        for bias, zcg, *options in itertools.product(biases, zcgs, *fixed):
            out.append(Variant(op.name, weight, bias, zcg, tuple(options)))
    return out


def drawn_values(dtype: torch.dtype, device: str = "cpu") -> dict[str, Any]:
    """The probe's point: every tensor role drawn (seeded), the options the kernel may take
    at what the variants assume (eps 1e-5, group = the row, norm before the gate, zcg off)."""
    gen = torch.Generator().manual_seed(1234)
    shape = (PROBE_ROWS, PROBE_D)
    t = {n: torch.randn(shape, generator=gen, dtype=torch.float64)
         for n in ("x", "residual", "z")}
    t["weight"] = 0.5 + torch.rand(PROBE_D, generator=gen, dtype=torch.float64)
    t["bias"] = torch.randn(PROBE_D, generator=gen, dtype=torch.float64)
    t.update({n: torch.randn(shape, generator=gen, dtype=torch.float64) for n in ("a", "b")})
    cast = {n: v.to(device=device, dtype=dtype) for n, v in t.items()}
    own = {a.name: a.default for op in ROWS.values() for a in op.axes}
    return {**cast, "fp64": t, "eps": _EPS, "zcg": False, "offset": 0.0, "shape": (PROBE_D,),
            "size": PROBE_D, "device": torch.device(device), "dtype": dtype,
            "group_size": PROBE_D, "norm_before_gate": True, "prenorm": True, "none": None,
            **own}


@dataclass(frozen=True)
class Seen:
    """What the forward matched: ``errors`` per candidate variant, closest first; ``why``
    when it could not run here."""

    errors: tuple[tuple[float, Variant], ...] = ()
    why: str = ""
    # What its forward raised where it ran nowhere and the exception was no refusal of a
    # device or dtype (a NameError, a wrong shape): a broken kernel, not one that cannot
    # run here; "" otherwise.
    raised: str = ""
    # Whether its output required grad with its inputs requiring it (``None``: not seen, a
    # kernel that refused to run so): ``False`` is a kernel with no backward to check.
    grad: bool | None = None
    # Its required parameters that no role of any op fills (``y``, ``power``): a kernel
    # taking more than the ops here (read in Megatron's order where it has three or four).
    unfilled: tuple[str, ...] = ()
    # Where its output matches no op at its own defaults: a boolean parameter no role fills,
    # the value that makes it match, and what it then matches (fla's ``is_rms_norm=True``).
    flip: tuple[str, bool, str] | None = None

    def match(self, op: str | None = None) -> Variant | None:
        """The closest variant (of ``op``) the output matches, if any."""
        return next((v for e, v in self.errors if e <= MATCH and op in (None, v.op)), None)

    @property
    def closest(self) -> str:
        """``rms_norm (max relative error 0.41)``: the nearest variant, for a line saying
        nothing matched."""
        if not self.errors:
            return f"its forward did not run here ({self.why})" if self.why else ""
        e, v = self.errors[0]
        return f"closest: {v.words}, max relative error {e:.2g}"


_GRAD_ROLES = ("x", "residual", "z", "weight", "bias", "a", "b")


def _output(run: Callable[[dict[str, Any]], Any], dtype: torch.dtype, device: str
            ) -> tuple[torch.Tensor, bool | None]:
    """The kernel's first output at the probe's point, as an fp64 CPU tensor, and whether it
    required grad with every tensor it takes requiring grad (``None``: the kernel refused
    inputs that require grad, and ran without)."""
    values = drawn_values(dtype, device)
    try:
        with torch.enable_grad():
            # non-leaf views, so that a kernel writing in place may
            live = {n: values[n].detach().requires_grad_() * 1 for n in _GRAD_ROLES}
            raw = run({**values, **live})
        grad: bool | None = bool(_first(raw).requires_grad)
    except Exception:  # torch refused an in-place write, say: once more, without grad
        with torch.no_grad():
            raw = run(drawn_values(dtype, device))
        grad = None
    return _first(raw).detach().to(device="cpu", dtype=torch.float64), grad


def _first(raw: Any) -> torch.Tensor:
    return raw[0] if isinstance(raw, (tuple, list)) else raw  # type: ignore[no-any-return]


def probe(run: Callable[[dict[str, Any]], Any], roles: frozenset[str],
          ops: tuple[str, ...] | None = None) -> Seen:
    """Call ``run(values)`` once (fp64 on CPU; else fp32, else fp32 on CUDA) and compare its
    first output with every :func:`candidates` variant's reference."""
    why, raised = "", ""
    targets = [(torch.float64, "cpu"), (torch.float32, "cpu")]
    targets += [(torch.float32, "cuda")] if gpu.present() else []
    drawn = drawn_values(torch.float64)["fp64"]
    for dtype, device in targets:
        try:  # in a child process at load (kernels/adapting/sandbox.py): a crash costs the kernel
            y, grad = sandbox.call(functools.partial(_output, run, dtype, device),
                             f"its forward at a {(PROBE_ROWS, PROBE_D)} "
                             f"{str(dtype).removeprefix('torch.')} point on {device}", device)
        except Exception as exc:  # refused here (a CUDA-only kernel): the next, else say why
            why = first_line(exc)
            raised = raised or ("" if refusal(exc) is not None else why)
            continue
        errors = []
        for v in candidates(roles, ops):
            ref = v.reference(drawn, PROBE_D)
            if ref.shape != y.shape:
                continue
            scale = float(ref.abs().max()) or 1.0
            err = float((y - ref).abs().max()) / scale
            errors.append((err if err == err else float("inf"), v))
        return Seen(tuple(sorted(errors, key=lambda ev: ev[0])), grad=grad)
    return Seen(why=why, raised=raised)

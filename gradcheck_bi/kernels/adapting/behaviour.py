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
# Moves of the probe's point every op here answers alike: its normalised inputs (x, and a
# residual added to it) scaled by SCALE leave the output as it is (up to eps), and the weight
# moved by ±STEP along a random direction moves it affinely (y = n(x)·γ + β). An output that
# matches no op and moves otherwise is another function (MobileBERT's NoNorm x·w + b; a
# weight inside the norm, rms_norm(x·(1 + w))), not one of the ops with a defect.
SCALE, STEP = 4.0, 0.5
_SCALED = ("x", "residual")


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


def moved(move: str, dtype: torch.dtype, device: str = "cpu") -> dict[str, Any]:
    """The probe's point (:func:`drawn_values`) moved: ``"scaled"`` (x and the residual ×
    :data:`SCALE`), ``"w+"`` / ``"w-"`` (the weight ± :data:`STEP`·u, u drawn once), ``""``
    not at all; its ``"fp64"`` entry, which the references read, moved alike."""
    values = drawn_values(dtype, device)
    fp64 = values["fp64"]
    if not move:
        return values
    if move == "scaled":
        change = {n: SCALE * fp64[n] for n in _SCALED}
    else:
        u = torch.randn(PROBE_D, generator=torch.Generator().manual_seed(4321),
                        dtype=torch.float64)
        change = {"weight": fp64["weight"] + (STEP if move == "w+" else -STEP) * u}
    return {**values, **{n: t.to(device=device, dtype=dtype) for n, t in change.items()},
            "fp64": {**fp64, **change}}


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
    # Where its output matches no op: how it moves unlike every op here (:func:`unlike`),
    # which makes it none of them with a defect; "" where it moves as they do.
    unlike: str = ""

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


def _output(run: Callable[[dict[str, Any]], Any], dtype: torch.dtype, device: str,
            move: str = "") -> tuple[torch.Tensor, bool | None]:
    """The kernel's first output at the probe's point (moved by ``move``, :func:`moved`), as
    an fp64 CPU tensor, and whether it required grad with every tensor it takes requiring
    grad (``None``: the kernel refused inputs that require grad, and ran without)."""
    values = moved(move, dtype, device)
    try:
        with torch.enable_grad():
            # non-leaf views, so that a kernel writing in place may
            live = {n: values[n].detach().requires_grad_() * 1 for n in _GRAD_ROLES}
            raw = run({**values, **live})
        grad: bool | None = bool(_first(raw).requires_grad)
    except Exception:  # torch refused an in-place write, say: once more, without grad
        with torch.no_grad():
            raw = run(moved(move, dtype, device))
        grad = None
    return _first(raw).detach().to(device="cpu", dtype=torch.float64), grad


def _first(raw: Any) -> torch.Tensor:
    return raw[0] if isinstance(raw, (tuple, list)) else raw  # type: ignore[no-any-return]


def _targets() -> list[tuple[torch.dtype, str]]:
    """Where the probe runs, in turn until one does: fp64 on CPU, fp32, fp32 on CUDA."""
    targets = [(torch.float64, "cpu"), (torch.float32, "cpu")]
    return targets + ([(torch.float32, "cuda")] if gpu.present() else [])


def _at(dtype: torch.dtype, device: str) -> str:
    return (f"its forward at a {(PROBE_ROWS, PROBE_D)} {str(dtype).removeprefix('torch.')} "
            f"point on {device}")


def probe(run: Callable[[dict[str, Any]], Any], roles: frozenset[str],
          ops: tuple[str, ...] | None = None) -> Seen:
    """Call ``run(values)`` once (fp64 on CPU; else fp32, else fp32 on CUDA) and compare its
    first output with every :func:`candidates` variant's reference."""
    why, raised = "", ""
    drawn = drawn_values(torch.float64)["fp64"]
    for dtype, device in _targets():
        try:  # in a child process at load (kernels/adapting/sandbox.py): a crash costs the kernel
            y, grad = sandbox.call(functools.partial(_output, run, dtype, device),
                                   _at(dtype, device), device)
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


def _rel(num: torch.Tensor, den: torch.Tensor) -> float:
    """max |num| / max |den| (0 where both are 0)."""
    top, bottom = float(num.abs().max()), float(den.abs().max())
    return top / bottom if bottom else (0.0 if top == 0 else float("inf"))


def _responses(y: dict[str, torch.Tensor]) -> dict[str, float]:
    """How an output moves (``y`` at each :func:`moved` point): relative to itself under the
    scale; its weight's second difference relative to the first."""
    out = {"scaled": _rel(y["scaled"] - y[""], y[""])}
    if "w+" in y:
        out["weight"] = _rel(y["w+"] - 2 * y[""] + y["w-"], y["w+"] - y["w-"])
    return out


def _outputs(run: Callable[[dict[str, Any]], Any], dtype: torch.dtype, device: str,
             moves: tuple[str, ...]) -> dict[str, torch.Tensor]:
    return {m: _output(run, dtype, device, m)[0] for m in moves}


def unlike(run: Callable[[dict[str, Any]], Any], roles: frozenset[str],
           ops: tuple[str, ...] | None = None) -> str:
    """Why an output that matched no variant is none of them with a defect: a move of the
    probe's point (:func:`moved`) after which every :func:`candidates` variant's reference
    stays within :data:`MATCH` (unchanged, or affine in the weight) moves the kernel's output
    by more; "" where no move does, or the kernel runs nowhere here. One more call of its
    forward per move (x scaled; the weight moved either way where it takes one)."""
    moves = ("", "scaled", *(("w+", "w-") if "weight" in roles else ()))
    points = {m: moved(m, torch.float64)["fp64"] for m in moves}  # what the references read
    for dtype, device in _targets():
        try:
            y = sandbox.call(functools.partial(_outputs, run, dtype, device, moves),
                             _at(dtype, device) + ", moved", device)
        except Exception:  # refused here: the next target
            continue
        seen = _responses(y)
        refs = []
        for v in candidates(roles, ops):
            at = {m: v.reference(points[m], PROBE_D) for m in moves}
            if at[""].shape == y[""].shape:
                refs.append(_responses(at))
        for name, r in seen.items():
            most = max((c[name] for c in refs), default=float("inf"))
            if r > MATCH >= most:
                return (f"x × {SCALE:g} moves its output by {r:.2g} (relative), every op's "
                        f"here by {most:.2g} at most" if name == "scaled" else
                        f"its output is not affine in the weight (moved ±{STEP:g} along a "
                        f"random direction: second difference {r:.2g} of the first, every "
                        f"op's here {most:.2g} at most)")
        return ""
    return ""

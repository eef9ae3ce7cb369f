"""The words every stage shares: names, plain types and the errors that cross stages.

This module imports nothing of the package; every other module may import it. Data flows
one way through the stages that use these types::

    kernel → perturbation → measurement → verdict → report
    (KernelSpec)  (Config)   (Measurement)  (Result)

* a **check** is one of :data:`CHECKS`; a **γ control** one of :data:`CONTROLS`, defined
  on the *effective* weight γ (under ``zero_centered_gamma`` the stored parameter is γ − 1,
  so ``ones`` stays the blind control in both modes);
* a :class:`Config` is one point of a sweep; a :class:`Measurement` what a check measured
  there; a :class:`Result` the verdict, one row of the contract's JSON;
* a :class:`KernelSpec` is a kernel under test with the :class:`Defect` s it declares; an
  :class:`Expectation` is a case file's rule about what a point must show.

>>> Config(check="dx").control, Config(check="dx").zero_centered_gamma
('randn', False)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

CHECKS = ("forward", "dx", "dw", "batch_invariance")
CONTROLS = ("randn", "ones", "zeros")
DTYPES = {
    "fp64": torch.float64,
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}
HALF_DTYPES = ("bf16", "fp16")
# torch's names for the dtypes above (the API takes them, and torch.dtype objects, too).
DTYPE_ALIASES = {"float64": "fp64", "double": "fp64", "float32": "fp32", "float": "fp32",
                 "bfloat16": "bf16", "float16": "fp16", "half": "fp16"}
DEVICES = ("cpu", "cuda")
# How rounding is judged (Config.precision): at the working precision measured from the
# kernel's forward, or at the dtype's whatever the kernel computes in.
PRECISIONS = ("measured", "exact")
EXPECTED_STATUSES = ("pass", "fail")


class Unsupported(Exception):
    """The check cannot run here (no GPU, a dtype the method cannot use, a refusing kernel)."""


class ContractViolation(Exception):
    """A kernel broke the contract in a way that is a wrong answer, not a crash: no gradient
    (None) for a differentiable input, a gradient of the wrong shape, a write into a tensor
    it does not own. The point is a ``fail`` with this message, never an ``error``."""


class KernelLoadError(Exception):
    """A kernel reference could not be resolved or loaded (exit code 2)."""


class KernelCrashed(Exception):
    """The kernel ended, killed or hung the process that recognised it at load
    (:mod:`gradcheck_bi.kernels.adapting.sandbox`): an ``error`` result, the other kernels
    still run."""


@dataclass(frozen=True)
class Config:
    """One point of a sweep: what to check, where, on which data, judged how."""

    check: str
    device: str = "cpu"
    dtype: str = "fp64"
    shape: tuple[int, ...] = (2, 8, 256)
    eps: float = 1e-6
    seed: int = 0
    control: str = "randn"  # the γ control (see CONTROLS)
    zero_centered_gamma: bool = False
    input_scale: float = 1.0
    weight_scale: float = 1.0
    atol: float | None = None
    rtol: float | None = None
    stencil: str = "central-4"
    step_rel: float | None = None
    max_memory: int | None = None  # None: the default budget, computed when first asked
    # "full": every element of dx; "directional": ⟨dx, v⟩ along random unit v per row.
    mode: str = "full"
    directions: int = 8
    # How the kernel's tensors are laid out in memory (kernels/calling/layout.py: "x-strided", …).
    layout: str = "contiguous"
    # The op (gradcheck_bi.ops) and what only the other ops have: the β control, the gated
    # norm's group size (resolved: never None) and norm_before_gate. RMSNorm leaves them.
    op: str = "rms_norm"
    bias: str | None = None
    group_size: int | None = None
    norm_before_gate: bool | None = None
    # How rounding is judged: "measured" at the kernel's working precision (measured once per
    # kernel, device and dtype: gradcheck_bi.checks.precision), "exact" at the dtype's. The
    # measured one, where it is coarser than the dtype ("fp32" inside an fp64 call), or None.
    precision: str = "measured"
    working_precision: str | None = None
    # An op of any shape (gradcheck_bi.ops.shaped): the values of its own axes at this point
    # (layout, reduction, the cotangent control, …), as (axis, value) pairs.
    variant: tuple[tuple[str, Any], ...] = ()

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


@dataclass
class Result:
    """One verdict: a check of one kernel at one configuration (a row of the JSON).

    The field names are the public contract's: ``weight`` is the γ control's name and
    ``zero_centered_gamma`` the mode, as in the JSON and in baselines. ``atol`` … ``step_rel``
    are the settings that set this check's tolerance (``None`` where a setting does not act
    on the check, or was left to its derived default): a baseline keys on them.
    """

    kernel: str
    check: str
    device: str
    dtype: str
    shape: list[int]
    eps: float
    seed: int
    weight: str
    zero_centered_gamma: bool
    max_abs_err: float | None
    tolerance: float | None
    status: str
    expected: str
    as_expected: bool
    message: str = ""
    worst: list[int] | None = None
    input_scale: float = 1.0
    weight_scale: float = 1.0
    layout: str = "contiguous"
    atol: float | None = None
    rtol: float | None = None
    mode: str | None = None
    stencil: str | None = None
    step_rel: float | None = None
    details: dict[str, Any] = field(default_factory=dict)
    # An error's whole traceback, for --debug; never in the JSON (it names this machine).
    trace: str = field(default="", repr=False, compare=False)
    # The op and its point's extra axes (Config); in the JSON only for ops other than
    # rms_norm, so an RMSNorm result reads as it always has.
    op: str = "rms_norm"
    bias: str | None = None
    group_size: int | None = None
    norm_before_gate: bool | None = None
    # The precision the kernel was judged at where it computes coarser than its dtype
    # (Config.working_precision); in the JSON only then.
    working_precision: str | None = None
    # An op's own axes' values (Config.variant); in the JSON only then.
    variant: dict[str, Any] | None = None
    # Whether the point has the row ops' axes (ROW_ONLY: eps, γ's control and mode, the
    # scales): not an op of any shape's, whose JSON leaves them out. Never in the JSON itself.
    row_axes: bool = field(default=True, repr=False)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        del d["trace"]
        if d["variant"] is None:
            del d["variant"]
        if not d.pop("row_axes"):  # an op of any shape: the row ops' axes mean nothing there
            for key in ROW_ONLY:  # but an input scale its op draws at (ShapedOp.scaled)
                if key != "input_scale" or d[key] == 1.0:
                    del d[key]
        extra = {k: d.pop(k) for k in OP_FIELDS}
        if extra["op"] != "rms_norm" or any(v is not None for v in extra.values()
                                            if v != "rms_norm"):  # an RMSNorm with a β
            d = _with_op_fields(d, extra)
        for key in ("max_abs_err", "tolerance"):
            v = d[key]
            if isinstance(v, float) and not math.isfinite(v):
                d[key] = str(v)  # JSON has no inf/nan literals
        if not d["message"]:
            del d["message"]
        if d["working_precision"] is None:
            del d["working_precision"]
        return d


OP_FIELDS = ("op", "bias", "group_size", "norm_before_gate")
# The row ops' axes, left out of the JSON of an op of any shape (a result with a variant)
ROW_ONLY = ("eps", "weight", "zero_centered_gamma", "input_scale", "weight_scale")


def _with_op_fields(d: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``op`` after ``kernel``, ``bias`` after ``weight``, the gated norm's options after
    ``zero_centered_gamma``; a field the op does not have (None) is left out."""
    out: dict[str, Any] = {}
    after = {"kernel": ("op",), "weight": ("bias",),
             "zero_centered_gamma": ("group_size", "norm_before_gate")}
    for key, value in d.items():
        out[key] = value
        out.update({k: extra[k] for k in after.get(key, ()) if extra[k] is not None})
    return out


@dataclass(frozen=True)
class Defect:
    """A known defect and the (check, zcg, γ control) points where it must be detected."""

    name: str
    summary: str
    checks: frozenset[str]
    zcg: frozenset[bool]
    controls: frozenset[str]

    def shows(self, check: str, zero_centered_gamma: bool, control: str) -> bool:
        return (check in self.checks and zero_centered_gamma in self.zcg
                and control in self.controls)


@dataclass(frozen=True)
class KernelSpec:
    """A kernel under test: its name, its ``apply`` object and the defects it declares.

    ``source`` is ``"bundled"`` for the kernels shipped here, else the reference it was
    loaded from (``PATH.py:ATTR``, ``package.module:ATTR`` or ``"api"``).
    """

    name: str
    fn: Any
    defects: tuple[Defect, ...] = ()
    description: str = ""
    source: str = "bundled"
    # The zero_centered_gamma settings it can be checked at, and how zcg reaches it
    # (kernels/adapting/adapters.py): a kernel without zcg is run at zcg=off only, a built-in
    # (1 + w) one at zcg=on only.
    zcg: frozenset[bool] = frozenset({False, True})
    zcg_how: str = ""
    # Tensors it writes into by design ("grad_output": Liger's in-place backward).
    allow_mutation: frozenset[str] = frozenset()
    # The op it computes (gradcheck_bi.ops) and, for a kernel recognised from its
    # parameters, one line saying which op and from which names.
    op: str = "rms_norm"
    recognised: str = ""
    # Parameters of its op the kernel does not take (at None: absent) and options it fixes
    # instead of taking (group_size, norm_before_gate), at their values, and one line each
    # saying how (kernels/adapting/opadapt.py): not swept. The default is Megatron's
    # ``apply(x, weight, eps, zcg)``: an RMSNorm without β.
    fixed: tuple[tuple[str, Any], ...] = (("bias", None),)
    fixed_how: tuple[str, ...] = ()
    # The ``kernel_args`` it was resolved with (--kernel-arg, --op): a worker process
    # reloads the kernel from ``ref`` with these, whatever its sweep carries.
    loaded_with: tuple[tuple[str, Any], ...] = ()
    # Where its output matched another op than the one it is checked as (a kernel named
    # RMSNorm that subtracts the mean): the words a failed forward adds
    # (kernels/adapting/behaviour.py).
    mismatch: str = ""

    @property
    def ref(self) -> str:
        """How a run names where the kernel came from: the bundled name, else its source."""
        return self.name if self.source == "bundled" else self.source

    def not_run(self, zero_centered_gamma: bool) -> str:
        """The one line a report gives for the zcg setting this kernel is not run at."""
        return f"{self.name}: {self.why_not(zero_centered_gamma)}"

    def why_not(self, zero_centered_gamma: bool) -> str:
        """Why the kernel is not run at this zcg setting (:meth:`not_run` without the name)."""
        return (f"zcg={'on' if zero_centered_gamma else 'off'} results not run "
                f"— zero_centered_gamma is {self.zcg_how}")


@dataclass(frozen=True)
class Expectation:
    """A case's rule: at every point it matches (``None`` matches anything) expect ``status``.

    Rules outrank both ``expect`` and a bundled kernel's declared defects.
    """

    status: str
    kernel: str | None = None
    check: str | None = None
    device: str | None = None
    dtype: str | None = None
    weight: str | None = None
    zcg: bool | None = None
    reason: str = ""

    def matches(self, kernel: str, cfg: Config) -> bool:
        wanted = (self.kernel, self.check, self.device, self.dtype, self.weight, self.zcg)
        actual = (kernel, cfg.check, cfg.device, cfg.dtype, cfg.control,
                  cfg.zero_centered_gamma)
        return all(w is None or w == a for w, a in zip(wanted, actual, strict=True))


def did_you_mean(value: object, allowed: Sequence[str]) -> str:
    """`` (did you mean 'randn'?)`` when ``value`` is a near miss of one of ``allowed``, else
    ``""`` — the hint every bad choice gets, on the command line, in a case file and in the
    API alike."""
    import difflib

    if not isinstance(value, str):
        return ""
    if DTYPE_ALIASES.get(value) in allowed:  # torch's name for one of ours: --dtype float32
        return f" (did you mean {DTYPE_ALIASES[value]!r}?)"
    close = difflib.get_close_matches(value, list(allowed), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def first_line(exc: BaseException) -> str:
    """``"TypeName: first line of the message"`` — how an exception is named in a result."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def format_error(err: float | None) -> str:
    """An error or tolerance, whole: ``—`` when absent, ``0`` when exactly zero (tables, the
    text layout and the baseline's drift lines all write numbers this way)."""
    return "—" if err is None else ("0" if err == 0 else f"{err:.3e}")

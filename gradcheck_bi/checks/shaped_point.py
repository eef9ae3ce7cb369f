"""A point of an op of any shape, and calling its kernel there: the point's own draw (one
seed per point, its layout applied), the kernel's outputs in the op's canonical axes, its
analytic gradients of ``Σ ⟨cotangent, output⟩``, and what it wrote into.

Every call compares the bits of what the kernel received before and after (a write into
an input or the cotangent is a ``fail``, unless declared).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, replace
from typing import Any

import torch

from gradcheck_bi.kernels.calling.shaped_call import ShapedKernel, snapshot, unchanged
from gradcheck_bi.kernels.calling.writes import allowed_mutations
from gradcheck_bi.ops import SHAPED
from gradcheck_bi.ops.shaped import Drawn, ShapedOp, Variant
from gradcheck_bi.vocab import Config, ContractViolation


# -- a point ---------------------------------------------------------------------------
@dataclass
class Point:
    op: ShapedOp
    cfg: Config
    variant: Variant
    drawn: Drawn

    @property
    def dtype(self) -> torch.dtype:
        return self.cfg.torch_dtype

    def canonical(self, tensors: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.op.canonical(tensors or self.drawn.tensors, self.drawn.options)

    def exact(self) -> dict[str, Any]:
        """The point's tensors in fp64, canonical (integer roles as they are)."""
        return {k: (v.detach().to(torch.float64) if v is not None and v.is_floating_point()
                    else v) for k, v in self.canonical().items()}


def seed_of(cfg: Config) -> int:
    """A seed per (seed, variant, layout): every point draws its own data, reproducibly."""
    return cfg.seed * 1_000_003 + zlib.crc32(repr((cfg.variant, cfg.shape)).encode())


def make_point(cfg: Config, op: ShapedOp | None = None) -> Point:
    op = op or SHAPED[cfg.op]
    variant = Variant(cfg.variant) if cfg.variant else op.variants()[0]
    drawn = _draw(cfg, op, variant)
    if cfg.input_scale != 1.0 and op.scaled:
        drawn = replace(drawn, tensors={**drawn.tensors, **{
            r: scaled(t, cfg.input_scale) for r in op.scaled
            if (t := drawn.tensors.get(r)) is not None}})
    layout = cfg.layout
    if layout.endswith("-strided") and not layout.startswith("grad"):
        role = layout[: -len("-strided")]
        t = drawn.tensors.get(role)
        if t is not None:
            drawn = replace(drawn, tensors={**drawn.tensors, role: strided(t)})
    return Point(op, cfg, variant, drawn)


# The last draw, kept pristine: the points of one variant (its layouts, its forward and
# gradient checks, batch invariance's contiguous twin) run one after another and share
# their data; a copy costs a fraction of drawing (at (512, 32000) fp64: 0.5 s a draw, a
# serial fp64 normal). One entry: one draw's memory more, never more.
_kept_draw: list[tuple[Any, Drawn]] = []


def draw_key(cfg: Config, op: ShapedOp) -> tuple[Any, ...]:
    """What a point's draw depends on: points with one key draw the same values."""
    return (op.name, seed_of(cfg), cfg.variant, cfg.shape, cfg.dtype, cfg.device)


def _draw(cfg: Config, op: ShapedOp, variant: Variant) -> Drawn:
    """The point's draw, before its layout: its op's ``draw`` from the point's seed, or a
    copy of the same draw kept from the point before (a kernel may write into what it
    gets: every point gets tensors of its own)."""
    key = draw_key(cfg, op)
    if not (_kept_draw and _kept_draw[0][0] == key):
        gen = torch.Generator().manual_seed(seed_of(cfg))
        drawn = op.draw(op.sizes(cfg.shape), variant, cfg.torch_dtype, cfg.device, gen)
        _kept_draw[:] = [(key, drawn)]
        drawn = _copy_drawn(drawn)  # the kept one stays as drawn
    else:
        drawn = _copy_drawn(_kept_draw[0][1])
    return drawn


def _copy_drawn(d: Drawn) -> Drawn:
    clone = lambda t: t.clone() if isinstance(t, torch.Tensor) else t  # noqa: E731
    return replace(d, tensors={k: clone(v) for k, v in d.tensors.items()},
                   cotangents={k: clone(v) for k, v in d.cotangents.items()},
                   options=dict(d.options))


def scaled(t: torch.Tensor, scale: float) -> torch.Tensor:
    """``t · scale``, computed in fp64 and rounded once to ``t``'s dtype."""
    return (t.to(torch.float64) * scale).to(t.dtype)


def strided(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values in a view whose last axis has stride 2 (every other element of a
    buffer twice as wide), its other strides those of that buffer."""
    buf = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype, device=t.device) \
        if t.dim() else torch.zeros(2, dtype=t.dtype, device=t.device)
    view = buf[..., ::2] if t.dim() else buf[0]
    view.copy_(t)
    return view


def cotangent(g: torch.Tensor, shape: torch.Size, layout: str) -> torch.Tensor:
    """The canonical cotangent as the kernel gets it: its output's shape, in ``layout``
    (``grad-strided``, ``grad-transposed``: column-major storage, ``grad-expanded``: one
    value expanded with stride 0 — what ``loss.sum()``'s backward hands on)."""
    g = g.reshape(shape)
    if layout == "grad-strided":
        return strided(g)
    if layout == "grad-transposed" and g.dim() >= 2:
        return g.transpose(-1, -2).contiguous().transpose(-1, -2)
    if layout == "grad-expanded":
        return g.reshape(-1)[:1].reshape([1] * g.dim()).expand(shape) if g.dim() else g
    return g.contiguous()


# -- calling the kernel ----------------------------------------------------------------
def outputs_of(point: Point, raw: tuple[Any, ...]) -> dict[str, torch.Tensor]:
    op = point.op
    if len(raw) < len(op.outputs):
        raise ContractViolation(f"the kernel returned {len(raw)} output(s); {op.name} has "
                                f"{len(op.outputs)} ({', '.join(o.name for o in op.outputs)})")
    out = {}
    for o, t in zip(op.outputs, raw, strict=False):
        if not isinstance(t, torch.Tensor):
            raise ContractViolation(f"output {o.name} is a {type(t).__name__}, not a tensor")
        out[o.name] = t
    return out


def forward(kernel: ShapedKernel, point: Point, tensors: dict[str, Any] | None = None,
            exact: bool = True) -> dict[str, torch.Tensor]:
    """The kernel's outputs (canonical; fp64 unless ``exact`` is False: as it returned
    them) at ``tensors`` (the point's by default)."""
    tensors = tensors if tensors is not None else point.drawn.tensors
    if allowed_mutations():  # a kernel that writes into what it gets (by design): copies
        tensors = _copies(tensors)
    with torch.no_grad():
        outs = outputs_of(point, kernel(tensors, point.drawn.options))
    views = {k: point.op.output_view(k, v) for k, v in outs.items()}
    return {k: v.to(torch.float64) for k, v in views.items()} if exact else views


def with_grads(kernel: ShapedKernel, point: Point, tensors: dict[str, Any] | None = None,
               cotangents: dict[str, torch.Tensor] | None = None
               ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The kernel's outputs and its analytic gradients of ``Σ ⟨cotangent, output⟩`` with
    respect to every differentiable role it was given (canonical), watching its writes."""
    op = point.op
    tensors = dict(tensors if tensors is not None else point.drawn.tensors)
    cotangents = cotangents if cotangents is not None else point.drawn.cotangents
    allowed = allowed_mutations()
    if allowed:  # a kernel that writes into what it gets (by design): copies
        tensors = _copies(tensors)
    leaves = {}
    for k, v in tensors.items():
        if v is not None and op.role(k).differentiable:
            leaves[k] = v.detach().requires_grad_(True)
        else:
            leaves[k] = v
    before = snapshot(leaves)
    outs = outputs_of(point, kernel(leaves, point.drawn.options))
    unchanged("forward", before, leaves, allowed)
    gs = {k: cotangent(cotangents[k], outs[k].shape, point.cfg.layout) for k in outs
          if k in cotangents}
    names = [k for k, v in leaves.items() if isinstance(v, torch.Tensor) and v.requires_grad]
    pairs = [(outs[k], gs[k]) for k in gs if outs[k].requires_grad]
    watched = {**before, **snapshot({f"g:{k}": g for k, g in gs.items()})}
    if not pairs:
        raise ContractViolation("no output of the kernel is differentiable (does its "
                                "forward detach, or has it no backward?)")
    grads = torch.autograd.grad([p[0] for p in pairs], [leaves[k] for k in names],
                                [p[1] for p in pairs], allow_unused=True)
    unchanged("backward", watched, {**leaves, **{f"g:{k}": g for k, g in gs.items()}},
              allowed)
    found = {}
    for k, gr in zip(names, grads, strict=True):
        if gr is None and not op.independent:  # a plain function's input that reaches
            gr = torch.zeros_like(leaves[k])      # no output: autograd's None is its zero
        if gr is None:
            raise ContractViolation(f"the backward returned no gradient (None) for {k}")
        if gr.shape != leaves[k].shape:
            raise ContractViolation(f"d{k} has shape {tuple(gr.shape)}; {k} is "
                                    f"{tuple(leaves[k].shape)}")
        found[k] = gr
    canon = op.canonical({**{k: None for k in tensors}, **found}, point.drawn.options)
    grads_c = {k: v.detach().to(torch.float64) for k, v in canon.items() if v is not None}
    outs_c = {k: op.output_view(k, v.detach()).to(torch.float64) for k, v in outs.items()}
    return outs_c, grads_c


def _copies(tensors: dict[str, Any]) -> dict[str, Any]:
    """Each tensor copied with its strides (a kernel declared to write into its inputs must
    not change the point's own: the finite differences read them again)."""
    out: dict[str, Any] = {}
    for k, v in tensors.items():
        if isinstance(v, torch.Tensor):
            c = torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=v.device)
            c.copy_(v)
            out[k] = c
        else:
            out[k] = v
    return out


def bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same shape and bits (NaNs where NaNs)."""
    return a.shape == b.shape and bool(torch.equal(a, b) or (a.isnan() & b.isnan()).sum()
                                       == (a != b).sum())

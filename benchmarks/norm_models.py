"""The norms' hand-written rounding models against the derived one: hand / derived per element.

    PYTHONPATH=. python benchmarks/norm_models.py [--repeat 4] [--seed 0] [--ops rms_norm ...]

For each norm op, every combination of its options — γ (randn, ones, zeros) × zero_centered_gamma,
β (the op's controls; none where β is optional), the gated norm's group size (D and a divisor
of D), norm_before_gate and activation — in fp64 and fp32, at ``--repeat`` points each, the
(shape, input scale) taken in turn from a shuffled cross of :data:`SHAPES` × :data:`SCALES` so
that every pair comes up for every op. At each point (tests/independent/hand_vs_derived.py):
the forward's per-element tolerance and each gradient's kernel-rounding σ as the old engine
computes them, against ``errors.derived`` on the op's fp64 reference (forward: ``K_SIGMA·σ``;
gradients: σ; all in units of u). Prints a Markdown table per op × quantity × dtype of
``hand / derived`` over all elements of all points: min, median, max and where the extremes are
(the point and the element), and how many elements have a derived 0 under a nonzero hand
(``inf``, left out of the median).
"""

from __future__ import annotations

import argparse
import itertools
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "independent"))
sys.path.insert(0, str(ROOT))

from hand_vs_derived import compare  # noqa: E402

from gradcheck_bi.vocab import CONTROLS, Config  # noqa: E402

OPS = ("rms_norm", "fused_add_rms_norm", "layer_norm", "rms_norm_gated")
SHAPES = ((3, 1), (5, 7), (4, 96), (2, 4, 1024))
SCALES = (1e-3, 1.0, 1e3)
DTYPES = ("fp64", "fp32")


def variants(op: str, d: int) -> list[dict[str, object]]:
    """The op's own options at row length ``d``: β, and the gated norm's group size, order and
    activation (a group of D/4 where 4 divides D, else D alone)."""
    biases: tuple[str | None, ...] = {"rms_norm": (None, "randn", "zeros"),
                                      "layer_norm": ("randn", "zeros"),
                                      "rms_norm_gated": (None, "randn", "zeros")}.get(op, (None,))
    if op != "rms_norm_gated":
        return [{"bias": b} for b in biases]
    groups = [None, "quarter"]
    return [{"bias": b, "group_size": g, "norm_before_gate": nbg, "activation": act}
            for b, g, nbg, act in itertools.product(biases, groups, (True, False),
                                                    ("silu", "sigmoid"))]


def config(op: str, dtype: str, shape: tuple[int, ...], scale: float, gamma: str, zcg: bool,
           opts: dict[str, object], seed: int) -> Config:
    d = shape[-1]
    group = opts.get("group_size")
    if group == "quarter":
        group = d // 4 if d % 4 == 0 else None
    extra: dict[str, object] = {}
    if op == "rms_norm_gated":
        extra = {"group_size": group, "norm_before_gate": opts["norm_before_gate"],
                 "variant": (("activation", opts["activation"]),)}
    return Config("forward", dtype=dtype, shape=shape, input_scale=scale, control=gamma,
                  zero_centered_gamma=zcg, op=op, bias=opts.get("bias"), seed=seed, **extra)


def describe(cfg: Config) -> str:
    words = [f"γ={cfg.control}" + (" zcg" if cfg.zero_centered_gamma else "")]
    if cfg.bias is not None:
        words.append(f"β={cfg.bias}")
    if cfg.op == "rms_norm_gated":
        words.append(f"G={cfg.group_size or 'D'}")
        words.append("before" if cfg.norm_before_gate else "after")
        words.append(dict(cfg.variant)["activation"])
    shape = "×".join(str(s) for s in cfg.shape)
    return f"{' '.join(words)} ({shape}) ×{cfg.input_scale:g}"


@dataclass
class Summary:
    """hand / derived over every element of every point of one op × quantity × dtype."""

    ratios: list[torch.Tensor] = field(default_factory=list)
    lo: tuple[float, str] = (float("inf"), "")
    hi: tuple[float, str] = (0.0, "")
    inf: int = 0
    points: int = 0

    def add(self, ratio: torch.Tensor, where: str) -> None:
        """``ratio``: per element in its tensor's shape; nan (0/0) left out, inf counted."""
        self.points += 1
        flat = ratio.reshape(-1)
        self.inf += int(torch.isinf(flat).sum())
        finite = torch.isfinite(flat)
        if not finite.any():
            return
        self.ratios.append(flat[finite])
        low = torch.where(finite, flat, torch.inf).argmin()
        high = torch.where(finite, flat, -torch.inf).argmax()
        for i, is_low in ((int(low), True), (int(high), False)):
            at = ", ".join(str(int(k)) for k in torch.unravel_index(torch.tensor(i),
                                                                     ratio.shape))
            v = float(flat[i])
            if is_low and v < self.lo[0]:
                self.lo = (v, f"{where} [{at}]")
            if not is_low and v > self.hi[0]:
                self.hi = (v, f"{where} [{at}]")

    def row(self, key: tuple[str, str, str]) -> str:
        allr = torch.cat(self.ratios) if self.ratios else torch.zeros(0)
        med = f"{float(allr.median()):.3g}" if allr.numel() else "–"
        lo = f"{self.lo[0]:.3g}" if self.ratios else "–"
        hi = f"{self.hi[0]:.3g}" if self.ratios else "–"
        return (f"| {' | '.join(key)} | {self.points} | {allr.numel()} | {self.inf} | {lo} | "
                f"{med} | {hi} | {self.lo[1]} | {self.hi[1]} |")


def run(ops: tuple[str, ...], repeat: int, seed: int) -> dict[tuple[str, str, str], Summary]:
    rng = random.Random(seed)
    table: dict[tuple[str, str, str], Summary] = {}
    point_seed = seed
    for op in ops:
        pairs = list(itertools.product(SHAPES, SCALES))
        rng.shuffle(pairs)
        turn = itertools.cycle(pairs)
        combos = [(g, z, v) for g in CONTROLS for z in (False, True)
                  for v in range(len(variants(op, 4)))]
        for (gamma, zcg, v), _ in itertools.product(combos, range(repeat)):
            shape, scale = next(turn)
            point_seed += 1
            for dtype in DTYPES:  # the same draw in each dtype
                cfg = config(op, dtype, shape, scale, gamma, zcg, variants(op, shape[-1])[v],
                             point_seed)
                where = describe(cfg)
                for q, pair in compare(cfg).items():
                    table.setdefault((op, q, dtype), Summary()).add(pair.ratio(), where)
    return table


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=4, help="points per option combination")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ops", nargs="+", default=list(OPS), choices=OPS)
    a = p.parse_args()
    t0 = time.perf_counter()
    table = run(tuple(a.ops), a.repeat, a.seed)
    print(f"`PYTHONPATH=. python benchmarks/norm_models.py --repeat {a.repeat} --seed {a.seed}`"
          f" — torch {torch.__version__}, CPU, {time.perf_counter() - t0:.0f} s\n")
    print("| op | quantity | dtype | points | elements | inf | min | median | max | "
          "where min | where max |")
    print("|---|---|---|--:|--:|--:|--:|--:|--:|---|---|")
    for key, s in table.items():
        print(s.row(key))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

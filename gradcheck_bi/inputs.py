"""The inputs of one point: ``x``, the stored weight for its γ control, and the upstream ``g``.

Controls are defined on the effective weight γ: under ``zero_centered_gamma`` the stored
parameter is ``γ - 1``, so γ = ones stays the blind control in both modes. Everything is
drawn in fp64 from the point's seed and only then cast, so the draw depends only on seed,
shape and scales — never on kernel, check, zcg or device — and every kernel and control
sees the same ``x`` and ``g``.

The fp64 draw is the one piece of a GPU check that runs on the host (~20 ns per value), so
it is made once per ``(seed, shape)`` and kept (:data:`DRAW_CACHE_BYTES`): the dx and dw
points of a configuration, and its other controls, share it. Large draws are split over
idle cores (:func:`draw_normal`) with bits equal to one ``torch.randn`` after another.
What a point gets from a kept draw — scaled, cast and on its device — is kept beside it
(:func:`placed`): a later point of that draw copies it on the device instead of scaling,
casting and copying from the host again.

>>> from gradcheck_bi.vocab import Config
>>> x, w, g = make_inputs(Config(check="dx", shape=(2, 4), control="ones",
...                              zero_centered_gamma=True))
>>> w.tolist()
[0.0, 0.0, 0.0, 0.0]
"""

from __future__ import annotations

import functools
import math
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

import torch
from torch.utils.weak import WeakIdKeyDictionary

from gradcheck_bi.fd.threads import usable_cores
from gradcheck_bi.vocab import Config

# Draws kept for reuse, least recently used dropped first; a larger draw is not kept.
DRAW_CACHE_BYTES = 256 << 20
# Below this many values, or with fewer idle cores, one core draws them. Measured
# (docs/benchmarks.md, "The input draw"): 2.2-3.2x faster on 16 cores for 1-4 M values,
# no faster on 2 (the stream must still be walked once, at ~1/3 of a normal's cost).
PARALLEL_DRAW_MIN = 1 << 16
PARALLEL_DRAW_MIN_CORES = 4
_BLOCK = 16  # torch's CPU normal fill transforms uniforms in blocks of 16
_draws: OrderedDict[tuple[int, tuple[int, ...]], tuple[torch.Tensor, ...]] = OrderedDict()
_lock = threading.Lock()
# Per kept draw (held weakly: gone with the draw), its last PLACED_PER_DRAW placements.
PLACED_PER_DRAW = 2
_placed: WeakIdKeyDictionary = WeakIdKeyDictionary()


def _consumed(n: int) -> int:
    """fp64 uniforms that ``torch.randn(n)`` (``n >= 16``) takes from a CPU generator: one
    per value, and the last block drawn again when ``n`` is not a multiple of 16."""
    return n + (_BLOCK if n % _BLOCK else 0)


def _pieces(sizes: list[int], parts: int) -> list[tuple[int, int, int]]:
    """``(tensor, start, length)`` pieces of about ``sum(sizes) / parts`` values, each a
    multiple of 16 long except a tensor's last, which is at least 16 long."""
    step = max(_BLOCK, -(-sum(sizes) // parts // _BLOCK) * _BLOCK)
    out = []
    for i, n in enumerate(sizes):
        start = 0
        while n - start >= step + _BLOCK:
            out.append((i, start, step))
            start += step
        out.append((i, start, n - start))
    return out


def _draw_split(gen: torch.Generator, sizes: list[int], parts: int,
                pool: ThreadPoolExecutor | None) -> list[torch.Tensor]:
    """What ``[torch.randn(n, generator=gen) for n in sizes]`` returns, drawn in pieces:
    this thread walks the generator's stream with ``torch.rand`` (the same uniforms, ~3×
    cheaper than normals) and hands each piece's starting state to the pool."""
    outs = [torch.empty(n, dtype=torch.float64) for n in sizes]

    def fill(state: torch.Tensor, i: int, start: int, length: int) -> None:
        g = torch.Generator().set_state(state)
        torch.randn(length, generator=g, dtype=torch.float64, out=outs[i][start:start + length])

    pieces = _pieces(sizes, parts)
    skip = torch.empty(max(_consumed(n) for _, _, n in pieces), dtype=torch.float64)
    jobs = []
    for i, start, length in pieces:
        state = gen.get_state()
        if pool is None:
            fill(state, i, start, length)
        else:
            jobs.append(pool.submit(fill, state, i, start, length))
        torch.rand(_consumed(length), generator=gen, dtype=torch.float64,
                   out=skip[: _consumed(length)])
    for job in jobs:
        job.result()
    return outs


@functools.cache
def _split_matches() -> bool:
    """Whether this torch's CPU generator consumes its stream as :func:`_consumed` says:
    a small split draw compared bit for bit with plain ``torch.randn`` calls."""
    sizes = [83, 48, 37]
    plain_gen = torch.Generator().manual_seed(12345)
    plain = [torch.randn(n, generator=plain_gen, dtype=torch.float64) for n in sizes]
    split = _draw_split(torch.Generator().manual_seed(12345), sizes, 5, None)
    return all(torch.equal(a, b) for a, b in zip(plain, split, strict=True))


def draw_normal(seed: int, sizes: list[int]) -> list[torch.Tensor]:
    """fp64 standard normals: bit for bit ``[torch.randn(n) for n in sizes]`` from a CPU
    generator seeded with ``seed``, split over the idle cores when the draw is large (and
    every size but the last is at least 16, where the stream's use is known)."""
    gen = torch.Generator().manual_seed(seed)
    total, cores = sum(sizes), usable_cores()
    small = min(sizes) < _BLOCK  # a stream use only known for >= 16 values
    if (total < PARALLEL_DRAW_MIN or cores < PARALLEL_DRAW_MIN_CORES or small
            or not _split_matches()):
        return [torch.randn(n, generator=gen, dtype=torch.float64) for n in sizes]
    with ThreadPoolExecutor(max_workers=cores) as pool:
        return _draw_split(gen, sizes, cores, pool)


def _draw(seed: int, shape: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
    """Unscaled ``(x, g, γ)`` for a seed and shape, kept while they fit the cache."""
    key = (seed, shape)
    with _lock:
        if key in _draws:
            _draws.move_to_end(key)
            return _draws[key]
    n = math.prod(shape)
    x, g, gamma = draw_normal(seed, [n, n, shape[-1]])
    found = (x.view(shape), g.view(shape), gamma)
    size = 8 * (2 * n + shape[-1])
    with _lock:
        if size <= DRAW_CACHE_BYTES:
            _draws[key] = found
            while sum(8 * sum(t.numel() for t in v) for v in _draws.values()) > DRAW_CACHE_BYTES:
                _draws.popitem(last=False)
    return found


def effective_gamma(cfg: Config, gamma_randn: torch.Tensor) -> torch.Tensor:
    """γ for the point's control, fp64; ``randn`` scales the drawn ``gamma_randn``."""
    if cfg.control == "randn":
        return gamma_randn * cfg.weight_scale
    fill = {"ones": 1.0, "zeros": 0.0}[cfg.control]
    return torch.full((gamma_randn.shape[0],), fill, dtype=torch.float64)


def placed(drawn: torch.Tensor, scale: float | None, dtype: torch.dtype,
           device: torch.device) -> torch.Tensor:
    """``(drawn * scale).to(device, dtype)`` (``scale=None``: ``drawn.to(device, dtype)``)
    as a fresh tensor: a copy, on the device, of the one made the first time for this draw
    (kept while the draw is, its last :data:`PLACED_PER_DRAW` placements) — the same bits,
    without the host's product and cast and the copy from the host again."""
    key = (scale, dtype, str(device))
    with _lock:
        kept = _placed.get(drawn)
        made = kept.get(key) if kept is not None else None
    if made is None:
        made = (drawn if scale is None else drawn * scale).to(device, dtype, copy=True)
        with _lock:
            kept = _placed.setdefault(drawn, OrderedDict())
            kept[key] = made
            while len(kept) > PLACED_PER_DRAW:
                kept.popitem(last=False)
    return made.clone()


def make_inputs(cfg: Config) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x, stored weight, upstream grad g)`` for a config, in its dtype and on its device.

    Fresh tensors every call: a kernel that writes into its inputs cannot reach the kept
    draw."""
    x_raw, g_raw, gamma_raw = _draw(cfg.seed, tuple(cfg.shape))
    gamma = effective_gamma(cfg, gamma_raw)
    w = gamma - 1 if cfg.zero_centered_gamma else gamma
    dt, dev = cfg.torch_dtype, torch.device(cfg.device)
    return (placed(x_raw, cfg.input_scale, dt, dev), w.to(dev, dt),
            placed(g_raw, None, dt, dev))

"""The inputs of a point: shared across kernels and controls, γ defined on the effective weight."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from gradcheck_bi import inputs
from gradcheck_bi.inputs import make_inputs
from gradcheck_bi.vocab import Config


def test_inputs_are_shared_across_kernels_and_controls() -> None:
    x1, _, g1 = make_inputs(Config(check="dx", control="randn"))
    x2, w2, g2 = make_inputs(Config(check="forward", control="ones", zero_centered_gamma=True))
    assert x1.equal(x2) and g1.equal(g2)
    assert (w2 == 0).all()  # zcg stores γ − 1: the ones control is still γ = 1


def test_inputs_follow_seed_dtype_and_scales() -> None:
    a = make_inputs(Config(check="dx", seed=3, dtype="fp32", input_scale=1e-3))
    b = make_inputs(Config(check="dx", seed=4, dtype="fp32", input_scale=1e-3))
    assert all(t.dtype == torch.float32 for t in a)
    assert not a[0].equal(b[0]), "a new seed draws new x"
    assert float(a[0].abs().max()) < 1e-2
    assert float(make_inputs(Config(check="dx", control="zeros"))[1].abs().max()) == 0.0


def _sequential(cfg: Config) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The draw as first defined: one torch.randn after another from the seed, then cast."""
    gen = torch.Generator().manual_seed(cfg.seed)
    x = torch.randn(cfg.shape, generator=gen, dtype=torch.float64) * cfg.input_scale
    g = torch.randn(cfg.shape, generator=gen, dtype=torch.float64)
    gamma = torch.randn(cfg.shape[-1], generator=gen, dtype=torch.float64) * cfg.weight_scale
    if cfg.control != "randn":
        gamma = torch.full_like(gamma, 1.0 if cfg.control == "ones" else 0.0)
    w = gamma - 1 if cfg.zero_centered_gamma else gamma
    dt = cfg.torch_dtype
    return x.to(dt), w.to(dt), g.to(dt)


@pytest.mark.parametrize("shape", [(2, 8, 256), (3, 4097), (64, 1031), (1, 24), (5, 7)])
def test_draw_is_bitwise_the_sequential_randn_draw(shape: tuple[int, ...],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # Force the split path on (four "idle" cores, no size floor) and clear the kept draws, so
    # both the split and the kept copy are compared with plain torch.randn calls.
    monkeypatch.setattr(inputs, "usable_cores", lambda: 4)
    monkeypatch.setattr(inputs, "PARALLEL_DRAW_MIN", 0)
    inputs._draws.clear()
    assert inputs._split_matches()  # (cached: it draws through _draw_split once itself)
    split = inputs._draw_split
    used: list[int] = []
    monkeypatch.setattr(inputs, "_draw_split",
                        lambda *a: used.append(1) or split(*a))  # type: ignore[func-returns-value]
    for control, zcg, scale in (("randn", False, 1.0), ("ones", True, 1e-3), ("zeros", False, 7.0)):
        cfg = Config(check="dx", shape=shape, seed=11, control=control, zero_centered_gamma=zcg,
                     input_scale=scale, weight_scale=scale)
        for got, want in zip(make_inputs(cfg), _sequential(cfg), strict=True):
            assert got.dtype == want.dtype and torch.equal(got, want)
    assert used == ([] if shape[-1] < 16 else [1]), "drawn once, split unless D < 16"


@pytest.mark.parametrize("parts", [2, 3, 8, 64])
def test_split_draw_matches_one_randn_after_another(parts: int) -> None:
    sizes = [4096 + 5, 4096 + 5, 300]
    gen = torch.Generator().manual_seed(7)
    want = [torch.randn(n, generator=gen, dtype=torch.float64) for n in sizes]
    with ThreadPoolExecutor(max_workers=parts) as pool:
        got = inputs._draw_split(torch.Generator().manual_seed(7), sizes, parts, pool)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert len(inputs._pieces(sizes, parts)) >= min(parts, 3)
    assert inputs._split_matches()


def test_kept_draw_cannot_be_changed_through_returned_tensors() -> None:
    cfg = Config(check="dx", shape=(4, 32), seed=5)
    x, w, g = make_inputs(cfg)
    x.add_(1.0), w.add_(1.0), g.add_(1.0)  # a kernel that writes into its inputs
    for got, want in zip(make_inputs(cfg), _sequential(cfg), strict=True):
        assert torch.equal(got, want)


def test_kept_draws_stay_under_their_byte_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inputs, "DRAW_CACHE_BYTES", 3 * 8 * (2 * 64 + 8))
    inputs._draws.clear()
    for seed in range(6):
        make_inputs(Config(check="dx", shape=(8, 8), seed=seed))
    assert list(inputs._draws) == [(3, (8, 8)), (4, (8, 8)), (5, (8, 8))]
    inputs._draws.clear()


def test_placed_inputs_are_fresh_copies_of_one_placement() -> None:
    drawn = torch.randn(4, 8, dtype=torch.float64)
    a = inputs.placed(drawn, 0.5, torch.float32, torch.device("cpu"))
    a.add_(1.0)  # a kernel that writes into its input
    b = inputs.placed(drawn, 0.5, torch.float32, torch.device("cpu"))
    assert b.dtype == torch.float32 and torch.equal(b, (drawn * 0.5).to(torch.float32))
    assert b.data_ptr() != inputs.placed(drawn, 0.5, torch.float32, torch.device("cpu")).data_ptr()
    unscaled = inputs.placed(drawn, None, torch.float64, torch.device("cpu"))
    assert torch.equal(unscaled, drawn) and unscaled.data_ptr() != drawn.data_ptr()
    for scale in (1.0, 2.0, 3.0):
        inputs.placed(drawn, scale, torch.float32, torch.device("cpu"))
    assert list(inputs._placed[drawn]) == [(s, torch.float32, "cpu") for s in (2.0, 3.0)]
    kept = len(inputs._placed)
    del drawn  # a placement lives as long as its draw
    assert len(inputs._placed) == kept - 1

"""What a kernel under test may write into: the tensors it was handed, compared bitwise.

Every call of a kernel (:mod:`.opcall`) hands it copies and compares each, after the forward
and after the backward, with what it held before (:func:`unchanged`): a write is a
:class:`~gradcheck_bi.vocab.ContractViolation` (a ``fail``), unless the check declared it
(:func:`declared_mutations`: a named adapter, a case file's ``allow_mutation``,
``--allow-mutation``), when it is a note in the report.

>>> import torch
>>> x = torch.ones(4)
>>> with declared_mutations(frozenset({"x"})) as seen:
...     unchanged("forward", {"x": (x.clone().add_(1), x)})
>>> seen
['forward overwrote x (100% of elements)']
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

from gradcheck_bi.ops import SHAPED
from gradcheck_bi.vocab import ContractViolation

# The tensors a kernel may write into during the current check, and the declared writes seen.
_DECLARED: ContextVar[tuple[frozenset[str], list[str]]] = ContextVar(
    "declared_mutations", default=(frozenset(), []))
# What a kernel can declare it writes into: a norm's x or weight, the cotangent, and any
# tensor role of an op of any shape (logits, A, …).
MUTABLE = ("x", "weight", "grad_output",
           *dict.fromkeys(r.name for op in SHAPED.values() for r in op.roles
                          if r.name not in ("x", "weight")))


@contextmanager
def declared_mutations(allowed: frozenset[str] = frozenset()) -> Iterator[list[str]]:
    """Within the block, writes into the tensors named in ``allowed`` (a named adapter's
    declaration, a case file's ``allow_mutation``, ``--allow-mutation``) are not failures;
    the list collects one line per such write, for the report's note."""
    seen: list[str] = []
    token = _DECLARED.set((frozenset(allowed), seen))
    try:
        yield seen
    finally:
        _DECLARED.reset(token)


def allowed_mutations() -> frozenset[str]:
    """The writes declared for the current check (see :func:`declared_mutations`)."""
    return _DECLARED.get()[0]


def noted_mutations() -> list[str]:
    """The current check's list of notes on declared writes (see
    :func:`declared_mutations`): what a call made under it has added so far."""
    return _DECLARED.get()[1]


def _fraction_changed(now: torch.Tensor, before: torch.Tensor) -> float:
    """The fraction of elements whose bits differ (NaN-safe: compared as integers)."""
    if now.shape != before.shape:
        return 1.0
    if now.dtype.is_floating_point:
        ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[now.element_size()]
        a, b = now.detach().contiguous().view(ints), before.contiguous().view(ints)
    else:
        a, b = now.detach(), before
    if torch.equal(a, b):  # the usual case: one pass, no temporaries, no count
        return 0.0
    return float((a != b).double().mean())


def _bytes(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The tensors' bits end to end, as one flat uint8 tensor (one op: the cat).

    ``contiguous()`` keeps the stride of a dim of size 1 (a strided ``(1,)`` tensor counts
    as contiguous), which ``view(torch.uint8)`` refuses: such a tensor is copied.

    >>> _bytes([torch.zeros(2)[::2], torch.ones(1, dtype=torch.float16)]).tolist()
    [0, 0, 0, 0, 0, 60]
    """
    flat = [t.detach().contiguous().view(-1) for t in tensors]
    return torch.cat([(f if f.stride(-1) == 1 else f.clone(memory_format=torch.contiguous_format)
                       ).view(torch.uint8) for f in flat])


def all_bits_equal(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> bool | None:
    """Whether every pair ``(a, b)`` holds the same bits, told with one comparison (one host
    sync, where a ``torch.equal`` per pair is one each); ``None`` when that cannot be told
    at once — fewer than two pairs, or a pair differing in shape or dtype: compare each.

    >>> a = torch.tensor([1.0, float("nan")]); b = torch.arange(3, dtype=torch.int16)
    >>> all_bits_equal([(a, a.clone()), (b, b.clone())]), all_bits_equal([(a, a), (b, b + 1)])
    (True, False)
    """
    if len(pairs) < 2 or any(a.shape != b.shape or a.dtype != b.dtype for a, b in pairs):
        return None
    return torch.equal(_bytes([a for a, _ in pairs]), _bytes([b for _, b in pairs]))


def unchanged(phase: str, owned: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Compare each ``name: (tensor the kernel held, copy from before)`` bitwise after
    ``phase``: a write is a :class:`ContractViolation`, or, where declared
    (:func:`declared_mutations`), a note. Used by RMSNorm's calls and the other row ops'."""
    if all_bits_equal(list(owned.values())):  # the usual case: one comparison for all
        return
    allowed, seen = _DECLARED.get()
    for name, (now, before) in owned.items():
        changed = _fraction_changed(now, before)
        if not changed:
            continue
        line = f"{phase} overwrote {name} ({changed:.0%} of elements)"
        if name not in allowed:
            raise ContractViolation(line + "; declare it with --allow-mutation "
                                    f"{name} if it is by design")
        if line not in seen:
            seen.append(line)

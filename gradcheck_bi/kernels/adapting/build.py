"""A user's nn.Module class (or factory), built for each point of a sweep.

Both adapters (:mod:`.adapters` for an RMSNorm with a weight and no bias, :mod:`.opadapt`
for every other op and variant) build modules here. A module is built per (D, eps, zcg,
device, dtype, group size, gate order), its constructor's parameters filled by role
(:func:`~.signature.ctor_slots`):

* the hidden size and eps under its own names; a group size (the point's, else D) or a
  number of groups (``n_groups`` = D / group size);
* a ``config`` object written here: the module's config class (its annotation, else the
  one ``*Config`` class its module holds, by the longest shared name), built with the
  class's own keyword names for the hidden size (``hidden_size``, ``d_model``, …) and for
  eps (``rms_norm_eps``, ``layer_norm_eps``, ``eps``, …);
* no hidden size: a weightless norm (``(eps)`` or nothing);
* no eps: a norm that fixes its own, checked at it: read from the module (an ``eps``,
  ``variance_epsilon`` or ``epsilon`` attribute; an ``eps=`` constant in its forward, else
  its one small constant such as ``+ 1e-5``; else the one eps its parts share).

Refused when loaded, each in one line (exit 2): a channels-first norm (BatchNorm,
InstanceNorm, GroupNorm, ``*2d``: channels on axis 1, statistics not over the last axis
alone), a module with a parameter that is not ``(D,)`` (a gate MLP, adaLN's projections: not
a norm over the last axis), a one-input module whose output is not shaped like its input, a
config class that cannot be found or has no hidden size, a module whose eps is neither taken
nor readable.

>>> b = Builder(__import__("torch").nn.RMSNorm, "torch.nn:RMSNorm", {})
>>> b.own_eps, type(b.probe).__name__
(None, 'RMSNorm')
"""

from __future__ import annotations

import inspect
import re
import sys
import typing
from collections.abc import Callable
from typing import Any

import torch

from gradcheck_bi.kernels.adapting.signature import VARIADIC, ctor_slots, fill, role_of
from gradcheck_bi.vocab import KernelLoadError, first_line

PROBE_D = 8  # the hidden size a module is built at once on CPU, when loaded
_KEPT = 16  # built modules kept per kernel
_CONFIG_SIZE = ("hidden_size", "d_model", "dim", "hidden_dim", "n_embd", "embed_dim")
_CONFIG_EPS = ("eps", "rms_norm_eps", "layer_norm_eps", "norm_eps", "layer_norm_epsilon",
               "rms_norm_epsilon", "epsilon", "variance_epsilon")
_EPS_ATTRS = ("eps", "variance_epsilon", "epsilon", "variance_eps")
_EPS_LITERAL = re.compile(r"\beps(?:ilon)?\s*=\s*(\d+(?:\.\d*)?(?:[eE]-?\d+)?)")
_SMALL_LITERAL = re.compile(r"(?<![\w.])(\d+(?:\.\d*)?[eE]-\d+)")  # 1e-5, 1.0e-6
_CHANNELS_FIRST_TYPES = (torch.nn.modules.batchnorm._NormBase, torch.nn.GroupNorm,
                         torch.nn.LocalResponseNorm, torch.nn.CrossMapLRN2d)
_CHANNELS_FIRST_NAME = re.compile(r"BatchNorm|InstanceNorm|GroupNorm|[123]d$")


def _class_of(factory: Any) -> type | None:
    while hasattr(factory, "func"):  # functools.partial
        factory = factory.func
    return factory if isinstance(factory, type) else None


def refuse_channels_first(factory: Any, name: str) -> None:
    """A :class:`KernelLoadError` for a norm with channels on axis 1 (BatchNorm2d, GroupNorm,
    ``*2d``)."""
    cls = _class_of(factory)
    if cls is None:
        return
    named = _CHANNELS_FIRST_NAME.search(cls.__name__)
    if issubclass(cls, _CHANNELS_FIRST_TYPES):
        # the nearest public torch class it is ("BatchNorm2d"), not a private base ("_NormBase")
        kind = next((c.__name__ for c in cls.__mro__ if c.__module__.startswith("torch.")
                     and not c.__name__.startswith("_")
                     and issubclass(c, _CHANNELS_FIRST_TYPES)), cls.__name__)
        why = f"a torch {kind}"
    elif named is not None:
        why = f"named {named.group(0)!r}"
    else:
        return
    # True of each kind: BatchNorm's statistics run over N and the positions, GroupNorm's over
    # a group of channels and the positions, LocalResponseNorm's across neighbouring channels.
    raise KernelLoadError(
        f"kernel {name} is a channels-first norm ({why}): axis 1 of (N, C, ...) holds its "
        "channels and its statistics do not run over the last axis alone; gradcheck-bi checks "
        "norms over the last axis")


def config_class(factory: Any, slot: str, name: str) -> type:
    """The config class a constructor's ``slot`` takes: its annotation, else the ``*Config``
    class of the factory's module sharing the longest name prefix with it."""
    cls = _class_of(factory)
    init = next((c.__dict__["__init__"] for c in cls.__mro__ if "__init__" in c.__dict__),
                None) if cls else factory
    try:
        hint = typing.get_type_hints(init).get(slot)
    except Exception:  # unresolvable annotations: fall back on the module's classes
        hint = None
    if isinstance(hint, type) and hint.__name__.endswith("Config"):
        return hint
    module = sys.modules.get(getattr(factory, "__module__", "") or "")
    own = getattr(cls or factory, "__name__", "")
    found = [v for k, v in vars(module or object).items()
             if isinstance(v, type) and k.endswith("Config")]

    def shared(c: type) -> int:
        return len(_common_prefix(own, c.__name__))

    best = sorted(found, key=shared, reverse=True)
    if not best or (len(best) > 1 and shared(best[0]) == shared(best[1])) \
            or shared(best[0]) == 0:
        raise KernelLoadError(
            f"kernel {name} takes a config object ({slot}) and its config class cannot be "
            "told (no annotation, no one *Config class in its module): give --kernel-arg "
            f"{slot}=VALUE")
    return best[0]


def _common_prefix(a: str, b: str) -> str:
    n = next((i for i, (p, q) in enumerate(zip(a, b, strict=False)) if p != q), min(len(a),
                                                                                 len(b)))
    return a[:n]


def _keywords(cls: type) -> set[str]:
    try:
        return set(inspect.signature(cls).parameters)
    except (TypeError, ValueError):
        return set()


def own_eps(module: torch.nn.Module) -> tuple[float, str] | None:
    """The eps a module fixes, and where it was read: an eps attribute of its own, an
    ``eps=`` constant in its forward (else its one small constant, ``+ 1e-5``), else the one
    eps its parts share."""
    for attr in _EPS_ATTRS:
        value = getattr(module, attr, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value), f"its attribute {attr}"
    try:
        source = inspect.getsource(type(module).forward)
    except (OSError, TypeError):
        source = ""
    literals = {float(v) for v in _EPS_LITERAL.findall(source)} or {
        float(v) for v in _SMALL_LITERAL.findall(source)}
    if len(literals) == 1:
        return float(literals.pop()), "its forward's constant"
    parts = {(n, a): float(getattr(m, a)) for n, m in module.named_modules() if n
             for a in _EPS_ATTRS if isinstance(getattr(m, a, None), (int, float))}
    if len(set(parts.values())) == 1:
        (part, attr), value = next(iter(parts.items()))
        return value, f"its {part}.{attr}"
    return None


def probe_values() -> dict[str, Any]:
    """The point a module is built at when loaded: CPU, fp32, D = PROBE_D, whole-row group."""
    return {"size": PROBE_D, "eps": 1e-6, "zcg": False, "offset": 0.0, "shape": (PROBE_D,),
            "device": torch.device("cpu"), "dtype": torch.float32, "group_size": None,
            "norm_before_gate": None}


def required_inputs(module: torch.nn.Module) -> list[str]:
    """The names of the parameters its forward cannot go without."""
    try:
        params = inspect.signature(module.forward).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.default is inspect.Parameter.empty
            and p.kind not in VARIADIC]


def _output_shape(module: torch.nn.Module) -> tuple[int, ...] | None:
    """The shape a one-input module returns for x of (2, PROBE_D); ``None`` where it takes
    more inputs or does not run here (its points say why)."""
    if len(required_inputs(module)) != 1:
        return None
    try:
        with torch.no_grad():
            y = module(torch.randn(2, PROBE_D, generator=torch.Generator().manual_seed(0)))
    except Exception:  # refused here: each point reports it
        return None
    return tuple(y.shape) if isinstance(y, torch.Tensor) else None


class Builder:
    """A module class or factory and how each of its constructor's parameters is filled.

    ``probe`` is the module built once on CPU at ``D = PROBE_D`` (``None`` where it does
    not build here, a CUDA-only module); ``own_eps`` is ``(eps, where read)`` for a
    constructor that takes none.
    """

    def __init__(self, factory: Callable[..., Any], name: str, kernel_args: dict[str, Any]
                 ) -> None:
        refuse_channels_first(factory, name)
        self.factory, self.name, self.kernel_args = factory, name, kernel_args
        self.slots = ctor_slots(factory, getattr(factory, "__name__", name), kernel_args)
        config = role_of(self.slots, "config")
        self.config = config_class(factory, config.name, name) if config else None
        if self.config is not None and not self._config_fields(_CONFIG_SIZE):
            raise KernelLoadError(
                f"kernel {name} takes a {self.config.__name__}, which has no hidden size "
                f"({', '.join(_CONFIG_SIZE[:3])}, …) to write")
        self._built: dict[tuple[str, ...], torch.nn.Module] = {}
        # The hidden size given as the shape (D,), not the int D (:meth:`_construct`);
        # None until a build was refused with the int.
        self.size_as_shape: bool | None = None
        self.probe, why = self._probe()
        if self.probe is None and self.config is not None:  # the config written here fails
            raise KernelLoadError(
                f"kernel {name} could not be built from the {self.config.__name__} written "
                f"here (hidden size {PROBE_D}, the class's other defaults): {why}")
        # (eps, where read), or the reason there is none: refused where the op has an eps
        self.own_eps: tuple[float, str] | None = None
        self.no_eps = ""
        if not self.takes_eps:
            self.own_eps, self.no_eps = self._own_eps(why)

    @property
    def takes_eps(self) -> bool:
        """Whether each point's eps reaches the module (a parameter, or its config)."""
        return role_of(self.slots, "eps") is not None or (
            self.config is not None and bool(self._config_fields(_CONFIG_EPS)))

    def _config_fields(self, names: tuple[str, ...]) -> list[str]:
        assert self.config is not None
        keywords = _keywords(self.config)
        return [n for n in names if n in keywords or hasattr(self.config, n)]

    def _write_config(self, size: int, eps: float) -> Any:
        """The config object: the class's defaults with the hidden size and eps written."""
        assert self.config is not None
        given = {**{n: size for n in self._config_fields(_CONFIG_SIZE)},
                 **{n: eps for n in self._config_fields(_CONFIG_EPS)}}
        keywords = _keywords(self.config)
        config = self.config(**{n: v for n, v in given.items() if n in keywords})
        for n, v in given.items():
            if n not in keywords:
                setattr(config, n, v)
        return config

    def _values(self, values: dict[str, Any]) -> dict[str, Any]:
        size = values["size"]
        group = values.get("group_size") or size
        gate = values.get("norm_before_gate")
        slot = role_of(self.slots, "norm_before_gate")
        if gate is None:
            gate = slot.default if slot is not None and slot.default is not None else True
        return {**values, "group_size": group, "n_groups": size // group,
                "norm_before_gate": gate,
                "config": self._write_config(size, values["eps"]) if self.config else None}

    def build(self, values: dict[str, Any]) -> torch.nn.Module:
        """The module for a point's ``values`` (size, eps, zcg, offset, device, dtype,
        group_size, norm_before_gate), built once and kept."""
        key = tuple(repr(values.get(k)) for k in ("size", "eps", "zcg", "device", "dtype",
                                                   "group_size", "norm_before_gate"))
        if key not in self._built:
            module = self._construct(self._values(values))
            if not isinstance(module, torch.nn.Module):
                raise TypeError(f"{self.name} built a {type(module).__name__}, not an nn.Module")
            if len(self._built) >= _KEPT:
                self._built.pop(next(iter(self._built)))
            self._built[key] = module.to(values["device"])
        return self._built[key]

    def _construct(self, values: dict[str, Any]) -> Any:
        """The factory called with ``values``; its hidden size as the shape ``(D,)`` where
        the int is refused with a TypeError and the shape is taken (ChameleonLayerNorm reads
        ``hidden_size[-1]``, as ``nn.LayerNorm`` takes ``normalized_shape`` either way),
        that reading kept for every later point."""
        shaped = {**values, "size": (values["size"],)}
        if self.size_as_shape:
            values = shaped
        args, kwargs = fill(self.slots, values, self.kernel_args)
        try:
            return self.factory(*args, **kwargs)
        except TypeError:
            if self.size_as_shape is not None or role_of(self.slots, "size") is None:
                raise
            self.size_as_shape = False
            args, kwargs = fill(self.slots, shaped, self.kernel_args)
            try:
                module = self.factory(*args, **kwargs)
            except Exception:  # the int's own error says more
                pass
            else:
                self.size_as_shape = True
                return module
            raise

    def _probe(self) -> tuple[torch.nn.Module | None, str]:
        try:
            module = self.build(probe_values())
        except Exception as exc:  # not buildable here (a CUDA-only module): each point says
            return None, first_line(exc)
        foreign = [f"{n} {tuple(p.shape)}" for n, p in module.named_parameters()
                   if tuple(p.shape) != (PROBE_D,)]
        if foreign:
            raise KernelLoadError(
                f"kernel {self.name} is not a norm over the last axis: built at D = {PROBE_D}"
                f", it has parameters that are no (D,) weight or bias ({', '.join(foreign)})")
        shape = _output_shape(module)
        if shape is not None and shape != (2, PROBE_D):
            raise KernelLoadError(
                f"kernel {self.name} is not a norm over the last axis: for x of (2, {PROBE_D})"
                f" its forward returns {shape}")
        return module, ""

    def _own_eps(self, why: str) -> tuple[tuple[float, str] | None, str]:
        """The eps it fixes and where it was read, else ``None`` and the refusal of an op
        with an eps."""
        what = getattr(self.factory, "__name__", self.name)
        if self.probe is None:
            raise KernelLoadError(f"kernel {self.name} takes no eps and could not be built "
                                  f"here to read its own ({why})")
        found = own_eps(self.probe)
        if found is None:
            return None, (
                f"kernel {self.name}: {what} takes no eps and shows none (no eps, "
                "variance_epsilon or epsilon attribute, no eps= constant in its forward), "
                "so there is no eps to check it at")
        return found, ""

    def fixed(self, needs_eps: bool = True
              ) -> tuple[tuple[tuple[str, Any], ...], tuple[str, ...]]:
        """``spec.fixed`` and ``spec.fixed_how`` for a module that fixes its eps, else empty;
        a :class:`KernelLoadError` for one that shows none, when its op ``needs_eps``."""
        if self.no_eps and needs_eps:
            raise KernelLoadError(self.no_eps)
        if self.own_eps is None:
            return (), ()
        value, where = self.own_eps
        what = getattr(self.factory, "__name__", self.name)
        return ((("eps", value),),
                (f"eps not swept — {what} takes no eps: checked at its own eps={value:g} "
                 f"(read from {where})",))

    def tensors(self, module: torch.nn.Module, d: int) -> list[str]:
        """The names of the module's ``(d,)`` parameters."""
        return [n for n, p in module.named_parameters() if tuple(p.shape) == (d,)]

    @property
    def weightless(self) -> bool:
        """Built here, with no ``(D,)`` parameter at all: a norm without weight or bias."""
        return self.probe is not None and not self.tensors(self.probe, PROBE_D)


__all__ = [
    "PROBE_D",
    "Builder",
    "config_class",
    "own_eps",
    "probe_values",
    "refuse_channels_first",
    "required_inputs",
]

"""A STAND-IN for torchvision, used only by benchmarks/scoreboard.py to import timm.layers.

torchvision has no CPU wheel on the machines this scoreboard was written on, and ``import
timm`` imports torchvision (datasets, transforms, ``ops.misc.FrozenBatchNorm2d``) at module
level. This package answers every ``torchvision.*`` import with an empty module whose every
name is a placeholder class that raises ``NotImplementedError`` when called or instantiated.
It computes nothing: no class of torchvision is scored through it, and a timm class that uses
torchvision at run time raises (the scoreboard then shows that class as broken, not passing).
It is put on ``PYTHONPATH`` only for the scoreboard's timm subprocesses, and only when the real
torchvision cannot be imported.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

__version__ = "0.0+scoreboard.stand.in"


class _PlaceholderMeta(type):
    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{cls.__qualname__}.{name}")


def _placeholder(name: str) -> Any:
    def refuse(self: Any, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(f"torchvision.{name} is the scoreboard's stand-in: "
                                  "torchvision is not installed")

    return _PlaceholderMeta(name, (), {"__init__": refuse, "__module__": "torchvision"})


def _module_getattr(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    return _placeholder(name)


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Makes ``torchvision.<anything>`` an empty package of placeholders."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if not fullname.startswith("torchvision."):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: Any) -> types.ModuleType:
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = _module_getattr  # type: ignore[method-assign]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


sys.meta_path.insert(0, _StandInFinder())
__getattr__ = _module_getattr

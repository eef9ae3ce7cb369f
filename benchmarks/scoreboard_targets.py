"""The scoreboard's subjects: every norm class and function of torch, Liger, transformers, timm,
and torch's entry points of the tool's other ops.

    python benchmarks/scoreboard_targets.py LIBRARY    # torch, torch-ops, liger, liger-ops, fla,
                                                      # transformers, transformers-ops, timm

prints a JSON object ``{"targets": [...], "skipped": [...]}`` on stdout. Each target is
``{"id", "library", "kernel", "kernel_args"}``: ``kernel`` is the ``--kernel`` value a new
user would type (``package.module:Class``) and ``kernel_args`` the ``--kernel-arg`` values,
empty except for the torch constructor flags listed in ``TORCH_VARIANTS``. ``skipped`` lists
the modules that could not be imported here, with the one-line reason.

benchmarks/scoreboard.py runs this in a subprocess per library (importing every modeling
module of transformers takes a few hundred MB; the timm one needs the torchvision stand-in on
its path), so the scoreboard process itself imports none of these libraries.

Which classes: those whose name contains "Norm", that are ``torch.nn.Module`` subclasses and
are defined in the module they are found in (a copy of LlamaRMSNorm in another model's module
counts again: it is another class a user may point the tool at). torch's functions: those of
``torch.nn.functional`` whose name contains "norm". ``torch-ops``: the ``torch.nn`` and
``torch.nn.functional`` entry points of the tool's ops beyond norms (``TORCH_OPS``);
``transformers-ops``: transformers' own (``TRANSFORMERS_OPS``). ``liger-ops`` and ``fla``:
every op with a hand-written backward — each ``torch.autograd.Function`` subclass with a public
name defined in a module of ``liger_kernel.ops`` (one level), of ``fla.modules.activations`` or
of ``fla.modules.norm`` (Ascend/NPU variants left out: they do not run on CUDA).
"""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
import sys
from typing import Any

# torch modules and functions at the constructor flags a user sets (nn.LayerNorm with
# and without bias, nn.RMSNorm with and without affine, group_norm where it fits: one group).
TORCH_VARIANTS: list[tuple[str, list[str]]] = [
    ("torch.nn:LayerNorm", ["bias=False"]),
    ("torch.nn:LayerNorm", ["elementwise_affine=False"]),
    ("torch.nn:RMSNorm", ["elementwise_affine=False"]),
    ("torch.nn:GroupNorm", ["num_groups=1"]),
    ("torch.nn.functional:group_norm", ["num_groups=1"]),
]

# Beyond norms: torch's entry points of the tool's other ops (cross_entropy, log_softmax, gemm),
# each called as shipped: a function with its defaults, a module from its constructor's.
TORCH_OPS = ["torch.nn.functional:cross_entropy", "torch.nn:CrossEntropyLoss",
             "torch.nn.functional:log_softmax", "torch.nn:LogSoftmax",
             "torch.nn.functional:linear", "torch.nn:Linear"]
# transformers' entry points of those ops: its cross-entropy over logits with a target
# (fixed_cross_entropy; ForMaskedLMLoss, the same over flattened tokens) and GPT-2's Conv1D
# (y = x @ W + b). Not listed: ForCausalLMLoss scores row i against label i + 1 (a shifted
# target, no op of the tool); ForTokenClassification and ForSequenceClassificationLoss need
# a config object; transformers.activations computes no gated product (gelu or silu alone).
TRANSFORMERS_OPS = ["transformers.loss.loss_utils:fixed_cross_entropy",
                    "transformers.loss.loss_utils:ForMaskedLMLoss",
                    "transformers.pytorch_utils:Conv1D"]


def target(library: str, kernel: str, kernel_args: list[str] | None = None) -> dict[str, Any]:
    args = list(kernel_args or [])
    ident = kernel + (f" [{', '.join(args)}]" if args else "")
    return {"id": ident, "library": library, "kernel": kernel, "kernel_args": args}


def norm_classes(module: Any) -> list[str]:
    """Names of the nn.Module classes defined in ``module`` whose name contains "Norm"."""
    import torch

    return sorted(name for name, obj in vars(module).items()
                  if "Norm" in name and inspect.isclass(obj)
                  and issubclass(obj, torch.nn.Module) and obj.__module__ == module.__name__)


def functions_with_backward(module: Any) -> list[str]:
    """Names of the public ``torch.autograd.Function`` subclasses defined in ``module``."""
    import torch

    return sorted(name for name, obj in vars(module).items()
                  if inspect.isclass(obj) and issubclass(obj, torch.autograd.Function)
                  and obj.__module__ == module.__name__ and not name.startswith("_")
                  and not name.endswith("NPU"))


def _walk(package: str, keep: Any, classes: Any = norm_classes
          ) -> tuple[list[tuple[str, list[str]]], list[dict[str, str]]]:
    """(module, its classes) for every submodule of ``package`` that ``keep`` accepts:
    ``classes`` names them (norm classes by default)."""
    found, skipped = [], []
    root = importlib.import_module(package)
    for info in pkgutil.walk_packages(root.__path__, prefix=package + "."):
        if not keep(info.name):
            continue
        try:
            module = importlib.import_module(info.name)
        except Exception as exc:  # a missing optional dependency of that one module
            skipped.append({"module": info.name,
                            "reason": f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"})
            continue
        found.append((info.name, classes(module)))
    return found, skipped


def torch_targets() -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    import torch
    import torch.nn.functional as F

    classes = sorted(name for name, obj in vars(torch.nn).items()
                     if "Norm" in name and inspect.isclass(obj)
                     and issubclass(obj, torch.nn.Module))
    functions = sorted(name for name, obj in vars(F).items()
                       if "norm" in name.lower() and not name.startswith("_")
                       and inspect.isfunction(obj))
    targets = [target("torch", f"torch.nn:{name}") for name in classes]
    targets += [target("torch", f"torch.nn.functional:{name}") for name in functions]
    targets += [target("torch", kernel, args) for kernel, args in TORCH_VARIANTS]
    return targets, []


def torch_op_targets() -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    return [target("torch-ops", kernel) for kernel in TORCH_OPS], []


def transformers_op_targets() -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    for module in sorted({kernel.partition(":")[0] for kernel in TRANSFORMERS_OPS}):
        importlib.import_module(module)  # a missing one: the library is skipped, with why
    return [target("transformers-ops", kernel) for kernel in TRANSFORMERS_OPS], []


def liger_targets() -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    try:
        importlib.import_module("liger_kernel.transformers")
    except ImportError as exc:
        return [], [{"module": "liger_kernel", "reason": f"not importable: {exc}"}]
    found, skipped = _walk("liger_kernel.transformers", lambda name: name.count(".") == 2)
    return ([target("liger", f"{module}:{name}") for module, names in found for name in names],
            skipped)


def liger_op_targets() -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    found, skipped = _walk("liger_kernel.ops", lambda name: name.count(".") == 2,
                           functions_with_backward)
    return ([target("liger-ops", f"{module}:{name}") for module, names in found
             for name in names], skipped)


def fla_targets() -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    targets: list[dict[str, Any]] = []
    skipped: list[dict[str, str]] = []
    for package in ("fla.modules.activations", "fla.modules.norm"):
        found, missed = _walk(package, lambda name: "ascend" not in name,
                              functions_with_backward)
        targets += [target("fla", f"{module}:{name}") for module, names in found
                    for name in names]
        skipped += missed
    return targets, skipped


def transformers_targets() -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    def is_modeling(name: str) -> bool:
        parts = name.split(".")
        return len(parts) == 4 and parts[3].startswith("modeling_")

    found, skipped = _walk("transformers.models", is_modeling)
    return ([target("transformers", f"{module}:{name}") for module, names in found
             for name in names], skipped)


def timm_targets() -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    found, skipped = _walk("timm.layers", lambda name: name.count(".") == 2)
    return ([target("timm", f"{module}:{name}") for module, names in found for name in names],
            skipped)


LIBRARIES = {"torch": torch_targets, "torch-ops": torch_op_targets, "liger": liger_targets,
             "liger-ops": liger_op_targets, "fla": fla_targets,
             "transformers": transformers_targets, "transformers-ops": transformers_op_targets,
             "timm": timm_targets}


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in LIBRARIES:
        print(f"usage: scoreboard_targets.py {'|'.join(LIBRARIES)}", file=sys.stderr)
        return 2
    targets, skipped = LIBRARIES[argv[0]]()
    json.dump({"targets": targets, "skipped": skipped}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

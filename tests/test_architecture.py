"""The package's shape: data flows one way, no import circles, no module over 350 lines.

Every import in ``gradcheck_bi/`` — at the top of a module or inside a function — is read
from the source. An import may point to its own layer or a lower one, never up; within a
layer the imports form no circle. The layers, bottom to top, are the README's
"Architecture" section.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "gradcheck_bi"
MAX_LINES = 350

# Bottom to top: kernel → perturbation → measurement → (sweep data) → verdict → run →
# report → the user's entry points.
LAYERS: list[tuple[str, ...]] = [
    ("gradcheck_bi.vocab", "gradcheck_bi._version", "gradcheck_bi._atomic", "gradcheck_bi.lowp"),
    ("gradcheck_bi.kernels",),
    ("gradcheck_bi.fd", "gradcheck_bi.inputs"),
    ("gradcheck_bi.checks", "gradcheck_bi.stepsweep"),
    ("gradcheck_bi.sweep", "gradcheck_bi.cases"),
    ("gradcheck_bi.gate",),
    ("gradcheck_bi.runner",),
    ("gradcheck_bi.report",),
    ("gradcheck_bi.api", "gradcheck_bi.cli", "gradcheck_bi.__main__"),
]
TOP = "gradcheck_bi"  # the public API re-exports from every layer


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _layer(module: str) -> int:
    if module == TOP:
        return len(LAYERS)
    for i, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return i
    raise AssertionError(f"{module} is in no layer: add it to LAYERS (and to the README)")


def _imports(module: str) -> set[str]:
    """Package modules ``module`` imports anywhere in its source."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from pkg import sub` imports the submodule when there is one.
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES
                     else node.module for a in node.names]
        else:
            continue
        found |= {n for n in names if n in MODULES and n != module}
    return found


GRAPH = {m: _imports(m) for m in MODULES}


def test_every_module_has_a_layer() -> None:
    for module in MODULES:
        _layer(module)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_import_points_up(module: str) -> None:
    up = [t for t in GRAPH[module] if _layer(t) > _layer(module)]
    assert not up, f"{module} (layer {_layer(module)}) imports higher layers: " + ", ".join(
        f"{t} (layer {_layer(t)})" for t in up)


def test_no_import_circle() -> None:
    state: dict[str, int] = {}  # 1 on the current path, 2 done

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for t in sorted(GRAPH[m]):
            if state.get(t) == 1:
                circle = [*path[path.index(t):], t]
                raise AssertionError("import circle: " + " → ".join(circle))
            if t not in state:
                visit(t, [*path, t])
        state[m] = 2

    for m in sorted(GRAPH):
        if m not in state:
            visit(m, [m])


def test_vocabulary_imports_nothing_of_the_package() -> None:
    assert GRAPH["gradcheck_bi.vocab"] == set()


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_over_the_size_limit(module: str) -> None:
    lines = len(MODULES[module].read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{MODULES[module]} has {lines} lines (limit {MAX_LINES})"


def test_the_checker_sees_an_upward_import() -> None:
    # The rule above must be able to fail: a lower module importing the CLI is caught.
    assert _layer("gradcheck_bi.cli.run") > _layer("gradcheck_bi.fd.estimate")
    assert "gradcheck_bi.kernels.reduction" in GRAPH["gradcheck_bi.fd.reduce"]

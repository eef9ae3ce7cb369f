"""The package's shape: data flows one way, no import circles, no module over 600 lines.

Every import in ``gradcheck_bi/`` — at the top of a module or inside a function — is read
from the source. An import may point to its own layer or a lower one, never up; within a
layer the imports form no circle. The layers, bottom to top, are docs/architecture.md's
"The layers".

Files are split by idea, not by length: a module holds one idea whole. Past
``MAX_LINES`` a module is probably holding two, and this test asks for the split.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "gradcheck_bi"
MAX_LINES = 600

# Bottom to top: words, fixed-order sums and op records → tolerance → perturbation → the kernel
# called (and the kernels bundled) → the kernel adapted → measurement → (sweep data) → verdict →
# run → report → the user's entry points. The kernels under test sit above the engine's numerics:
# fd/ and tolerance/ never import them (what both sum with, sums/, is a leaf).
LAYERS: list[tuple[str, ...]] = [
    ("gradcheck_bi.vocab", "gradcheck_bi._version", "gradcheck_bi._atomic", "gradcheck_bi.gpu",
     "gradcheck_bi.sums", "gradcheck_bi.ops"),
    ("gradcheck_bi.tolerance", "gradcheck_bi.errors"),
    ("gradcheck_bi.fd", "gradcheck_bi.inputs", "gradcheck_bi.lowp"),
    ("gradcheck_bi.kernels.calling", "gradcheck_bi.kernels.bundled"),
    ("gradcheck_bi.kernels",),
    ("gradcheck_bi.checks", "gradcheck_bi.stepsweep", "gradcheck_bi.generic"),
    ("gradcheck_bi.point", "gradcheck_bi.sweep", "gradcheck_bi.cases", "gradcheck_bi.shard"),
    ("gradcheck_bi.gate",),
    ("gradcheck_bi.measure", "gradcheck_bi.serve", "gradcheck_bi.workers", "gradcheck_bi.runner",
     "gradcheck_bi.upfront"),
    ("gradcheck_bi.report",),
    ("gradcheck_bi.api", "gradcheck_bi.cli", "gradcheck_bi.__main__", "gradcheck_bi.pytest_plugin"),
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


def _imports_in(source: str, module: str) -> set[str]:
    """Package modules that ``source`` (the text of ``module``) imports anywhere."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
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


def _imports(module: str) -> set[str]:
    return _imports_in(MODULES[module].read_text(encoding="utf-8"), module)


def _upward(module: str, targets: set[str]) -> list[str]:
    """The imports of ``module`` that point to a higher layer, described."""
    return [f"{t} (layer {_layer(t)})" for t in sorted(targets) if _layer(t) > _layer(module)]


def _circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` (``a → b → a``), or None."""
    state: dict[str, int] = {}  # 1 on the current path, 2 done

    def visit(m: str, path: list[str]) -> list[str] | None:
        state[m] = 1
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                return [*path[path.index(t):], t]
            if t not in state and (found := visit(t, [*path, t])):
                return found
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m, [m])):
            return found
    return None


GRAPH = {m: _imports(m) for m in MODULES}


def test_every_module_has_a_layer() -> None:
    for module in MODULES:
        _layer(module)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_import_points_up(module: str) -> None:
    up = _upward(module, GRAPH[module])
    assert not up, f"{module} (layer {_layer(module)}) imports higher layers: " + ", ".join(up)


def test_no_import_circle() -> None:
    circle = _circle(GRAPH)
    assert circle is None, "import circle: " + " → ".join(circle or [])


def test_vocabulary_imports_nothing_of_the_package() -> None:
    assert GRAPH["gradcheck_bi.vocab"] == set()


def test_the_fixed_order_sums_are_a_leaf() -> None:
    # The bundled kernels, fd/ and tolerance/ share these sums: they import nothing of the
    # package but each other, so the engine's numerics never lean on a kernel under test.
    for module in (m for m in MODULES if m.startswith("gradcheck_bi.sums")):
        outside = {t for t in GRAPH[module] if not t.startswith("gradcheck_bi.sums")}
        assert not outside, f"{module} imports {sorted(outside)}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_over_the_size_limit(module: str) -> None:
    lines = len(MODULES[module].read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, (f"{MODULES[module]} has {lines} lines (limit {MAX_LINES}): "
                                "which two ideas does it hold?")


def test_the_checker_sees_an_upward_import() -> None:
    # The rules above must be able to fail: fed a low module that imports the CLI and the
    # report (at the top and inside a function), they flag both and nothing else.
    source = ("import torch\nfrom gradcheck_bi.cli import run\nfrom gradcheck_bi import vocab\n"
              "def f():\n    import gradcheck_bi.report.text\n")
    found = _imports_in(source, "gradcheck_bi.fd.estimate")
    assert found == {"gradcheck_bi.cli.run", "gradcheck_bi.vocab", "gradcheck_bi.report.text"}
    assert [u.split()[0] for u in _upward("gradcheck_bi.fd.estimate", found)] == [
        "gradcheck_bi.cli.run", "gradcheck_bi.report.text"]


def test_the_checker_sees_an_import_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert _circle(graph) == ["a", "b", "c", "a"]
    assert _circle({**graph, "c": set()}) is None

"""README.md and docs/: short enough to read, and quoting what the commands print today.

Quoted output sits between markers that docs/make_docs.py (``make docs``) rewrites. These tests
re-run the default run (a few seconds) and fail, naming what differs, when the README's pasted
block no longer says what it prints — so a figure cannot go stale silently.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_LINES = 250
OWN_KERNEL_WITHIN = 60


def _load_make_docs() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_docs", ROOT / "docs" / "make_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


make_docs = _load_make_docs()
PAGES = (*make_docs.PAGES, ROOT / "cases" / "README.md")


def _lines(page: Path) -> list[str]:
    return page.read_text(encoding="utf-8").splitlines()


def test_readme_is_short() -> None:
    n = len(_lines(README))
    assert n <= MAX_LINES, (f"README.md has {n} lines, at most {MAX_LINES}: move evidence to "
                            "docs/ and link it")


def test_the_own_kernel_commands_come_first() -> None:
    head = _lines(README)[:OWN_KERNEL_WITHIN]
    assert "## Check your own kernel" in head, (
        f"no '## Check your own kernel' heading in README.md's first {OWN_KERNEL_WITHIN} lines")
    commands = [ln for ln in head if ln.startswith("gradcheck-bi run --kernel ")]
    for kind, shape in (("a file", r"--kernel \S+\.py:\w+"),
                        ("a module", r"--kernel [\w.]+:\w+"),
                        ("a function", r"--kernel [\w.]+:\w+"),
                        ("a named adapter", r"--kernel (torch|liger)\b")):
        found = [c for c in commands if c.endswith("# " + kind) and re.search(shape, c)]
        assert found, (f"README.md's first {OWN_KERNEL_WITHIN} lines have no "
                       f"`gradcheck-bi run --kernel …  # {kind}` command")


def test_the_readme_names_the_test_command() -> None:
    text = README.read_text(encoding="utf-8")
    assert "The test command is `make test`" in text and "`.ci/run`" in text


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_machine_paths(page: Path) -> None:
    found = [f"{page.name}:{i}: {ln.strip()[:80]}" for i, ln in enumerate(_lines(page), 1)
             if re.search(r"(?<![\w.])/(work|root|tmp|home)\b", ln)]
    assert not found, "a development machine's path in the docs:\n" + "\n".join(found)


def test_each_quoted_block_lives_on_one_page() -> None:
    seen: dict[str, list[str]] = {}
    for page in make_docs.PAGES:
        text = page.read_text(encoding="utf-8")
        for name in re.findall(r"<!-- docs:begin ([\w-]+) -->", text):
            seen.setdefault(name, []).append(page.name)
        opened = re.findall(r"<!-- docs:begin [\w-]+ -->", text)
        assert len(opened) == len(make_docs.blocks_in(text)), (
            f"{page.name}: a docs:begin marker without its docs:end")
    unknown = sorted(set(seen) - set(make_docs.BLOCKS))
    assert not unknown, f"markers that docs/make_docs.py does not know: {unknown}"
    for name in make_docs.BLOCKS:
        assert len(seen.get(name, [])) == 1, f"block {name!r} is on pages {seen.get(name, [])}"


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    anchors, fenced = set(), False
    for ln in _lines(page):
        if ln.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6} (.+)", ln)):
            anchors.add(_slug(m.group(1)))
    return anchors


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_resolve(page: Path) -> None:
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {file.name}")
    assert not broken, f"{page.name}: broken links:\n" + "\n".join(broken)


# --- the README's pasted default run against the default run now ---------------------------

@pytest.fixture(scope="module")
def default_run() -> Any:
    return make_docs.gradcheck(*make_docs.DEFAULT_RUN)


def _claimed() -> str:
    return make_docs.blocks_in(README.read_text(encoding="utf-8"))["default-run"]


def _rows(markdown: str) -> dict[str, list[str]]:
    """'kernel device dtype' → the cells of its row, from a pasted Markdown table."""
    rows = {}
    for ln in markdown.splitlines():
        cells = [c.strip() for c in ln.strip().strip("|").split("|")]
        if ln.startswith("| ") and len(cells) > 2 and cells[0] not in ("kernel", "---"):
            rows[f"{cells[0]} {cells[1]}"] = cells[2:]
    return rows


NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:e[-+]\d+)?")


def _figures_agree(claimed: str, now: str) -> bool:
    """The same words (statuses); O(1) figures to 3 digits, noise-floor ones in magnitude."""
    if NUMBER.sub("#", claimed) != NUMBER.sub("#", now):
        return False
    for a, b in zip(*(map(float, NUMBER.findall(s)) for s in (claimed, now)), strict=True):
        if (a == 0) != (b == 0):
            return False
        if max(a, b) >= 1e-3 and abs(a - b) > 1e-3 * max(a, b):
            return False
        if 0 < max(a, b) < 1e-3 and not 0.1 < a / b < 10:
            return False
    return True


def test_the_default_runs_verdict_is_the_one_the_readme_quotes(default_run: Any) -> None:
    claimed = make_docs.VERDICT.findall(_claimed())
    assert claimed, "README.md's default-run block has no VERDICT line"
    now = default_run.verdict()
    assert claimed[-1] == now, (f"README.md quotes {claimed[-1]!r}; "
                                f"`{default_run.command}` now prints {now!r} — run `make docs`")
    code = re.search(r"exit (\d+)", _claimed())
    assert code and int(code.group(1)) == default_run.code, (
        f"README.md says exit {code.group(1) if code else '?'}; the run exits "
        f"{default_run.code}")


def test_the_default_runs_table_is_the_one_the_readme_quotes(default_run: Any) -> None:
    now_section = make_docs.markdown_section(default_run.stdout,
                                             make_docs.DEFAULT_TABLE)
    claimed_caption = re.search(r"(\d+) results", _claimed())
    now_caption = re.search(r"(\d+) results", now_section)
    assert claimed_caption and now_caption and claimed_caption[1] == now_caption[1], (
        f"README.md's table counts {claimed_caption[1] if claimed_caption else '?'} results, "
        f"the run's {now_caption[1] if now_caption else '?'}")
    claimed, now = _rows(_claimed()), _rows(now_section)
    assert claimed.keys() == now.keys(), f"rows: README.md {list(claimed)}, now {list(now)}"
    for row, cells in claimed.items():
        # γ=randn, γ=ones, γ=zeros, tolerance (the last column, the worst index, may move
        # with the machine's rounding)
        for col, (was, is_) in enumerate(zip(cells[:4], now[row][:4], strict=True)):
            assert _figures_agree(was, is_), (
                f"README.md's default-run table, row {row!r}, column {col + 3}: it quotes "
                f"{was!r}, the run now prints {is_!r} — run `make docs`")

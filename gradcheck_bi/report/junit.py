"""Verdicts → JUnit XML, one ``<testcase>`` per result, for CI test reporters.

The subset that Jenkins, GitLab and GitHub test-report actions all read::

    <testsuites name="gradcheck-bi" tests= failures= errors= skipped=>
      <testsuite name="gradcheck-bi.<kernel>" tests= failures= errors= skipped=>
        <testcase classname="gradcheck-bi.<kernel>.<check>" name="cpu/fp64 shape=... γ=randn ...">
          <failure message="one line" type="unexpected-fail">details</failure>

* as expected (including a declared defect detected where it must show) → a bare testcase;
* ``pass``/``fail`` not as expected, or drift from ``--baseline`` → ``<failure>``;
* ``error`` (the kernel raised) → ``<error>``;
* ``unsupported`` (cannot run here) → ``<skipped>``.

Reporters key a test by (classname, name), and GitLab keeps only the first of duplicates,
so every name spells out the whole configuration. The message goes both in the ``message``
attribute and in the element's text (GitLab shows only the text).

>>> from gradcheck_bi.vocab import Result
>>> r = Result("after", "dx", "cpu", "fp64", [2, 8], 1e-6, 0, "randn", False, 0.5, 1e-13,
...            "fail", "pass", False)
>>> "failures=\\"1\\"" in to_junit([r])
True
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable

from gradcheck_bi.gate.baseline import Drift, Key, key_of
from gradcheck_bi.point import AXES, AXIS, OP_AXES_ALWAYS, has_eps, op_words, spelled, weight_words
from gradcheck_bi.report.tables import describe, error_words
from gradcheck_bi.vocab import Result

# XML 1.0 cannot carry most control characters, even escaped; kernels' messages might.
_INVALID_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _clean(text: str) -> str:
    return _INVALID_XML.sub("?", text)


def _dotless(name: str) -> str:
    # Jenkins splits classname at the last dot into package.class; keep kernel refs whole.
    return name.replace(".", "_")


# The name's head, in this order; every other axis follows where it is not its default.
_HEAD = ("eps", "seed")  # after the γ words (point.weight_words)
# The op's controls every result carries (γ's), spelled by weight_words where the op has them
_WEIGHT = tuple(a.field for a in OP_AXES_ALWAYS)


def case_name(r: Result) -> str:
    """The testcase name: the whole configuration, so that no two results share one — every
    axis of the point the JSON carries (:mod:`gradcheck_bi.point`) but the tolerance
    settings, the check (the classname's) and the op (the kernel's)."""
    row = r.__dict__
    parts = [f"{r.device}/{r.dtype}", "shape=" + "x".join(str(d) for d in r.shape),
             *weight_words(row), *(spelled(AXIS[f], row[AXIS[f].public]) for f in _HEAD
                                   if f != "eps" or has_eps(row))]
    parts += [spelled(a, row[a.public]) for a in AXES
              if a.json == "always" and not a.setting and row[a.public] != a.default
              and a.field not in ("check", "device", "dtype", "shape", *_HEAD, *_WEIGHT)]
    return " ".join(parts + op_words(row))


def _outcome(r: Result, drift: list[Drift]) -> tuple[str, str, str] | None:
    """(element, type, message) for a testcase that is not a plain pass, else ``None``."""
    if r.status == "unsupported":
        return "skipped", "unsupported", r.message or "unsupported here"
    if r.status == "error":
        return "error", "kernel-error", describe(r)
    if not r.as_expected:
        kind = "defect-not-detected" if r.expected == "fail" else "unexpected-fail"
        return "failure", kind, describe(r)
    if drift:
        return "failure", "baseline-drift", "; ".join(d.line for d in drift)
    return None


def to_junit(results: Iterable[Result], drifts: Iterable[Drift] = (),
             name: str = "gradcheck-bi", unchecked: Iterable[tuple[str, str]] = ()) -> str:
    """The JUnit XML document for ``results``; ``drifts`` (from a baseline) fail their case.

    A drift for a result that did not run at all (recorded but missing) becomes a testcase
    of its own, failed. A kernel that ran no point (``unchecked``: kernel, why) becomes one
    skipped testcase with the reason, so that a report of 0 tests never reads as green.
    """
    results = list(results)
    by_key: dict[Key, list[Drift]] = {}
    for d in drifts:
        by_key.setdefault(d.key, []).append(d)
    suites: dict[str, list[ET.Element]] = {}
    counts: dict[str, dict[str, int]] = {}
    seen: set[Key] = set()

    def add(kernel: str, case: ET.Element, outcome: str | None) -> None:
        suite = f"{name}.{_dotless(kernel)}"
        suites.setdefault(suite, []).append(case)
        c = counts.setdefault(suite, {"tests": 0, "failures": 0, "errors": 0, "skipped": 0})
        c["tests"] += 1
        if outcome == "failure":
            c["failures"] += 1
        elif outcome == "error":
            c["errors"] += 1
        elif outcome == "skipped":
            c["skipped"] += 1

    for r in results:
        key = key_of(r)
        seen.add(key)
        case = ET.Element("testcase", classname=f"{name}.{_dotless(r.kernel)}.{r.check}",
                          name=_clean(case_name(r)))
        out = _outcome(r, by_key.get(key, []))
        if out is not None:
            element, kind, message = out
            message = _clean(message)
            child = ET.SubElement(case, element, message=message)
            if element != "skipped":
                child.set("type", kind)
            child.text = message
        if r.max_abs_err is not None:
            props = ET.SubElement(case, "system-out")
            tol = "—" if r.tolerance is None else f"{r.tolerance:.3e}"
            props.text = (f"status {r.status} (expected {r.expected}); {error_words(r)} "
                          f"{r.max_abs_err:.3e}, tolerance {tol}")
        add(r.kernel, case, None if out is None else out[0])

    for key, ds in by_key.items():
        if key in seen:
            continue
        kernel, check = str(key[0]), str(key[1])
        case = ET.Element("testcase", classname=f"{name}.{_dotless(kernel)}.{check}",
                          name=_clean(ds[0].line))
        message = _clean("; ".join(d.line for d in ds))
        child = ET.SubElement(case, "failure", message=message, type="baseline-drift")
        child.text = message
        add(kernel, case, "failure")

    for kernel, why in unchecked:
        case = ET.Element("testcase", classname=f"{name}.{_dotless(kernel)}",
                          name="nothing checked")
        ET.SubElement(case, "skipped", message=_clean(f"nothing checked: {why}")).text = \
            _clean(f"nothing checked: {why}")
        add(kernel, case, "skipped")

    root = ET.Element("testsuites", name=name)
    total = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for suite_name, cases in suites.items():
        c = counts[suite_name]
        attrs = {"name": suite_name, **{k: str(v) for k, v in c.items()}}
        suite = ET.SubElement(root, "testsuite", attrs)
        suite.extend(cases)
        for k in total:
            total[k] += c[k]
    for k, v in total.items():
        root.set(k, str(v))
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"

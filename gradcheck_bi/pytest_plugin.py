"""A pytest plugin: a sweep's points as pytest items, and a ``gradcheck_bi`` fixture.

Registered on install (entry point ``pytest11``); without ``--gradcheck-bi`` it adds a
fixture and an option group and imports nothing heavy (no torch), so a suite that never asks
pays nothing. Two ways in:

* ``pytest --gradcheck-bi KERNEL [--gradcheck-bi-case FILE] [--gradcheck-bi-arg NAME=VALUE]``
  collects one item per point of the sweep (the default sweep, or the case file's), named
  ``KERNEL[op-check-device-dtype-shape-controls]``: ``-k``, ``-x``, ``--lf``, ``--junitxml``
  and ``-n`` work as on any test. A point not as expected fails with the tool's one line; a
  declared defect shown is an xfail; an ``unsupported`` point a skip with its reason.
* the fixture: ``gradcheck_bi.check(kernel, **options)`` runs :func:`gradcheck_bi.check`
  and fails the calling test with the tool's lines, not our traceback.

Items are measured in the pytest process (one :class:`~gradcheck_bi.measure.PointMeasurer`
per session), not in worker processes as ``gradcheck-bi run`` does: a kernel that crashes the
process ends the session (under ``-n`` xdist restarts the worker and reports that point) and
a case's ``timeout`` is not enforced. The fixture's ``check`` isolates as the API does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from gradcheck_bi.api import Report
    from gradcheck_bi.measure import PointMeasurer
    from gradcheck_bi.sweep import Sweep
    from gradcheck_bi.vocab import Config, KernelSpec

MARKER = "gradcheck_bi"
GROUP = "gradcheck-bi"  # the collector's name: every item's node id starts with it
_STATE = pytest.StashKey["_Points"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gradcheck-bi", "gradcheck-bi: a kernel's sweep as test items")
    group.addoption("--gradcheck-bi", action="append", metavar="KERNEL", dest="gradcheck_bi",
                    default=[], help="Collect one item per point of this kernel's sweep: a "
                    "bundled name, PATH.py[:ATTR] or package.module:ATTR. Repeatable.")
    group.addoption("--gradcheck-bi-case", metavar="FILE.toml", dest="gradcheck_bi_case",
                    default=None, help="The sweep of this case file instead of the default.")
    group.addoption("--gradcheck-bi-arg", action="append", metavar="NAME=VALUE",
                    dest="gradcheck_bi_arg", default=[],
                    help="A `gradcheck-bi run` option over the sweep, without its dashes: "
                    "shape=3,16 check=dx,dw weight=randn zcg=off dtype=fp32 eps=1e-5 …; "
                    "also expect=pass|fail and kernel-arg=NAME=VALUE. Repeatable.")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{MARKER}: a point of a gradcheck-bi sweep (collected by --gradcheck-bi)")
    if config.getoption("gradcheck_bi", None):
        from gradcheck_bi.cli.options import UsageError
        from gradcheck_bi.vocab import KernelLoadError

        try:
            config.stash[_STATE] = _load(config)
        except (UsageError, KernelLoadError, ValueError) as exc:
            raise pytest.UsageError(f"gradcheck-bi: {exc}") from None


@dataclass
class _Points:
    """What ``--gradcheck-bi`` asked for: every point, the notes a run prints, and the
    measurer shared by the session's items (made at the first item)."""

    points: list[tuple[KernelSpec, Config, Sweep]]
    notes: list[str]
    unchecked: list[tuple[str, str]]
    measurer: PointMeasurer | None = None
    names: dict[str, int] = field(default_factory=dict)


def _load(config: pytest.Config) -> _Points:
    """The sweeps (the case's or the default) with the ``--gradcheck-bi-arg`` overrides, the
    kernels loaded once, and their points in the sweep's fixed order."""
    from gradcheck_bi.cases import load_case
    from gradcheck_bi.kernels.adapting.loader import complete_ref
    from gradcheck_bi.runner import resolve_kernels, sweep_points
    from gradcheck_bi.sweep import Sweep, not_run, unchecked, with_overrides

    case = config.getoption("gradcheck_bi_case")
    sweeps = load_case(case).sweeps if case else [Sweep()]
    overrides = _overrides(config.getoption("gradcheck_bi_arg"))
    kernels = [complete_ref(k) for k in config.getoption("gradcheck_bi")]
    sweeps = [with_overrides(s, kernels=kernels, **overrides,
                             kernel_args={**s.kernel_args, **overrides.get("kernel_args", {})})
              for s in sweeps]
    specs = resolve_kernels(kernels, sweeps[0].kernel_args)
    points = sweep_points(sweeps, specs)
    ran = {spec.name for spec, _, _ in points}
    return _Points(points, not_run(sweeps, specs), unchecked(sweeps, specs, ran))


def _overrides(args: list[str]) -> dict[str, Any]:
    """``NAME=VALUE`` words → :class:`~gradcheck_bi.sweep.Sweep` fields, each read by its
    ``run`` option's rule (:func:`gradcheck_bi.cli.options.read`); a name given twice
    adds to a list option and replaces a single one."""
    from gradcheck_bi.cli.options import UsageError, parse_kernel_arg, read
    from gradcheck_bi.point import AXES, AXIS, BadValue, boolean, choice
    from gradcheck_bi.vocab import EXPECTED_STATUSES, did_you_mean

    by_name = {a.cli.removeprefix("--"): a for a in AXES if a.cli}
    given: dict[str, list[str]] = {}
    for arg in args:
        name, sep, value = arg.partition("=")
        name = name.strip().replace("_", "-")
        if not sep or name not in (*by_name, "expect", "kernel-arg"):
            near = did_you_mean(name, (*by_name, "expect", "kernel-arg"))
            raise UsageError(f"--gradcheck-bi-arg {arg!r}: expected NAME=VALUE with NAME a "
                             f"`gradcheck-bi run` option ({', '.join(by_name)}, expect, "
                             f"kernel-arg){near}")
        given.setdefault(name, []).append(value.strip())
    out: dict[str, Any] = {}
    point: dict[str, Any] = {}
    for name, words in given.items():
        if name == "kernel-arg":
            out["kernel_args"] = dict(parse_kernel_arg(w) for w in words)
        elif name == "expect":
            try:
                out["expect"] = choice(EXPECTED_STATUSES)(words[-1])
            except BadValue as exc:
                raise UsageError(f"--gradcheck-bi-arg expect={words[-1]}: expected {exc}"
                                 f"{exc.hint}") from None
            out["expectations"] = []  # as --expect: it outranks a case's rules
        else:
            axis = by_name[name]
            listed = axis.plural and (axis.choices or axis.word) and axis.value is not boolean
            point[axis.field] = read(axis, words if listed else _word(words[-1]))
    if "device" in point or "dtype" in point:
        device = point.pop("device", "cpu")
        out["targets"] = [(device, point.pop("dtype", "fp64" if device == "cpu" else "fp32"))]
    if "op" in point:
        out.setdefault("kernel_args", {})["op"] = point.pop("op")
    out.update({key: v for f, v in point.items() if (key := AXIS[f].key) is not None})
    return out


def _word(text: str) -> Any:
    """A word of ``--gradcheck-bi-arg`` as the command line's typed option would have it."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


# --- collection ---------------------------------------------------------------------------


class SweepCollector(pytest.Collector):
    """The parent of every point item (node id ``gradcheck-bi``)."""

    def collect(self) -> list[pytest.Item]:  # items are made by the hook below
        return []


class PointItem(pytest.Item):
    """One point of the sweep: its kernel, configuration and sweep."""

    def __init__(self, *, point: tuple[KernelSpec, Config, Sweep] | None = None,
                 why: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.point = point
        self.why = why  # a kernel that has no point: the reason nothing was checked
        self.add_marker(MARKER)

    def runtest(self) -> None:
        from gradcheck_bi.fd import threads as fd_threads
        from gradcheck_bi.report.summary import failure_line

        if self.point is None:
            pytest.skip(f"nothing checked: {self.why}")
        state = self.config.stash[_STATE]
        if state.measurer is None:
            from gradcheck_bi.measure import PointMeasurer
            from gradcheck_bi.upfront import preload_cpu_sums

            preload_cpu_sums([i.point for i in self.session.items
                              if isinstance(i, PointItem) and i.point is not None])
            state.measurer = PointMeasurer()
        with fd_threads.policy(None):
            result = state.measurer(*self.point)
        if result.status == "unsupported":
            pytest.skip(f"unsupported here: {result.message}")
        if not result.as_expected:
            pytest.fail(failure_line(result, 1), pytrace=False)
        if result.expected == "fail":
            pytest.xfail(f"declared defect shown: {failure_line(result, 1)}")

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, self.nodeid


def point_id(spec: KernelSpec, cfg: Config) -> str:
    """``rms_norm-dx-cpu-fp64-2x8x256-γrandn-zcg_off``: the point's op, check, target,
    shape and controls, then any axis away from its default (layout, scales, eps, seed)."""
    from gradcheck_bi.point import op_words, public, weight_words

    row = public(cfg, ())
    words = [cfg.op, cfg.check, cfg.device, cfg.dtype, "x".join(map(str, cfg.shape))]
    for w in [*weight_words(row), *op_words(row)]:
        label, _, value = w.partition("=")
        words.append(label + value if len(label) == 1 else f"{label}_{value}")
    if cfg.layout != "contiguous":
        words.append(cfg.layout)
    extra = {"xscale": cfg.input_scale != 1.0, "wscale": cfg.weight_scale != 1.0,
             "eps": cfg.eps != 1e-6, "seed": cfg.seed != 0}
    values = {"xscale": cfg.input_scale, "wscale": cfg.weight_scale, "eps": cfg.eps,
              "seed": cfg.seed}
    words += [f"{k}_{values[k]:g}" for k, shown in extra.items() if shown]
    return "-".join(words)


@pytest.hookimpl(tryfirst=True)  # before -k, -m and --lf select among the items
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    if _STATE not in config.stash:
        return
    from gradcheck_bi.report.tables import short_name

    state = config.stash[_STATE]
    parent = SweepCollector.from_parent(session, name=GROUP, nodeid=GROUP)
    seen: dict[str, int] = {}
    made: list[pytest.Item | pytest.Collector] = []
    for spec, cfg, sweep in state.points:
        name = f"{short_name(spec.name)}[{point_id(spec, cfg)}]"
        seen[name] = seen.get(name, 0) + 1  # settings two case blocks differ in: -2, -3
        if seen[name] > 1:
            name = f"{name[:-1]}-{seen[name]}]"
        made.append(PointItem.from_parent(parent, name=name, nodeid=f"{GROUP}::{name}",
                                          point=(spec, cfg, sweep)))
    for kernel, why in state.unchecked:
        name = f"{short_name(kernel)}[nothing-checked]"
        made.append(PointItem.from_parent(parent, name=name, nodeid=f"{GROUP}::{name}", why=why))
    items += [item for item in made if isinstance(item, pytest.Item)]
    # As the session reports each collector it collects: the terminal counts these items.
    config.hook.pytest_collectreport(report=pytest.CollectReport(GROUP, "passed", None, made))


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if _STATE in config.stash:
        for note in config.stash[_STATE].notes:
            terminalreporter.write_line(f"gradcheck-bi: note: {note}")


# --- the fixture ---------------------------------------------------------------------------


class Checker:
    """The ``gradcheck_bi`` fixture's value."""

    def check(self, kernel: Any, **options: Any) -> Report:
        """:func:`gradcheck_bi.check` (``kernel``: an object, or a reference as ``--kernel``
        takes it); a result not as expected fails the test with the tool's lines, nothing
        checked here (every result unsupported) skips it, a bad option fails it in one line.
        """
        __tracebackhide__ = True
        from gradcheck_bi.api import GradcheckFailure, GradcheckSkipped, check
        from gradcheck_bi.vocab import KernelLoadError

        # failed or skipped outside the ``except``: inside, pytest shows the report twice
        # ("During handling of the above exception, another exception occurred")
        try:
            return check(kernel, **options)
        except GradcheckFailure as exc:
            failed, skipped = str(exc.report), None
        except GradcheckSkipped as exc:
            failed, skipped = None, str(exc.report)
        except (KernelLoadError, TypeError, ValueError) as exc:
            failed, skipped = f"gradcheck-bi: {exc}", None
        if skipped is not None:
            pytest.skip(skipped)
        pytest.fail(failed or "", pytrace=False)


@pytest.fixture
def gradcheck_bi() -> Checker:
    """``gradcheck_bi.check(MyNormFn, checks=["dx", "dw"], shapes=[(4, 1000)])`` in a test."""
    return Checker()


__all__ = ["Checker", "PointItem", "gradcheck_bi", "point_id"]

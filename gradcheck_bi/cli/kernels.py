"""``gradcheck-bi kernels``: every kernel ``--kernel`` takes, and what each needs.

Nothing is imported to tell whether a named adapter's library is installed
(``importlib.util.find_spec``), so the listing is quick and never fails on a broken
library.
"""

from __future__ import annotations

import sys
import textwrap

from gradcheck_bi.kernels import BUNDLED, NAMED

WIDTH = 80  # a CI log; the text below is laid out for it
SHAPES = """\
Your own kernel: --kernel PATH.py:ATTR or package.module:ATTR, where ATTR is
  an autograd Function  its forward's parameters are read (Megatron's
                        apply(x, weight, eps, zero_centered_gamma) too);
                        SomeFunction.apply exported as a function is read
                        through its Function
  a function            f(x, weight, eps), f(a, b), f(logits, target, …),
                        torch.nn.functional:cross_entropy, …
  an nn.Module class    built per shape from its constructor (hidden_size |
  or factory            dim | normalized_shape, eps, …); its parameters are
                        bound for each call; a module with none (vLLM's
                        SiluAndMul) is called as it is
  --kernel-arg name=value
                        any other parameter (a module's config, Liger's
                        casting_mode)
What it computes is found, not assumed: candidates of every op `gradcheck-bi
  ops` lists come from the parameters' names, order and defaults, and one
  forward at a small random point against each candidate's fp64 reference
  decides; no match is one line (exit 2) naming the nearest op. --op NAME says
  the op; --generic checks a kernel of no op here.
zero_centered_gamma (norms): a keyword or an offset parameter runs both
  settings; with neither, the kernel is run once at w = 0 to tell γ = w
  (zcg=on not run) from γ = 1 + w (built in, as Gemma's: zcg=off not run);
  --kernel-arg zcg=builtin or zcg=absent says so instead.
"""


def _wrap(text: str, first: str) -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=first,
                         subsequent_indent=" " * (len(first) + 2),
                         break_on_hyphens=False, break_long_words=False)


def kernels_command() -> int:
    """List the bundled kernels, the named adapters and the shapes of kernel --kernel takes."""
    out = ["Bundled kernels (no dependency; CPU or CUDA, every dtype), op rms_norm"]
    out += [f"  {name:<15} {spec.description}" for name, spec in BUNDLED.items()]
    out += ["", "Named adapters (each imports its library only when asked for)"]
    width = max(15, *(len(n) for n in NAMED))
    for op in dict.fromkeys(named.op for named in NAMED.values()):
        out += [f" op {op}:"]
        for name, named in NAMED.items():
            if named.op != op:
                continue
            here = "installed" if named.installed() else "NOT installed"
            out += _wrap(f"{named.summary}", f"  {name:<{width}} ")
            out += _wrap(f"needs {named.needs} [{here}]", " " * (width + 3))
    sys.stdout.write("\n".join(out) + "\n\n" + SHAPES)
    return 0

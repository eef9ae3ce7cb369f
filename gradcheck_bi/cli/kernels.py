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
  an autograd Function  apply(x, weight, eps, zero_centered_gamma) as
                        Megatron's, or any forward whose parameters say what
                        they are (x, weight | w | gamma | scale, eps,
                        zero_centered_gamma, offset)
  a function            f(x, weight, eps), f(x, weight, eps,
                        zero_centered_gamma), rms_norm(input, normalized_shape,
                        weight, eps)
  an nn.Module class    built per shape and eps from (hidden_size | dim |
  or factory            normalized_shape, eps | variance_epsilon [,
                        zero_centered_gamma | offset]); its one (D,) parameter
                        is the weight, bound for each call
  --kernel-arg name=value
                        any other parameter (a module's config, Liger's
                        casting_mode)
zero_centered_gamma: a keyword or an offset parameter runs both settings; with
  neither, the kernel is run once at w = 0 to tell γ = w (zcg=on not run) from
  γ = 1 + w (built in, as Gemma's: zcg=off not run); --kernel-arg zcg=builtin
  or zcg=absent says so instead.
Other ops (fused_add_rms_norm, layer_norm, rms_norm_gated) are recognised from
  the parameter names (`gradcheck-bi ops` lists them); --op NAME says the op.
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

"""The parameter names by which a kernel's signature is read: name → role.

A **role** is what the adapter fills a parameter with: an input (``x``, ``residual``,
``z``), a parameter (``weight``, ``bias``), an option (``eps``, ``group_size``,
``norm_before_gate``, ``prenorm``, ``zcg``, ``offset``) or ``shape`` (torch's
``normalized_shape``). Names are matched case-insensitively (``X``, ``W``, ``R``).

>>> ROLE_OF["hidden_states"], ROLE_OF["r"], ROLE_OF["gate"], ROLE_OF["variance_epsilon"]
('x', 'residual', 'z', 'eps')
"""

from __future__ import annotations

ROLE_NAMES: dict[str, tuple[str, ...]] = {
    "x": ("x", "input", "hidden_states", "inp"),
    "residual": ("residual", "r", "res"),
    "z": ("z", "gate", "g"),  # fla's rms_norm_gated(x, g, …)
    "weight": ("weight", "w", "gamma", "scale"),
    "bias": ("bias", "b", "beta"),
    "eps": ("eps", "epsilon", "variance_epsilon", "variance_eps"),
    "group_size": ("group_size",),
    "norm_before_gate": ("norm_before_gate",),
    "prenorm": ("prenorm",),
    "zcg": ("zero_centered_gamma", "zcg"),
    "offset": ("offset",),
    "shape": ("normalized_shape",),
}
# What a role is, in a sentence that says why a kernel was read as an op ("'R' is a
# residual").
ROLE_WORDS = {"residual": "a residual", "bias": "a bias", "z": "a gate",
              "group_size": "a group size", "norm_before_gate": "norm_before_gate"}
ROLE_OF: dict[str, str] = {n: role for role, names in ROLE_NAMES.items() for n in names}
# Words of a kernel's own names (its function's or class's, then its module's), in
# snake_case (``CohereLayerNorm`` → ``cohere_layer_norm``), that say which op it computes;
# the first pattern that matches names it. "rms" alone says only RMSNorm-like: a gated or
# fused norm is one too, and its parameters say so first (kernels/adapting/recognise.py).
OP_WORDS: tuple[tuple[str, str], ...] = (
    (r"(^|_)gated(_|$)|(^|_)gate_?norm", "rms_norm_gated"),
    (r"(^|_)(fused_)?add_rms|rms_?norm_add|(^|_)skip_rms", "fused_add_rms_norm"),
    (r"layer_?norm", "layer_norm"),
    (r"(^|_)rms", "rms_norm"),
)
# A name that says one op yet names a wider family, and the op whose output it may compute:
# "LayerNorm" in T5LayerNorm and its many copies (MT5, UMT5, LongT5, Pix2Struct, ImageGPT, …)
# is x·rsqrt(mean(x²) + eps)·γ, no mean subtracted and no bias. A kernel so named whose output
# matches that op exactly, with no bias, is checked as it (one note; --op restores the name's).
GENERIC_NAMES: dict[str, str] = {"layer_norm": "rms_norm"}
# Roles filled with a tensor shaped like x or (D,): what a module's forward or a call takes.
TENSOR_ROLES = ("x", "residual", "z", "weight", "bias")


def names_of(role: str) -> str:
    """``"x | input | hidden_states | inp"``: the names a role is recognised by."""
    return " | ".join(ROLE_NAMES[role])

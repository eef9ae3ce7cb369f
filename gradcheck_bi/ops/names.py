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
    "z": ("z", "gate"),
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
# Roles filled with a tensor shaped like x or (D,): what a module's forward or a call takes.
TENSOR_ROLES = ("x", "residual", "z", "weight", "bias")


def names_of(role: str) -> str:
    """``"x | input | hidden_states | inp"``: the names a role is recognised by."""
    return " | ".join(ROLE_NAMES[role])

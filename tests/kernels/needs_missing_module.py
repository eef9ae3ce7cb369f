"""A kernel file whose module imports a package this machine does not have."""

import gradcheck_bi_no_such_dependency  # noqa: F401

Fn = None

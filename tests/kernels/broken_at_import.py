"""A kernel file that fails while its module runs: it cannot be loaded at all (exit 2)."""

WIDTH = 1024
raise RuntimeError(f"user kernel: BLOCK must divide {WIDTH}, misconfigured at import")

"""The fixed block sizes of every row reduction: constants, never derived from the batch.

A row's reduction order depends only on these and on the row length ``D``, so a row's bits
are the same alone or inside any batch. The torch path and both Triton kernels read them
from here.

>>> block_d(300), block_d(5000)
(512, 1024)
"""

from __future__ import annotations

MAX_BLOCK_D = 1024
# Rows per Triton program. Fixed per device, never derived from the batch.
BLOCK_M_CUDA = 4
BLOCK_M_INTERPRETER = 64


def block_d(n_cols: int) -> int:
    """Columns per block: the next power of two of ``n_cols``, capped at 1024."""
    return min(MAX_BLOCK_D, 1 << max(0, (n_cols - 1).bit_length()))

"""Vector reductions that do not go through BLAS.

OpenBLAS runs even a dot product on several threads; when another process holds
a core, each call waits for a thread to be scheduled and a 10 microsecond norm
takes milliseconds.  The iterative methods reduce vectors many times per
iteration, so they use numpy's own single-threaded einsum loops instead.
"""
from __future__ import annotations

import math

import numpy as np


def norm(a: np.ndarray) -> float:
    """Euclidean norm of a 1-D array."""
    return math.sqrt(float(np.einsum("i,i->", a, a)))


def dot(a: np.ndarray, b: np.ndarray) -> float:
    """Inner product of two 1-D arrays."""
    return float(np.einsum("i,i->", a, b))

"""Random number generators as the mechanisms take them: ``None``, a seed or a ``Generator``."""
from __future__ import annotations

import numbers

import numpy as np

__all__ = ["as_rng"]


def as_rng(rng: object) -> np.random.Generator:
    """``None`` (fresh entropy), a non-negative int seed, or a ``Generator``."""
    if isinstance(rng, np.random.Generator):
        return rng
    if rng is None:
        return np.random.default_rng()
    if isinstance(rng, numbers.Integral) and not isinstance(rng, (bool, np.bool_)):
        if rng < 0:
            raise ValueError(f"rng seed must be non-negative, got {rng}")
        return np.random.default_rng(int(rng))
    raise ValueError(f"rng must be None, a non-negative int seed or a numpy.random.Generator, "
                     f"got {type(rng).__name__}")

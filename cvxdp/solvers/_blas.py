"""How many threads the BLAS under numpy and scipy uses, for a block of work.

OpenBLAS's threads pay for themselves in long dense factorisations and cost in many short
calls: on a 2-core machine the interior point's n = 1,000 elastic net took 0.64 s with two
threads against 0.30 s with one (each 1,000 x 1,000 Cholesky 15 ms, with outliers of 60-100
ms waiting for the second thread), where at n = 10,000 two threads took 50 s against 75 s.
numpy and scipy each load their own OpenBLAS (``scipy_openblas``, 64- and 32-bit integers);
:func:`threads` sets both through their ``set_num_threads`` and restores them when the
outermost block ends.  Where none is found (another BLAS, a platform without
``/proc/self/maps``) it does nothing.  Blocks on several Python threads at once share one
count (a lock and a depth: the first block's saved counts are restored by the last to end).
"""
from __future__ import annotations

import contextlib
import ctypes
import threading
from typing import Iterator

__all__ = ["threads"]

_SUFFIXES = ("64_", "")
_PREFIXES = ("scipy_openblas", "openblas")
_lock = threading.Lock()
_state = {"depth": 0, "saved": None, "libs": None}


def _find() -> list[tuple]:
    """``(set, get)`` of every OpenBLAS loaded in this process."""
    try:
        with open("/proc/self/maps") as f:
            paths = sorted({line.split()[-1] for line in f if "openblas" in line.lower()
                            and line.split()[-1].startswith("/")})
    except OSError:
        return []
    found = []
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix in _PREFIXES:
            for suffix in _SUFFIXES:
                set_ = getattr(lib, f"{prefix}_set_num_threads{suffix}", None)
                get = getattr(lib, f"{prefix}_get_num_threads{suffix}", None)
                if set_ is not None and get is not None:
                    set_.argtypes, set_.restype, get.restype = [ctypes.c_int], None, ctypes.c_int
                    found.append((set_, get))
                    break
            else:
                continue
            break
    return found


def _libs() -> list[tuple]:
    if _state["libs"] is None:
        _state["libs"] = _find()
    return _state["libs"]


@contextlib.contextmanager
def threads(count: int | None) -> Iterator[None]:
    """BLAS calls in the block use ``count`` threads (``None``: as many as before the
    outermost block)."""
    with _lock:
        libs = _libs()
        if _state["depth"] == 0:
            _state["saved"] = [get() for _, get in libs]
        _state["depth"] += 1
        before = [get() for _, get in libs]
        for (set_, _), saved in zip(libs, _state["saved"]):
            set_(max(1, int(count)) if count is not None else saved)
    try:
        yield
    finally:
        with _lock:
            _state["depth"] -= 1
            restore = _state["saved"] if _state["depth"] == 0 else before
            for (set_, _), k in zip(libs, restore):
                set_(k)

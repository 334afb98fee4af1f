"""One step of a top-down estimate: the children of some parents, given the parents' estimates.

The Census Bureau's TopDown algorithm estimates a geography level by level: the nation from
its measurements, then each state's children given the state's estimate, and so on.  Given a
parent's estimate ``xhat_p`` its children's problem

    minimize  sum_c f_c(x_c)      subject to  sum_c x_c = xhat_p   [ x_c >= 0 ]

(``f_c`` the squared loss of the child's own measurements) is independent of every other
parent's, so a level is many small problems: the unit of work handed to a worker.  A *chunk*
is a set of parents with their children, solved at once as a forest of two-level trees with
the parents' histograms fixed (:class:`~cvxdp.solvers.tree.gls.TreeGLS` with invariants
``E = I`` at the roots, exact; or :func:`~cvxdp.solvers.tree.nonneg.solve_nonneg` with
``fixed_roots``, certified to ``eps_rel``).  Everything here is arrays in, arrays out (a chunk
pickles small), and deterministic: a chunk gives the same bits wherever it runs.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .. import result as R
from .forest import Forest
from .gls import Block, Invariant, TreeGLS
from .nonneg import NonnegSettings, solve_nonneg

__all__ = ["Chunk", "ChunkResult", "solve_chunk", "chunk_bytes"]


@dataclass
class Chunk:
    """Parents (``parents``: global unit ids, ``values`` their fixed ``(p, k)`` estimates,
    or ``None`` for roots solved on their own), their children (``children`` global ids,
    ``owner`` the position in ``parents`` of each child's parent), and the children's
    measurement blocks with *local* unit indices (children numbered ``0 .. c-1``)."""

    level: int
    parents: np.ndarray
    values: np.ndarray | None
    children: np.ndarray
    owner: np.ndarray
    blocks: list[Block]
    k: int
    nonneg: bool
    eps_rel: float
    max_iters: int = 20000


@dataclass
class ChunkResult:
    level: int
    units: np.ndarray              # global ids of the units estimated
    x: np.ndarray                  # their estimates (units, k)
    status: str
    gap: float
    iterations: int
    info: dict = field(default_factory=dict)


def chunk_bytes(n_units: int, k: int) -> int:
    """Memory a chunk's solve needs, about: a dozen ``(units, k)`` float arrays in the passes
    and the ADMM, plus its measurements."""
    return 16 * n_units * k * 8


def solve_chunk(chunk: Chunk) -> ChunkResult:
    """The children's estimates (module docstring); for ``values is None`` the ``children``
    are roots estimated from their own measurements alone."""
    k, c = chunk.k, chunk.children.size
    if chunk.values is None:
        forest = Forest(np.full(c, -1, dtype=np.int64))
        blocks, fixed, offset = chunk.blocks, None, 0
    else:
        p = chunk.parents.size
        parent = np.r_[np.full(p, -1, dtype=np.int64), chunk.owner.astype(np.int64)]
        forest = Forest(parent)
        blocks = [Block(b.nodes + p, b.Q, b.w, b.y) for b in chunk.blocks]
        fixed, offset = Invariant(np.arange(p), np.eye(k), chunk.values), p
    if chunk.nonneg:
        res = solve_nonneg(forest, k, blocks, NonnegSettings(eps_rel=chunk.eps_rel,
                                                             max_iters=chunk.max_iters),
                           fixed_roots=fixed)
        x, status, gap, iters = res.x, res.status, res.gap, res.iterations
    else:
        x = TreeGLS(forest, k, blocks, [] if fixed is None else [fixed]).solve()
        status, gap, iters = R.OPTIMAL, 0.0, 1
    return ChunkResult(chunk.level, chunk.children, x[offset:], status, gap, iters)

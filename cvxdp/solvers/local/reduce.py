"""Unmeasured cliques of the local polytope eliminated before the solve and filled in after.

A clique ``C`` that no loss term touches (a marginal in the model but not measured: the
unmeasured cliques of a workload) constrains the others only through its overlaps: its table
must be a non-negative table with total ``N`` whose marginal on ``C & D`` is clique ``D``'s,
for every other clique ``D``.  Let ``F_1 .. F_r`` be the largest of those overlaps.  When they
form an *acyclic* family -- ordered so that each ``S_j = F_j & (F_1 | .. | F_{j-1})`` lies in
one earlier ``F_i`` (the running intersection property) -- every set of marginals on them that
agree where they overlap is met by the non-negative table ::

    t_C = prod_j mu_{F_j} / prod_{j >= 2} mu_{S_j}  /  |dom(C \\ (F_1 | .. | F_r))|     (0/0 = 0)

(the decomposable model of the family: Lauritzen, *Graphical Models* 1996, Prop. 3.16 and
sec. 3.2.1; Beeri, Fagin, Maier & Yannakakis, J. ACM 1983, for pairwise consistency on
acyclic families), with ``mu_S = N`` for an empty ``S`` and the uniform table ``N / |dom(C)|``
for an empty family.  The other cliques' local polytope with ``C`` removed is then exactly the
projection of the one with ``C``: removing ``C`` changes neither the optimum nor the optimal
value, and the tables above complete any point of the smaller problem into one of the larger,
with the same loss.  At the optimum the loss gradient on ``C`` is zero, so its duals are zero.

Removing one clique can make another eliminable, so :func:`reduce` repeats until none is, and
:meth:`Reduction.expand` fills the tables in the reverse order.  The measured cliques are never
removed, nor the last clique.  Most useful where every *measured* cell has curvature (all
two-way marginals with some pairs unmeasured: each unmeasured pair overlaps the others in two
single attributes, an acyclic family): the smaller problem is then eligible for the dual
Newton (:mod:`cvxdp.solvers.local.newton`), which a cell without a loss term rules out.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
import scipy.sparse as sp

from .. import result as R
from ..marginal.loss import LossTerm, MarginalLoss
from .problem import LocalProblem
from .region_graph import RegionGraph

__all__ = ["Reduction", "reduce"]


@dataclass
class _Filled:
    """How one eliminated clique is filled in: ``parts`` are ``(F_j, source clique)`` in a
    running-intersection order and ``seps`` the ``(S_j, source clique)`` for ``j >= 2``
    (original clique indices; attribute sets as tuples in the clique's axis order)."""

    k: int
    parts: list[tuple[tuple[int, ...], int]]
    seps: list[tuple[tuple[int, ...], int]]
    free: int                                   # cells of the attributes in no overlap


@dataclass
class Reduction:
    """The problem without its eliminable unmeasured cliques, and how to undo it."""

    problem: LocalProblem                        # the smaller problem
    full: LocalProblem                           # the original problem
    keep: np.ndarray                             # original indices of the kept cliques
    filled: list[_Filled] = field(default_factory=list)   # in elimination order

    def expand(self, x: np.ndarray) -> np.ndarray:
        """A point of the smaller problem completed into one of the original (module
        docstring), with the same loss."""
        G = self.full.graph
        out = self.expand_cells(x)
        total = self.full.total if self.full.total is not None \
            else float(self.problem.graph.totals(x)[0])
        for f in reversed(self.filled):
            G.block(out, f.k)[...] = self._table(out, f, total)
        return out

    def expand_cells(self, v: np.ndarray) -> np.ndarray:
        """A per-cell vector of the smaller problem with zeros on the eliminated cliques."""
        G, small = self.full.graph, self.problem.graph
        out = np.zeros(G.n)
        for j, k in enumerate(self.keep.tolist()):
            out[G.offsets[k]:G.offsets[k + 1]] = v[small.offsets[j]:small.offsets[j + 1]]
        return out

    def _table(self, t: np.ndarray, f: _Filled, total: float) -> np.ndarray:
        G = self.full.graph
        clique, shape = G.cliques[f.k], G.shapes[f.k]
        if not f.parts:
            return np.full(shape, total / math.prod(shape))

        def spread(attrs, src):
            m = G.marginal(t, src, attrs)
            return m.reshape([G.sizes[a] if a in attrs else 1 for a in clique])
        out = np.ones(shape)
        for attrs, src in f.parts:
            out = out * spread(attrs, src)
        for attrs, src in f.seps:
            den = spread(attrs, src) if attrs else np.full([1] * len(clique), total)
            out = np.divide(out, den, out=np.zeros(shape), where=np.broadcast_to(den, shape) > 0)
        return out / f.free

    def result(self, res: R.SolverResult) -> R.SolverResult:
        """The smaller problem's result in the original's terms: the point completed, the
        per-cell duals zero on the eliminated cliques, the residual on the whole graph."""
        x = self.expand(res.x) if res.x is not None else None
        duals = {k: self.expand_cells(v) for k, v in res.duals.items()}
        info = dict(res.info, eliminated=len(self.filled))
        resid = self.full.graph.residual(x, self.full.total) if x is not None else res.primal_residual
        return replace(res, x=x, duals=duals, info=info, primal_residual=resid)


def reduce(p) -> Reduction | None:
    """The :class:`Reduction` of ``p`` (a :class:`cvxdp.solvers.local.admm.LocalProblem`), or
    ``None`` when no clique is eliminable."""
    G = p.graph
    measured = _measured_cliques(p)
    alive = set(range(len(G.cliques)))
    filled: list[_Filled] = []
    # a worklist: removing a clique can only change the overlaps of the cliques meeting it
    todo = sorted(k for k in alive if not measured[k])
    queued = set(todo)
    while todo and len(alive) > 1:
        k = todo.pop(0)
        queued.discard(k)
        plan = _plan(G, k, sorted(alive - {k}))
        if plan is None:
            continue
        filled.append(plan)
        alive.discard(k)
        for d in sorted(alive):
            if not measured[d] and d not in queued and set(G.cliques[d]) & set(G.cliques[k]):
                todo.append(d)
                queued.add(d)
    if not filled:
        return None
    keep = np.array(sorted(alive), dtype=np.int64)
    return Reduction(problem=_smaller(p, keep), full=p, keep=keep, filled=filled)


def _measured_cliques(p) -> np.ndarray:
    """Whether any loss term touches a cell of each clique."""
    G = p.graph
    touched = np.zeros(G.n, dtype=bool)
    for t in p.loss.terms:
        if isinstance(t.A, slice):
            touched[t.A] = True
        else:
            touched[np.unique(t.A.indices)] = True
    return np.logical_or.reduceat(touched, G.offsets[:-1]) if G.n else np.zeros(0, dtype=bool)


def _plan(G: RegionGraph, k: int, others: list[int]) -> _Filled | None:
    """Clique ``k``'s largest overlaps with ``others`` in a running-intersection order, or
    ``None`` if no such order is found (a cyclic family: ``k`` stays)."""
    clique = G.cliques[k]
    found: dict[frozenset, int] = {}
    for d in others:
        s = frozenset(clique) & frozenset(G.cliques[d])
        if s and s not in found:
            found[s] = d
    tops = [s for s in found if not any(s < o for o in found)]
    order = lambda s: tuple(a for a in clique if a in s)    # noqa: E731 (the clique's axis order)
    free = math.prod(G.sizes[a] for a in clique if not any(a in s for s in tops))
    if not tops:
        return _Filled(k, [], [], free)
    tops.sort(key=lambda s: (-len(s), order(s)))
    chosen, rest = [tops[0]], tops[1:]
    parts, seps = [(order(tops[0]), found[tops[0]])], []
    while rest:
        union = frozenset().union(*chosen)
        for s in rest:
            sep = s & union
            home = next((c for c in chosen if sep <= c), None)
            if home is not None:
                break
        else:
            return None
        rest.remove(s)
        chosen.append(s)
        parts.append((order(s), found[s]))
        seps.append((order(sep), found[home] if sep else found[s]))
    return _Filled(k, parts, seps, free)


def _smaller(p, keep: np.ndarray):
    """``p`` on the kept cliques only: the region graph rebuilt, the loss terms re-indexed."""
    G = p.graph
    kept_cells = np.zeros(G.n, dtype=bool)
    for k in keep.tolist():
        kept_cells[G.offsets[k]:G.offsets[k + 1]] = True
    shift = np.concatenate([[0], np.cumsum(~kept_cells)])     # cells removed before each index
    cols = np.flatnonzero(kept_cells)
    terms = []
    for t in p.loss.terms:
        if isinstance(t.A, slice):
            A = slice(t.A.start - int(shift[t.A.start]), t.A.stop - int(shift[t.A.start]))
        else:
            A = sp.csr_matrix(t.A)[:, cols]
        terms.append(LossTerm(t.kind, A, t.b, t.w))
    graph = RegionGraph(G.sizes, [G.cliques[k] for k in keep.tolist()])
    return LocalProblem(graph, MarginalLoss(terms, int(cols.size), p.loss.constant), p.total)

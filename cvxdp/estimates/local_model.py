"""A graphical model of bounded size fitted to the consistent marginals of a :class:`cvxdp.LocalPolytope`.

After a solve, a :class:`cvxdp.LocalPolytope` holds clique marginals ``mu_C`` (non-negative,
one total ``N``) that agree on every attribute set two cliques share.  They answer exactly
every marginal inside one clique (``constraint.marginal``), and nothing else: the local
polytope is a *relaxation* of the marginal polytope, so for cliques with cycles (e.g. all
two-way marginals) there may be no table at all with these marginals, and when there is one,
many.  :func:`fit_model` picks one distribution -- a junction-tree graphical model of bounded
size -- to answer marginals spanning cliques and to sample synthetic records.

Selection.  The cliques are scored from the consistent marginals by their *total
correlation* (for pairs, the mutual information)

    TC(C) = sum_{a in C} H(mu_a / N) - H(mu_C / N)      (nats; 0 for independent attributes),

by default penalised as in BIC, ``score = TC(C) - df(C) ln(N) / (2 N)`` with
``df(C) = prod n_a - 1 - sum (n_a - 1)`` (the degrees of freedom of the dependence).  The
penalty matters: the plug-in TC of a noisy large table is inflated by the noise (on Adult with
all pairs at epsilon = 1, the estimated (age, fnlwgt) table has TC 0.75 against 0.05 in the
data), and the unpenalised greedy then copies noise into the model.  The score only orders:
cliques are visited in decreasing score (or in the order of ``cliques=``), and a clique is
*selected* if it has at most ``max_cells`` cells and the selected set stays within the
method's rule; otherwise it is *dropped*.  A clique inside a selected one is reproduced with
it (it counts as kept).  Every attribute that some clique measures but no selected clique
covers gets its one-way marginal; attributes in no clique at all are uniform.

``method="decomposable"`` (the default): the selected set must stay *decomposable*: its
hypergraph acyclic (GYO reduction; for pairs, a forest -- so for all two-way marginals and
``score="total_correlation"`` the result is the Chow-Liu tree, the maximum spanning tree of
the mutual informations; with the default ``"bic"``, the maximum spanning tree of the
penalised scores) and its junction tree within ``max_cells``.  Consistent marginals on a decomposable clique set are
always realised, by exactly one maximum-entropy distribution, the junction-tree product

    p(x) = prod_C mu_C(x_C) / prod_S mu_S(x_S)      (cliques C and separators S of a join tree),

built directly from the clique tables (:meth:`cvxdp.GraphicalModel.from_clique_tables`, no
optimisation; a junction-tree clique the triangulation forms from several selected cliques gets
its marginal of this product).  **Exact:** every marginal inside a kept clique equals the
LocalPolytope's (to the solve's consistency tolerance), hence every one-way marginal of a
measured attribute, and the total.

``method="mirror_descent"``: the selected set only needs a junction tree (after
triangulation) whose cliques have at most ``max_cells`` cells, so it may contain cycles (a
richer model: all two-way marginals on a few attributes fit as they are).  The model is the
closest realisable point, ``minimize sum_C ||x_C - mu_C||_2^2`` over
:class:`cvxdp.MarginalPolytope` (selected cliques, same total), solved by
``cvxdp.MIRROR_DESCENT``.  The loss is 0 exactly when the consistent marginals on the selected
cliques come from one table; the local polytope does not promise that for a cyclic set, so the
kept cliques are reproduced only up to the fit's residual, which the report gives.

**Not exact**, for both methods: the marginals of dropped cliques (their L1 distance to the
LocalPolytope's is reported), and everything spanning cliques: those come from the model's
conditional-independence assumptions (attributes not in one junction-tree clique are
independent given the separators between them), which the data never confirmed.  Synthetic
records (``model.synthetic_data``, in the attributes' original values when the domain has
labels) are drawn exactly from the model, so their marginals add sampling error to the model's.

The report is ``model.info``, a :class:`ModelFit`: kept and dropped cliques (with the reason),
scores, and each clique's L1 error ``||model_C - mu_C||_1`` against the LocalPolytope.
"""
from __future__ import annotations

import math
import numbers
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

import cvxpy as cp

from ..modelling.domain import Domain
from ..modelling.marginal_polytope import MarginalPolytope
from ..names import MIRROR_DESCENT
from ..solvers.marginal.junction_tree import JunctionTree, ModelTooLarge
from .graphical_model import GraphicalModel


@runtime_checkable
class ConsistentMarginals(Protocol):
    """What :func:`fit_model` reads of a solved constraint: clique marginals that agree wherever
    they overlap (a :class:`cvxdp.LocalPolytope` after a solve)."""

    domain: Domain
    cliques: list
    total: Any
    fitted_total: float | None       # a property of the constraint

    def known_total(self) -> float | None: ...

    def tables(self) -> list[np.ndarray] | None: ...

    def marginal(self, attrs: Any) -> np.ndarray: ...

__all__ = ["fit_model", "ModelFit", "total_correlation", "bic_score", "METHODS", "SCORES"]

#: the fitting methods of :func:`fit_model`
METHODS = ("decomposable", "mirror_descent")

Clique = tuple[str, ...]


@dataclass(frozen=True)
class ModelFit:
    """What :func:`fit_model` kept, dropped, and how far the model is from the LocalPolytope.

    Attributes
    ----------
    method : ``"decomposable"`` or ``"mirror_descent"``.
    selected : the cliques the model was built from, in selection order (the LocalPolytope's
        cliques or the ``cliques=`` given, plus one-way marginals added for attributes no
        selected clique covers).
    kept : the LocalPolytope's cliques inside a selected clique: the model is fitted to them
        (exactly for ``"decomposable"``).
    dropped : the LocalPolytope's other cliques (``reasons[c]`` says why).
    reasons : for each dropped clique, why: ``"cells"`` (more than ``max_cells`` cells),
        ``"cycle"`` (would make the selected set non-decomposable), ``"junction tree"`` (its
        junction tree would have a clique above ``max_cells``), ``"not listed"`` (not in
        ``cliques=``).
    scores : the score (nats) of every scored clique; ``score`` names the rule.
    errors : for every LocalPolytope clique, ``||model marginal - LocalPolytope marginal||_1``
        (counts; divide by ``total`` for the fraction of records misplaced, 0..2).
    total : the model's number of records.
    max_cells : the bound used; ``largest_cells``: the junction tree's largest clique.
    unmeasured : attributes in no LocalPolytope clique (uniform in the model).
    solve : for ``"mirror_descent"``: status, objective, iterations and time of the fit.
    time : seconds spent in :func:`fit_model`.
    """

    method: str
    score: str
    selected: tuple[Clique, ...]
    kept: tuple[Clique, ...]
    dropped: tuple[Clique, ...]
    reasons: dict[Clique, str]
    scores: dict[Clique, float]
    errors: dict[Clique, float]
    total: float
    max_cells: int
    largest_cells: int
    unmeasured: tuple[str, ...] = ()
    solve: dict[str, Any] | None = None
    time: float = 0.0
    junction_tree: tuple[Clique, ...] = field(default=())

    def max_error(self, which: str = "kept") -> float:
        """Largest L1 error (counts) over the ``"kept"`` or ``"dropped"`` cliques (0 if none)."""
        if which not in ("kept", "dropped"):
            raise ValueError(f"which must be 'kept' or 'dropped', got {which!r}")
        cl = self.kept if which == "kept" else self.dropped
        return max((self.errors[c] for c in cl), default=0.0)

    def describe(self) -> str:
        """A few lines: what is kept (exact or fitted), what is dropped and how far off."""
        n = self.total
        lines = [f"{self.method} model ({self.score} score) of {n:,.0f} records: "
                 f"{len(self.selected)} selected cliques, junction tree of "
                 f"{len(self.junction_tree)} cliques (largest "
                 f"{self.largest_cells:,} cells, max_cells={self.max_cells:,}); fitted in "
                 f"{self.time:.2f} s"]
        lines.append(f"kept {len(self.kept)} of {len(self.kept) + len(self.dropped)} cliques, "
                     f"largest L1 error / N {self.max_error('kept') / n:.1e}"
                     + (" (exact: a decomposable set)" if self.method == "decomposable" else
                        " (the fit's residual)"))
        if self.dropped:
            errs = [self.errors[c] / n for c in self.dropped]
            why = Counter(self.reasons[c] for c in self.dropped)
            lines.append(f"dropped {len(self.dropped)} ("
                         + ", ".join(f"{k}: {v}" for k, v in sorted(why.items()))
                         + f"); NOT exact: L1 error / N mean {np.mean(errs):.4f}, "
                           f"max {np.max(errs):.4f}")
        if self.unmeasured:
            lines.append(f"unmeasured attributes (uniform): {', '.join(self.unmeasured)}")
        return "\n".join(lines)

    __str__ = describe


# ---------------------------------------------------------------------------- scores
def _entropy(p: np.ndarray) -> float:
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


def total_correlation(table: np.ndarray) -> float:
    """``sum_a H(p_a) - H(p)`` (nats) of the distribution ``table / table.sum()`` (axes =
    attributes); the mutual information for two axes, 0 for independent attributes."""
    t = np.clip(np.asarray(table, dtype=float), 0.0, None)
    s = t.sum()
    if not s > 0:
        return 0.0
    p = t / s
    h1 = sum(_entropy(p.sum(axis=tuple(j for j in range(p.ndim) if j != i)))
             for i in range(p.ndim))
    return max(0.0, h1 - _entropy(p.ravel()))


def bic_score(table: np.ndarray, total: float) -> float:
    """``TC - df ln(N) / (2 N)``: the total correlation less a BIC penalty of ``ln(N) / (2 N)``
    nats per degree of freedom ``df = prod n_a - 1 - sum (n_a - 1)`` (0 for one attribute)."""
    shape = np.shape(table)
    df = math.prod(shape) - 1 - sum(n - 1 for n in shape)
    n = max(float(total), 2.0)
    return total_correlation(table) - df * math.log(n) / (2 * n)


#: the named scores of :func:`fit_model`
SCORES = {"bic": bic_score,
          "total_correlation": lambda table, total: total_correlation(table)}


# ---------------------------------------------------------------------------- decomposability
def _acyclic(edges: Sequence[frozenset[int]]) -> bool:
    """GYO reduction: is the hypergraph ``edges`` alpha-acyclic (decomposable)?  Repeatedly
    delete attributes in only one edge and edges inside another; acyclic iff nothing is left."""
    es = {frozenset(e) for e in edges if e}
    while es:
        count = Counter(a for e in es for a in e)
        nxt = {frozenset(a for a in e if count[a] > 1) for e in es}
        nxt = {e for e in nxt if e and not any(e < f for f in nxt)}
        if nxt == es:
            return False
        es = nxt
    return True


def _join_tree(cliques: Sequence[frozenset[int]]) -> list[int]:
    """Parent of each clique in a join tree of a decomposable set of maximal cliques (a
    maximum-weight spanning tree of the intersection sizes; -1 for the root)."""
    n = len(cliques)
    edges = sorted(((len(cliques[i] & cliques[j]), i, j) for i in range(n) for j in range(i + 1, n)),
                   reverse=True)
    comp = list(range(n))

    def find(i: int) -> int:
        while comp[i] != i:
            comp[i] = comp[comp[i]]
            i = comp[i]
        return i

    adj: list[list[int]] = [[] for _ in range(n)]
    for _, i, j in edges:
        ri, rj = find(i), find(j)
        if ri != rj:
            comp[ri] = rj
            adj[i].append(j)
            adj[j].append(i)
    parent = [-2] * n
    if n:
        parent[0] = -1
        stack = [0]
        while stack:
            i = stack.pop()
            for j in adj[i]:
                if parent[j] == -2:
                    parent[j] = i
                    stack.append(j)
    return parent


def _subtree_marginal(cliques: list[tuple[int, ...]], tables: list[np.ndarray], parent: list[int],
                      target: tuple[int, ...], total: float) -> np.ndarray:
    """``total * p(x_target)`` of the junction-tree product of consistent ``tables`` (axes in each
    clique's order) on the join tree ``parent``; axes of the result in ``target``'s order."""
    n = len(cliques)
    tset = set(target)
    adj: list[set[int]] = [set() for _ in range(n)]
    for i, p in enumerate(parent):
        if p >= 0:
            adj[i].add(p)
            adj[p].add(i)
    need = {i for i in range(n) if tset & set(cliques[i])}
    keep = set(range(n))
    leaves = [i for i in keep if len(adj[i]) <= 1 and i not in need]
    while leaves:                                  # prune to the subtree spanning `need`
        i = leaves.pop()
        if i not in keep or len(adj[i] & keep) > 1 or i in need:
            continue
        keep.discard(i)
        leaves.extend(j for j in adj[i] if j in keep and j not in need and len(adj[j] & keep) <= 1)
    root = min(need)
    factors: list[tuple[tuple[int, ...], np.ndarray]] = [(cliques[root], tables[root] / total)]
    seen, stack = {root}, [root]
    while stack:
        i = stack.pop()
        for j in adj[i]:
            if j in keep and j not in seen:
                seen.add(j)
                stack.append(j)
                sep = set(cliques[i]) & set(cliques[j])
                own = tuple(k for k, a in enumerate(cliques[j]) if a not in sep)
                t = tables[j]
                s = t.sum(axis=own, keepdims=True)
                with np.errstate(divide="ignore", invalid="ignore"):
                    cond = np.where(s > 0, t / np.where(s > 0, s, 1.0), 0.0)
                factors.append((cliques[j], cond))
    labels = sorted(set().union(*(set(c) for c, _ in factors)))
    loc = {a: k for k, a in enumerate(labels)}
    args: list[Any] = []
    for c, arr in factors:
        args += [arr, [loc[a] for a in c]]
    args.append([loc[a] for a in target])
    return total * np.einsum(*args, optimize="greedy")


# ---------------------------------------------------------------------------- arguments
def _check_max_cells(max_cells: Any) -> int:
    if isinstance(max_cells, bool) or not isinstance(max_cells, numbers.Integral) or max_cells < 1:
        raise ValueError(f"fit_model: max_cells must be a positive integer (cells of the largest "
                         f"junction-tree clique), got {max_cells!r}")
    return int(max_cells)


def _check_cliques(cliques: Any, con: ConsistentMarginals) -> list[Clique]:
    dom = con.domain
    if isinstance(cliques, (str, bytes)) or not isinstance(cliques, Sequence) or not cliques:
        raise ValueError(f"fit_model: cliques must be a non-empty sequence of attribute tuples "
                         f"(in order of preference), got {cliques!r}")
    out: list[Clique] = []
    for c in cliques:
        try:
            c = dom.clique(c)
        except (KeyError, ValueError, TypeError) as e:
            raise ValueError(f"fit_model: cliques: {c!r} is not an attribute tuple of the "
                             f"domain ({e})") from None
        if not any(set(c) <= set(k) for k in con.cliques):
            raise ValueError(f"fit_model: cliques: {c} lies in no clique of the LocalPolytope, "
                             f"so its marginal is not known (cliques: {con.cliques})")
        if any(set(c) == set(k) for k in out):
            raise ValueError(f"fit_model: cliques: {c} is listed twice")
        out.append(c)
    return out


# ---------------------------------------------------------------------------- the fit
def fit_model(constraint: ConsistentMarginals, *, max_cells: int = 2 ** 20,
              cliques: Sequence[Sequence[str] | str] | None = None,
              method: str = "decomposable", score: str | Callable[[np.ndarray, float], float] = "bic",
              solve_options: Mapping[str, Any] | None = None) -> GraphicalModel:
    """A junction-tree graphical model fitted to a solved LocalPolytope's consistent marginals.

    Parameters
    ----------
    constraint : a :class:`cvxdp.LocalPolytope` whose marginals have values (after a solve).
    max_cells : largest junction-tree clique of the model, in cells; a clique that does not fit
        is dropped (module docstring).
    cliques : the candidate cliques in order of preference (each an attribute tuple inside a
        clique of ``constraint``); default: ``constraint``'s cliques by decreasing score.
        LocalPolytope cliques not covered by a selected one are dropped.
    method : ``"decomposable"`` (exact on every kept clique; a forest of cliques) or
        ``"mirror_descent"`` (any junction tree within ``max_cells``; a least-squares fit).
    score : ``"bic"`` (total correlation less a BIC penalty per degree of freedom),
        ``"total_correlation"`` (plug-in; Chow-Liu), or a function ``(table, total) -> float``
        of a clique's estimated table (axes in the clique's order).  Unused with ``cliques=``
        except in the report.
    solve_options : keyword arguments for ``prob.solve`` of the ``"mirror_descent"`` fit
        (e.g. ``max_iters``, ``time_limit``).

    Returns
    -------
    A :class:`cvxdp.GraphicalModel` over ``constraint.domain`` scaled to the constraint's total
    (the fitted total if it was free), with ``model.info`` a :class:`ModelFit`: which cliques
    are kept (exact) and dropped (with their L1 error).  ``ValueError`` names an invalid
    argument.
    """
    t_start = time.perf_counter()
    max_cells, score_fn, score_name = _check_arguments(constraint, max_cells, method, score,
                                                       solve_options)
    candidates = list(constraint.cliques) if cliques is None else _check_cliques(cliques, constraint)
    total = _check_solved(constraint, max_cells)
    dom: Domain = constraint.domain

    def table(c: Clique) -> np.ndarray:
        """The LocalPolytope's marginal on ``c``, clipped at 0 and scaled to ``total``."""
        t = np.clip(constraint.marginal(c), 0.0, None)
        s = t.sum()
        return t * (total / s) if s > 0 else np.full(t.shape, total / t.size)

    scores = _scores(list(constraint.cliques) + candidates, table, score_fn, total)
    if cliques is None:
        order = {c: k for k, c in enumerate(candidates)}
        candidates.sort(key=lambda c: (-scores[c], order[c]))
    sel = _Selection(dom, max_cells, method)
    selected, reasons = sel.select(candidates)
    measured = {a for c in constraint.cliques for a in c}
    covered = {a for c in selected for a in c}
    selected += [(a,) for a in dom.names if a in measured and a not in covered]
    unmeasured = tuple(a for a in dom.names if a not in measured)
    kept = tuple(c for c in constraint.cliques if any(set(c) <= set(s) for s in selected))
    dropped = tuple(c for c in constraint.cliques if c not in kept)
    by_set = {frozenset(c): c for c in candidates}
    why = {c: reasons.get(by_set.get(frozenset(c)), "not listed") for c in dropped}
    solve_info = None
    if method == "decomposable":
        tree = sel.tree_of(selected)
        model = _decomposable(dom, tree, [tuple(sorted(sel.fs(s))) for s in selected], table,
                              total)
    else:
        model, tree, solve_info = _fit_mirror_descent(constraint, selected, table, total,
                                                      max_cells, dict(solve_options or {}))
    errors = {c: float(np.abs(model.marginal(c) - constraint.marginal(c)).sum())
              for c in constraint.cliques}
    model.info = ModelFit(
        method=method, score=score_name, selected=tuple(selected), kept=kept, dropped=dropped, reasons=why,
        scores=scores, errors=errors, total=float(total), max_cells=max_cells,
        largest_cells=int(max(tree.cells)), unmeasured=unmeasured, solve=solve_info,
        time=time.perf_counter() - t_start,
        junction_tree=tuple(tuple(dom.names[a] for a in c) for c in tree.cliques))
    return model


def _check_arguments(constraint: Any, max_cells: Any, method: Any, score: Any,
                     solve_options: Any) -> tuple[int, Callable[[np.ndarray, float], float], str]:
    """``(max_cells, score function, score name)``, or ``ValueError`` naming the argument."""
    if not isinstance(constraint, ConsistentMarginals):
        raise ValueError(f"fit_model: constraint must be a cvxdp.LocalPolytope, got "
                         f"{type(constraint).__name__}")
    max_cells = _check_max_cells(max_cells)
    if method not in METHODS:
        raise ValueError(f"fit_model: method must be one of {METHODS}, got {method!r}")
    if isinstance(score, str) and score in SCORES:
        score_fn, score_name = SCORES[score], score
    elif callable(score) and not isinstance(score, str):
        score_fn, score_name = score, getattr(score, "__name__", "custom")
    else:
        raise ValueError(f"fit_model: score must be one of {tuple(SCORES)} or a function "
                         f"(table, total) -> float, got {score!r}")
    if solve_options is not None and not isinstance(solve_options, Mapping):
        raise ValueError(f"fit_model: solve_options must be a mapping of prob.solve keyword "
                         f"arguments, got {type(solve_options).__name__}")
    if solve_options and method != "mirror_descent":
        raise ValueError("fit_model: solve_options only apply to method='mirror_descent'")
    return max_cells, score_fn, score_name


def _check_solved(constraint: ConsistentMarginals, max_cells: int) -> float:
    """The total the model is scaled to; ``ValueError`` before a solve, for a total that is
    not positive, or for a ``max_cells`` below an attribute's size."""
    if constraint.tables() is None:
        raise ValueError("fit_model: constraint's marginals have no value (solve the problem "
                         "first)")
    dom: Domain = constraint.domain
    total = constraint.known_total() if constraint.total is not None else constraint.fitted_total
    if total is None or not (math.isfinite(total) and total > 0):
        raise ValueError(f"fit_model: constraint's total is {total!r}; a model needs a positive "
                         f"total")
    big = [a for a in dom.names if dom[a] > max_cells]
    if big:
        raise ValueError(f"fit_model: max_cells={max_cells:,} is below the size of attribute(s) "
                         f"{big}; every attribute needs a clique of its own size at least")
    return total


def _scores(cliques: list[Clique], table: Callable[[Clique], np.ndarray],
            score_fn: Callable[[np.ndarray, float], float], total: float) -> dict[Clique, float]:
    """Each clique's score (its estimated table's), once per clique; ``ValueError`` for a
    score that is not a finite number."""
    scores: dict[Clique, float] = {}
    for c in dict.fromkeys(cliques):
        v = score_fn(table(c), total)
        try:
            v = float(v)
        except (TypeError, ValueError):
            v = math.nan
        if not math.isfinite(v):
            raise ValueError(f"fit_model: score gave {v!r} for {c}; it must return a finite number")
        scores[c] = v
    return scores


class _Selection:
    """The greedy selection of the module docstring over a domain: a clique is selected if it
    fits ``max_cells``, is not inside a selected one and keeps the selected set within the
    method's rule (decomposable: acyclic; both: a junction tree within ``max_cells``)."""

    def __init__(self, dom: Domain, max_cells: int, method: str) -> None:
        self.dom, self.max_cells, self.method = dom, max_cells, method
        self.idx = {a: dom.index(a) for a in dom.names}

    def fs(self, c: Clique) -> frozenset[int]:
        return frozenset(self.idx[a] for a in c)

    def tree_of(self, cls: list[Clique]) -> JunctionTree:
        return JunctionTree(self.dom.sizes, [tuple(sorted(self.fs(c))) for c in cls],
                            max_cells=self.max_cells)

    def select(self, candidates: list[Clique]) -> tuple[list[Clique], dict[Clique, str]]:
        """``(selected, why each refused clique was dropped)`` in the candidates' order."""
        fs = self.fs
        selected: list[Clique] = []
        reasons: dict[Clique, str] = {}
        for c in candidates:
            if self.dom.size(c) > self.max_cells:
                reasons[c] = "cells"
                continue
            if any(fs(c) <= fs(s) for s in selected):
                continue                              # reproduced with a selected clique
            trial = selected + [c]
            if self.method == "decomposable" and not _acyclic([fs(s) for s in trial]):
                reasons[c] = "cycle"
                continue
            try:
                self.tree_of(trial)
            except ModelTooLarge:
                reasons[c] = "junction tree"
                continue
            selected = [s for s in selected if not fs(s) < fs(c)] + [c]
        return selected, reasons


def _decomposable(dom: Domain, tree: JunctionTree, sel: list[tuple[int, ...]],
                  table: Callable[[Clique], np.ndarray], total: float) -> GraphicalModel:
    """The junction-tree product of the selected cliques' tables (``sel``: sorted attribute
    indices), built directly (module docstring): a junction-tree clique inside a selected one
    takes its table, any other (a triangulation clique, or attributes no clique measures)
    the product's marginal."""
    sel_tabs = [table(tuple(dom.names[a] for a in s)) for s in sel]
    parent = _join_tree([frozenset(s) for s in sel])
    tabs = []
    for jc in tree.cliques:
        if any(set(jc) <= set(s) for s in sel):
            tabs.append(table(tuple(dom.names[a] for a in jc)))
        else:
            tabs.append(_product_marginal(sel, sel_tabs, parent, jc, dom.sizes, total))
    return GraphicalModel.from_clique_tables(dom, tree, tabs, total)


def _product_marginal(sel: list[tuple[int, ...]], tabs: list[np.ndarray], parent: list[int],
                      target: tuple[int, ...], sizes: Sequence[int], total: float) -> np.ndarray:
    """The junction-tree product's marginal on ``target`` (sorted attribute indices), with
    attributes in no selected clique uniform and independent of the rest."""
    inside = set().union(*map(set, sel))
    part = tuple(a for a in target if a in inside)
    m = _subtree_marginal(sel, tabs, parent, part, total) if part else np.array(total)
    for a in target:
        if a not in inside:
            m = np.multiply.outer(m, np.full(sizes[a], 1.0 / sizes[a]))
    order = list(part) + [a for a in target if a not in inside]
    return np.transpose(m, [order.index(a) for a in target])


def _fit_mirror_descent(constraint: ConsistentMarginals, selected: list[Clique], table, total: float,
                        max_cells: int, options: dict[str, Any]
                        ) -> tuple[GraphicalModel, JunctionTree, dict[str, Any]]:
    """``minimize sum_C ||x_C - mu_C||^2 / total`` over the marginal polytope of ``selected``."""
    dom = constraint.domain
    x = {c: cp.Variable(dom.shape(c)) for c in selected}
    mp = MarginalPolytope(x, dom, total=total, max_cells=max_cells)
    loss = sum(cp.sum_squares(x[c] - table(c)) for c in selected) / total
    prob = cp.Problem(cp.Minimize(loss), [mp])
    options.setdefault("eps_rel", 1e-8)
    t0 = time.perf_counter()
    prob.solve(method="cvxdp", solver=MIRROR_DESCENT, **options)
    info = {"status": prob.status, "objective": prob.value,
            "iterations": prob.solver_stats.num_iters, "time": time.perf_counter() - t0}
    if mp.model is None:
        raise RuntimeError(f"fit_model: the mirror-descent fit returned no model "
                           f"(status {prob.status})")
    return mp.model, mp.tree, info

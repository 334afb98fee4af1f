"""The model :mod:`cvxdp.estimates.synth` returns: ``mbi.MarkovRandomField`` answering with cvxdp's inference.

Imported only when mbi (and so jax) is installed: :mod:`cvxdp.estimates.synth` imports it inside
its functions, and ``import cvxdp`` never does.

:class:`CvxdpMarkovRandomField` is a module-level subclass of ``mbi.MarkovRandomField`` (mbi 1.x
and 2.x) with one more field, ``solve_info``: what ran and what it certified, as ``(key, value)``
pairs (``dict(model.solve_info)``; see :func:`cvxdp.synth.estimate`).  It is

* a registered jax pytree (its leaves are those of ``potentials``, ``marginals``, ``total`` and,
  with mbi 2.x, ``constraints``; ``solve_info`` is static data), so ``jax.jit(f)(model)``,
  ``jax.tree.map`` and mbi 2.x's ``mbi.save`` / ``mbi.load`` work on it;
* picklable (nothing but its fields is stored on an instance; caches are kept beside it);
* the same distribution as mbi's own class with the same fields: ``project`` answers exactly
  what ``mbi.MarkovRandomField.project`` answers (the stored marginals when they cover the
  attributes, otherwise the marginal of ``p ∝ exp(sum of potentials)`` scaled to ``total``, with
  mbi 2.x's structural constraints folded in as zeros), computed with cvxdp's numpy
  junction-tree inference (:mod:`cvxdp.solvers.marginal.inference`) instead of a JAX kernel
  compiled per attribute set.  Under ``jax.jit`` (traced fields) it answers through mbi.
"""
from __future__ import annotations

import dataclasses
import math
import weakref
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import mbi
import numpy as np

from ..solvers.marginal.inference import GraphicalModel as _Inference
from ..solvers.marginal.junction_tree import JunctionTree

__all__ = ["CvxdpMarkovRandomField", "markov_random_field"]

_HAS_CONSTRAINTS = any(f.name == "constraints" for f in dataclasses.fields(mbi.MarkovRandomField))


@dataclasses.dataclass(frozen=True)
class CvxdpMarkovRandomField(mbi.MarkovRandomField):
    """``mbi.MarkovRandomField`` whose ``project`` runs cvxdp's numpy inference (module docstring).

    ``solve_info``: ``(key, value)`` pairs describing the estimate (``dict(model.solve_info)``).
    """

    solve_info: tuple = ()

    def project(self, attrs):
        attrs = (attrs,) if isinstance(attrs, (str, int)) else tuple(attrs)
        if self.marginals.supports(attrs) and not _traced(self):
            return self.marginals.project(attrs)
        inference = _inference(self)
        if inference is None:                 # traced under jax.jit: mbi's own elimination
            return _traced_project(self, attrs)
        dom = self.domain.project(attrs)
        if not attrs:
            values = np.asarray(float(self.total))
        else:
            names = list(self.domain.attributes)
            values = inference.marginal([names.index(a) for a in attrs])
        return mbi.Factor(dom, jnp.asarray(np.asarray(values, dtype=float).reshape(dom.shape)))

    def synthetic_data(self, rows: int | None = None, method: str = "round"):
        """mbi's ``synthetic_data``, with every structural constraint inside a clique of the
        junction tree it samples along: mbi builds that tree from the model's cliques only,
        so a constraint on attributes no clique holds together would not be sampled (mbi
        2.0.0's own models draw such records); here the constraint's attribute set is added
        as a clique with zero potential (the same distribution)."""
        cons = tuple(getattr(self, "constraints", ()) or ())
        extra = []
        for c in cons:
            attrs = tuple(c.domain.attributes)
            if not any(set(attrs) <= set(k) for k in list(self.cliques) + extra):
                extra.append(attrs)
        if not extra:
            return super().synthetic_data(rows, method)
        dom = self.domain
        cliques = list(self.cliques) + extra
        tables = {k: self.potentials[k] for k in self.cliques}
        tables.update({e: mbi.Factor.zeros(dom.project(e)) for e in extra})
        full = mbi.MarkovRandomField(potentials=mbi.CliqueVector(dom, cliques, tables),
                                     marginals=self.marginals, total=self.total, constraints=cons)
        return full.synthetic_data(rows, method)


def _traced_project(model, attrs: tuple):
    """``project`` with traced fields: mbi's variable elimination (its ``project`` turns the
    total into a Python float, which a traced total is not), constraints folded in."""
    from mbi import marginal_oracles
    if model.marginals.supports(attrs):
        return model.marginals.project(attrs)
    kw = {"constraints": tuple(model.constraints)} if getattr(model, "constraints", ()) else {}
    return marginal_oracles.variable_elimination(model.potentials, attrs, model.total, **kw)


# ------------------------------------------------------------------ jax pytree and pickling
_FIELDS = tuple(f.name for f in dataclasses.fields(CvxdpMarkovRandomField) if f.name != "solve_info")


def _flatten_with_keys(model):
    children = tuple((jax.tree_util.GetAttrKey(n), getattr(model, n)) for n in _FIELDS)
    return children, model.solve_info


def _flatten(model):
    return tuple(getattr(model, n) for n in _FIELDS), model.solve_info


def _unflatten(solve_info, children):
    out = object.__new__(CvxdpMarkovRandomField)
    for n, v in zip(_FIELDS, children):
        object.__setattr__(out, n, v)
    object.__setattr__(out, "solve_info", solve_info)
    return out


jax.tree_util.register_pytree_with_keys(CvxdpMarkovRandomField, _flatten_with_keys, _unflatten,
                                        _flatten)


# ------------------------------------------------------------------ the inference, cached
# one calibrated junction tree per live model, kept beside it (not in its __dict__, which is
# what pickling stores); dropped with the model
_CACHE: dict[int, Any] = {}


def _traced(model) -> bool:
    return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(model))


def _inference(model) -> _Inference | None:
    """The calibrated junction tree of ``p ∝ exp(sum potentials) * constraints`` scaled to the
    total (``None`` when the fields are traced)."""
    key = id(model)
    hit = _CACHE.get(key)
    if hit is not None and hit[0]() is model:
        return hit[1]
    if _traced(model):
        return None
    out = _build_inference(model)
    _CACHE[key] = (weakref.ref(model), out)
    weakref.finalize(model, _CACHE.pop, key, None)
    return out


def _build_inference(model) -> _Inference:
    dom = model.domain
    names = list(dom.attributes)
    sizes = [int(dom.config[a]) for a in names]
    factors, logs = [], []
    for cl in model.potentials.cliques:
        f = model.potentials[cl]
        factors.append(tuple(names.index(a) for a in f.domain.attributes))
        logs.append(np.asarray(f.values, dtype=float))
    for c in getattr(model, "constraints", ()) or ():
        pot = c.potential                      # 0 where allowed, -inf where forbidden
        factors.append(tuple(names.index(a) for a in pot.domain.attributes))
        logs.append(np.asarray(pot.values, dtype=float))
    factors, logs = _merge_repeats(factors, logs)
    tree = JunctionTree(sizes, factors)
    beliefs, log_z = tree.calibrate(tree.clique_potentials(logs), overwrite=True)
    total = float(model.total)
    if not (math.isfinite(log_z) and total > 0):
        tables = [np.zeros(s) for s in tree.shapes]
        return _Zero(tree, tables)
    tables = [total * np.exp(b - log_z) for b in beliefs]
    return _Inference.from_clique_tables(tree, tables, total)


def _merge_repeats(factors: list[tuple], logs: list[np.ndarray]):
    """One factor per attribute set (the junction tree takes distinct factors): repeats are
    added, transposed to the first one's attribute order."""
    out_f: list[tuple] = []
    out_l: list[np.ndarray] = []
    where: dict[frozenset, int] = {}
    for f, t in zip(factors, logs):
        k = where.get(frozenset(f))
        if k is None:
            where[frozenset(f)] = len(out_f)
            out_f.append(f)
            out_l.append(np.array(t, dtype=float))
        else:
            out_l[k] = out_l[k] + np.transpose(t, [f.index(a) for a in out_f[k]])
    return out_f, out_l


class _Zero:
    """The inference of the zero table (total 0, or every cell forbidden): zeros."""

    def __init__(self, tree: JunctionTree, tables) -> None:
        self.sizes = tree.sizes

    def marginal(self, attrs: Sequence[int]) -> np.ndarray:
        return np.zeros(tuple(self.sizes[a] for a in attrs))


# ------------------------------------------------------------------ building a model
def _junction_edges(cliques: list[tuple]) -> list[tuple[int, int]]:
    """``(child, parent)`` pairs of a maximum-weight spanning forest (weight: shared attributes),
    a junction tree when the cliques are those of a triangulated graph; each child appears once."""
    k = len(cliques)
    parent_of = list(range(k))

    def find(i):
        while parent_of[i] != i:
            parent_of[i] = parent_of[parent_of[i]]
            i = parent_of[i]
        return i

    cand = sorted(((len(set(cliques[i]) & set(cliques[j])), i, j)
                   for i in range(k) for j in range(i + 1, k)), key=lambda t: -t[0])
    adj: dict[int, list[int]] = {i: [] for i in range(k)}
    for w, i, j in cand:
        if w == 0:
            break
        ri, rj = find(i), find(j)
        if ri != rj:
            parent_of[ri] = rj
            adj[i].append(j)
            adj[j].append(i)
    edges, seen = [], set()
    for root in range(k):                 # orient every component away from its first clique
        if root in seen:
            continue
        seen.add(root)
        stack = [root]
        while stack:
            i = stack.pop()
            for j in adj[i]:
                if j not in seen:
                    seen.add(j)
                    edges.append((j, i))
                    stack.append(j)
    return edges


def _sum_to(table: np.ndarray, clique: tuple, keep: tuple) -> np.ndarray:
    axes = tuple(i for i, a in enumerate(clique) if a not in keep)
    m = table.sum(axis=axes) if axes else table
    rest = [a for a in clique if a in keep]
    return np.transpose(m, [rest.index(a) for a in keep])


def markov_random_field(mdomain, cliques: list[tuple], tables: list[np.ndarray], total: float, *,
                        constraints: Sequence = (), potentials: list[np.ndarray] | None = None,
                        info: dict | None = None, floor: float = 1e-300) -> CvxdpMarkovRandomField:
    """The model of the junction-tree distribution ``prod_K mu_K / prod_S mu_S`` of consistent
    clique ``tables`` (over ``cliques``, a junction tree's), scaled to ``total``: marginals the
    tables, log-potentials ``log mu_K - log mu_S`` (each separator subtracted once, from the
    clique below it; empty cells at ``log floor``).  ``potentials``: log-potentials to use
    instead (over the same cliques).  ``constraints``: mbi 2.x structural constraints stored on
    the model (folded in by ``project`` and by mbi's ``synthetic_data``)."""
    scale = total if total > 0 else 1.0
    if potentials is None:
        logs = [np.log(np.maximum(t / scale, floor)) for t in tables]
        for child, parent in _junction_edges(cliques):
            c = cliques[child]
            sep = tuple(a for a in c if a in cliques[parent])
            ls = np.log(np.maximum(_sum_to(tables[child], c, sep) / scale, floor))
            # sep keeps the child's attribute order: broadcast over the child's other axes
            other = tuple(i for i, a in enumerate(c) if a not in sep)
            logs[child] = logs[child] - np.expand_dims(ls, other)
    else:
        logs = potentials
    pot = {c: mbi.Factor(mdomain.project(c), jnp.asarray(t)) for c, t in zip(cliques, logs)}
    mar = {c: mbi.Factor(mdomain.project(c), jnp.asarray(np.asarray(t, dtype=float)))
           for c, t in zip(cliques, tables)}
    kw = {"constraints": tuple(constraints)} if _HAS_CONSTRAINTS else {}
    if constraints and not _HAS_CONSTRAINTS:
        raise ValueError("structural constraints need mbi>=2 (mbi.MarkovRandomField.constraints)")
    return CvxdpMarkovRandomField(potentials=mbi.CliqueVector(mdomain, list(cliques), pot),
                                  marginals=mbi.CliqueVector(mdomain, list(cliques), mar),
                                  total=float(total), solve_info=_freeze(info or {}), **kw)


def _freeze(info: dict) -> tuple:
    """``info`` as hashable ``(key, value)`` pairs (static pytree data must hash and compare)."""
    out = []
    for k, v in info.items():
        if isinstance(v, float) and math.isnan(v):
            v = None
        elif isinstance(v, (np.floating, np.integer)):
            v = v.item()
        elif isinstance(v, (list, dict)):
            v = repr(v)
        out.append((str(k), v))
    return tuple(out)

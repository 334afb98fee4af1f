"""The noisy data of a solved cvxpy model: where it is, what noise it carries, what it fits.

A model built with :func:`cvxdp.nll` / :func:`cvxdp.elastic_net` holds each measurement's
answers as a cvxpy ``Constant`` that remembers its :class:`~cvxdp.Measurement`
(:func:`cvxdp.modelling.losses.noisy_answers`); a plain spelling (``cp.norm1(A @ x - y)``)
names its noisy data in ``noise=``.  Each *source* (one measurement, one noisy array) may
appear in several leaves of the expression tree; all of them take the same re-drawn value.

The fitted answers of a source, the expected data under the estimate, are read off the
residual the source appears in: for ``r = ... + s * y`` (``s = +1`` for ``y - Q x``,
``s = -1`` for ``Q x - y``) the answers that would make ``r`` zero are ``y - s r``.  The
parametric bootstrap draws ``fitted + noise`` (Efron and Tibshirani 1993, ch. 6).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import cvxpy as cp
import numpy as np
from cvxpy.atoms.affine.add_expr import AddExpression
from cvxpy.atoms.affine.unary_operators import NegExpression

from ..modelling.losses import NOISE_TAG
from ..modelling.measurement import NOISE_FAMILIES, Measurement

__all__ = ["NoiseSource", "find_noise", "substitute"]


@dataclass
class NoiseSource:
    """One noisy array of the model: its leaves, noise family, per-entry scale (the leaves'
    shape) and the fitted answers under the current solution."""

    name: str
    leaves: list
    family: str
    scale: np.ndarray
    fitted: np.ndarray | None = None
    _fits: list = field(default_factory=list, repr=False)

    @property
    def shape(self) -> tuple:
        return self.leaves[0].shape

    @property
    def variance(self) -> np.ndarray:
        """Per-entry noise variance: ``2 b^2`` (Laplace) or ``sigma^2`` (Gaussian)."""
        return 2.0 * self.scale ** 2 if self.family == "laplace" else self.scale ** 2

    def draw(self, rng: np.random.Generator) -> np.ndarray:
        """``fitted + noise``, one fresh draw of the release under the estimate."""
        if self.family == "laplace":
            e = rng.laplace(0.0, 1.0, self.shape)
        else:
            e = rng.standard_normal(self.shape)
        return self.fitted + self.scale * e


def _spec(spec, shape: tuple, where: str) -> tuple[str, np.ndarray]:
    """``(family, scale broadcast to shape)`` from a Measurement or ``(family, scale)``."""
    if isinstance(spec, Measurement):
        if int(np.prod(shape)) != spec.queries.shape[0]:
            raise ValueError(f"noise[{where}]: the measurement has {spec.queries.shape[0]} "
                             f"answers, the model's data has shape {shape}")
        return spec.noise, spec.scales.reshape(shape) if shape else spec.scales.reshape(())
    if not (isinstance(spec, tuple) and len(spec) == 2):
        raise TypeError(f"noise[{where}] must be a cvxdp.Measurement or a (family, scale) pair, "
                        f"got {type(spec).__name__}")
    family, scale = spec
    if family not in NOISE_FAMILIES:
        raise ValueError(f"noise[{where}]: family must be one of {NOISE_FAMILIES}, got {family!r}")
    try:
        s = np.broadcast_to(np.asarray(scale, dtype=float), shape).copy()
    except (TypeError, ValueError):
        raise ValueError(f"noise[{where}]: scale must be a positive number or an array of "
                         f"shape {shape}, got {scale!r}") from None
    if not np.all(np.isfinite(s)) or np.any(s <= 0):
        raise ValueError(f"noise[{where}]: scale must be positive and finite")
    return family, s


def _walk(exprs):
    """Every node of the expression trees once (they are DAGs), with its parent nodes."""
    parents: dict[int, list] = {}
    nodes: dict[int, object] = {}
    stack = list(exprs)
    for e in exprs:
        parents.setdefault(id(e), [])
    while stack:
        e = stack.pop()
        if id(e) in nodes:
            continue
        nodes[id(e)] = e
        for a in e.args:
            parents.setdefault(id(a), []).append(e)
            stack.append(a)
    return nodes, parents


def _user_keys(noise) -> list:
    if noise is None:
        return []
    if isinstance(noise, dict):
        return list(noise.items())
    try:
        pairs = [tuple(p) for p in noise]
    except TypeError:
        raise TypeError("noise must be a dict {Parameter or Constant: spec} or a list of "
                        "(data, spec) pairs") from None
    for i, p in enumerate(pairs):
        if len(p) != 2:
            raise ValueError(f"noise[{i}] must be a (data, spec) pair, got {len(p)} items")
    return pairs


def find_noise(prob: cp.Problem, noise=None) -> list[NoiseSource]:
    """The noise sources of ``prob``: tagged measurement answers, and the user's ``noise``
    (``{Parameter or Constant: spec}`` or ``[(data, spec), ...]`` with ``data`` a
    Parameter, a Constant or the numpy array the model was built from; ``spec`` a
    :class:`~cvxdp.Measurement` or ``(family, scale)``).  ``ValueError`` if the user names
    data the model does not hold, or if there is none at all."""
    roots = [prob.objective.expr] + [c for c in prob.constraints]
    nodes, _ = _walk(roots)
    leaves = [e for e in nodes.values() if not e.args and not isinstance(e, cp.Variable)]
    sources: dict[int, NoiseSource] = {}
    for leaf in leaves:
        m = getattr(leaf, NOISE_TAG, None)
        if isinstance(m, Measurement):
            src = sources.get(id(m))
            if src is None:
                fam, sc = _spec(m, leaf.shape, repr(m))
                src = sources[id(m)] = NoiseSource(f"measurement {len(sources)}", [], fam, sc)
            src.leaves.append(leaf)
    for i, (key, spec) in enumerate(_user_keys(noise)):
        matched = _match(key, leaves)
        if not matched:
            raise ValueError(f"noise[{i}]: the model holds no {_describe(key)}")
        fam, sc = _spec(spec, matched[0].shape, str(i))
        src = NoiseSource(f"noise[{i}]", [], fam, sc)
        for leaf in matched:
            for s in sources.values():
                if any(lf is leaf for lf in s.leaves):
                    s.leaves.remove(leaf)
            src.leaves.append(leaf)
        sources[-1 - i] = src
    out = [s for s in sources.values() if s.leaves]
    if not out:
        raise ValueError("the model holds no noisy data cvxdp knows of: build its losses with "
                         "cvxdp.nll / cvxdp.elastic_net from cvxdp.Measurement objects, or name "
                         "the noisy data and its noise with noise={y: ('laplace', b)}")
    for s in out:
        if len({lf.shape for lf in s.leaves}) != 1:
            raise ValueError(f"{s.name}: its data appears with different shapes")
    return out


def _match(key, leaves) -> list:
    if isinstance(key, (cp.Parameter, cp.Constant)):
        return [lf for lf in leaves if lf is key]
    if isinstance(key, cp.Expression):
        raise TypeError("noise keys must be the noisy data (a Parameter, a Constant or an "
                        f"array), got the expression {key}")
    try:
        arr = np.asarray(key, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"noise: a key must be the model's noisy data (a Parameter, a Constant "
                         f"or a numeric array), got {key!r}") from None
    out = []
    for lf in leaves:
        if isinstance(lf, cp.Constant) and lf.shape == arr.shape:
            v = lf.value
            v = v.toarray() if hasattr(v, "toarray") else np.asarray(v)
            if np.array_equal(v, arr):
                out.append(lf)
    return out


def _describe(key) -> str:
    if isinstance(key, cp.Parameter):
        return f"Parameter {key.name()}"
    if isinstance(key, cp.Constant):
        return "such Constant"
    return f"constant equal to the given array of shape {np.shape(key)}"


def fit_sources(prob: cp.Problem, sources: list[NoiseSource]) -> None:
    """Set each source's ``fitted`` answers from the residuals it appears in (module
    docstring); the variables must hold the solution.  ``ValueError`` if a source appears
    in the objective in no residual ``Q x - y`` (or ``y - Q x``) or its residuals disagree."""
    nodes, parents = _walk([prob.objective.expr])
    for src in sources:
        fits = []
        for leaf in src.leaves:
            for par in parents.get(id(leaf), []):
                sign, add = 1.0, par
                if isinstance(par, NegExpression):
                    sign = -1.0
                    ups = [p for p in parents.get(id(par), []) if isinstance(p, AddExpression)]
                    add = ups[0] if ups else None
                if not isinstance(add, AddExpression) or add.shape != leaf.shape:
                    continue
                r = add.value
                if r is None:
                    raise ValueError("error_bars: solve the problem first (its variables have "
                                     "no value)")
                fits.append(np.asarray(leaf.value, dtype=float) - sign * np.asarray(r, float))
        if not fits:
            raise ValueError(f"error_bars: {src.name} does not appear in the objective as a "
                             "residual Q @ x - y (or y - Q @ x): its fitted answers are unknown")
        f0 = fits[0]
        for f in fits[1:]:
            if not np.allclose(f, f0, rtol=1e-9, atol=1e-9 * max(1.0, float(np.abs(f0).max()))):
                raise ValueError(f"error_bars: {src.name} appears in residuals that fit it "
                                 "differently")
        src.fitted = f0


def substitute(prob: cp.Problem, mapping: dict[int, cp.Expression],
               extra: list | None = None) -> tuple[cp.Problem, dict[int, int]]:
    """A copy of ``prob`` with each leaf whose ``id`` is in ``mapping`` replaced (unchanged
    subtrees are shared, not copied) and ``extra`` constraints appended; also the map from
    the new constraints' ids to the original constraints' ids."""
    memo: dict[int, object] = {}

    def sub(e):
        hit = memo.get(id(e))
        if hit is not None:
            return hit
        if id(e) in mapping:
            out = mapping[id(e)]
        elif not e.args:
            out = e
        else:
            args = [sub(a) for a in e.args]
            out = e if all(a is b for a, b in zip(args, e.args)) else e.copy(args)
        memo[id(e)] = out
        return out

    obj = prob.objective
    new_obj = type(obj)(sub(obj.expr))
    cons, ids = [], {}
    for c in prob.constraints:
        nc = sub(c)
        cons.append(nc)
        ids[nc.id] = c.id
    return cp.Problem(new_obj, cons + list(extra or [])), ids

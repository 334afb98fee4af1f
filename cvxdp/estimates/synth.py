"""cvxdp as the estimator inside mbi-based synthesizers (AIM, MST, ...): ``pip install cvxdp[mbi]``.

The synthesizers built on mbi (Private-PGM) -- OpenDP's ``opendp.extras.mbi`` AIM, MST, Fixed
and Sequential, and scripts written against ``mbi.estimation`` -- alternate private measurements
with an *estimation* step: given noisy linear measurements of marginals, find the distribution
that explains them best.  :func:`estimate` does that step with cvxdp's solvers and hands back
mbi's own model type, so a synthesizer runs on cvxdp's method without a change on its side.

The problem solved
------------------
Each mbi ``LinearMeasurement`` ``i`` carries a clique ``S_i`` (attribute names), noisy answers
``y_i``, a noise standard deviation ``sigma_i`` and a linear ``query`` ``Q_i`` on the flattened
(C order) marginal ``mu_{S_i}``.  The estimate is

    minimise    sum_i  || Q_i mu_{S_i} - y_i ||_2^2 / (2 sigma_i^2)        (norm="l2", Gaussian)
                [or    sum_i  || Q_i mu_{S_i} - y_i ||_1 / sigma_i          (norm="l1", Laplace)]
    over        the marginals mu_C of the maximal measured cliques C, with
                mu_C = marginal on C of one table p >= 0 with sum(p) = N,

the marginal polytope (:class:`cvxdp.MarginalPolytope`; ``mu_{S_i}`` is the sum of its home
clique's marginal over the attributes outside ``S_i``).  ``N`` is the ``known_total`` when one is
given, and otherwise *free*: optimised with the marginals (the maximum-likelihood total), where
mbi's own estimators fix ``N`` beforehand to the inverse-variance average of the identity
measurements' sums.  With the total free the optimum is therefore never worse than mbi's for the
same loss.  When the junction tree of the cliques is too large (:class:`cvxdp.ModelTooLarge`),
the estimate is taken over the local polytope instead (``cvxdp.LocalPolytope``, pairwise
consistent marginals, when this cvxdp version has it).  The loss is mbi's
``marginal_loss.from_linear_measurements`` loss (norm ``"l2"`` or ``"l1"``, not normalised), so
the two objective values compare directly.

The model returned
------------------
An ``mbi.MarkovRandomField`` built from the solution.  Over the marginal polytope cvxdp leaves a
:class:`cvxdp.GraphicalModel` on the constraint; its junction-tree clique tables ``mu_K`` define
the distribution ``p = prod_K mu_K / prod_S mu_S`` (``S`` the separators of a junction tree),
which is the maximum-entropy distribution with the fitted marginals.  The returned model has
these tables as ``marginals`` and log-potentials ``theta_K = log mu_K - log mu_S`` (each
separator subtracted once, from the clique that hangs below it; empty cells get a log floor of
``log 1e-300`` instead of ``-inf`` so mbi's message passing never meets ``inf - inf``), scaled to
the fitted ``total``.  Its ``cliques`` are therefore the junction tree's cliques, which equal the
maximal measured cliques when those form a chordal graph (trees: MST; and in practice most AIM
workloads); otherwise they include the triangulation's fill-in, so AIM's model-size filter
(``hypothetical_model_size(model.cliques + [candidate])``) can only be more conservative.  Over the
local polytope the model is ``constraint.model()``, a graphical model fitted to the consistent
marginals, converted the same way.  The model is an instance of a subclass of
``mbi.MarkovRandomField`` whose ``project`` answers from cvxdp's own numpy inference on the same
distribution (mbi compiles a JAX kernel per attribute set, which dominated AIM's selection
step); a copy made with ``dataclasses.replace`` answers through mbi again, with the same numbers.

Plugging it in
--------------
* OpenDP (``opendp.extras.mbi``, checked on opendp 0.16.0): every algorithm dataclass (``AIM``,
  ``MST``, ``Fixed``, ``Sequential``) has the field ``estimator: Callable = mirror_descent`` with
  the contract ``estimator(domain, measurements, *, potentials=None) -> mbi.MarkovRandomField``
  (``opendp/extras/mbi/_utilities/__init__.py``).  That is the hook::

      algorithm = dp.mbi.AIM(estimator=cvxdp.synth.estimator(eps_rel=1e-6))
      # or, for an existing configuration:
      algorithm = cvxdp.synth.with_cvxdp(dp.mbi.MST())

  OpenDP also passes ``potentials`` (the previous model's, a warm start for mirror descent):
  accepted and not used.  Its measurements include a zero-way total (clique ``()``) and prefix
  queries on one-way marginals; both are handled (any linear ``query`` is, see below).
* mbi 1.x (``mbi.estimation.mirror_descent(domain, loss_fn, *, known_total=None,
  potentials=None, marginal_oracle=..., iters=1000, stateful=False, stepsize=None,
  callback_fn=..., mesh=None) -> MarkovRandomField``; ``mbi.Estimator`` is the ``Protocol``
  ``(domain, loss_fn, *, known_total=None, **kwargs) -> Projectable``): :func:`estimate` has that
  signature; mirror-descent-only keywords (``iters``, ``callback_fn``, ``marginal_oracle``,
  ``stepsize``, ``stateful``, ``mesh``) are accepted and ignored -- cvxdp stops on its own
  certified gap ``eps_rel``, not an iteration count.  opendp 0.16.0 pins ``mbi==1.1.0``.
* mbi 2.x: ``mbi.Estimator`` is an abstract dataclass whose method
  ``estimate(domain, loss_fn, known_total=None, constraints=(), iters=1000, callback_fn=None,
  warm_start=None, tol=None, patience=2) -> Model`` is what callers use (``mbi/estimation.py``).
  ``cvxdp.synth.CvxdpEstimator(**options)`` is such an Estimator (the class is made on first
  access, only where mbi 2 is installed); :func:`estimate` also accepts ``warm_start`` and an
  empty ``constraints``.
* The AIM and MST scripts of the Private-PGM repository (``mechanisms/aim.py``,
  ``mechanisms/mst.py``; not part of the ``mbi`` package) call ``mbi.estimation.mirror_descent``
  directly and take no estimator argument: there is no hook.  The least intrusive change is one
  line in the script (``estimation.mirror_descent`` -> ``cvxdp.synth.estimate``), whose keywords
  (``iters=``, ``potentials=``, ``callback_fn=``) :func:`estimate` accepts.

Queries
-------
A measurement's ``query`` is any linear map of the clique's ``Factor`` to a vector (mbi's default
``Factor.datavector`` -- the identity --, mbi 2's ``DatavectorQuery``, ``SlicedQuery``,
``WeightedQuery``, OpenDP's prefix query, a user's function).  The identity is recognised; any
other query's matrix is read off by differentiating it with jax (``jax.jacfwd``), which also
checks that it is linear (no offset).  Measurements must be given as a list (a ``MarginalLossFn``
is a jax function cvxdp cannot read).

Nothing here is imported by ``import cvxdp``: mbi and jax are imported when :func:`estimate` runs
(a missing package raises ``ImportError`` naming ``pip install cvxdp[mbi]``).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from typing import Any, Callable, Sequence

import numpy as np
import scipy.sparse as sp
import cvxpy as cp

from ..names import ADMM, MIRROR_DESCENT
from ..modelling.domain import Domain
from ..modelling.local_polytope import LocalPolytope
from ..modelling.marginal_polytope import MarginalPolytope, ModelTooLarge

# CvxdpEstimator: made on first use by the module __getattr__ (it needs the optional mbi)
__all__ = ["estimate", "estimator", "with_cvxdp", "CvxdpEstimator", "LOG_FLOOR"]  # noqa: F822

#: empty cells get this probability (not 0) in the log-potentials of the returned model
LOG_FLOOR = 1e-300

_INSTALL = "cvxdp.synth needs mbi (and jax); install them with: pip install 'cvxdp[mbi]'"

# keywords of mbi's estimators that configure its own first-order methods: accepted so that
# cvxdp.synth.estimate is a drop-in replacement, and not used (cvxdp stops on its certified gap)
_MBI_ONLY = frozenset({"iters", "callback_fn", "marginal_oracle", "stepsize", "stateful", "mesh",
                       "tol", "patience"})


def _mbi():
    """The mbi package, or an ImportError telling how to get it."""
    try:
        import mbi  # noqa: F401
        import jax  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"{_INSTALL} ({exc})") from exc
    return mbi


def estimate(domain, loss_fn, *, known_total: float | None = None, potentials=None,
             warm_start=None, constraints: Sequence = (), solver: str | None = None,
             norm: str = "l2", eps_rel: float | None = None, eps_abs: float | None = None,
             max_iters: int | None = None, time_limit: float | None = None,
             polytope: str = "auto", max_cells: int | None = None, verbose: bool = False,
             solve_options: dict | None = None, **mbi_options: Any):
    """Fit an ``mbi.MarkovRandomField`` to mbi measurements with a cvxdp solver.

    Parameters
    ----------
    domain : ``mbi.Domain``.
    loss_fn : list of ``mbi.LinearMeasurement``.
    known_total : the number of records if known; ``None`` (default): the total is free,
        estimated jointly with the marginals.
    potentials, warm_start : a previous model's potentials (mbi 1.x / OpenDP) or model (mbi 2.x):
        accepted for the signature, not used.
    constraints : mbi 2.x structural constraints; only the empty sequence is supported.
    solver : a cvxdp method (``cvxdp.MIRROR_DESCENT`` for the marginal polytope,
        ``cvxdp.ADMM`` for the local polytope), ``None`` (that method for the polytope used:
        the returned model is built from its result, so ``solver=None``'s cost model, which
        may hand small problems to Clarabel, is not consulted), or a cvxpy solver name
        (``cp.CLARABEL`` solves the junction tree's local polytope; it leaves only the
        marginals, and the model is then fitted to them: ``MarginalPolytope.model``).
    norm : ``"l2"`` (Gaussian measurements, mbi's default) or ``"l1"`` (Laplace).
    eps_rel, eps_abs, max_iters, time_limit : cvxdp's stopping rules (``None``: the method's
        defaults; ``eps_rel`` is the certified relative optimality gap).
    polytope : ``"auto"`` (marginal polytope, the local polytope when the junction tree is too
        large), ``"marginal"`` or ``"local"``.
    max_cells : largest junction-tree clique accepted before falling back (default cvxdp's).
    solve_options : further keyword arguments for ``Problem.solve``.
    mbi_options : mbi's mirror-descent keywords (``iters``, ``callback_fn``, ...), ignored.

    Returns the ``mbi.MarkovRandomField`` of the estimate (see the module docstring).
    """
    _mbi()
    unknown = sorted(set(mbi_options) - _MBI_ONLY)
    if unknown:
        raise TypeError(f"estimate: unexpected keyword argument(s) {unknown}")
    if constraints:
        raise NotImplementedError("cvxdp.synth.estimate: mbi structural constraints are not "
                                  "supported")
    if norm not in ("l2", "l1"):
        raise ValueError(f"estimate: norm must be 'l2' or 'l1', got {norm!r}")
    if polytope not in ("auto", "marginal", "local"):
        raise ValueError(f"estimate: polytope must be 'auto', 'marginal' or 'local', got {polytope!r}")
    fit = _Fit(domain, loss_fn, known_total, norm)
    constraint, kind = fit.constraint(polytope, max_cells)
    prob = cp.Problem(cp.Minimize(fit.objective()), [constraint])
    opts = dict(solve_options or {})
    for key, val in (("eps_rel", eps_rel), ("eps_abs", eps_abs), ("max_iters", max_iters),
                     ("time_limit", time_limit)):
        if val is not None:
            opts[key] = val
    if solver is None:
        solver = MIRROR_DESCENT if kind == "marginal" else ADMM
    prob.solve(method="cvxdp", solver=solver, verbose=verbose, **opts)
    if any(v.value is None for v in fit.variables.values()):
        raise RuntimeError(f"cvxdp.synth.estimate: the solve returned no solution "
                           f"(status {prob.status})")
    if prob.status not in ("optimal",):
        warnings.warn(f"cvxdp.synth.estimate: solver status {prob.status}", RuntimeWarning,
                      stacklevel=2)
    return fit.model(constraint, kind)


def estimator(**options: Any) -> Callable:
    """``estimate`` with its options fixed: ``estimator(domain, loss_fn, *, known_total=None,
    potentials=None, ...)``, the form OpenDP's ``Algorithm.estimator`` takes."""
    bad = {"domain", "loss_fn"} & set(options)
    if bad:
        raise TypeError(f"estimator: {sorted(bad)} are the estimator's arguments, not options")
    out = functools.partial(estimate, **options)
    functools.update_wrapper(out, estimate)
    return out


def with_cvxdp(algorithm, **options: Any):
    """A copy of an OpenDP ``opendp.extras.mbi`` algorithm (``AIM(...)``, ``MST(...)``,
    ``Fixed(...)``, ``Sequential(...)``) whose estimator is cvxdp's (``estimator(**options)``)."""
    if not dataclasses.is_dataclass(algorithm) or not any(
            f.name == "estimator" for f in dataclasses.fields(algorithm)):
        raise TypeError(f"with_cvxdp: {type(algorithm).__name__} has no 'estimator' field "
                        f"(expected an opendp.extras.mbi algorithm such as AIM or MST)")
    return dataclasses.replace(algorithm, estimator=estimator(**options))


# ------------------------------------------------------------------------------ the problem
class _Fit:
    """mbi measurements -> cvxpy variables and loss over the maximal measured cliques."""

    def __init__(self, domain, measurements, known_total, norm: str) -> None:
        mbi = _mbi()
        if not isinstance(measurements, (list, tuple)):
            raise TypeError("cvxdp.synth.estimate: loss_fn must be a list of mbi.LinearMeasurement "
                            f"(a {type(measurements).__name__} is a jax function cvxdp cannot read)")
        measurements = list(measurements)
        for i, m in enumerate(measurements):
            if not isinstance(m, mbi.LinearMeasurement):
                raise TypeError(f"cvxdp.synth.estimate: loss_fn[{i}] is a {type(m).__name__}, "
                                f"not an mbi.LinearMeasurement")
        self.mbi = mbi
        self.mdomain = domain
        self.attrs = tuple(domain.attributes)
        self.names = {a: str(a) for a in self.attrs}
        if len(set(self.names.values())) != len(self.attrs):
            raise ValueError(f"cvxdp.synth: attribute names {self.attrs} are not distinct as strings")
        self.domain = Domain([(self.names[a], int(domain.config[a])) for a in self.attrs])
        self.measurements = measurements
        self.norm = norm
        if known_total is not None:
            known_total = float(known_total)
            if not (math.isfinite(known_total) and known_total > 0):
                raise ValueError(f"cvxdp.synth.estimate: known_total must be positive, got {known_total}")
        self.total = known_total
        cliques = []
        for m in measurements:
            c = tuple(m.clique)
            unknown = [a for a in c if a not in self.names]
            if unknown:
                raise KeyError(f"cvxdp.synth: measurement on {c} names attribute(s) {unknown} "
                               f"outside the domain {self.attrs}")
            if c and c not in cliques:
                cliques.append(c)
        maximal = [c for c in cliques if not any(set(c) < set(d) for d in cliques)]
        # two orderings of one attribute set keep the first
        seen, self.cliques = set(), []
        for c in maximal:
            if frozenset(c) not in seen:
                seen.add(frozenset(c))
                self.cliques.append(c)
        if not self.cliques:                       # only totals measured
            self.cliques = [self.attrs[:1]]
        self.variables = {c: cp.Variable(self._size(c), name="mu_" + "_".join(self.names[a] for a in c))
                          for c in self.cliques}

    def _size(self, clique) -> int:
        return math.prod(int(self.mdomain.config[a]) for a in clique)

    def _home(self, clique) -> tuple:
        s = set(clique)
        return next(c for c in self.cliques if s <= set(c))

    def objective(self) -> cp.Expression:
        terms = []
        for m in self.measurements:
            clique = tuple(m.clique)
            home = self._home(clique)
            A = _marginalizer(home, clique, self.mdomain)
            Q = _query_matrix(self.mbi, m.query, self.mdomain.project(clique))
            if Q is not None:
                A = sp.csr_matrix(Q @ A)
            y = np.asarray(m.noisy_measurement, dtype=float).ravel()
            if y.size != A.shape[0]:
                raise ValueError(f"cvxdp.synth: a measurement on {clique} has {y.size} answers but "
                                 f"its query gives {A.shape[0]}")
            sigma = max(float(m.stddev), 1e-12)     # mbi's own guard for zero-noise invariants
            x = self.variables[home]
            if A.shape[0] == A.shape[1] and (A != sp.identity(A.shape[0], format="csr")).nnz == 0:
                r = x - y
            else:
                r = A @ x - y
            terms.append(cp.sum_squares(r) / (2.0 * sigma ** 2) if self.norm == "l2"
                         else cp.norm1(r) / sigma)
        out = terms[0]
        for t in terms[1:]:
            out = out + t
        return out

    def constraint(self, polytope: str, max_cells: int | None):
        marginals = {tuple(self.names[a] for a in c): v for c, v in self.variables.items()}
        kw = {} if max_cells is None else {"max_cells": int(max_cells)}
        if polytope in ("auto", "marginal"):
            try:
                return MarginalPolytope(marginals, self.domain, self.total, **kw), "marginal"
            except ModelTooLarge:
                if polytope == "marginal":
                    raise
        return LocalPolytope(marginals, self.domain, self.total), "local"

    # ---------------------------------------------------------------- back to mbi
    def model(self, constraint, kind: str):
        gm = constraint.model() if kind == "local" else constraint.model
        if gm is None:
            # the zero table (no distribution to model): the measured cliques' tables are the
            # model's when they already form a junction tree
            cliques = list(self.cliques)
            free = [a for a in self.attrs if not any(a in c for c in cliques)]
            jt = {frozenset(self.domain.names[i] for i in c) for c in constraint.tree.cliques} \
                if kind == "marginal" else None
            if jt != {frozenset(self.names[a] for a in c) for c in cliques + [(a,) for a in free]}:
                raise ValueError("cvxdp.synth: this solver leaves no graphical model for cliques "
                                 "that are not a junction tree; use solver=cvxdp.MIRROR_DESCENT")
            tables = [np.asarray(self.variables[c].value, dtype=float).reshape(
                tuple(int(self.mdomain.config[a]) for a in c)) for c in cliques]
            total = max(float(tables[0].sum()), 0.0)
            for a in free:                          # unmeasured: uniform, as cvxdp's model has it
                n = int(self.mdomain.config[a])
                cliques.append((a,))
                tables.append(np.full(n, total / n))
        else:
            total = float(gm.total)
            back = {v: k for k, v in self.names.items()}
            cliques = [tuple(back[n] for n in c) for c in gm.cliques]
            tables = [np.asarray(gm.marginal([self.names[a] for a in c]), dtype=float) for c in cliques]
        out = _markov_random_field(self.mbi, self.mdomain, cliques, tables, total)
        if gm is not None:
            names = self.names
            _attach_answers(out, lambda attrs: gm.marginal([names[a] for a in attrs]))
        return out


def _marginalizer(home: tuple, clique: tuple, mdomain) -> sp.csr_matrix:
    """The 0/1 matrix taking the flat (C order) marginal on ``home`` to the flat marginal on
    ``clique`` (a subset, in its own attribute order; ``()`` gives the total)."""
    shape = tuple(int(mdomain.config[a]) for a in home)
    n = math.prod(shape)
    coords = np.unravel_index(np.arange(n), shape)
    sub = tuple(int(mdomain.config[a]) for a in clique)
    rows = (np.ravel_multi_index(tuple(coords[home.index(a)] for a in clique), sub) if clique
            else np.zeros(n, dtype=np.int64))
    return sp.csr_matrix((np.ones(n), (rows, np.arange(n))), shape=(math.prod(sub), n))


def _is_identity(mbi, query) -> bool:
    if query is mbi.Factor.datavector or query == mbi.Factor.datavector:
        return True
    dq = getattr(mbi, "DatavectorQuery", None)        # mbi 2.x
    return dq is not None and isinstance(query, dq)


#: a non-identity query is read as a dense matrix up to this many entries
_MAX_QUERY_ENTRIES = 2 ** 24


def _query_matrix(mbi, query, subdomain) -> np.ndarray | None:
    """``None`` for the identity, else the matrix of the linear ``query`` on the flat marginal."""
    if _is_identity(mbi, query):
        return None
    import jax
    import jax.numpy as jnp
    shape = tuple(subdomain.shape)
    n = math.prod(shape)

    def f(v):
        return jnp.ravel(query(mbi.Factor(subdomain, jnp.reshape(v, shape))))

    zero = jnp.zeros(n)
    offset = np.asarray(f(zero), dtype=float)
    if offset.size * n > _MAX_QUERY_ENTRIES:
        raise ValueError(f"cvxdp.synth: a non-identity query on {tuple(subdomain.attributes)} would be a "
                         f"{offset.size} x {n} dense matrix")
    if np.any(offset != 0):
        raise ValueError(f"cvxdp.synth: the query on {tuple(subdomain.attributes)} is not linear "
                         f"(it maps zero to nonzero)")
    return np.asarray(jax.jacfwd(f)(zero), dtype=float).reshape(offset.size, n)


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


def _attach_answers(model, answer: Callable[[tuple], np.ndarray]) -> None:
    """Let ``model.project`` answer from cvxdp's graphical model (:func:`_model_class`).  The
    model is frozen (a chex dataclass); the answering function is kept beside its fields, so a
    copy made by ``dataclasses.replace`` simply answers through mbi again."""
    object.__setattr__(model, "_cvxdp_answer", answer)


_MODEL_CLASSES: dict = {}


def _model_class(mbi):
    """``CvxdpMarkovRandomField``: ``mbi.MarkovRandomField`` whose ``project`` computes the
    marginal with cvxdp's numpy junction-tree inference (``cvxdp.GraphicalModel.marginal``) --
    the same distribution, so the same numbers as mbi's variable elimination up to rounding --
    instead of compiling a JAX kernel per attribute set.  AIM scores every candidate marginal
    by ``model.project`` in every round; with mbi's kernels that was 77 s of a 123 s release
    (Adult, 6 attributes, 32 rounds), most of it JAX compilation."""
    cls = _MODEL_CLASSES.get(id(mbi.MarkovRandomField))
    if cls is not None:
        return cls

    class CvxdpMarkovRandomField(mbi.MarkovRandomField):
        def project(self, attrs):
            answer = getattr(self, "_cvxdp_answer", None)
            if answer is None:
                return super().project(attrs)
            attrs = (attrs,) if isinstance(attrs, str) else tuple(attrs)
            import jax.numpy as jnp
            # the zero-way marginal (OpenDP measures the total) is the model's total
            values = np.asarray(answer(attrs) if attrs else float(self.total), dtype=float)
            values = values.reshape(self.domain.project(attrs).shape)
            return mbi.Factor(self.domain.project(attrs), jnp.asarray(values))

    CvxdpMarkovRandomField.__module__ = __name__
    CvxdpMarkovRandomField.__qualname__ = "CvxdpMarkovRandomField"
    _MODEL_CLASSES[id(mbi.MarkovRandomField)] = CvxdpMarkovRandomField
    return CvxdpMarkovRandomField


def _markov_random_field(mbi, mdomain, cliques: list[tuple], tables: list[np.ndarray], total: float):
    """mbi's model of the junction-tree distribution ``prod_K mu_K / prod_S mu_S``."""
    import jax.numpy as jnp
    scale = total if total > 0 else 1.0
    logs = [np.log(np.maximum(t / scale, LOG_FLOOR)) for t in tables]
    for child, parent in _junction_edges(cliques):
        c = cliques[child]
        sep = tuple(a for a in c if a in cliques[parent])
        ms = _sum_to(tables[child], c, sep)
        ls = np.log(np.maximum(ms / scale, LOG_FLOOR))
        # sep keeps the child's attribute order: broadcast over the child's other axes
        other = tuple(i for i, a in enumerate(c) if a not in sep)
        logs[child] = logs[child] - np.expand_dims(ls, other)
    pot = {c: mbi.Factor(mdomain.project(c), jnp.asarray(t)) for c, t in zip(cliques, logs)}
    mar = {c: mbi.Factor(mdomain.project(c), jnp.asarray(np.asarray(t, dtype=float)))
           for c, t in zip(cliques, tables)}
    return _model_class(mbi)(potentials=mbi.CliqueVector(mdomain, list(cliques), pot),
                                 marginals=mbi.CliqueVector(mdomain, list(cliques), mar),
                                 total=float(total))


# ------------------------------------------------------------------------------ mbi 2.x class
_CLASS = None


def _estimator_class():
    """``CvxdpEstimator``: a subclass of mbi 2.x's abstract ``mbi.Estimator`` running
    :func:`estimate` (made once, on first access)."""
    global _CLASS
    if _CLASS is not None:
        return _CLASS
    mbi = _mbi()
    base = getattr(mbi, "Estimator", None)
    if base is None or not isinstance(base, type) or not hasattr(base, "estimate"):
        raise ImportError("cvxdp.synth.CvxdpEstimator needs mbi>=2 (mbi.Estimator with an "
                          "estimate method); with mbi 1.x pass cvxdp.synth.estimate itself")

    class CvxdpEstimator(base):
        """mbi 2.x Estimator solving with cvxdp; ``options`` are :func:`estimate`'s keywords."""

        def __init__(self, **options):
            object.__setattr__(self, "marginal_oracle", None)
            object.__setattr__(self, "options", dict(options))

        def estimate(self, domain, loss_fn, known_total=None, constraints=(), iters=1000,
                     callback_fn=None, warm_start=None, tol=None, patience=2):
            return estimate(domain, loss_fn, known_total=known_total, constraints=constraints,
                            warm_start=warm_start, **self.options)

        def _init(self, *args, **kwargs):        # cvxdp solves in one call: no stepping API
            raise NotImplementedError("CvxdpEstimator solves in estimate(); it has no steps")

        _step = _finalize = _init

        def __eq__(self, other):
            return type(other) is type(self) and other.options == self.options

        def __hash__(self):
            return hash(type(self))

        def __repr__(self):
            opts = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
            return f"CvxdpEstimator({opts})"

        def precompile(self, *args, **kwargs):
            import concurrent.futures
            fut: concurrent.futures.Future = concurrent.futures.Future()
            fut.set_result(None)                 # nothing is compiled
            return fut

    CvxdpEstimator.__module__ = __name__
    CvxdpEstimator.__qualname__ = "CvxdpEstimator"
    _CLASS = CvxdpEstimator
    return _CLASS


def __getattr__(name: str):
    if name == "CvxdpEstimator":
        return _estimator_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

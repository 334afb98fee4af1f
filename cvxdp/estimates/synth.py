"""cvxdp as the estimator inside mbi-based synthesizers (AIM, MST, ...): ``pip install cvxdp[mbi]``.

The synthesizers built on mbi (Private-PGM) -- OpenDP's ``opendp.extras.mbi`` AIM, MST, Fixed
and Sequential, and scripts written against ``mbi.estimation`` -- alternate private measurements
with an *estimation* step: given noisy linear measurements of marginals, find the distribution
that explains them best.  :func:`estimate` does that step with cvxdp's solvers and hands back
mbi's own model type, so a synthesizer runs on cvxdp's method without a change on its side.

The problems solved
-------------------
Each mbi ``LinearMeasurement`` ``i`` carries a clique ``S_i`` (attribute names), noisy answers
``y_i``, a noise standard deviation ``sigma_i`` and a linear ``query`` ``Q_i`` on the flattened
(C order) marginal ``mu_{S_i}``.  The loss is one of mbi's (``mbi.marginal_loss``), given either
as the list of measurements or as the ``MarginalLossFn`` mbi builds from it:

* ``from_linear_measurements(ms, norm="l2")`` (or the list): ``sum_i ||Q_i mu_{S_i} - y_i||^2 /
  (2 sigma_i^2)`` (Gaussian noise; mbi's default);
* ``norm="l1"``: ``sum_i ||Q_i mu_{S_i} - y_i||_1 / sigma_i`` (Laplace noise);
* ``normalize=True``: mbi's reporting forms ``sqrt(L2 / (m N))`` and ``L1 / (m N)`` (``m``
  measurements, ``N`` the total).  At a fixed total they are increasing functions of the
  plain losses, so they have the same minimisers: the plain loss is solved, and the value
  reported is the normalised one;
* ``mle_loss_fn(targets)`` (mbi 2.x; :func:`mle_from_marginals` is mbi 1.x's
  ``estimation.mle_from_marginals``): ``-sum_C <t_C, log mu_C>`` over target marginals ``t_C``.
  When the targets are consistent (the marginals of one table up to scale, the usual case:
  marginals of a previous model), the optimum is ``mu_C = N t_C / |t_C|``, and each clique's
  term is at least ``-<t_C, log(N t_C / |t_C|)>`` over *any* nonnegative ``mu_C`` summing to
  ``N`` (Gibbs' inequality), so the sum of those terms is a lower bound: the estimate is the L2
  projection of the scaled targets onto the marginal polytope (cvxdp's method), certified
  optimal for the MLE loss by that bound.  When the bound does not close (inconsistent
  targets) no cvxdp method solves the log loss, and the same model -- the junction tree's
  local polytope -- goes to a standard conic solver (Clarabel, exponential cones), which
  ``solve_info`` reports.

Every loss is minimised over the *marginal polytope* (:class:`cvxdp.MarginalPolytope`): the
marginals ``mu_C`` of the maximal measured cliques are those of one table ``p >= 0`` with
``sum(p) = N``.  ``N`` is the ``known_total`` when one is given.  Otherwise, for the plain L1 / L2
losses it is *free*, optimised with the marginals (the maximum-likelihood total), where mbi fixes
``N`` beforehand (the inverse-variance average of the identity measurements' sums for a list,
``1`` for a ``MarginalLossFn``): the optimum is then never worse than mbi's for the same loss.
The normalised losses and the log loss have no finite minimiser in ``N``; there ``N`` is fixed:
mbi's ``1`` for the normalised losses, and the targets' total for the log loss (the
Poisson-likelihood total; mbi uses ``1``).  With no measurement at all the model is the uniform
distribution with total ``known_total`` (default ``1``), as mbi's.  When the junction tree of the
cliques is too large (:class:`cvxdp.ModelTooLarge`), the estimate is taken over the local
polytope instead (:class:`cvxdp.LocalPolytope`, pairwise consistent marginals).

Structural constraints
----------------------
mbi 2.x's ``mbi.Constraint`` (``constraints=[...]``) declares which combinations of values of an
attribute set can occur: ``valid`` or ``invalid`` combinations, or a ``mapping`` (a functional
dependency ``fine -> coarse``).  A record with a forbidden combination has probability zero, so
the estimate is taken over the marginals of tables that vanish on those records.  cvxdp solves
that exactly by a change of domain: the attributes of overlapping constraints are merged into
one attribute whose values are the allowed combinations only, each measured clique touching
them is measured on the merged attribute (its answers a fixed 0/1 image of the merged marginal),
and the problem is the usual one over the merged domain -- the same method, certificate and
exactness.  The model returned is over the original attributes: the junction-tree tables
expanded back (zero on every forbidden combination), the constraints stored on it
(``model.constraints``: ``project`` and ``synthetic_data`` fold them in; for sampling, a
constraint whose attributes no clique holds together is added as a clique of zero potential, which
mbi 2.0.0's own sampler does not do), and an attribute that occurs in no measurement and is fixed
inside its clique by the constraints (the coarse side of a ``mapping``) dropped from the model's
cliques, since the folded constraint determines it (kept when the smaller model would not
reproduce the tables).

The model returned
------------------
A :class:`cvxdp.estimates.mbi_model.CvxdpMarkovRandomField` -- an ``mbi.MarkovRandomField`` --
built from the solution.  Over the marginal polytope cvxdp leaves a :class:`cvxdp.GraphicalModel`
on the constraint; its junction-tree clique tables ``mu_K`` define the distribution
``p = prod_K mu_K / prod_S mu_S`` (``S`` the separators), the maximum-entropy distribution with
the fitted marginals.  The returned model has these tables as ``marginals`` and log-potentials
``theta_K = log mu_K - log mu_S`` (each separator subtracted once, from the clique that hangs
below it; empty cells get a log floor of ``log 1e-300`` instead of ``-inf`` so mbi's message
passing never meets ``inf - inf``), scaled to the fitted ``total``.  Its ``cliques`` are
therefore the junction tree's cliques, which equal the maximal measured cliques when those form
a chordal graph (trees: MST; and in practice most AIM workloads); otherwise they include the
triangulation's fill-in, so AIM's model-size filter (``hypothetical_model_size(model.cliques +
[candidate])``) can only be more conservative.  Over the local polytope the model is
``constraint.model()``, a graphical model fitted to the consistent marginals, converted the same
way.  The model is a registered jax pytree, pickles, round-trips ``mbi.save`` / ``mbi.load``
(mbi 2.x), and answers ``project`` with cvxdp's numpy inference on its own fields (mbi compiles
a JAX kernel per attribute set, which dominated AIM's selection step).  ``model.solve_info``
(``dict(model.solve_info)``) says what ran: ``loss``, ``route``, ``status``, ``gap`` (the
certified relative gap ``(f - L) / max(1, |f|)``, ``None`` where nothing certified it),
``objective`` (the loss asked for, normalised where it is), ``total``, ``total_given``.

Plugging it in
--------------
* OpenDP (``opendp.extras.mbi``, checked on opendp 0.16.0): every algorithm dataclass (``AIM``,
  ``MST``, ``Fixed``, ``Sequential``) has the field ``estimator: Callable = mirror_descent`` with
  the contract ``estimator(domain, measurements, *, potentials=None) -> mbi.MarkovRandomField``
  (``opendp/extras/mbi/_utilities/__init__.py``).  That is the hook::

      algorithm = dp.mbi.AIM(estimator=cvxdp.synth.estimator(eps_rel=1e-6))
      # or, for an existing configuration:
      algorithm = cvxdp.synth.with_cvxdp(dp.mbi.MST())

  Options are validated when the estimator is made (a misspelt or out-of-range option is a
  ``ValueError`` naming it, before any budget is spent).  OpenDP also passes ``potentials``
  (the previous model's, a warm start for mirror descent): accepted and not used.  Its
  measurements include a zero-way total (clique ``()``) and prefix queries on one-way marginals;
  both are handled (any linear ``query`` is, see below).
* mbi 1.x (``mbi.estimation.mirror_descent(domain, loss_fn, *, known_total=None,
  potentials=None, marginal_oracle=..., iters=1000, stateful=False, stepsize=None,
  callback_fn=..., mesh=None) -> MarkovRandomField``; ``mbi.Estimator`` is the ``Protocol``
  ``(domain, loss_fn, *, known_total=None, **kwargs) -> Projectable``): :func:`estimate` has that
  signature; mirror-descent-only keywords (``iters``, ``marginal_oracle``, ``stepsize``,
  ``stateful``, ``mesh``, ``tol``, ``patience``) are accepted and ignored -- cvxdp stops on its
  own certified gap ``eps_rel``, not an iteration count.  opendp 0.16.0 pins ``mbi==1.1.0``.
* mbi 2.x: ``mbi.Estimator`` is an abstract dataclass whose method
  ``estimate(domain, loss_fn, known_total=None, constraints=(), iters=1000, callback_fn=None,
  warm_start=None, tol=None, patience=2) -> Model`` is what callers use (``mbi/estimation.py``).
  ``cvxdp.synth.CvxdpEstimator(**options)`` is such an Estimator (with mbi 1.x a callable of
  the 1.x ``Protocol``), its options real dataclass fields (``dataclasses.replace`` keeps them)
  validated when it is made.
* ``callback_fn(marginals)`` is called at each of cvxdp's convergence checks with what mbi
  passes -- a ``CliqueVector`` of the current marginals on the maximal measured cliques -- and
  once more with the final estimate; a callable that also takes a keyword ``gap`` receives the
  certified relative gap at that check (for a free total: of the current fixed-total solve;
  the final call: of the returned estimate).  Routes that report no iterate (the local
  polytope's ADMM, a standard solver) call it once, at the end.
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
checks that it is linear (no offset).  A ``MarginalLossFn`` that none of mbi's constructors made
(a user's own jax function) is refused (``TypeError``): cvxdp cannot read its form.

Nothing here is imported by ``import cvxdp``: mbi and jax are imported when :func:`estimate` runs
(a missing package raises ``ImportError`` naming ``pip install cvxdp[mbi]``).
"""
from __future__ import annotations

import functools
import inspect
import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import scipy.sparse as sp
import cvxpy as cp

from ..names import ADMM, MIRROR_DESCENT
from ..methods.options import Option, OptionSet
from ..methods.registry import METHODS
from ..modelling.domain import Domain
from ..modelling.local_polytope import LocalPolytope
from ..modelling.marginal_polytope import MarginalPolytope, ModelTooLarge

__all__ = ["estimate", "estimator", "with_cvxdp", "mle_from_marginals", "check_options",
           "OPTIONS", "LOG_FLOOR"]

#: empty cells get this probability (not 0) in the log-potentials of the returned model
LOG_FLOOR = 1e-300

_INSTALL = "cvxdp.synth needs mbi (and jax); install them with: pip install 'cvxdp[mbi]'"

_INF = math.inf

#: cvxdp's options of :func:`estimate` (also the fields of ``CvxdpEstimator``): validated when
#: an estimator is made (:func:`check_options`)
OPTIONS = OptionSet("cvxdp.synth", {o.name: o for o in [
    Option("solver", "solver", None,
           "a cvxdp method (cvxdp.MIRROR_DESCENT for the marginal polytope, cvxdp.ADMM for the "
           "local polytope) or an installed cvxpy solver; None: the method of the polytope used",
           nullable=True),
    Option("norm", "choice", None, "'l2' (Gaussian) or 'l1' (Laplace) for a list of "
           "measurements; None: 'l2', or the norm of the MarginalLossFn given",
           choices=("l2", "l1"), nullable=True),
    Option("eps_rel", "number", None, "largest certified relative gap (f - L) / max(1, |f|)",
           low=0, low_open=True, high=_INF, high_open=True, nullable=True),
    Option("eps_abs", "number", None, "largest constraint violation of the returned marginals",
           low=0, low_open=True, high=_INF, high_open=True, nullable=True),
    Option("max_iters", "integer", None, "iterations at most", low=1, nullable=True),
    Option("time_limit", "number", None, "seconds of solve time at most", low=0, low_open=True,
           nullable=True),
    Option("polytope", "choice", "auto", "'auto' (the marginal polytope, the local polytope "
           "when the junction tree is too large), 'marginal' or 'local'",
           choices=("auto", "marginal", "local")),
    Option("max_cells", "integer", None, "largest junction-tree clique (cells) before 'auto' "
           "falls back to the local polytope", low=1, nullable=True),
    Option("verbose", "bool", False, "log cvxdp's per-iteration table"),
]})
#: a mapping of further ``Problem.solve`` keywords (checked against the method's options)
_SOLVE_OPTIONS = "solve_options"

#: keywords of mbi's estimators that configure its own first-order methods or warm starts:
#: accepted so that :func:`estimate` is a drop-in replacement, and not used (cvxdp stops on its
#: certified gap); ``callback_fn`` is used (module docstring)
_MBI_ONLY = frozenset({"iters", "marginal_oracle", "stepsize", "stateful", "mesh", "tol",
                       "patience", "potentials", "warm_start"})
#: per-call arguments :func:`estimator` may also fix
_PER_CALL = frozenset({"known_total", "constraints", "callback_fn"})


def _mbi():
    """The mbi package, or an ImportError telling how to get it."""
    try:
        import mbi  # noqa: F401
        import jax  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"{_INSTALL} ({exc})") from exc
    return mbi


# ------------------------------------------------------------------------------ options
def _known() -> list[str]:
    return sorted(set(OPTIONS.options) | {_SOLVE_OPTIONS} | _MBI_ONLY | _PER_CALL)


def check_options(options: Mapping[str, Any], where: str = "cvxdp.synth") -> dict[str, Any]:
    """Validate :func:`estimate`'s options (cvxdp's, ``solve_options``, mbi's keywords and the
    per-call ``known_total`` / ``constraints`` / ``callback_fn``) before any work: a
    ``ValueError`` naming the option (and listing the known ones for a name not known).
    Returns them with the values converted."""
    unknown = sorted(k for k in options if k not in _known())
    if unknown:
        raise ValueError(f"{where}: unknown option(s) {unknown}; known options: {_known()}")
    out: dict[str, Any] = {}
    for name, value in options.items():
        opt = OPTIONS.options.get(name)
        if opt is not None:
            out[name] = None if value is None else opt.validate(where, value)
        else:
            out[name] = value
    solver = out.get("solver")
    if solver is not None and solver not in (MIRROR_DESCENT, ADMM) \
            and solver.upper() not in cp.installed_solvers():
        raise ValueError(f"{where}: option solver={solver!r} is not allowed; expected "
                         f"cvxdp.MIRROR_DESCENT, cvxdp.ADMM or an installed cvxpy solver "
                         f"({', '.join(cp.installed_solvers())})")
    cons = out.get("constraints")
    if cons is not None and not isinstance(cons, (list, tuple)):
        raise ValueError(f"{where}: option constraints={cons!r} is not allowed; expected a list "
                         f"of mbi.Constraint")
    cb = out.get("callback_fn")
    if cb is not None and not callable(cb):
        raise ValueError(f"{where}: option callback_fn={cb!r} is not allowed; expected a callable "
                         f"or None")
    kt = out.get("known_total")
    if kt is not None:
        try:
            kt = float(kt)
        except (TypeError, ValueError):
            kt = math.nan
        if not (math.isfinite(kt) and kt > 0):
            raise ValueError(f"{where}: option known_total={options['known_total']!r} is not "
                             f"allowed; expected a positive finite number or None")
        out["known_total"] = kt
    if out.get(_SOLVE_OPTIONS) is not None:
        out[_SOLVE_OPTIONS] = _check_solve_options(out[_SOLVE_OPTIONS], solver, where)
    return out


def _check_solve_options(given: Any, solver: str | None, where: str) -> dict[str, Any]:
    """``solve_options``: a mapping; with a cvxdp method (or ``solver=None``, whose method is
    MIRROR_DESCENT or ADMM) each key must be an option of that method and its value allowed."""
    if not isinstance(given, Mapping):
        raise ValueError(f"{where}: option solve_options={given!r} is not allowed; expected a "
                         f"mapping of Problem.solve keywords")
    given = dict(given)
    names = [solver] if solver in (MIRROR_DESCENT, ADMM) else \
        ([MIRROR_DESCENT, ADMM] if solver is None else [])
    if not names:                                         # a cvxpy solver: its own keywords
        return given
    sets = [METHODS[n].options for n in names]
    for key, value in given.items():
        owners = [s for s in sets if key in s.options]
        if not owners:
            known = sorted(set().union(*(s.options for s in sets)))
            raise ValueError(f"{where}: solve_options has unknown option {key!r} for "
                             f"{' or '.join(names)}; known options: {known}")
        if value is not None:
            errors = []
            for s in owners:
                try:
                    s.options[key].validate(f"{where}: solve_options ({s.method})", value)
                    break
                except ValueError as exc:
                    errors.append(exc)
            else:
                raise errors[0]
    return given


# ------------------------------------------------------------------------------ entry points
def estimate(domain, loss_fn, *, known_total: float | None = None, potentials=None,
             warm_start=None, constraints: Sequence = (), callback_fn: Callable | None = None,
             solver: str | None = None, norm: str | None = None, eps_rel: float | None = None,
             eps_abs: float | None = None, max_iters: int | None = None,
             time_limit: float | None = None, polytope: str = "auto",
             max_cells: int | None = None, verbose: bool = False,
             solve_options: dict | None = None, **mbi_options: Any):
    """Fit an ``mbi.MarkovRandomField`` to mbi measurements with a cvxdp solver.

    Parameters
    ----------
    domain : ``mbi.Domain``.
    loss_fn : a list of ``mbi.LinearMeasurement``, or the ``mbi.MarginalLossFn`` of mbi's
        ``marginal_loss.from_linear_measurements`` (``norm`` ``"l2"`` or ``"l1"``, normalised
        or not) or ``marginal_loss.mle_loss_fn`` (module docstring).
    known_total : the number of records if known; ``None`` (default): the total is free,
        estimated jointly with the marginals (fixed losses: see the module docstring).
    potentials, warm_start : a previous model's potentials (mbi 1.x / OpenDP) or model (mbi 2.x):
        accepted for the signature, not used.
    constraints : mbi 2.x structural constraints (``mbi.Constraint``): forbidden combinations
        get probability zero (module docstring).
    callback_fn : ``callback_fn(marginals[, gap=...])`` at each convergence check and at the
        end (module docstring).
    solver : a cvxdp method (``cvxdp.MIRROR_DESCENT`` for the marginal polytope,
        ``cvxdp.ADMM`` for the local polytope), ``None`` (that method for the polytope used:
        the returned model is built from its result, so ``solver=None``'s cost model, which
        may hand small problems to Clarabel, is not consulted), or a cvxpy solver name
        (``cp.CLARABEL`` solves the junction tree's local polytope; it leaves only the
        marginals, and the model is then fitted to them: ``MarginalPolytope.model``).
    norm : ``"l2"`` (Gaussian measurements, mbi's default) or ``"l1"`` (Laplace) for a list
        of measurements; a ``MarginalLossFn`` carries its own (a different ``norm`` given
        is a ``ValueError``).
    eps_rel, eps_abs, max_iters, time_limit : cvxdp's stopping rules (``None``: the method's
        defaults; ``eps_rel`` is the certified relative optimality gap).
    polytope : ``"auto"`` (marginal polytope, the local polytope when the junction tree is too
        large), ``"marginal"`` or ``"local"``.
    max_cells : largest junction-tree clique accepted before falling back (default cvxdp's).
    solve_options : further keyword arguments for ``Problem.solve`` (checked against the
        method's options).
    mbi_options : mbi's first-order keywords (``iters``, ``stepsize``, ``tol``, ...), ignored;
        any other keyword is a ``TypeError``.

    Returns a ``CvxdpMarkovRandomField`` (an ``mbi.MarkovRandomField``; module docstring).
    """
    mbi = _mbi()
    unknown = sorted(set(mbi_options) - _MBI_ONLY)
    if unknown:
        raise TypeError(f"estimate: unexpected keyword argument(s) {unknown}; known options: "
                        f"{_known()}")
    opts = check_options(dict(known_total=known_total, constraints=constraints,
                              callback_fn=callback_fn, solver=solver, norm=norm, eps_rel=eps_rel,
                              eps_abs=eps_abs, max_iters=max_iters, time_limit=time_limit,
                              polytope=polytope, max_cells=max_cells, verbose=verbose,
                              solve_options=solve_options), "estimate")
    terms = _read_loss(mbi, domain, loss_fn, opts["norm"])
    return _estimate(mbi, domain, terms, opts, stacklevel=3)


def mle_from_marginals(marginals, known_total: float | None = None, iters: int | None = None,
                       marginal_oracle=None, callback_fn: Callable | None = None, mesh=None,
                       **options: Any):
    """mbi 1.x's ``estimation.mle_from_marginals(marginals, known_total)`` with cvxdp: the model
    maximising the likelihood ``sum_C <t_C, log mu_C>`` of the target marginals ``marginals``
    (an ``mbi.CliqueVector``) with total ``known_total`` (default: the targets' total); the
    same as :func:`estimate` with mbi 2.x's ``marginal_loss.mle_loss_fn(marginals)`` (module
    docstring).  ``iters``, ``marginal_oracle``, ``mesh``: mbi's, ignored.  ``options``:
    :func:`estimate`'s."""
    mbi = _mbi()
    opts = check_options(dict(options, known_total=known_total, callback_fn=callback_fn),
                         "mle_from_marginals")
    if not isinstance(marginals, mbi.CliqueVector):
        raise TypeError(f"mle_from_marginals: marginals must be an mbi.CliqueVector, got "
                        f"{type(marginals).__name__}")
    return _estimate(mbi, marginals.domain, _mle_terms(marginals), _defaults(opts), stacklevel=3)


def estimator(**options: Any) -> Callable:
    """``estimate`` with its options fixed: ``estimator(domain, loss_fn, *, known_total=None,
    potentials=None, ...)``, the form OpenDP's ``Algorithm.estimator`` takes.  The options are
    checked now (:func:`check_options`: ``ValueError`` naming a bad one)."""
    bad = {"domain", "loss_fn"} & set(options)
    if bad:
        raise TypeError(f"estimator: {sorted(bad)} are the estimator's arguments, not options")
    check_options(options, "estimator")
    out = functools.partial(estimate, **options)
    functools.update_wrapper(out, estimate)
    return out


def with_cvxdp(algorithm, **options: Any):
    """A copy of an OpenDP ``opendp.extras.mbi`` algorithm (``AIM(...)``, ``MST(...)``,
    ``Fixed(...)``, ``Sequential(...)``) whose estimator is cvxdp's (``estimator(**options)``,
    options checked now)."""
    import dataclasses
    if not dataclasses.is_dataclass(algorithm) or not any(
            f.name == "estimator" for f in dataclasses.fields(algorithm)):
        raise TypeError(f"with_cvxdp: {type(algorithm).__name__} has no 'estimator' field "
                        f"(expected an opendp.extras.mbi algorithm such as AIM or MST)")
    est = estimator(**options)
    return dataclasses.replace(algorithm, estimator=est)


def _defaults(opts: dict) -> dict:
    base = {"solver": None, "norm": None, "eps_rel": None, "eps_abs": None, "max_iters": None,
            "time_limit": None, "polytope": "auto", "max_cells": None, "verbose": False,
            _SOLVE_OPTIONS: None, "known_total": None, "constraints": (), "callback_fn": None}
    base.update({k: v for k, v in opts.items() if k in base})
    if base["polytope"] is None:
        base["polytope"] = "auto"
    if base["verbose"] is None:
        base["verbose"] = False
    return base


# ------------------------------------------------------------------------------ the loss
@dataclass
class _Terms:
    """The loss read off mbi's input: ``kind`` ``"measurements"`` (``norm``, ``normalize``,
    ``measurements``), ``"mle"`` (``targets``: ``(clique, flat t)``) or ``"empty"``."""

    kind: str
    norm: str = "l2"
    normalize: bool = False
    measurements: list = field(default_factory=list)
    targets: list = field(default_factory=list)

    @property
    def loss(self) -> str:
        if self.kind == "mle":
            return "mle"
        return self.norm + (" normalised" if self.normalize else "")


def _read_loss(mbi, domain, loss_fn, norm: str | None) -> _Terms:
    if isinstance(loss_fn, (list, tuple)):
        ms = list(loss_fn)
        for i, m in enumerate(ms):
            if not isinstance(m, mbi.LinearMeasurement):
                raise TypeError(f"cvxdp.synth.estimate: loss_fn[{i}] is a {type(m).__name__}, "
                                f"not an mbi.LinearMeasurement")
        return _Terms("measurements" if ms else "empty", norm or "l2", False, ms)
    if not isinstance(loss_fn, mbi.MarginalLossFn):
        raise TypeError(f"cvxdp.synth.estimate: loss_fn must be a list of mbi.LinearMeasurement "
                        f"or an mbi.MarginalLossFn, got {type(loss_fn).__name__}")
    ml = mbi.marginal_loss
    fn = loss_fn.loss_fn
    read = None
    plain = {getattr(ml, "_l2_loss", None): ("l2", False), getattr(ml, "_l1_loss", None): ("l1", False),
             getattr(ml, "_normalized_l2_loss", None): ("l2", True),
             getattr(ml, "_normalized_l1_loss", None): ("l1", True)}
    plain.pop(None, None)
    if fn in plain:                                          # mbi 2.x
        read = (plain[fn][0], plain[fn][1], list(loss_fn.data))
    elif _made_by(fn, ml.from_linear_measurements):          # mbi 1.x: a closure
        free = _closure(fn)
        read = (free["norm"], bool(free["normalize"]), list(free["measurements"]))
    elif hasattr(ml, "mle_loss_fn") and _made_by(fn, ml.mle_loss_fn):
        if norm is not None:
            raise ValueError(f"cvxdp.synth.estimate: norm={norm!r} given with an MLE loss "
                             f"(marginal_loss.mle_loss_fn), which has no norm")
        return _mle_terms(loss_fn.data)
    if read is None:
        raise TypeError("cvxdp.synth.estimate: this MarginalLossFn was not made by mbi's "
                        "marginal_loss.from_linear_measurements or mle_loss_fn, and cvxdp cannot "
                        f"read the form of a jax function ({getattr(fn, '__qualname__', fn)!r}); "
                        "pass the list of mbi.LinearMeasurement instead")
    lnorm, normalize, ms = read
    if norm is not None and norm != lnorm:
        raise ValueError(f"cvxdp.synth.estimate: norm={norm!r} given with a MarginalLossFn of "
                         f"norm {lnorm!r}")
    return _Terms("measurements" if ms else "empty", lnorm, normalize, ms)


def _made_by(fn, maker) -> bool:
    """``fn`` is a function defined inside ``maker`` (its code is one of maker's constants)."""
    code = getattr(fn, "__code__", None)
    return code is not None and any(c is code for c in maker.__code__.co_consts)


def _closure(fn) -> dict[str, Any]:
    return {n: c.cell_contents for n, c in zip(fn.__code__.co_freevars, fn.__closure__ or ())}


def _mle_terms(targets) -> _Terms:
    out = []
    for cl in targets.cliques:
        f = targets[cl]
        t = np.asarray(f.values, dtype=float).ravel()
        if not np.all(np.isfinite(t)) or np.any(t < 0):
            raise ValueError(f"cvxdp.synth: the MLE target on {tuple(f.domain.attributes)} must be "
                             f"finite and nonnegative")
        out.append((tuple(f.domain.attributes), t))
    return _Terms("mle" if out else "empty", targets=out)


# ------------------------------------------------------------------------------ the problem
def _estimate(mbi, domain, terms: _Terms, opts: dict, *, stacklevel: int):
    opts = _defaults(opts)
    space = _Space(mbi, domain, opts["constraints"])
    known = opts["known_total"]
    if terms.kind == "empty":
        total = known if known is not None else 1.0       # mbi's default
        return space.uniform_model(total, dict(loss=terms.loss, route="no measurements: the "
                                               "uniform model", status="optimal", gap=0.0,
                                               objective=0.0, total=total,
                                               total_given=known is not None))
    if terms.kind == "mle":
        return _estimate_mle(space, terms, opts, stacklevel + 1)
    if terms.normalize and known is None:
        known = 1.0                                       # mbi's total for a MarginalLossFn
    fit = _Fit(space, terms.measurements, terms.norm, known)
    run = fit.solve(opts, stacklevel + 1)
    info = run.info(terms)
    if terms.normalize and info["objective"] is not None:
        info["objective"] = _normalised(info["objective"], terms, known)
    return fit.model(run, info)


def _normalised(value: float, terms: _Terms, total: float) -> float:
    m = len(terms.measurements)
    v = value / m / total
    return math.sqrt(max(v, 0.0)) if terms.norm == "l2" else v


class _Space:
    """The attributes the problem is posed over: mbi's, with the attributes of each group of
    overlapping structural constraints merged into one attribute whose values are the allowed
    combinations (module docstring).  Without constraints, mbi's attributes themselves."""

    def __init__(self, mbi, mdomain, constraints) -> None:
        self.mbi = mbi
        self.mdomain = mdomain
        self.attrs = tuple(mdomain.attributes)
        self.size = {a: int(mdomain.config[a]) for a in self.attrs}
        names = [str(a) for a in self.attrs]
        if len(set(names)) != len(names):
            raise ValueError(f"cvxdp.synth: attribute names {self.attrs} are not distinct as strings")
        self.constraints = tuple(constraints or ())
        self.groups = _groups(mbi, mdomain, self.constraints)        # [(attrs, allowed codes)]
        self.group_of: dict[Any, int] = {a: g for g, (attrs, _) in enumerate(self.groups)
                                         for a in attrs}
        taken = set(names)
        self.gname = []
        for attrs, _ in self.groups:
            n = "+".join(str(a) for a in attrs)
            while n in taken:
                n += "'"
            taken.add(n)
            self.gname.append(n)
        self.gindex = {n: g for g, n in enumerate(self.gname)}
        # the space's attributes, in mbi's order (a group where its first attribute is)
        self.names: list[str] = []
        self.sizes: list[int] = []
        for a in self.attrs:
            g = self.group_of.get(a)
            if g is None:
                self.names.append(str(a))
                self.sizes.append(self.size[a])
            elif a == self.groups[g][0][0]:
                self.names.append(self.gname[g])
                self.sizes.append(len(self.groups[g][1]))
        self.domain = Domain(list(zip(self.names, self.sizes)))
        self.index = {n: i for i, n in enumerate(self.names)}
        # per group: the original values of each allowed combination, and the inverse
        self.decode = []
        self.encode = []
        for attrs, codes in self.groups:
            shape = tuple(self.size[a] for a in attrs)
            self.decode.append(np.stack(np.unravel_index(codes, shape), axis=1))
            inv = np.full(math.prod(shape), -1, dtype=np.int64)
            inv[codes] = np.arange(codes.size)
            self.encode.append(inv)

    # ---------------------------------------------------------------- cliques and maps
    def clique(self, c: tuple) -> tuple[str, ...]:
        """The space's attributes of an mbi clique (a group once, where it first occurs)."""
        out: list[str] = []
        for a in c:
            g = self.group_of.get(a)
            n = str(a) if g is None else self.gname[g]
            if n not in out:
                out.append(n)
        return tuple(out)

    def shape(self, sc: tuple[str, ...]) -> tuple[int, ...]:
        return tuple(self.sizes[self.index[n]] for n in sc)

    def lift(self, c: tuple) -> sp.csr_matrix | None:
        """The 0/1 matrix from the flat marginal on ``clique(c)`` to the flat marginal on the
        mbi clique ``c`` (``None`` when they are the same)."""
        if not any(a in self.group_of for a in c):
            return None
        sc = self.clique(c)
        shape = self.shape(sc)
        n = math.prod(shape)
        coords = np.unravel_index(np.arange(n), shape) if shape else ()
        values = []
        for a in c:
            g = self.group_of.get(a)
            if g is None:
                values.append(coords[sc.index(str(a))])
            else:
                values.append(self.decode[g][coords[sc.index(self.gname[g])],
                                             self.groups[g][0].index(a)])
        cshape = tuple(self.size[a] for a in c)
        rows = (np.ravel_multi_index(tuple(values), cshape) if c else np.zeros(n, dtype=np.int64))
        return sp.csr_matrix((np.ones(n), (rows, np.arange(n))), shape=(math.prod(cshape), n))

    def expand(self, sc: tuple[str, ...], table: np.ndarray) -> tuple[tuple, np.ndarray]:
        """A table on the space's clique ``sc`` as a table on mbi's attributes (groups expanded,
        zero on forbidden combinations)."""
        attrs: list = []
        for n in sc:
            g = self.gindex.get(n)
            attrs.extend(self.groups[g][0] if g is not None else [self._attr(self.index[n])])
        shape = tuple(self.size[a] for a in attrs)
        if not any(n in self.gindex for n in sc):
            return tuple(attrs), np.asarray(table, dtype=float).reshape(shape)
        coords = np.indices(shape).reshape(len(shape), -1)
        idx, ok = [], np.ones(coords.shape[1], dtype=bool)
        k = 0
        for n in sc:
            g = self.gindex.get(n)
            if g is None:
                idx.append(coords[k])
                k += 1
            else:
                w = len(self.groups[g][0])
                gshape = tuple(self.size[a] for a in self.groups[g][0])
                code = self.encode[g][np.ravel_multi_index(tuple(coords[k:k + w]), gshape)]
                ok &= code >= 0
                idx.append(np.where(code >= 0, code, 0))
                k += w
        t = np.asarray(table, dtype=float).reshape(self.shape(sc))
        vals = t[tuple(idx)] if idx else np.full(coords.shape[1], float(t))
        return tuple(attrs), np.where(ok, vals, 0.0).reshape(shape)

    def _attr(self, i: int):
        """The mbi attribute of the space's (ungrouped) attribute ``i``."""
        n = self.names[i]
        return next(a for a in self.attrs if str(a) == n)

    # ---------------------------------------------------------------- models
    def uniform_model(self, total: float, info: dict):
        """The uniform distribution over the allowed records, with ``total``: independent
        attributes (and constraint groups), each table summing to ``total``."""
        from .mbi_model import markov_random_field
        cliques, tables = [], []
        for i, n in enumerate(self.names):
            c, tab = self.expand((n,), np.ones(self.sizes[i]))
            cliques.append(c)
            tables.append(tab * (total / float(tab.sum())))
        return markov_random_field(self.mdomain, cliques, tables, total,
                                   constraints=self.constraints, info=info, floor=LOG_FLOOR)


#: a group of overlapping structural constraints spans at most this many value combinations
_MAX_GROUP_CELLS = 2 ** 24


def _groups(mbi, mdomain, constraints) -> list[tuple[tuple, np.ndarray]]:
    """The constraints merged into groups of overlapping attribute sets: ``(attributes in mbi's
    order, flat codes of the allowed combinations)``."""
    if not constraints:
        return []
    Constraint = getattr(mbi, "Constraint", None)
    attrs_all = tuple(mdomain.attributes)
    items = []
    for i, c in enumerate(constraints):
        if Constraint is None or not isinstance(c, Constraint):
            raise TypeError(f"cvxdp.synth: constraints[{i}] is a {type(c).__name__}, not an "
                            f"mbi.Constraint (mbi>=2)")
        attrs = tuple(c.domain.attributes)
        bad = [a for a in attrs if a not in attrs_all]
        if bad:
            raise ValueError(f"cvxdp.synth: constraints[{i}] names attribute(s) {bad} outside "
                             f"the domain {attrs_all}")
        for a in attrs:
            if int(c.domain.config[a]) != int(mdomain.config[a]):
                raise ValueError(f"cvxdp.synth: constraints[{i}] gives attribute {a!r} "
                                 f"{int(c.domain.config[a])} values, the domain "
                                 f"{int(mdomain.config[a])}")
        allowed = np.isfinite(np.asarray(c.potential.values, dtype=float))   # 0 / -inf
        items.append((attrs, allowed))
    # union of overlapping attribute sets
    comp: list[set] = []
    for attrs, _ in items:
        s = set(attrs)
        merged = [g for g in comp if g & s]
        for g in merged:
            comp.remove(g)
            s |= g
        comp.append(s)
    out = []
    for s in sorted(comp, key=lambda s: min(attrs_all.index(a) for a in s)):
        attrs = tuple(a for a in attrs_all if a in s)
        shape = tuple(int(mdomain.config[a]) for a in attrs)
        if math.prod(shape) > _MAX_GROUP_CELLS:
            raise ModelTooLarge(f"cvxdp.synth: the structural constraints chain the attributes "
                                f"{attrs} together ({math.prod(shape):,} combinations, above "
                                f"{_MAX_GROUP_CELLS:,}); cvxdp merges overlapping constraints "
                                f"into one attribute of their allowed combinations")
        mask = np.ones(shape, dtype=bool)
        for cattrs, allowed in items:
            if set(cattrs) <= s:
                perm = np.transpose(allowed, [cattrs.index(a) for a in attrs if a in cattrs])
                mask &= perm.reshape(tuple(shape[j] if a in cattrs else 1
                                           for j, a in enumerate(attrs)))
        codes = np.flatnonzero(mask.ravel())
        if codes.size == 0:
            raise ValueError(f"cvxdp.synth: the constraints on {attrs} allow no combination of "
                             f"values: no table satisfies them")
        out.append((attrs, codes))
    return out


def _marginalizer(home: tuple, clique: tuple, shape_of: Callable[[tuple], tuple]) -> sp.csr_matrix:
    """The 0/1 matrix taking the flat (C order) marginal on ``home`` to the flat marginal on
    ``clique`` (a subset, in its own attribute order; ``()`` gives the total)."""
    shape = shape_of(home)
    n = math.prod(shape)
    coords = np.unravel_index(np.arange(n), shape)
    sub = shape_of(clique)
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


def _maximal(cliques: list[tuple]) -> list[tuple]:
    """The cliques contained in no other, one ordering of each attribute set (the first)."""
    seen, out = set(), []
    for c in cliques:
        if any(set(c) < set(d) for d in cliques) or frozenset(c) in seen:
            continue
        seen.add(frozenset(c))
        out.append(c)
    return out


class _Fit:
    """Terms ``(home variable, matrix, answers, weight)`` over the space's maximal cliques ->
    cvxpy variables, loss and polytope; the solve; the model back in mbi's attributes."""

    def __init__(self, space: _Space, measurements: list, norm: str, total: float | None, *,
                 targets: list | None = None) -> None:
        mbi = space.mbi
        self.space, self.norm, self.total = space, norm, total
        rows: list[tuple[tuple, Any, np.ndarray, float]] = []   # (mbi clique, Q, y, sigma)
        for m in measurements:
            c = tuple(m.clique)
            bad = [a for a in c if a not in space.size]
            if bad:
                raise KeyError(f"cvxdp.synth: measurement on {c} names attribute(s) {bad} "
                               f"outside the domain {space.attrs}")
            Q = _query_matrix(mbi, m.query, space.mdomain.project(c))
            y = np.asarray(m.noisy_measurement, dtype=float).ravel()
            rows.append((c, Q, y, max(float(m.stddev), 1e-12)))   # mbi's guard for invariants
        for c, t in targets or []:
            rows.append((c, None, t, 1.0))
        self.rows = rows
        self.mbi_cliques = _maximal([c for c, *_ in rows if c]) or []
        scl = [space.clique(c) for c, *_ in rows]
        self.cliques = _maximal([s for s in scl if s]) or [(space.names[0],)]
        self.variables = {c: cp.Variable(math.prod(space.shape(c)), name="mu_" + "_".join(c))
                          for c in self.cliques}
        self.maps = [self._map(c) for c, *_ in rows]            # (home, matrix or None)
        self.mbi_maps = {c: self._map(c) for c in self.mbi_cliques}

    def _home(self, sc: tuple) -> tuple:
        s = set(sc)
        return next(c for c in self.cliques if s <= set(c))

    def _map(self, c: tuple) -> tuple[tuple, sp.csr_matrix | None]:
        """The variable holding the mbi clique ``c`` and the matrix from it to ``c``'s flat
        marginal (``None``: the identity)."""
        sp_ = self.space
        sc = sp_.clique(c)
        home = self._home(sc) if sc else self.cliques[0]
        A = None
        if home != sc:
            A = _marginalizer(home, sc, sp_.shape)
        L = sp_.lift(c)
        if L is not None:
            A = L if A is None else sp.csr_matrix(L @ A)
        return home, A

    # ---------------------------------------------------------------- the problem
    def residuals(self) -> list[tuple[cp.Expression, float]]:
        out = []
        for (c, Q, y, sigma), (home, A) in zip(self.rows, self.maps):
            if Q is not None:
                A = sp.csr_matrix(Q) if A is None else sp.csr_matrix(Q @ A)
            x = self.variables[home]
            n_out = x.size if A is None else A.shape[0]
            if y.size != n_out:
                raise ValueError(f"cvxdp.synth: a measurement on {c} has {y.size} answers but "
                                 f"its query gives {n_out}")
            out.append(((x if A is None else A @ x) - y, sigma))
        return out

    def objective(self) -> cp.Expression:
        terms = [cp.sum_squares(r) / (2.0 * s ** 2) if self.norm == "l2" else cp.norm1(r) / s
                 for r, s in self.residuals()]
        return functools.reduce(lambda a, b: a + b, terms)

    def constraint(self, polytope: str, max_cells: int | None):
        marginals = dict(self.variables)
        kw = {} if max_cells is None else {"max_cells": int(max_cells)}
        if polytope in ("auto", "marginal"):
            try:
                return MarginalPolytope(marginals, self.space.domain, self.total, **kw), "marginal"
            except ModelTooLarge:
                if polytope == "marginal":
                    raise
        return LocalPolytope(marginals, self.space.domain, self.total), "local"

    def solve(self, opts: dict, stacklevel: int, objective: cp.Expression | None = None,
              solver: str | None = None) -> "_Run":
        constraint, kind = self.constraint(opts["polytope"], opts["max_cells"])
        prob = cp.Problem(cp.Minimize(self.objective() if objective is None else objective),
                          [constraint])
        kw = dict(opts[_SOLVE_OPTIONS] or {})
        for key in ("eps_rel", "eps_abs", "max_iters", "time_limit"):
            if opts[key] is not None:
                kw[key] = opts[key]
        solver = solver or opts["solver"] or (MIRROR_DESCENT if kind == "marginal" else ADMM)
        cb = _Callback(opts["callback_fn"], self) if opts["callback_fn"] is not None else None
        if cb is not None and solver in (MIRROR_DESCENT, ADMM):
            kw["callback"] = cb.check
        prob.solve(method="cvxdp", solver=solver, verbose=opts["verbose"], **kw)
        if any(v.value is None for v in self.variables.values()):
            raise RuntimeError(f"cvxdp.synth.estimate: the solve returned no solution "
                               f"(status {prob.status})")
        if prob.status != "optimal":
            warnings.warn(f"cvxdp.synth.estimate: solver status {prob.status}", RuntimeWarning,
                          stacklevel=stacklevel)
        run = _Run(self, prob, constraint, kind, solver)
        if cb is not None:
            cb.final(run)
        return run

    # ---------------------------------------------------------------- views of a solution
    def flat(self) -> np.ndarray:
        return np.concatenate([np.asarray(v.value, dtype=float).ravel()
                               for v in self.variables.values()])

    def clique_vector(self, flat: np.ndarray):
        """mbi's ``CliqueVector`` of the marginals on the maximal measured cliques, from the
        variables' values concatenated (``flat``)."""
        import jax.numpy as jnp
        mbi, sp_ = self.space.mbi, self.space
        parts, at = {}, 0
        for c, v in self.variables.items():
            parts[c] = flat[at:at + v.size]
            at += v.size
        cliques = self.mbi_cliques or []
        tables = {}
        for c in cliques:
            home, A = self.mbi_maps[c]
            vals = parts[home] if A is None else A @ parts[home]
            dom = sp_.mdomain.project(c)
            tables[c] = mbi.Factor(dom, jnp.asarray(np.asarray(vals, dtype=float).reshape(dom.shape)))
        return mbi.CliqueVector(sp_.mdomain, list(cliques), tables)

    # ---------------------------------------------------------------- back to mbi
    def model(self, run: "_Run", info: dict):
        from .mbi_model import markov_random_field
        sp_ = self.space
        constraint, kind = run.constraint, run.kind
        gm = constraint.model() if kind == "local" else constraint.model
        if gm is None:
            # the zero table (no distribution to model): the variables' tables are the
            # model's when they already form a junction tree
            scl = list(self.cliques)
            free = [n for n in sp_.names if not any(n in c for c in scl)]
            jt = {frozenset(sp_.domain.names[i] for i in c) for c in constraint.tree.cliques} \
                if kind == "marginal" else None
            if jt != {frozenset(c) for c in scl + [(n,) for n in free]}:
                raise ValueError("cvxdp.synth: this solver leaves no graphical model for cliques "
                                 "that are not a junction tree; use solver=cvxdp.MIRROR_DESCENT")
            tables = [np.asarray(self.variables[c].value, dtype=float).reshape(sp_.shape(c))
                      for c in scl]
            total = max(float(tables[0].sum()), 0.0)
            for n in free:                          # unmeasured: uniform, as cvxdp's model has it
                k = sp_.sizes[sp_.index[n]]
                scl.append((n,))
                tables.append(np.full(k, total / k))
        else:
            total = float(gm.total)
            scl = [tuple(c) for c in gm.cliques]
            tables = [np.asarray(gm.marginal(list(c)), dtype=float) for c in scl]
        cliques, tabs = [], []
        for sc, t in zip(scl, tables):
            c, tab = sp_.expand(sc, t)
            cliques.append(c)
            tabs.append(tab)
        info["total"] = total
        small_c, small_t = _drop_determined(sp_, cliques, tabs, self.rows)
        if small_c != cliques:
            out = markov_random_field(sp_.mdomain, small_c, small_t, total,
                                      constraints=sp_.constraints, info=info, floor=LOG_FLOOR)
            if _same_model(out, cliques, tabs):
                return out
        return markov_random_field(sp_.mdomain, cliques, tabs, total, constraints=sp_.constraints,
                                   info=info, floor=LOG_FLOOR)


def _drop_determined(space: _Space, cliques: list[tuple], tables: list[np.ndarray],
                     rows: list) -> tuple[list[tuple], list[np.ndarray]]:
    """Drop from the model's cliques each attribute of a constraint group that no measurement
    names and that, in every clique holding it, the clique's other attributes fix under the
    constraints (the coarse side of a ``mapping``): on the allowed records every table holding
    it is then a function of the rest, and the folded constraint restores it.  The caller
    checks the result against the full tables (:func:`_same_model`)."""
    if not space.groups:
        return cliques, tables
    measured = {a for c, *_ in rows for a in c}
    cl = [list(c) for c in cliques]
    tb = [np.asarray(t, dtype=float) for t in tables]
    for a in space.attrs:
        g = space.group_of.get(a)
        holding = [i for i, c in enumerate(cl) if a in c]
        if a in measured or g is None or not holding \
                or not all(len(cl[i]) > 1 and _fixed_by_rest(space, g, a, cl[i]) for i in holding):
            continue
        for i in holding:
            tb[i] = tb[i].sum(axis=cl[i].index(a))
            cl[i].remove(a)
    out_c = [tuple(c) for c in cl]
    # a clique now inside another is implied by it (a junction tree's neighbour holds it)
    keep = [i for i, c in enumerate(out_c)
            if not any(j != i and (set(c) < set(d) or (set(c) == set(d) and j < i))
                       for j, d in enumerate(out_c))]
    return [out_c[i] for i in keep], [tb[i] for i in keep]


def _fixed_by_rest(space: _Space, g: int, a, clique: list) -> bool:
    """Within group ``g``, the clique's other attributes of the group fix ``a`` on every
    allowed combination."""
    attrs = space.groups[g][0]
    others = [b for b in attrs if b in clique and b != a]
    if not others:
        return False
    dec = space.decode[g]
    key = dec[:, [attrs.index(b) for b in others]]
    val = dec[:, attrs.index(a)]
    seen: dict[tuple, int] = {}
    for k, v in zip(map(tuple, key), val):
        if seen.setdefault(k, int(v)) != int(v):
            return False
    return True


def _same_model(model, cliques: list[tuple], tables: list[np.ndarray]) -> bool:
    """``model`` (constraints folded) reproduces every clique table to 1e-9 of the total (or
    100 roundoffs of the precision jax stores the model in: float32 unless x64 is on)."""
    leaf = model.potentials[model.potentials.cliques[0]].values if model.potentials.cliques else 0.0
    eps = float(np.finfo(np.asarray(leaf).dtype).eps) if np.asarray(leaf).dtype.kind == "f" else 0.0
    tol = max(1e-9, 100 * eps) * max(float(model.total), 1e-300)
    for c, t in zip(cliques, tables):
        got = np.asarray(model.project(c).datavector(flatten=False), dtype=float)
        if got.shape != t.shape or float(np.max(np.abs(got - t), initial=0.0)) > tol:
            return False
    return True


@dataclass
class _Run:
    """A finished solve: the problem, the polytope constraint and its kind, the solver."""

    fit: _Fit
    prob: cp.Problem
    constraint: Any
    kind: str
    solver: str

    def stats(self) -> dict:
        st = self.prob.solver_stats
        return (st.extra_stats or {}) if st is not None and isinstance(st.extra_stats, dict) else {}

    def gap(self) -> float | None:
        g = self.stats().get("gap")
        return None if g is None or not math.isfinite(float(g)) else float(g)

    def info(self, terms: _Terms) -> dict:
        ex = self.stats()
        method = self.solver in (MIRROR_DESCENT, ADMM)
        if method:
            inner = ex.get("info") if isinstance(ex.get("info"), dict) else {}
            route = f"cvxdp {self.solver} on the {self.kind} polytope" + (
                f": {inner['route']}" if inner.get("route") else "")
        else:
            route = f"{self.solver} on the " + (
                "junction tree's local polytope" if self.kind == "marginal" else "local polytope")
        return dict(loss=terms.loss, route=route, status=self.prob.status,
                    gap=self.gap() if method else None,
                    objective=float(self.prob.value) if self.prob.value is not None else None,
                    total=None, total_given=self.fit.total is not None)


class _Callback:
    """mbi's ``callback_fn`` driven by cvxdp's checks (module docstring)."""

    def __init__(self, fn: Callable, fit: _Fit) -> None:
        self.fn, self.fit = fn, fit
        self.gap_kw = _accepts_gap(fn)
        self.last: np.ndarray | None = None

    def call(self, flat: np.ndarray, gap: float | None) -> None:
        marginals = self.fit.clique_vector(flat)
        if self.gap_kw:
            self.fn(marginals, gap=gap)
        else:
            self.fn(marginals)
        self.last = flat

    def check(self, info: dict) -> bool:
        x = info.get("x")
        if x is not None and np.asarray(x).size == sum(v.size for v in self.fit.variables.values()):
            g = info.get("rel gap")
            self.call(np.array(x, dtype=float), None if g is None else float(g))
        return False

    def final(self, run: _Run) -> None:
        flat = self.fit.flat()
        if self.last is not None and self.last.shape == flat.shape and np.array_equal(self.last, flat):
            return
        self.call(flat, run.gap())


def _accepts_gap(fn: Callable) -> bool:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return False
    try:
        sig.bind(None, gap=0.0)
    except TypeError:
        return False
    return True


# ------------------------------------------------------------------------------ the MLE loss
#: certified relative gap the MLE's consistent-targets route must reach (when eps_rel is unset)
_MLE_EPS = 1e-6


def _estimate_mle(space: _Space, terms: _Terms, opts: dict, stacklevel: int):
    """``min -sum_C <t_C, log mu_C>`` over the marginal polytope with total ``N`` (module
    docstring): the L2 projection of the scaled targets, certified by the per-clique bound;
    else the exponential-cone program on a standard solver."""
    sums = [float(t.sum()) for _, t in terms.targets]
    known = opts["known_total"]
    N = known if known is not None else float(np.mean(sums))
    if not N > 0:
        raise ValueError("cvxdp.synth: the MLE targets are all zero; give known_total")
    scaled = [(c, N * t / s if s > 0 else t) for (c, t), s in zip(terms.targets, sums)]
    eps = opts["eps_rel"] or _MLE_EPS
    fit = _Fit(space, [], "l2", N, targets=scaled)
    lower = sum(-float(t[t > 0] @ np.log(N * t[t > 0] / s)) for (_, t), s in zip(terms.targets, sums)
                if s > 0)
    consistent = opts["solver"] in (None, MIRROR_DESCENT, ADMM)
    if consistent:
        o = dict(opts, eps_rel=min(eps * 1e-3, 1e-9), callback_fn=None)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)   # judged by the MLE bound below
            run = fit.solve(o, stacklevel + 1)
        f = _mle_value(fit, terms.targets)
        gap = (f - lower) / max(1.0, abs(f)) if math.isfinite(f) else math.inf
        if gap <= eps:
            info = dict(loss="mle", route="the targets are consistent: their L2 projection ("
                        + run.info(terms)["route"] + "), certified optimal for the log loss by the "
                        "per-clique bound", status="optimal", gap=max(gap, 0.0), objective=f,
                        total=N, total_given=known is not None)
            if opts["callback_fn"] is not None:
                _Callback(opts["callback_fn"], fit).call(fit.flat(), max(gap, 0.0))
            return fit.model(run, info)
    # the log loss itself, on a standard solver (no cvxdp method solves it)
    solver = opts["solver"] if opts["solver"] not in (None, MIRROR_DESCENT, ADMM) else \
        (cp.CLARABEL if cp.CLARABEL in cp.installed_solvers() else cp.SCS)
    obj = 0
    for (c, t), (home, A) in zip(terms.targets, fit.maps):
        pos = t > 0
        if not pos.any():
            continue
        x = fit.variables[home]
        expr = x if A is None else A @ x
        obj = obj - t[pos] @ cp.log(expr[np.flatnonzero(pos)])
    o = dict(opts, polytope="marginal", eps_rel=None, eps_abs=None, max_iters=None,
             time_limit=None, callback_fn=opts["callback_fn"])
    run = fit.solve(o, stacklevel + 1, objective=obj, solver=solver)
    f = _mle_value(fit, terms.targets)
    info = dict(loss="mle", route=f"no cvxdp method solves the log loss (the targets are not "
                f"consistent: the bound's gap is {gap:.2e})" if consistent else
                "no cvxdp method solves the log loss", status=run.prob.status, gap=None,
                objective=f, total=N, total_given=known is not None)
    info["route"] += f"; {solver} (exponential cones) on the junction tree's local polytope"
    return fit.model(run, info)


def _mle_value(fit: _Fit, targets: list) -> float:
    flat = fit.flat()
    parts, at = {}, 0
    for c, v in fit.variables.items():
        parts[c] = flat[at:at + v.size]
        at += v.size
    f = 0.0
    for (c, t), (home, A) in zip(targets, fit.maps):
        mu = parts[home] if A is None else A @ parts[home]
        pos = t > 0
        if np.any(mu[pos] <= 0):
            return math.inf
        f -= float(t[pos] @ np.log(mu[pos]))
    return f

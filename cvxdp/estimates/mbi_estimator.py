"""``CvxdpEstimator``: cvxdp's estimator as an mbi ``Estimator`` (imported only with mbi installed).

With mbi 2.x it is a subclass of the abstract dataclass ``mbi.Estimator`` (callers use its
``estimate`` method); with mbi 1.x, whose ``mbi.Estimator`` is a ``Protocol`` of functions
``(domain, loss_fn, *, known_total=None, **kwargs)``, it is a dataclass whose instances are such
functions.  Either way its options are :func:`cvxdp.synth.estimate`'s, as real dataclass fields
(``dataclasses.replace`` keeps them; ``dataclasses.asdict`` lists them), validated when it is
made (``ValueError`` naming the option), and it pickles (a module-level class).  mbi's own
constructor keywords ``marginal_oracle``, ``stepsize`` and ``mesh`` are accepted and unused, so
``CvxdpEstimator`` stands in for ``MirrorDescent(stepsize=...)`` as well.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
from typing import Any, Callable

import mbi

from .synth import OPTIONS, check_options, estimate

__all__ = ["CvxdpEstimator"]

_MBI2 = hasattr(getattr(mbi, "Estimator", None), "estimate")
_Base = mbi.Estimator if _MBI2 else object

#: the fields passed on to :func:`cvxdp.synth.estimate`
_PASSED = tuple(OPTIONS.options) + ("solve_options",)


@dataclasses.dataclass(frozen=True, kw_only=True, init=False)
class CvxdpEstimator(_Base):
    """An mbi estimator solving with cvxdp; the fields are :func:`cvxdp.synth.estimate`'s
    options (``solver``, ``norm``, ``eps_rel``, ``eps_abs``, ``max_iters``, ``time_limit``,
    ``polytope``, ``max_cells``, ``verbose``, ``solve_options``) and mbi's unused
    ``marginal_oracle``, ``stepsize``, ``mesh``."""

    solver: str | None = None
    norm: str | None = None
    eps_rel: float | None = None
    eps_abs: float | None = None
    max_iters: int | None = None
    time_limit: float | None = None
    polytope: str = "auto"
    max_cells: int | None = None
    verbose: bool = False
    solve_options: dict | None = None
    marginal_oracle: Any = None
    stepsize: float | None = None
    mesh: Any = None

    def __init__(self, **options: Any) -> None:
        fields = {f.name: f for f in dataclasses.fields(self)}
        unknown = sorted(set(options) - set(fields))
        if unknown:
            raise ValueError(f"CvxdpEstimator: unknown option(s) {unknown}; known options: "
                             f"{sorted(fields)}")
        for name, f in fields.items():
            object.__setattr__(self, name, options.get(name, f.default))
        checked = check_options(self.options(), "CvxdpEstimator")
        for name, value in checked.items():      # values converted (numbers, solve_options)
            object.__setattr__(self, name, value)

    def options(self) -> dict[str, Any]:
        """The options passed to :func:`cvxdp.synth.estimate`."""
        return {k: getattr(self, k) for k in _PASSED}

    def estimate(self, domain, loss_fn, known_total=None, constraints=(), iters=1000,
                 callback_fn: Callable | None = None, warm_start=None, tol=None, patience=2):
        """mbi 2.x's ``Estimator.estimate``: :func:`cvxdp.synth.estimate` with these options
        (``iters``, ``warm_start``, ``tol``, ``patience``: accepted, unused)."""
        return estimate(domain, loss_fn, known_total=known_total, constraints=constraints,
                        callback_fn=callback_fn, warm_start=warm_start, **self.options())

    def __call__(self, domain, loss_fn, *, known_total=None, **kwargs):
        """mbi 1.x's ``Estimator`` protocol and OpenDP's ``estimator`` field:
        :func:`cvxdp.synth.estimate` with these options (per-call keywords win)."""
        return estimate(domain, loss_fn, known_total=known_total, **{**self.options(), **kwargs})

    def precompile(self, *args, **kwargs) -> concurrent.futures.Future:
        """Nothing to compile: a finished future (mbi 2.x's ``Estimator.precompile``)."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        fut.set_result(None)
        return fut

    def _init(self, *args, **kwargs):           # cvxdp solves in one call: no stepping API
        raise NotImplementedError("CvxdpEstimator solves in estimate(); it has no steps")

    _step = _finalize = _init

    def __hash__(self) -> int:                 # solve_options is a dict: hash the type
        return hash(type(self))

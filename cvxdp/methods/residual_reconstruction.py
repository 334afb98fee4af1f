"""``cvxdp.ADMM`` on the non-negative, consistent reconstruction of residual answers.

Recognised: ``minimize cvxdp.nll(measurement, marginals)`` (residual answers of a marginal
workload; a positive multiple, plus a constant) subject to one :class:`cvxdp.LocalPolytope` over
the same marginal variables (:mod:`cvxdp.recognise.residual`).  The route,
``extra_stats["info"]["route"]``, is ``"residual ADMM"`` (:mod:`cvxdp.solvers.residual.nonneg`):
an ADMM in residual coordinates, where consistency holds by construction and every step is in
closed form, stopped by a certified duality gap; the local polytope's dual is written (minus the loss's
gradient at the bound's own point, whose Lagrangian bound is at least the certified one).  Of ADMM's own options ``rho``,
``alpha``, ``check_every`` and ``polish`` (the least-squares point on the face the ADMM holds
at zero, at every check) apply here; ``adaptive_rho``, ``dual_newton``, ``equality_split`` and ``general_route``
have nothing to choose.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import cvxpy as cp

from ..names import ADMM
from ..recognise.residual import ReconstructionExtraction, recognise_reconstruction
from ..solvers.residual.nonneg import CliqueResiduals, NonnegSettings, solve
from ..solvers.result import SOLUTION_PRESENT
from .base import Outcome
from .input_check import check_magnitudes, check_residual_scale
from .consistency import OPTIONS
from .options import STOPPING, Settings

__all__ = ["ResidualReconstruction"]


class ResidualReconstruction:
    """``cvxdp.ADMM`` on the reconstruction from residual answers (module docstring)."""

    name = ADMM
    family = "residual_reconstruction"
    options = OPTIONS

    def recognise(self, problem: cp.Problem) -> ReconstructionExtraction:
        """The problem as arrays; data too large for float64 refused here
        (:mod:`cvxdp.methods.input_check`)."""
        ext = recognise_reconstruction(problem)
        check_magnitudes(problem, ADMM)
        check_residual_scale(ext.atom, ADMM)
        return ext

    def cost(self, ext: ReconstructionExtraction) -> tuple[str, int]:
        return "residual_reconstruction", int(ext.constraint.graph.n)

    def cost_candidates(self, ext: Any) -> None:
        """One family/loss, which :meth:`cost` reads cheaply: nothing to narrow down."""
        return None

    def cost_before_recognition(self, problem: cp.Problem) -> None:
        return None

    def solve(self, problem: cp.Problem, ext: ReconstructionExtraction, settings: Settings, *,
              cached: Any) -> Outcome:
        atom, lp = ext.atom, ext.constraint
        W = atom.measurement.workload
        sizes = W.domain.sizes
        struct = CliqueResiduals(sizes, [tuple(sorted(o)) for o in atom.order],
                                 [W.basis.residual(j) for j in range(W.n_residuals)])
        s = NonnegSettings(**settings.pick(*STOPPING, "rho", "alpha", "check_every", "polish"))
        warm = settings.warm_start and all(v.value is not None for v in ext.variables)
        state = cached if warm and isinstance(cached, dict) else None
        res = solve(struct, atom.z, atom.w, lp.known_total(), s, state=state)
        primal: dict[int, Any] = {}
        duals: dict[int, Any] = {}
        if res.status in SOLUTION_PRESENT and res.x is not None:
            values = _user_order(struct, atom, res.x)
            for v, val in zip(ext.variables, values):
                primal[v.id] = val.reshape(v.shape, order="C") if v.ndim > 1 else val.ravel()
            point = res.info.get("dual_components")
            if res.status == "optimal" and point is not None:
                at = _user_order(struct, atom, np.concatenate([t.ravel() for t in
                                                               struct.expand(point)]))
                duals[lp.id] = [-ext.scale * g for g in atom.gradients(at)]
        info = {"route": res.info["route"], "rho": res.info["rho"], "total": res.info["total"],
                "residuals": W.n_residuals, "local_polytope": lp.describe()}
        return Outcome(status=res.status, primal=primal,
                       objective=ext.scale * res.objective + ext.constant,
                       iterations=res.iterations, solve_time=res.solve_time,
                       setup_time=res.setup_time, lower_bound=ext.scale * res.lower_bound
                       + ext.constant, history=res.history, duals=duals,
                       duals_certified=bool(duals), state=res.state,
                       warm_started=state is not None, info=info)


def _user_order(struct: CliqueResiduals, atom, x: np.ndarray) -> list[np.ndarray]:
    """The stacked tables (axes in domain order) as each marginal's table, axes in the
    clique's own order."""
    out, off = [], 0
    for shape, order in zip(struct.table_shapes, atom.order):
        n = int(np.prod(shape))
        T = x[off:off + n].reshape(shape)
        off += n
        out.append(np.transpose(T, [sorted(order).index(a) for a in order]))
    return out

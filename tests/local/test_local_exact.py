"""The local polytope's exact multipliers (:mod:`cvxdp.solvers.local.exact`): a small optimal
answer whose own multipliers did not certify is finished by the consistency family's exact
route; its dual passes the Lagrangian check against Clarabel's optimum."""
from __future__ import annotations

import pathlib
import sys

import numpy as np
import pytest
import cvxpy as cp

import cvxdp
from cvxdp.solvers.consistency import ipm
from cvxdp.solvers.local import admm as local_admm, exact

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
import stress  # noqa: E402

TIGHT = dict(tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10)


def stress_case():
    """The stress set's seed-11 ``local_l2`` instance 56 (rounded): an unmeasured one-way
    clique, a zero-weight cell, a known total; the ADMM's multipliers did not certify and the
    interior point on the small problems' first dense path gave up on it."""
    dom = cvxdp.Domain({"a0": 3, "a1": 3, "a2": 2})
    x01, x12, x0 = cp.Variable(9), cp.Variable((3, 2)), cp.Variable(3)
    w = np.full(9, 1.9705)
    w[6] = 0.0
    y01 = np.array([20.1123, 8.3383, 4.6275, 10.0858, 4.2887, 5.8038, 9.1129, 47.5351, 12.5907])
    y12 = np.array([[24.0140, 14.3712], [51.1558, 8.2841], [15.1991, 8.5005]])
    obj = (cp.sum_squares(cp.multiply(w, x01 - y01))
           + cp.sum_squares(cp.multiply(np.full((3, 2), 1.9705), x12 - y12)))
    con = cvxdp.LocalPolytope({("a0", "a1"): x01, ("a1", "a2"): x12, ("a0",): x0}, dom, total=122.0)
    return cp.Problem(cp.Minimize(obj), [con])


def test_the_interior_point_converges_on_the_stress_case():
    """Loss-free columns (the unmeasured clique) and dependent equality rows: the interior
    point's small path (LU of the whole KKT matrix) converges to its tolerance."""
    from cvxdp.recognise.clique_marginals import recognise_local
    from cvxdp.solvers.local.problem import LocalProblem
    prob = stress_case()
    ext = recognise_local(prob)
    lp = ext.constraint
    data = exact.consistency_data(LocalProblem(lp.graph, ext.loss, lp.known_total()))
    assert data.n == 18 and np.linalg.matrix_rank(data.A.toarray()) < data.A.shape[0]
    out = ipm.solve_qp(data)
    assert out is not None and out.accuracy <= ipm._TOL


@pytest.fixture
def no_own_multipliers(monkeypatch):
    """The iterations' multipliers never certify (what happened on 7 of 600 stress
    instances), so every optimal answer takes the exact finish."""
    monkeypatch.setattr(local_admm._Run, "_multipliers_from", lambda self, *a, **k: None)


def _instances():
    yield "stress case", stress_case
    for seed in range(4):
        for loss in ("l1", "l2", "enet"):
            yield f"seed {seed} {loss}", (lambda seed=seed, loss=loss: stress.local_instance(
                np.random.default_rng(100 + seed), loss))
        yield f"seed {seed} free total", (lambda seed=seed: stress.local_instance(
            np.random.default_rng(200 + seed), known_total=False))
        yield f"seed {seed} query rows", (lambda seed=seed: stress.local_instance(
            np.random.default_rng(300 + seed), general=True))


@pytest.mark.parametrize("name, make", list(_instances()), ids=[n for n, _ in _instances()])
def test_exact_multipliers_pass_the_lagrangian_check(no_own_multipliers, name, make):
    ref = make()
    ref.solve(solver=cp.CLARABEL, **TIGHT)
    prob = make()
    prob.solve(method="cvxdp", solver=cvxdp.ADMM)
    assert prob.status == cp.OPTIMAL
    es = prob.solver_stats.extra_stats
    assert "for exact multipliers" in es["info"]["route"] and es["duals_certified"]
    assert prob.value == pytest.approx(ref.value, rel=1e-6, abs=1e-6)
    assert stress.dual_check(prob, ref.value) == ("ok", "")


def test_larger_problems_and_duals_false_keep_the_answer(no_own_multipliers, monkeypatch):
    """Above ``EXACT_MAX`` cells, or with ``duals=False``, the iterations' answer stands
    (``optimal``, no dual written)."""
    prob = stress_case()
    prob.solve(method="cvxdp", solver=cvxdp.ADMM, duals=False)
    assert prob.status == cp.OPTIMAL and _no_dual(prob)
    monkeypatch.setattr(exact, "EXACT_MAX", 10)
    prob = stress_case()
    prob.solve(method="cvxdp", solver=cvxdp.ADMM)
    assert prob.status == cp.OPTIMAL and _no_dual(prob)
    assert "exact multipliers" not in prob.solver_stats.extra_stats["info"]["route"]


def _no_dual(prob) -> bool:
    """No dual written (``LocalPolytope.dual_value`` is one entry per clique)."""
    return all(v is None for v in prob.constraints[0].dual_value)


@pytest.mark.parametrize("total", [None, 10.0])
def test_the_consistency_rows_hold_exactly_on_consistent_tables(total):
    """``A t = b`` for the marginals of one joint table (scaled to the total when known),
    not once one cell of a clique moves; free totals: the cliques' totals equal."""
    from cvxdp.solvers.local.problem import LocalProblem
    from cvxdp.solvers.local.region_graph import RegionGraph
    from cvxdp.solvers.marginal.loss import LossTerm, MarginalLoss
    G = RegionGraph([2, 3, 2], [(0, 1), (1, 2), (2,), (0, 2)])
    loss = MarginalLoss([LossTerm("l2", slice(0, 6), np.arange(6.0), 1.0)], G.n)
    A, b = exact._constraints(LocalProblem(G, loss, total))
    joint = np.random.default_rng(0).random((2, 3, 2))
    joint *= (total or 7.0) / joint.sum()
    t = np.concatenate([joint.sum(axis=2).ravel(), joint.sum(axis=0).ravel(),
                        joint.sum(axis=(0, 1)), joint.sum(axis=1).ravel()])
    np.testing.assert_allclose(A @ t, b, atol=1e-12)
    t[3] += 0.5
    assert np.abs(A @ t - b).max() > 0.1

"""Duals of ``MarginalPolytope``: the multipliers ``y_C`` of "each measured marginal is the
table's marginal", written by MIRROR_DESCENT only when they certify, equal to a standard
solver's where unique, and checked by the Lagrangian they define."""
from __future__ import annotations

import numpy as np
import pytest
import cvxpy as cp

import cvxdp

TIGHT = dict(tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10, max_iter=500)


def instance(seed, kind, total_known=True):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(2, 4, 3)
    dom = cvxdp.Domain({"a": int(sizes[0]), "b": int(sizes[1]), "c": int(sizes[2])})
    n = 80
    data = np.column_stack([rng.integers(0, s, n) for s in sizes])
    cliques = [("a", "b"), ("b", "c")] + ([("a",)] if seed % 2 else [])
    mus = {c: cp.Variable(dom.shape(c)) for c in cliques}
    terms = []
    for i, c in enumerate(cliques):
        y = dom.count(data, c) + rng.normal(0, 2.0, dom.shape(c))
        l1 = kind == "l1" or (kind == "mixed" and i % 2 == 0)
        terms.append(cp.norm1(mus[c] - y) / 2.0 if l1 else cp.sum_squares(mus[c] - y) / 8.0)
    mp = cvxdp.MarginalPolytope(mus, dom, total=float(n) if total_known else None)
    return cp.Problem(cp.Minimize(cp.sum(terms)), [mp]), mp


def lagrangian_bound(prob, mp, y_parts):
    """``min f(m) + y^T (m - A mu)`` over free marginals ``m`` and ``mu`` in the local
    polytope: a lower bound on the optimum for any ``y``, equal to it for a certifying one."""
    cons = mp.local_polytope(mp.known_total())
    y = np.concatenate([np.asarray(p, dtype=float).ravel(order="C") for p in y_parts])
    lag = prob.objective.expr + y @ cons[0].args[0]
    return cp.Problem(cp.Minimize(lag), cons[1:]).solve(solver=cp.CLARABEL, **TIGHT)


def parts(dual_value):
    return dual_value if isinstance(dual_value, list) else [dual_value]


@pytest.mark.parametrize("kind", ["l2", "l1", "mixed"])
@pytest.mark.parametrize("total_known", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mirror_descent_duals_certify_and_match_clarabel(kind, total_known, seed):
    prob, mp = instance(seed, kind, total_known)
    f = prob.solve(method="cvxdp", solver=cvxdp.MIRROR_DESCENT, eps_rel=1e-9)
    assert prob.status == cp.OPTIMAL
    assert prob.solver_stats.extra_stats["duals_certified"]
    ours = [np.array(p, copy=True) for p in parts(mp.dual_value)]
    assert [p.shape for p in ours] == [a.shape for a in mp.args]
    low = lagrangian_bound(prob, mp, ours)
    assert low <= f + 1e-7 * max(1.0, abs(f))
    assert (f - low) / max(1.0, abs(f)) <= 1e-6
    ref_val = prob.solve(solver=cp.CLARABEL, **TIGHT)
    assert f == pytest.approx(ref_val, rel=1e-7, abs=1e-7)
    if kind == "l2":                   # strictly convex in the marginals: y = -grad is unique
        for a, b in zip(ours, parts(mp.dual_value)):
            np.testing.assert_allclose(a, b, atol=1e-6 * max(1.0, float(np.abs(b).max())))


@pytest.mark.parametrize("kind", ["l1", "mixed"])
@pytest.mark.parametrize("seed", range(6))
def test_consistent_answers_write_duals(kind, seed):
    """Answers with no noise: the optimum is 0 at the true marginals, every absolute row at
    its kink, where the iterate's own subgradient is +-w (the stress set's ``exact`` kind:
    36 of 100 solves wrote no duals before the kinks took the subgradient 0)."""
    rng = np.random.default_rng(seed)
    dom = cvxdp.Domain({"a": 3, "b": 2, "c": 3, "d": 2})
    data = np.column_stack([rng.integers(0, s, 60) for s in (3, 2, 3, 2)])
    cliques = [("a", "b"), ("b", "c"), ("c", "d")]
    mus = {c: cp.Variable(dom.shape(c)) for c in cliques}
    terms = [cp.norm1(mus[c] - dom.count(data, c)) / (1.0 + i) if kind == "l1" or i % 2 == 0
             else cp.sum_squares(mus[c] - dom.count(data, c)) for i, c in enumerate(cliques)]
    mp = cvxdp.MarginalPolytope(mus, dom, total=60.0)
    prob = cp.Problem(cp.Minimize(cp.sum(terms)), [mp])
    f = prob.solve(method="cvxdp", solver=cvxdp.MIRROR_DESCENT, eps_rel=1e-7)
    assert prob.status == cp.OPTIMAL and f == pytest.approx(0.0, abs=1e-6)
    assert prob.solver_stats.extra_stats["duals_certified"]
    low = lagrangian_bound(prob, mp, parts(mp.dual_value))
    assert -2e-7 <= low <= f + 1e-8


def test_one_clique_dual_is_one_array_and_uncertified_runs_write_none():
    prob, mp = instance(5, "l2")
    mus = list(mp.args)
    single = cvxdp.MarginalPolytope({("a", "b"): mus[0]}, mp.domain, total=80.0)
    p1 = cp.Problem(cp.Minimize(cp.sum_squares(mus[0] - 3.0)), [single])
    p1.solve(method="cvxdp", solver=cvxdp.MIRROR_DESCENT)
    assert isinstance(single.dual_value, np.ndarray) and single.dual_value.shape == mus[0].shape
    prob.solve(method="cvxdp", solver=cvxdp.MIRROR_DESCENT, max_iters=1, polish=False,
               warm_start=False, eps_rel=1e-12)
    if prob.status != cp.OPTIMAL:
        assert all(p is None for p in parts(mp.dual_value))
        assert not prob.solver_stats.extra_stats["duals_certified"]


def test_save_dual_value_checks_the_size():
    _, mp = instance(0, "l2")
    with pytest.raises(ValueError, match="multipliers"):
        mp.save_dual_value(np.zeros(3))

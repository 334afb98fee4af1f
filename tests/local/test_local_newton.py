"""The dual semismooth Newton method on the local polytope (``cvxdp.solvers.local.newton``).

It runs first when a ``LocalPolytope`` problem's squared loss measures every cell; each
instance is checked against Clarabel by ``test_local_polytope.check`` (objective, lower bound,
point, duals by comparison and by a KKT check), and here it is also checked that the Newton
method is what certified it -- on random and degenerate instances (one-cell and size-one
attributes, one clique, disjoint cliques, loops, free totals, extreme scales, noise-free data),
that it steps aside where it does not apply, that the ADMM takes over when it stops early, and
that its dual value is a lower bound at any multiplier (weak duality).
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import cvxpy as cp

import cvxdp
from cvxdp.solvers.local import newton as local_newton
from cvxdp.solvers.local import admm as local_admm
from cvxdp.solvers.local.admm import LocalProblem
from cvxdp.solvers.marginal.loss import LossTerm, MarginalLoss
from cvxdp.solvers.local.region_graph import RegionGraph

from test_local_polytope import check, make

PAIRS4 = list(itertools.combinations(range(4), 2))


def newton_info(inst):
    return inst.prob.solver_stats.extra_stats["info"]["dual_newton"]


CASES = {
    "pairs4": ([2, 3, 2, 2], PAIRS4),
    "triples": ([2, 2, 2, 2], [(0, 1, 2), (1, 2, 3), (0, 3)]),
    "loop": ([3, 2, 4], [(0, 1), (1, 2), (0, 2)]),
    "nested": ([2, 3, 2], [(0,), (0, 1), (1, 2), (2,), (0, 1, 2)]),
    "one-cell": ([1], [(0,)]),
    "size-one separator": ([2, 1, 2], [(0, 1), (1, 2)]),
    "single clique": ([3, 2, 2], [(0, 1, 2)]),
    "disjoint": ([2, 3, 2, 2], [(0, 1), (2, 3)]),
    "reversed axes": ([2, 3, 4], [(1, 0), (2, 1), (0, 2)]),
}


@pytest.mark.parametrize("total", [100.0, None])
@pytest.mark.parametrize("name", sorted(CASES))
def test_newton_certifies_and_matches_clarabel(name, total):
    sizes, cliques = CASES[name]
    inst = make(sum(map(ord, name)), sizes, cliques, loss="l2", total=total, noise=2.0)
    check(inst)
    info = newton_info(inst)
    assert info is not None and info["converged"], info


@pytest.mark.parametrize("total, noise, newton_certifies", [
    (1e-3, 1e-4, True), (1e-3, 1e4, True), (1e7, 1e4, True), (5.0, 50.0, True),
    # counts of 1e7 measured to 1: the dual value loses the digits the gap needs (at 1e-7)
    # before the repaired point does, and the ADMM finishes from the start
    (1e7, 1.0, False)])
def test_extreme_scales(total, noise, newton_certifies):
    """The scales of test_local_polytope.test_extreme_scales (the high signal-to-noise floor
    it marks, counts of 1e7 measured to 1e-3, holds for either method)."""
    inst = make(31, [2, 3, 2], [(0, 1), (1, 2), (0, 2)], loss="l2", total=total, noise=noise)
    check(inst)
    assert newton_info(inst)["converged"] is newton_certifies


@pytest.mark.parametrize("free", [False, True])
def test_noise_free_consistent_data_is_returned(free):
    """Exact marginals of one table (with empty cells): the optimum is the data itself."""
    rng = np.random.default_rng(8)
    sizes, cliques = [3, 2, 4], [(0, 1), (1, 2), (0, 2)]
    table = rng.poisson(2.0, sizes).astype(float)
    G = RegionGraph(sizes, cliques)
    y = np.concatenate([table.sum(axis=tuple(a for a in range(3) if a not in c)).ravel() for c in cliques])
    terms = [LossTerm("l2", slice(int(a), int(b)), y[a:b], 1.0) for a, b in zip(G.offsets[:-1], G.offsets[1:])]
    p = LocalProblem(G, MarginalLoss(terms, G.n), None if free else float(table.sum()))
    out = local_newton.solve(p, eps_rel=1e-9, max_iters=100, deadline=float("inf"))
    assert out.converged
    np.testing.assert_allclose(out.x, y, atol=1e-8 * table.sum())
    assert out.objective == pytest.approx(0.0, abs=1e-9)


def test_steps_aside_where_a_cell_is_unmeasured():
    # the unmeasured triple overlaps the pairs in a cycle, so it is not eliminated
    # (test_local_reduce) and its cells have no curvature: the proximal steps, which give
    # every cell curvature, take it, and write certified duals
    inst = make(21, [2, 3, 2], [(0, 1), (1, 2), (0, 2), (0, 1, 2)], loss="l2", total=7.0,
                unmeasured=(3,))
    check(inst, unique=False)
    info = inst.prob.solver_stats.extra_stats["info"]
    assert info["route"] == "proximal dual Newton" and info["dual_newton"]["converged"]
    assert info["duals_certified"]


def test_unmeasured_pairs_are_eliminated_first_then_it_runs():
    inst = make(21, [2, 3, 2, 2], PAIRS4, loss="l2", total=7.0, unmeasured=(1, 4))
    check(inst, unique=False)
    assert newton_info(inst)["converged"]


def test_option_turns_it_off_and_admm_agrees():
    inst = make(5, [2, 3, 2, 2], PAIRS4, loss="l2", noise=2.0)
    check(inst, dual_newton=False)
    assert newton_info(inst) is None


def test_admm_takes_over_when_it_stops_early(monkeypatch):
    """Without the exact finish on the Newton's point (it would certify this squared-loss
    model at once: next test), the ADMM goes on."""
    monkeypatch.setattr(local_newton, "_MAX_STEPS", 1)
    monkeypatch.setattr(local_admm._Run, "active_set_finish", lambda self: False)
    inst = make(9, [2, 3, 2, 2], PAIRS4, loss="l2", noise=2.0)
    check(inst)
    info = newton_info(inst)
    assert info["iterations"] == 1 and not info["converged"]
    assert inst.prob.solver_stats.extra_stats["iterations"] > 1


def test_the_newtons_point_is_finished_on_its_active_set(monkeypatch):
    """A Newton stopped after one step: its point's active set (no cell at zero, squared
    rows) gives the exact optimum in one solve, certified, with duals."""
    monkeypatch.setattr(local_newton, "_MAX_STEPS", 1)
    inst = make(9, [2, 3, 2, 2], PAIRS4, loss="l2", noise=2.0)
    check(inst)
    es = inst.prob.solver_stats.extra_stats
    assert newton_info(inst)["iterations"] == 1
    assert es["info"]["route"] == "dual Newton, then the active set of its point"
    assert es["duals_certified"] and es["iterations"] == 1


def test_bad_option_value_is_refused():
    inst = make(5, [2, 3], [(0, 1)], loss="l2")
    with pytest.raises(ValueError, match="dual_newton"):
        inst.prob.solve(method="cvxdp", solver=cvxdp.ADMM, dual_newton="yes")


@pytest.mark.parametrize("free", [False, True])
def test_dual_value_is_a_lower_bound_at_any_multiplier(free):
    """Weak duality: at random multipliers (projected) the dual value is below the loss of a
    point of the local polytope (the projected, mixed data), and at the Newton method's end
    it meets the optimum."""
    rng = np.random.default_rng(4)
    G = RegionGraph([3, 2, 4, 2], [(0, 1), (1, 2), (0, 2), (2, 3)])
    y = rng.normal(5.0, 3.0, G.n)
    w = rng.uniform(0.5, 2.0, G.n)
    terms = [LossTerm("l2", slice(int(a), int(b)), y[a:b], w[a:b]) for a, b in zip(G.offsets[:-1], G.offsets[1:])]
    p = LocalProblem(G, MarginalLoss(terms, G.n), None if free else 40.0)
    d = local_newton._Dual(p)
    from cvxdp.solvers.local.repair import mix
    feasible = p.loss.value(mix(G, G.project(np.abs(y), p.total), p.total))
    for _ in range(20):
        z = d.project(rng.normal(0, 3.0, d.n_dual))
        g, _, _ = d.evaluate(z)
        assert g <= feasible
    out = local_newton.solve(p, eps_rel=1e-9, max_iters=100, deadline=float("inf"))
    assert out.converged and out.lower <= out.objective + 1e-9 * abs(out.objective)
    prob, ref = cvxpy_reference(G, y, w, p.total)
    assert out.objective == pytest.approx(ref, rel=1e-7)


def cvxpy_reference(G, y, w, total):
    """Clarabel on the same problem, the local polytope written with the region marginalisers
    (each member of a region equal to its first)."""
    t = cp.Variable(G.n, nonneg=True)
    cons = []
    for i, reg in enumerate(G.regions):
        rows, size = G.region_rows(i), int(np.prod(reg.shape))
        first = G.M[rows.start:rows.start + size]
        for j in range(1, reg.members.size):
            cons.append((first - G.M[rows.start + j * size:rows.start + (j + 1) * size]) @ t == 0)
    S = np.zeros((len(G.cliques), G.n))
    for k, (a, b) in enumerate(zip(G.offsets[:-1], G.offsets[1:])):
        S[k, a:b] = 1.0
    cons.append(S @ t == total if total is not None else S[1:] @ t == S[0] @ t)
    prob = cp.Problem(cp.Minimize(0.5 * cp.sum(cp.multiply(w, cp.square(t - y)))), cons)
    prob.solve(solver=cp.CLARABEL, tol_gap_abs=1e-11, tol_gap_rel=1e-11, tol_feas=1e-11)
    return prob, prob.value


def test_hands_over_at_once_when_the_dual_outnumbers_the_active_cells(monkeypatch):
    """The first-step rule (rows per active cell), made to apply to a small problem: the ADMM
    then solves it from the start, to the same certified optimum."""
    monkeypatch.setattr(local_newton, "_RATIO_MIN_ROWS", 0)
    monkeypatch.setattr(local_newton, "_ROWS_PER_ACTIVE", 0.0)
    inst = make(9, [2, 3, 2, 2], PAIRS4, loss="l2", noise=2.0)
    check(inst)
    info = newton_info(inst)
    assert info["iterations"] == 1 and info["cg_steps"] == 0 and not info["converged"]


def test_hands_over_when_its_systems_stay_hard(monkeypatch):
    """The conjugate-gradient rule: with a cap of one step every system counts as hard, so
    the method stops after _HARD_STEPS steps and the ADMM finishes."""
    monkeypatch.setattr(local_newton, "_CG_MAX", 1)
    inst = make(9, [2, 3, 2, 2], PAIRS4, loss="l2", noise=2.0)
    check(inst)
    info = newton_info(inst)
    assert not info["converged"] and info["iterations"] <= local_newton._HARD_STEPS + 1


def _sparse_problem(free, seed=6):
    """Noisy marginals of a mostly empty table: many cells are zero at the optimum."""
    rng = np.random.default_rng(seed)
    G = RegionGraph([4, 3, 5, 2], [(0, 1), (1, 2), (0, 2), (2, 3)])
    y = rng.normal(0.0, 3.0, G.n) + np.where(rng.uniform(size=G.n) < 0.3, 8.0, 0.0)
    w = rng.uniform(0.5, 2.0, G.n)
    terms = [LossTerm("l2", slice(int(a), int(b)), y[a:b], w[a:b])
             for a, b in zip(G.offsets[:-1], G.offsets[1:])]
    return G, y, w, LocalProblem(G, MarginalLoss(terms, G.n), None if free else 60.0)


@pytest.mark.parametrize("free", [False, True])
def test_face_repair_is_consistent_on_its_face(free):
    """The face repair moves only the active cells of the dual minimiser and, where it clips
    no cell, makes the tables consistent to its conjugate gradients' tolerance (the residual
    is the gradient's, at the repaired point); where it clips, the residual still falls."""
    G, y, w, p = _sparse_problem(free)
    d = local_newton._Dual(p)
    z = local_newton._start(d)
    g, x, grad = d.evaluate(z)
    clean = 0
    for _ in range(12):
        out = local_newton._face_repair(d, x, grad)
        assert np.all(out >= 0) and np.all(out[x == 0] == 0)
        _, _, before = d.evaluate(z)
        after = d.project(np.concatenate([np.concatenate(
            [m.ravel() for m in G.region_marginals(out)]),
            G.totals(out) - (0.0 if free else p.total)]))
        if np.count_nonzero(out) == np.count_nonzero(x):
            clean += 1
            assert np.linalg.norm(after) <= 2 * local_newton._FACE_TOL * np.linalg.norm(before) \
                + 1e-12 * x.sum()              # rounding
        assert np.linalg.norm(after) <= np.linalg.norm(before) + 1e-9
        (z, g, x, grad), _, _ = local_newton._step(d, z, g, x, grad, 0.0)
    assert clean >= 3                          # near the optimum nothing is clipped


@pytest.mark.parametrize("free", [False, True])
def test_sparse_optimum_matches_clarabel(free):
    """Many cells zero at the optimum (the face repair certifies there): the optimum to 1e-9
    and the point against Clarabel's."""
    G, y, w, p = _sparse_problem(free)
    out = local_newton.solve(p, eps_rel=1e-9, max_iters=100, deadline=float("inf"))
    prob, ref = cvxpy_reference(G, y, w, p.total)
    assert out.converged and out.lower <= ref + 1e-9 * abs(ref)
    assert out.objective == pytest.approx(ref, rel=1e-9)
    assert np.mean(out.face == 0) > 0.2
    t = prob.variables()[0].value
    assert np.max(np.abs(out.x - t)) <= 1e-4 * max(1.0, np.abs(t).max())


def test_cg_stops_when_the_preconditioned_residual_vanishes():
    """The stress kind ``local_mixed`` (instance 43 of seed 0) ended in ``ZeroDivisionError``
    inside the face repair's conjugate gradients: ``r^T P(prec r)`` came out exactly 0 with
    the direction not 0, and the next step divided by it.  Here ``project`` returns a vector
    orthogonal to the residual once; the iteration must stop there, not divide by zero."""
    from types import SimpleNamespace

    from cvxdp.solvers.local.newton import _cg

    calls = []

    def project(v):
        calls.append(1)
        return np.array([v[1], -v[0]]) if len(calls) == 2 else v

    x, steps = _cg(lambda v: np.array([1.0, 2.0]) * v, np.array([2.0, 1.0]), np.ones(2),
                   SimpleNamespace(project=project), 0.0)
    assert steps == 1 and np.all(np.isfinite(x))

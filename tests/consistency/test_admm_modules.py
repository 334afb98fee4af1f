"""The ADMM numerical layer's modules through their array interfaces: the polish
(PolishResult), the separable dual points, the forest's interval multipliers, the KKT
check and the infeasibility certificate."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from cvxdp.solvers.consistency import admm
from cvxdp.solvers.consistency.admm import ADMMSettings, ConsistencyData, solve
from cvxdp.solvers.consistency.certify import separating_hyperplane
from cvxdp.solvers.consistency.duals import separable_dual_value
from cvxdp.solvers.consistency.kkt import kkt_check
from cvxdp.solvers.consistency.polish import (GeneralPoint, PolishResult, SeparablePoint, polish_general,
                                       polish_separable)
from cvxdp.solvers.consistency.affine import AffineProjector, make_projector
from cvxdp.solvers.consistency.losses import SeparableLoss
from cvxdp.solvers.tree.forest import Forest, distinct

from conftest import complete_parent, random_forest


def tree_problem(rng, h=4, l1=True):
    """Nodes of a complete binary tree measured directly, consistency, x >= 0."""
    parent = complete_parent(2, h)
    F = Forest(parent)
    n = F.n
    C = F.consistency_matrix()
    truth = np.zeros(n)
    truth[F.leaves] = rng.integers(0, 5, F.leaves.size)
    truth = F.sum_up(truth)
    y = truth + rng.laplace(size=n)
    w1 = np.ones(n) if l1 else np.zeros(n)
    w2 = np.zeros(n) if l1 else np.ones(n)
    return ConsistencyData(n=n, M=sp.identity(n, format="csr"), y=y, w1=w1, w2=w2,
                           lower=np.zeros(n), upper=np.full(n, np.inf), A=C, b=np.zeros(C.shape[0]))


def test_public_names_stay_importable():
    assert {"solve", "ADMMSettings", "ADMMState", "ConsistencyData"} <= set(admm.__all__)


@pytest.mark.parametrize("seed", range(4))
def test_interval_multipliers_lie_in_the_intervals_and_in_the_range(seed):
    rng = np.random.default_rng(seed)
    F = Forest(random_forest(40, rng))
    C = F.consistency_matrix().toarray()
    y = rng.normal(size=C.shape[0])
    lam0 = C.T @ y
    L, U = lam0 - rng.random(F.n), lam0 + rng.random(F.n)     # a point inside exists
    y_ref = np.zeros(F.n)
    y_ref[F.is_internal] = y + rng.normal(size=y.size)
    lam = F.interval_multipliers(L, U, y_ref, 1e-12)
    assert lam is not None
    assert np.all(lam >= L - 1e-9) and np.all(lam <= U + 1e-9)
    yy = np.linalg.lstsq(C.T, lam, rcond=None)[0]
    np.testing.assert_allclose(C.T @ yy, lam, atol=1e-9)


def test_interval_multipliers_report_a_conflict():
    F = Forest(np.array([-1, 0, 0]))
    # lam = (y, -y, -y): lam_0 >= 1 and lam_1 >= 0 cannot both hold
    L = np.array([1.0, 0.0, -np.inf])
    U = np.full(3, np.inf)
    assert F.interval_multipliers(L, U, np.zeros(3), 1e-12) is None


def test_distinct():
    assert distinct(np.array([3, 1, 2]), 4) and distinct(np.array([], dtype=int), 0)
    assert not distinct(np.array([0, 2, 0]), 3)


@pytest.mark.parametrize("l1", [True, False])
def test_polish_separable_is_a_function_of_arrays(l1):
    rng = np.random.default_rng(1)
    data = tree_problem(rng, l1=l1)
    res = solve(data, ADMMSettings(eps_abs=1e-9, eps_rel=1e-9, polish=False, max_iters=5000))
    f = data.separable_loss()
    proj = make_projector(data.A, data.b)
    st = res.state                             # the prox output has exact zeros and bound hits
    x = f.prox(st.z - st.u, st.rho)
    p = SeparablePoint(f=f, proj=proj, x=x, lam=st.rho * st.u, lam_dual=None, rho=st.rho,
                       constant=0.0, eps_abs=1e-9, eps_rel=1e-6)
    pol = polish_separable(p)
    assert isinstance(pol, PolishResult) and pol.ok and pol.reason == "ok" and pol.rounds >= 1
    assert np.max(np.abs(data.A @ pol.x)) <= 1e-9 and pol.x.min() >= 0
    assert pol.certified_gap <= 1e-6
    assert abs(pol.objective - data.objective(pol.x)) <= 1e-9 * max(1, abs(pol.objective))
    assert {"eq", "lower", "upper"} <= set(pol.duals)


def test_polish_separable_tries_last_winner_first_and_skips_last_failures(monkeypatch):
    """Within one solve: the candidate that gave the last point goes first, and those that
    failed last time run only while no candidate has given a point (``later``); the result
    says which won and which failed.  (The dual point's two candidates are made to fail.)"""
    from cvxdp.solvers.consistency import polish as P
    rng = np.random.default_rng(1)
    data = tree_problem(rng, l1=True)
    res = solve(data, ADMMSettings(eps_abs=1e-9, eps_rel=1e-9, polish=False, max_iters=5000))
    f, st = data.separable_loss(), res.state
    base = dict(f=f, proj=make_projector(data.A, data.b), x=f.prox(st.z - st.u, st.rho),
                lam=st.rho * st.u, lam_dual=-st.rho * st.u, rho=st.rho, constant=0.0,
                eps_abs=1e-9, eps_rel=-1.0)       # nothing certifies: every candidate runs
    tried = []
    real_set, real_once = P._separable_active_set, P._polish_separable_once

    def active_set(p, use_dual):
        tried.append(use_dual)
        act = real_set(p, use_dual)
        act.zero[0] ^= use_dual              # the dual point's guesses differ from the primal's
        return act

    def once(p, act, face):
        if tried[-1]:
            return P.PolishResult(reason="forced failure", rounds=6)
        return real_once(p, act, face)
    monkeypatch.setattr(P, "_separable_active_set", active_set)
    monkeypatch.setattr(P, "_polish_separable_once", once)
    first = P.polish_separable(SeparablePoint(**base))
    assert first.ok and set(first.failed) == {(True, False), (True, True)}
    assert first.variant in {(False, True), (False, False)} and len(tried) == 4
    tried.clear()
    again = P.polish_separable(SeparablePoint(**base, first=first.variant, later=first.failed))
    assert again.ok and tried == [False, False] and again.failed == ()
    tried.clear()
    thorough = P.polish_separable(SeparablePoint(**base, first=first.variant))
    assert thorough.ok and tried[0] is False and len(tried) == 4


def test_polish_separable_orders_candidates_by_loss_and_stops_a_scheduled_try(monkeypatch):
    """Pure L1: the primal point's face projection first, a dual-point candidate second
    (measured: the dual-point candidates of sparse L1 trees failed after 5-6 rounds where the
    primal face certified in 1-2); smooth coordinates beside pure-L1 ones: the regularised
    candidates first.  A scheduled try stops at the first candidate that gives a point; a
    thorough one runs on while nothing certifies."""
    from cvxdp.solvers.consistency import polish as P
    rng = np.random.default_rng(1)
    data = tree_problem(rng, l1=True)
    res = solve(data, ADMMSettings(eps_abs=1e-9, eps_rel=1e-9, polish=False, max_iters=5000))
    f, st = data.separable_loss(), res.state
    base = dict(proj=make_projector(data.A, data.b), x=f.prox(st.z - st.u, st.rho),
                lam=st.rho * st.u, lam_dual=-st.rho * st.u, rho=st.rho, constant=0.0,
                eps_abs=1e-9, eps_rel=-1.0)       # nothing certifies
    tried, use = [], []
    real_set, real_once = P._separable_active_set, P._polish_separable_once

    def active_set(p, use_dual):
        use.append(use_dual)
        act = real_set(p, use_dual)
        act.zero[0] ^= use_dual              # the two points' guesses differ
        return act

    def once(p, act, face):
        tried.append((use[-1], face))
        return real_once(p, act, face)
    monkeypatch.setattr(P, "_separable_active_set", active_set)
    monkeypatch.setattr(P, "_polish_separable_once", once)
    pol = P.polish_separable(SeparablePoint(f=f, **base))
    assert pol.ok and tried == list(P._ORDER_L1) and tried[:2] == [(False, True), (True, False)]
    tried.clear()
    pol = P.polish_separable(SeparablePoint(f=f, scheduled=True, **base))
    assert pol.ok and tried == [(False, True)]
    # a squared loss on the internal nodes beside pure-L1 leaves: regularised candidates first
    w2 = Forest(complete_parent(2, 4)).is_internal.astype(float)         # tree_problem's tree
    mixed = SeparableLoss(y=f.y, w1=np.where(w2 > 0, 0.0, f.w1), w2=w2, lower=f.lower, upper=f.upper)
    assert mixed.pure_l1.any() and (mixed.w2 > 0).any()
    tried.clear()
    P.polish_separable(SeparablePoint(f=mixed, **base))
    assert tried[:2] == [(True, False), (False, False)]


def test_polish_reports_why_it_failed():
    pol = PolishResult(reason="not available")
    assert not pol.ok and pol.certified_gap == np.inf


def test_polish_general_on_a_dense_measurement():
    rng = np.random.default_rng(2)
    n, m = 8, 12
    M = sp.csr_matrix(rng.integers(0, 2, (m, n)).astype(float))
    data = ConsistencyData(n=n, M=M, y=M @ rng.random(n) + 0.1 * rng.normal(size=m), w1=np.zeros(m),
                           w2=np.ones(m), lower=np.zeros(n), upper=np.full(n, np.inf))
    res = solve(data, ADMMSettings(eps_abs=1e-9, eps_rel=1e-9, polish=False, max_iters=20000))
    r = M @ res.x - data.y
    pol = polish_general(GeneralPoint(data, x=res.x, r=r, x_bounds=np.maximum(res.x, 0) * (res.x > 1e-8),
                                      rho=1.0, eps_abs=1e-9))
    assert pol.ok and pol.w is not None and pol.certified_gap <= 1e-8
    chk = kkt_check(data, pol.x, pol.duals, pol.w, 1e-9, 1e-8)
    assert chk["ok"], chk


def test_separable_dual_value_is_a_lower_bound():
    rng = np.random.default_rng(3)
    data = tree_problem(rng)
    res = solve(data, ADMMSettings(eps_abs=1e-10, eps_rel=1e-10))
    f = data.separable_loss()
    proj = make_projector(data.A, data.b)
    for _ in range(5):
        val, _ = separable_dual_value(f, proj, None, rng.normal(size=data.n), 0.0)
        assert val <= res.objective + 1e-9


def test_separating_hyperplane_between_box_and_affine_set():
    A = sp.csr_matrix(np.ones((1, 3)))
    proj = AffineProjector(A, np.array([10.0]))       # x1 + x2 + x3 = 10, but x <= 1
    lower, upper = np.zeros(3), np.ones(3)
    cert = separating_hyperplane(np.ones(3), lower, upper, proj, 1.0)
    assert cert is not None and cert["box_support"] < cert["affine_level"]
    assert separating_hyperplane(np.ones(3), lower, np.full(3, 5.0), proj, 1.0) is None


def test_separable_loss_is_cached_and_detects_shared_columns():
    n = 4
    M = sp.csr_matrix(np.eye(n)[[0, 1, 1]])
    data = ConsistencyData(n=n, M=M, y=np.zeros(3), w1=np.ones(3), w2=np.zeros(3),
                           lower=np.full(n, -np.inf), upper=np.full(n, np.inf))
    assert data.separable_loss() is None
    data.M = sp.csr_matrix(2.0 * np.eye(n)[[0, 1, 3]])
    data.y = np.ones(3)
    f = data.separable_loss()
    assert isinstance(f, SeparableLoss) and f is data.separable_loss()
    np.testing.assert_allclose(f.y, [0.5, 0.5, 0.0, 0.5])
    np.testing.assert_allclose(f.w1, [2.0, 2.0, 0.0, 2.0])


def test_polish_general_signs_the_multipliers_of_rows_between_fixed_coordinates():
    """``x1 = x2 = x3`` (two equality rows reading only coordinates at their bound 0): the
    least squares leaves those rows' multipliers at zero, so ``x2``'s bound multiplier came out
    -3 (its measurement pulls it up) and the bound was ``-inf`` though the point is optimal
    (the chain as a whole has reduced cost 10 - 3 > 0).  A small LP gives them their signs."""
    M = sp.csr_matrix(np.array([[1.0, 0, 0, 0], [1.0, 0, 0, 0], [0, 1.0, 0, 0], [0, 0, 1.0, 0]]))
    A = sp.csr_matrix(np.array([[0, 1.0, -1.0, 0], [0, 0, 1.0, -1.0]]))
    data = ConsistencyData(n=4, M=M, y=np.array([5.0, 6.0, -10.0, 3.0]), w1=np.zeros(4), w2=np.ones(4),
                           lower=np.zeros(4), upper=np.full(4, np.inf), A=A, b=np.zeros(2))
    x = np.array([5.5, 0.0, 0.0, 0.0])
    pol = polish_general(GeneralPoint(data, x=x, r=M @ x - data.y, x_bounds=x, rho=1.0, eps_abs=1e-9))
    assert pol.ok and pol.certified_gap <= 1e-12, (pol.reason, pol.lower_bound)
    assert pol.objective == pytest.approx(0.25 + 50.0 + 4.5)
    assert np.all(pol.duals["lower"] >= 0)
    chk = kkt_check(data, pol.x, pol.duals, pol.w, 1e-9, 1e-8)
    assert chk["ok"], chk


def test_a_dual_point_off_a_forest_is_repaired_by_an_lp():
    """``min |x0 - 4| + |x1 - 3| + |x2 - 1|`` s.t. ``sum x = 10``, ``x0 = x2``, ``x >= 0``
    (optimum 3; ``x3`` unmeasured).  The multiplier ``A^T [-1e-3, 0.5]`` has ``lam_3 < 0``,
    outside ``x3``'s domain ``lam_3 >= 0``: no scaling ``theta lam`` mends a sign, so the bound
    was the trivial 0.  The nearest points of ``range(A^T)`` in the domain (1-norm) are
    ``A^T [0, b]`` for ``b`` in ``[0.499, 0.501]``, with bounds ``3 b`` near 1.5."""
    from cvxdp.solvers.consistency.affine import AffineProjector
    from cvxdp.solvers.consistency.losses import SeparableLoss

    A = sp.csr_matrix(np.array([[1.0, 1, 1, 1], [1, 0, -1, 0]]))
    proj = AffineProjector(A, np.array([10.0, 0.0]))
    f = SeparableLoss(np.array([4.0, 3.0, 1.0, 0.0]), np.array([1.0, 1.0, 1.0, 0.0]), np.zeros(4),
                      np.zeros(4), np.full(4, np.inf))
    lam = A.T @ np.array([-1e-3, 0.5])
    val, repaired = separable_dual_value(f, proj, None, lam, 0.0)
    assert 1.497 - 1e-9 <= val <= 1.503 + 1e-9 and val <= 3.0
    assert repaired[1] == pytest.approx(0.0, abs=1e-9) and repaired[3] >= 0
    np.testing.assert_allclose(proj.project_nullspace(repaired), 0.0, atol=1e-12)

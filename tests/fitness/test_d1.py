"""Fitness for use at d = 1 (one cell, ``X`` of shape (1, 1)) in every spelling the docs
promise, against Clarabel, with the written duals checked by their Lagrangian.

At d = 1 the Lagrangian has a closed-form minimum over ``x > 0``: Problem 1,
``a beta x + sum_i lam_i (l_i^2 / x - c_i)`` (``beta = max_j b_j^2``), is at least
``2 sqrt(a beta sum_i lam_i l_i^2) - lam^T c``; Problem 2 adds ``s (1 - mu^T c)``, bounded
over ``0 <= s <= 2 s*`` as the stress set does."""
import numpy as np
import pytest
import cvxpy as cp

import cvxdp

TIGHT = dict(tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10)
SCALES = [1e-6, 1e-2, 1.0, 1e3, 1e9]            # variance targets from 1e-6 to 1e9


def instance(seed: int, target: float):
    """A random d = 1 workload (m rows of L, a basis B of shape (1, n)) and targets near
    ``target``."""
    rng = np.random.default_rng(seed)
    m, n = int(rng.integers(1, 6)), int(rng.integers(1, 4))
    L = rng.normal(size=(m, 1)) * rng.choice([1.0, 10.0])
    B = rng.normal(size=(1, n))
    c = target * rng.uniform(1.0, 4.0, m)
    return L, B, c


def variable(kind: str) -> tuple[cp.Variable, list]:
    """X as the attribute ``PSD=True`` or as ``X >> 0`` on a symmetric variable."""
    if kind == "psd":
        return cp.Variable((1, 1), PSD=True), []
    X = cp.Variable((1, 1), symmetric=True)
    return X, [X >> 0]


def cost(B, X, spelling: str):
    if spelling == "atom":
        return cvxdp.privacy_cost(B, X)
    return cp.max(cp.diag(B.T @ X @ B))


def variances(L, X, c, spelling: str, s=None) -> list:
    """``query_variance(L, X) <= c`` or ``cp.matrix_frac(l_i, X) <= c_i`` per row (Problem 2:
    ``s * c``, ``s * c_i``)."""
    if spelling == "atom":
        return [cvxdp.query_variance(L, X) <= (c if s is None else s * c)]
    return [cp.matrix_frac(L[i], X) <= (c[i] if s is None else s * c[i])
            for i in range(L.shape[0])]


def dual_vector(cons) -> np.ndarray:
    return np.concatenate([np.atleast_1d(np.asarray(con.dual_value, dtype=float)) for con in cons])


def clarabel(prob: cp.Problem, factor: float) -> float:
    """Clarabel's optimum of ``prob``, solved at targets divided by ``factor`` (where its
    tolerances are meaningful) and scaled back: the optimum is homogeneous in the targets."""
    prob.solve(solver=cp.CLARABEL, **TIGHT)
    assert prob.status == cp.OPTIMAL
    return prob.value * factor


@pytest.mark.parametrize("target", SCALES)
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("obj,var,rows", [("atom", "psd", "atom"), ("plain", "psd", "plain"),
                                          ("plain", "sym", "atom"), ("scaled", "sym", "plain")])
def test_problem_one_at_d_equals_one(seed, target, obj, var, rows):
    L, B, c = instance(seed, target)
    a = 2.5 if obj == "scaled" else 1.0
    X, psd = variable(var)
    cons = variances(L, X, c, rows)
    prob = cp.Problem(cp.Minimize(a * cost(B, X, "atom" if obj == "atom" else "plain")),
                      cons + psd)
    ours = prob.solve(method="cvxdp", solver=cvxdp.NEWTON_CG, eps_rel=1e-9)
    assert prob.status == cp.OPTIMAL
    lam = dual_vector(cons)
    assert np.all(lam >= 0)
    beta = float(np.max(B * B))
    bound = 2.0 * np.sqrt(a * beta * float(lam @ (L[:, 0] ** 2))) - float(lam @ c)
    assert (ours - bound) / max(1.0, abs(ours)) <= 1e-6
    Xn, psd_n = variable(var)                     # the same model at targets / target
    ref_prob = cp.Problem(cp.Minimize(a * cost(B, Xn, "atom" if obj == "atom" else "plain")),
                          variances(L, Xn, c / target, rows) + psd_n)
    assert ours == pytest.approx(clarabel(ref_prob, 1.0 / target), rel=1e-6)


@pytest.mark.parametrize("target", SCALES)
@pytest.mark.parametrize("seed", [3, 4])
@pytest.mark.parametrize("spelling", ["atom", "plain"])
def test_problem_two_at_d_equals_one(seed, target, spelling):
    L, B, c = instance(seed, target)
    rho = float(np.random.default_rng(seed).uniform(0.5, 4.0))
    X, s = cp.Variable((1, 1), PSD=True), cp.Variable()
    cons = variances(L, X, c, spelling, s)
    budget = cost(B, X, spelling) <= rho
    prob = cp.Problem(cp.Minimize(s), cons + [budget])
    ours = prob.solve(method="cvxdp", solver=cvxdp.NEWTON_CG, eps_rel=1e-9)
    assert prob.status == cp.OPTIMAL
    mu, nu = dual_vector(cons), float(budget.dual_value)
    assert np.all(mu >= 0) and nu >= 0
    beta = float(np.max(B * B))
    bound = (min(0.0, 1.0 - float(mu @ c)) * 2.0 * ours
             + 2.0 * np.sqrt(nu * beta * float(mu @ (L[:, 0] ** 2))) - nu * rho)
    assert (ours - bound) / max(1.0, abs(ours)) <= 1e-6
    Xn, sn = cp.Variable((1, 1), PSD=True), cp.Variable()
    ref_prob = cp.Problem(cp.Minimize(sn), variances(L, Xn, c / target, spelling, sn)
                          + [cost(B, Xn, spelling) <= rho])
    assert ours == pytest.approx(clarabel(ref_prob, 1.0 / target), rel=1e-6)


def test_an_off_diagonal_is_not_read_as_the_privacy_cost():
    """``cp.diag(M, k=1)`` is an off-diagonal: not the privacy cost (it was read as one, and
    an unbounded problem was called optimal)."""
    X = cp.Variable((3, 3), PSD=True)
    prob = cp.Problem(cp.Minimize(cp.max(cp.diag(np.eye(3) @ X @ np.eye(3), k=1))),
                      [cp.matrix_frac(np.ones(3), X) <= 1.0])
    with pytest.raises(cvxdp.NotRecognised, match="the objective max"):
        prob.solve(method="cvxdp", solver=cvxdp.NEWTON_CG)

"""The non-negative, consistent reconstruction from residual answers: ``minimize
cvxdp.nll(measurement, marginals)`` over a LocalPolytope, by ``cvxdp.ADMM`` in residual
coordinates, against Clarabel on the same model (known and free totals, degenerate cliques),
the written duals by a Lagrangian check, and the estimate's error against the unbiased one."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import cvxpy as cp

import cvxdp
import cvxdp.solvers.residual.measure

CLARABEL = dict(tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10)


def _reference(prob: cp.Problem) -> float:
    """Clarabel at tight tolerances, or at its defaults where those fail (it does at some)."""
    try:
        return prob.solve(solver=cp.CLARABEL, **CLARABEL)
    except cp.error.SolverError:
        return prob.solve(solver=cp.CLARABEL)


def _measure(seed, sizes, cliques, target, n=40, sparse=True):
    rng = np.random.default_rng(seed)
    dom = cvxdp.Domain({f"x{i}": k for i, k in enumerate(sizes)})
    cols = [rng.choice(k, n, p=np.r_[1.0, np.zeros(k - 1)]) if sparse and i % 2 else
            rng.integers(0, k, n) for i, k in enumerate(sizes)]
    recs = np.column_stack(cols)
    W = cvxdp.workloads.marginal_workload(dom, [tuple(dom.names[a] for a in c) for c in cliques])
    s = cp.Variable(W.n_residuals, pos=True)
    cp.Problem(cp.Minimize(cvxdp.privacy_cost(W, s)),
               [cvxdp.query_variance(W, s) <= target]).solve(method="cvxdp")
    return dom, recs, W, cvxdp.mechanisms.residual_gaussian(W, s.value, recs, rng=seed)


def _model(dom, W, m, total, order=None):
    cliques = list(W.cliques) if order is None else order
    mus = {c: cp.Variable(dom.shape(c)) for c in cliques}
    prob = cp.Problem(cp.Minimize(cvxdp.nll(m, mus)), [cvxdp.LocalPolytope(mus, dom, total=total)])
    return mus, prob


def _loss_matrix(dom, m, mus):
    """``(R, r)`` with ``nll(m, x) = ||R x - r||^2 / 2`` (``x`` the marginals stacked flat, C
    order, axes as given), built densely from the definition: residual ``A`` read from the
    first marginal holding it, centred by ``(x) (I - 1 1^T / n)``, weighted by ``1 / sqrt(s_A)``."""
    W = m.workload
    cliques = list(mus)
    offsets = np.cumsum([0] + [dom.size(c) for c in cliques])
    rows, rhs = [], []
    for j, A in enumerate(W.residuals):
        if W.basis.p[j] == 0:
            continue
        k = next(i for i, c in enumerate(cliques) if set(A) <= set(c))
        C = cliques[k]
        idx = np.indices(dom.shape(C)).reshape(len(C), -1)
        shape_A = tuple(dom[a] for a in A)
        cells_A = int(np.prod(shape_A)) if A else 1
        target = (np.ravel_multi_index(tuple(idx[C.index(a)] for a in A), shape_A) if A
                  else np.zeros(idx.shape[1], int))
        marg = np.zeros((cells_A, offsets[-1]))
        marg[target, offsets[k] + np.arange(idx.shape[1])] = 1.0
        P = np.ones((1, 1))
        for a in A:
            P = np.kron(P, np.eye(dom[a]) - 1.0 / dom[a])
        y = np.asarray(m.answers[j], dtype=float)
        z = cvxdp.solvers.residual.measure.sub_pinv(y, list(shape_A)) if A else y
        rows.append(P @ marg / np.sqrt(m.variances[j]))
        rhs.append(np.ravel(z) / np.sqrt(m.variances[j]))
    return np.vstack(rows), np.concatenate(rhs)


def _lagrangian_bound(dom, m, mus, duals, total) -> float:
    """``min_x f(x) + y^T x + min_t -y^T t`` over ``t`` in the local polytope: the first by
    least squares on the loss written out densely (``-inf`` unless ``y`` is in the range of
    ``R^T``), the second a linear program (HiGHS), ``t`` in a box that holds the optimum (with a
    free total the polytope is a cone)."""
    R, r = _loss_matrix(dom, m, mus)
    y = np.concatenate([np.asarray(d, dtype=float).ravel() for d in duals])
    x, *_ = np.linalg.lstsq(R.T @ R, R.T @ r - y, rcond=None)
    if np.linalg.norm(R.T @ (R @ x - r) + y) > 1e-6 * max(1.0, np.linalg.norm(y)):
        return -np.inf
    quad = 0.5 * float(np.sum((R @ x - r) ** 2)) + float(y @ x)
    big = 4.0 * max(1.0, max(float(np.sum(np.abs(v.value))) for v in mus.values()))
    ts = {c: cp.Variable(dom.shape(c)) for c in mus}
    lin = cp.Problem(cp.Minimize(-sum(cp.sum(cp.multiply(yc, ts[c])) for c, yc in zip(mus, duals))),
                     [cvxdp.LocalPolytope(ts, dom, total=total)] + [t <= big for t in ts.values()])
    return quad + lin.solve(solver=cp.HIGHS)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("known", [False, True])
def test_against_clarabel_with_certifying_duals(seed, known):
    rng = np.random.default_rng(seed)
    k = int(rng.integers(2, 5))
    sizes = rng.integers(2, 6, k).tolist()
    cliques = list(itertools.combinations(range(k), int(rng.integers(1, min(k, 3) + 1))))
    dom, recs, W, m = _measure(seed, sizes, cliques, float(rng.uniform(5, 60)))
    total = float(len(recs)) if known else None
    mus, prob = _model(dom, W, m, total)
    prob.solve(method="cvxdp", solver=cvxdp.ADMM, eps_rel=1e-9)
    assert prob.status == cp.OPTIMAL
    assert prob.solver_stats.extra_stats["info"]["route"] == "residual ADMM"
    ours = prob.value
    tables = {c: v.value.copy() for c, v in mus.items()}
    duals = [np.asarray(d).copy() for d in prob.constraints[0].dual_value]
    for c, t in tables.items():                              # non-negative and consistent
        assert t.min() >= -1e-9
        for d, u in tables.items():
            shared = [a for a in c if a in d]
            if shared:
                a_ = t.sum(axis=tuple(i for i, a in enumerate(c) if a not in shared))
                b_ = u.sum(axis=tuple(i for i, a in enumerate(d) if a not in shared))
                np.testing.assert_allclose(a_, np.transpose(b_, [[a for a in d if a in shared].index(x)
                                                                 for x in [a for a in c if a in shared]])
                                           if a_.ndim > 1 else b_, atol=1e-7 * max(1, len(recs)))
    bound = _lagrangian_bound(dom, m, mus, duals, total)
    assert (ours - bound) / max(1.0, ours) <= 1e-6
    assert ours == pytest.approx(_reference(cp.Problem(prob.objective, prob.constraints)),
                                 rel=1e-6, abs=1e-7)


def test_clique_axis_order_scaling_and_a_single_clique():
    """Marginals whose axes are in another order than the domain's, a scaled objective with a
    constant, one clique, attributes of size 1."""
    dom, recs, W, m = _measure(3, [3, 1, 4], [(0, 1, 2)], 20.0)
    mus = {("x2", "x0", "x1"): cp.Variable((4, 3, 1))}
    prob = cp.Problem(cp.Minimize(3.0 * cvxdp.nll(m, mus) + 2.0),
                      [cvxdp.LocalPolytope(mus, dom, total=None)])
    prob.solve(method="cvxdp", solver=cvxdp.ADMM, eps_rel=1e-9)
    assert prob.status == cp.OPTIMAL
    ours = prob.value
    assert ours == pytest.approx(_reference(cp.Problem(prob.objective, prob.constraints)), rel=1e-6)


def test_lower_error_than_the_unbiased_reconstruction_on_sparse_data():
    """On sparse data (most cells empty) the non-negative estimate's squared error over the
    workload is below the unbiased reconstruction's, summed over 8 releases."""
    ours = unbiased = 0.0
    for seed in range(8):
        dom, recs, W, m = _measure(seed, [5, 4, 6, 3], list(itertools.combinations(range(4), 2)),
                                   50.0, n=60)
        mus, prob = _model(dom, W, m, None)
        prob.solve(method="cvxdp", solver=cvxdp.ADMM, eps_rel=1e-7)
        est = cvxdp.reconstruct(W, m)
        for c in W.cliques:
            truth = dom.count(recs, c)
            ours += float(np.sum((mus[c].value - truth) ** 2))
            unbiased += float(np.sum((est[c] - truth) ** 2))
    assert ours < unbiased


def test_mismatched_models_are_refused():
    dom, recs, W, m = _measure(0, [3, 3, 2], [(0, 1), (1, 2)], 10.0)
    mus = {c: cp.Variable(dom.shape(c)) for c in W.cliques}
    other = {c: cp.Variable(dom.shape(c)) for c in W.cliques}
    prob = cp.Problem(cp.Minimize(cvxdp.nll(m, mus)), [cvxdp.LocalPolytope(other, dom)])
    with pytest.raises(cvxdp.NotRecognised, match="other marginals"):
        prob.solve(method="cvxdp", solver=cvxdp.ADMM)
    with pytest.raises(ValueError, match="no marginal holds"):
        cvxdp.nll(m, {("x0", "x1"): cp.Variable((3, 3))})


@pytest.mark.parametrize("target, n", [(1e-4, 40), (1e4, 40), (20.0, 100000)])
@pytest.mark.parametrize("known", [False, True])
def test_extreme_scales(target, n, known):
    """Targets from 1e-4 to 1e4 per cell and 100,000 records: the same optimum as Clarabel,
    duals that pass the Lagrangian check."""
    dom, recs, W, m = _measure(7, [3, 4, 2, 3], list(itertools.combinations(range(4), 2)), target,
                               n=n)
    total = float(n) if known else None
    mus, prob = _model(dom, W, m, total)
    prob.solve(method="cvxdp", solver=cvxdp.ADMM, eps_rel=1e-7)
    assert prob.status == cp.OPTIMAL
    ours = prob.value
    duals = [np.asarray(d).copy() for d in prob.constraints[0].dual_value]
    assert (ours - _lagrangian_bound(dom, m, mus, duals, total)) / max(1.0, ours) <= 1e-6
    ref = _reference(cp.Problem(prob.objective, prob.constraints))
    assert ours == pytest.approx(ref, rel=1e-6, abs=1e-6)

"""The active-set polish of quadratic marginal losses (solvers.marginal_polish) against
Clarabel on the local polytope: exact optima with many empty cells, tight certificates,
general linear measurements, forests, the model built from polished clique tables."""
from __future__ import annotations

import numpy as np
import pytest
import cvxpy as cp

import cvxdp
from cvxdp.solvers.marginal.inference import GraphicalModel
from cvxdp.solvers.marginal.junction_tree import JunctionTree
from cvxdp.solvers.marginal.loss import LossTerm, MarginalLoss
from cvxdp.solvers.marginal.polish import LocalPolytopeQP


def sparse_instance(seed, sizes, cliques, sigma=2.0, n_records=300, n_values=4):
    """Records drawn from a few distinct rows, so most cells of the optimum are empty."""
    rng = np.random.default_rng(seed)
    names = [f"a{i}" for i in range(len(sizes))]
    dom = cvxdp.Domain(dict(zip(names, sizes)))
    rows = np.column_stack([rng.integers(0, s, n_values) for s in sizes])
    data = rows[rng.integers(0, n_values, n_records)]
    cl = [tuple(names[i] for i in c) for c in cliques]
    ys = {c: dom.count(data, c) + rng.normal(0, sigma, dom.shape(c)) for c in cl}
    return dom, data, cl, ys


def build(dom, cl, ys, sigma, total, weights=None):
    mus = {c: cp.Variable(dom.shape(c)) for c in cl}
    w = weights or {c: 1.0 for c in cl}
    obj = sum(w[c] * cp.sum_squares(mus[c] - ys[c]) for c in cl) / (2 * sigma ** 2)
    mp = cvxdp.MarginalPolytope(mus, dom, total=total)
    return cp.Problem(cp.Minimize(obj), [mp]), mus, mp


def clarabel(prob, mus):
    prob.solve(method="cvxdp", solver=cp.CLARABEL)
    assert prob.status == "optimal"
    return prob.value, {c: v.value.copy() for c, v in mus.items()}


CASES = [
    ([4, 3, 5, 2], [(0, 1), (1, 2), (2, 3)]),                # chain
    ([3, 4, 2, 3], [(0, 1), (1, 2), (2, 0), (3,), (2, 3)]),  # cycle: triangulated
    ([3, 2, 4, 3], [(0, 1), (2, 3)]),                        # forest: two components
    ([2, 3, 2, 2, 3], [(0, 1, 2), (2, 3), (1,), (3, 4)]),    # mixed orders
]


@pytest.mark.parametrize("sizes,cliques", CASES)
def test_polish_reaches_the_optimum_with_a_tight_certificate(sizes, cliques):
    dom, data, cl, ys = sparse_instance(1, sizes, cliques)
    N = float(len(data))
    prob, mus, mp = build(dom, cl, ys, 2.0, N)
    prob.solve(method="cvxdp", solver=cvxdp.MIRROR_DESCENT, polish_start=20, eps_rel=1e-9)
    st = prob.solver_stats.extra_stats
    assert prob.status == "optimal" and st["info"]["polished"]
    ours, got = prob.value, {c: v.value.copy() for c, v in mus.items()}
    assert st["lower_bound"] <= ours
    assert ours - st["lower_bound"] <= 1e-9 * ours + 1e-12
    assert mp.residual < 1e-8 * N
    for c in cl:
        assert got[c].min() >= 0
    # many cells of the optimum are empty: the case entropic mirror descent only approaches
    multi = np.concatenate([got[c].ravel() for c in cl if len(c) > 1])
    assert (multi < 1e-9 * N).mean() > 0.2
    ref, ref_mu = clarabel(prob, mus)
    assert st["lower_bound"] <= ref * (1 + 1e-7) + 1e-9       # the certificate is a bound
    assert ours == pytest.approx(ref, rel=1e-7, abs=1e-9)
    for c in cl:                                              # measured marginals are unique
        np.testing.assert_allclose(got[c], ref_mu[c], atol=1e-4 * N ** 0.5)
    # the model is the junction-tree distribution of the polished tables
    for c in cl:
        np.testing.assert_allclose(mp.model.marginal(c), got[c], atol=1e-8 * N)


def test_weighted_and_general_linear_measurements():
    """A non-diagonal curvature (a dense query over a marginal) takes the block-matrix path."""
    dom, data, cl, ys = sparse_instance(4, [3, 4, 3], [(0, 1), (1, 2)])
    N = float(len(data))
    rng = np.random.default_rng(0)
    mus = {c: cp.Variable(dom.shape(c)) for c in cl}
    Q = rng.normal(size=(5, dom.size(cl[1])))
    q = Q @ dom.count(data, cl[1]).ravel() + rng.normal(0, 3.0, 5)
    obj = (cp.sum_squares(mus[cl[0]] - ys[cl[0]]) / 8 + 2.0 * cp.sum_squares(mus[cl[1]] - ys[cl[1]])
           + cp.sum_squares(Q @ cp.vec(mus[cl[1]], order="C") - q) / 18)
    prob = cp.Problem(cp.Minimize(obj), [cvxdp.MarginalPolytope(mus, dom, total=N)])
    prob.solve(method="cvxdp", solver=cvxdp.MIRROR_DESCENT, polish_start=20, eps_rel=1e-9)
    assert prob.status == "optimal" and prob.solver_stats.extra_stats["info"]["polished"]
    ours = prob.value
    ref, _ = clarabel(prob, mus)
    assert ours == pytest.approx(ref, rel=1e-7)


def test_polish_off_is_plain_mirror_descent():
    dom, data, cl, ys = sparse_instance(2, [3, 3, 2], [(0, 1), (1, 2)])
    prob, mus, mp = build(dom, cl, ys, 2.0, float(len(data)))
    prob.solve(method="cvxdp", solver=cvxdp.MIRROR_DESCENT, polish=False, max_iters=3000, eps_rel=1e-5)
    st = prob.solver_stats.extra_stats
    assert not st["info"]["polished"] and st["info"]["polish"] == []
    assert mp.model.theta is not None                          # the exponential-family model
    ours = prob.value
    ref, _ = clarabel(prob, mus)
    assert ours >= ref * (1 - 1e-7)
    assert ours == pytest.approx(ref, rel=1e-3)


def test_l1_losses_take_the_exact_lp_and_match_clarabel():
    dom, data, cl, ys = sparse_instance(3, [3, 2, 2], [(0, 1), (1, 2)])
    mus = {c: cp.Variable(dom.shape(c)) for c in cl}
    obj = sum(cp.norm1(mus[c] - ys[c]) for c in cl)
    prob = cp.Problem(cp.Minimize(obj), [cvxdp.MarginalPolytope(mus, dom, total=float(len(data)))])
    prob.solve(method="cvxdp", solver=cvxdp.MIRROR_DESCENT, polish_start=0, max_iters=300,
               eps_rel=1e-9)
    es = prob.solver_stats.extra_stats
    assert prob.status == "optimal" and es["gap"] <= 1e-9
    assert [p["kind"] for p in es["info"]["polish"]] == ["lp"]
    ours = prob.value
    prob.solve(solver=cp.CLARABEL, tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10)
    assert ours == pytest.approx(prob.value, rel=1e-7)


def _qp_problem(seed=5):
    tree = JunctionTree([3, 4, 2], [(0, 1), (1, 2)])
    rng = np.random.default_rng(seed)
    b = [rng.normal(4, 3, 12), rng.normal(6, 3, 8)]
    loss = MarginalLoss([LossTerm("l2", slice(0, 12), b[0], 0.5), LossTerm("l2", slice(12, 20), b[1], 1.0)], 20)
    return tree, loss, 48.0


def test_local_polytope_qp_from_a_uniform_start_and_idempotence():
    tree, loss, N = _qp_problem()
    qp = LocalPolytopeQP(tree, loss, N)
    x0 = np.concatenate([np.full(c, 1.0 / c) for c in tree.cells])
    before = x0.copy()
    res = qp.polish(x0)
    assert np.array_equal(x0, before)                         # the caller's array is untouched
    assert res is not None and res.residual < 1e-9 * N
    # Clarabel on the same QP through the cvxpy canonicalisation
    dom = cvxdp.Domain({"a": 3, "b": 4, "c": 2})
    cl = [("a", "b"), ("b", "c")]
    mus = {c: cp.Variable(dom.shape(c)) for c in cl}
    obj = 0.25 * cp.sum_squares(cp.vec(mus[cl[0]], order="C") - loss.terms[0].b) \
        + 0.5 * cp.sum_squares(cp.vec(mus[cl[1]], order="C") - loss.terms[1].b)
    prob = cp.Problem(cp.Minimize(obj), [cvxdp.MarginalPolytope(mus, dom, total=N)])
    prob.solve(solver=cp.CLARABEL)
    assert loss.value(res.mu) == pytest.approx(prob.value, rel=1e-8, abs=1e-9)
    # polishing the polished point changes nothing and settles at once
    again = qp.polish(np.concatenate([t.ravel() for t in res.x]) / N)
    assert again.rounds == 1
    np.testing.assert_allclose(again.mu, res.mu, atol=1e-9 * N)


def test_local_polytope_qp_rejects_bad_input():
    tree, loss, N = _qp_problem()
    qp = LocalPolytopeQP(tree, loss, N)
    with pytest.raises(ValueError, match="x0"):
        qp.polish(np.ones(3))
    with pytest.raises(ValueError, match="x0"):
        qp.polish(np.full(qp.nx, np.nan))
    l1 = MarginalLoss([LossTerm("l1", slice(0, 12), np.zeros(12), 1.0)], 20)
    with pytest.raises(ValueError, match="quadratic"):
        LocalPolytopeQP(tree, l1, N)


def test_model_from_clique_tables_keeps_empty_cells_empty():
    tree = JunctionTree([2, 3, 2], [(0, 1), (1, 2)])
    t01 = np.array([[4.0, 0.0, 2.0], [0.0, 3.0, 1.0]])
    t12 = np.array([[4.0, 0.0], [1.0, 2.0], [3.0, 0.0]])        # consistent on attribute 1
    tables = [None, None]
    for i, c in enumerate(tree.cliques):
        tables[i] = t01 if c == (0, 1) else t12
    m = GraphicalModel.from_clique_tables(tree, tables, 10.0)
    assert m.theta is None and np.isnan(m.log_partition)
    np.testing.assert_allclose(m.marginal((0, 1)), t01)
    np.testing.assert_allclose(m.marginal((2, 1)), t12.T)
    joint = m.marginal((0, 1, 2))
    np.testing.assert_allclose(joint.sum(axis=2), t01)
    rec = m.sample(2000, rng=0)
    assert not np.any((rec[:, 0] == 0) & (rec[:, 1] == 1))      # an empty cell is never drawn
    assert not np.any((rec[:, 1] == 2) & (rec[:, 2] == 1))
    with pytest.raises(ValueError, match="shape"):
        GraphicalModel.from_clique_tables(tree, [t01.T, t12], 10.0)
    with pytest.raises(ValueError, match="nonnegative"):
        GraphicalModel.from_clique_tables(tree, [-t01, t12] if tree.cliques[0] == (0, 1) else [t12, -t01], 10.0)
    with pytest.raises(ValueError, match="sums to"):
        GraphicalModel.from_clique_tables(tree, tables, 11.0)

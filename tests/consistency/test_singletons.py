"""Rows that fix coordinates substituted out before the forest is solved
(``cvxdp.solvers.consistency.singletons``): the rounds of the substitution by hand, refusals
(a value outside the bounds, rows that disagree), and OpenDP's layout with empty nodes on
several levels solved on the free nodes only, against Clarabel with the duals checked by the
Lagrangian."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import cvxpy as cp

import cvxdp
from cvxdp.recognise.consistency import recognise
from cvxdp.solvers.consistency import admm, singletons
from cvxdp.solvers.consistency.problem import ConsistencyData
from tests.conftest import CLARABEL_TIGHT, sparse_counts


def _data(rows, b, n=5, lower=0.0, upper=np.inf):
    A = sp.csr_matrix(np.array(rows, dtype=float))
    return ConsistencyData(n=n, M=sp.identity(n, format="csr"), y=np.zeros(n), w1=np.zeros(n),
                           w2=np.ones(n), lower=np.full(n, lower), upper=np.full(n, upper),
                           A=A, b=np.asarray(b, dtype=float))


def test_substitution_goes_in_rounds():
    """x3 = 0 and x4 = 2 fix, then x2 - x3 - x4 = 0 fixes x2 = 2, and x0 - x1 - x2 = 0 is
    left as x0 - x1 = 2."""
    d = _data([[1, -1, -1, 0, 0], [0, 0, 1, -1, -1], [0, 0, 0, 1, 0], [0, 0, 0, 0, 1]],
              [0, 0, 0, 2])
    A0, b0 = d.A.copy(), d.b.copy()
    sub = singletons.substitute(d, 1e-9)
    assert [r[1].tolist() for r in sub.rounds] == [[3, 4], [2]]
    np.testing.assert_array_equal(sub.fixed, [False, False, True, True, True])
    np.testing.assert_allclose(sub.value[2:], [2, 0, 2])
    assert sub.rows.tolist() == [0] and sub.b.tolist() == [2.0] and sub.empty.size == 0
    assert (d.A != A0).nnz == 0 and np.array_equal(d.b, b0)


def test_substitution_refuses_values_outside_the_bounds_and_rows_that_disagree():
    assert singletons.substitute(_data([[1, -1, -1, 0, 0], [0, 0, 0, 1, 0]], [0, -1]), 1e-9) is None
    assert singletons.substitute(_data([[1, -1, -1, 0, 0], [0, 0, 0, 1, 0], [0, 0, 0, 2, 0]],
                                       [0, 1, 3]), 1e-9) is None
    twice = singletons.substitute(_data([[1, -1, -1, 0, 0], [0, 0, 0, 1, 0], [0, 0, 0, 2, 0]],
                                        [0, 1, 2]), 1e-9)
    assert twice is not None and twice.empty.tolist() == [2]


def _release(n, k, seed):
    tree = cvxdp.workloads.hierarchy(n, k, layout="opendp")
    rng = np.random.default_rng(seed)
    return tree, tree.queries @ sparse_counts(n, rng) + rng.laplace(0, 2.0, tree.n_nodes)


@pytest.mark.parametrize("loss", ["l1", "l2", "en"])
@pytest.mark.parametrize("n,k,box,seed", [(5, 4, False, 0), (17, 4, False, 1), (17, 4, True, 2),
                                          (40, 3, False, 3), (130, 2, True, 4)])
def test_opendp_layout_solved_on_the_free_nodes(loss, n, k, box, seed):
    """Empty nodes on one level (5 leaves of 4^2 slots) and on two (17 of 4^3: two nodes of
    the second level cover only empty ones); ``C z == 0``, ``z >= 0`` (and ``z <= u``)."""
    tree, a = _release(n, k, seed)
    z = cp.Variable(tree.n_nodes)
    r = z - a
    f = {"l1": cp.norm1(r), "l2": cp.sum_squares(r),
         "en": 0.7 * cp.norm1(r) + 0.3 * cp.sum_squares(r)}[loss]
    cons = [tree.consistency @ z == 0, z >= 0] + ([z <= np.maximum(a, 0) + 3.0] if box else [])
    prob = cp.Problem(cp.Minimize(f), cons)
    res = admm.solve(recognise(prob).data)
    assert res.status == "optimal" and res.info["duals_certified"]
    assert res.info["substituted"] >= tree.empty.size
    val = prob.solve(method="cvxdp", solver=cvxdp.ADMM, eps_rel=1e-9, warm_start=False)
    assert prob.status == cp.OPTIMAL and prob.solver_stats.extra_stats["duals_certified"]
    ref = cp.Problem(prob.objective, prob.constraints).solve(solver=cp.CLARABEL, **CLARABEL_TIGHT)
    assert val == pytest.approx(ref, rel=1e-7, abs=1e-7)
    np.testing.assert_allclose(z.value[tree.empty], 0.0, atol=1e-9)
    _lagrangian_closes_the_gap(prob, z, a, loss, val)


def test_a_coordinate_fixed_at_a_value_moves_into_its_parent_row():
    """``z[leaf] == 3`` (a row with one entry, value not zero): the parent's row keeps
    ``b = 3`` after the substitution."""
    tree, a = _release(17, 4, 5)
    z = cp.Variable(tree.n_nodes)
    leaf = int(np.flatnonzero(np.asarray(tree.queries.sum(axis=1)).ravel() == 1)[2])
    prob = cp.Problem(cp.Minimize(cp.sum_squares(z - a)),
                      [tree.consistency @ z == 0, z >= 0, z[leaf] == 3])
    val = prob.solve(method="cvxdp", solver=cvxdp.ADMM, eps_rel=1e-9, warm_start=False)
    assert prob.status == cp.OPTIMAL and prob.solver_stats.extra_stats["duals_certified"]
    ref = cp.Problem(prob.objective, prob.constraints).solve(solver=cp.CLARABEL, **CLARABEL_TIGHT)
    assert val == pytest.approx(ref, rel=1e-7) and z.value[leaf] == pytest.approx(3.0)
    _lagrangian_closes_the_gap(prob, z, a, "l2", val)


def _lagrangian_closes_the_gap(prob, z, a, loss, val):
    """``min_z f(z) + sum_c dual_c^T (lhs - rhs)(z)`` in closed form per node: with
    ``c = sum_c`` of the constraints' gradients and ``k`` their constant, the loss
    ``phi(z - a) + c^T z`` is minimised per coordinate."""
    c, k = np.zeros(z.size), 0.0
    for con in prob.constraints:
        lam = np.atleast_1d(np.asarray(con.dual_value, dtype=float))
        expr = con.expr
        saved = z.value
        z.value = np.zeros(z.size)
        base = np.atleast_1d(expr.value).astype(float)
        G = np.column_stack([_unit_value(expr, z, j) - base for j in range(z.size)])
        z.value = saved
        if isinstance(con, cp.constraints.Inequality):
            assert lam.min() >= -1e-9
        c += G.T @ lam
        k += float(lam @ base)
    if loss == "l1":
        assert np.max(np.abs(c)) <= 1 + 1e-7
        bound = float(c @ a) + k
    elif loss == "l2":
        bound = float(c @ a - c @ c / 4) + k
    else:                                   # 0.7 |r| + 0.3 r^2 + c (r + a), per coordinate
        rr = -np.sign(c) * np.maximum(np.abs(c) - 0.7, 0.0) / 0.6
        bound = float(np.sum(0.7 * np.abs(rr) + 0.3 * rr ** 2 + c * (rr + a))) + k
    assert bound <= val + 1e-7 * max(1.0, abs(val))
    assert val - bound <= 1e-6 * max(1.0, abs(val)), (val, bound)


def _unit_value(expr, z, j):
    e = np.zeros(z.size)
    e[j] = 1.0
    z.value = e
    return np.atleast_1d(expr.value).astype(float)

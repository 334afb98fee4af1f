"""``cvxdp.round_consistent``: consistent integer rounding of a tree of counts (histograms).

* against HiGHS's MIP through cvxpy (``integer=True``) on random trees, histograms, weights
  and invariants: the same objective, and every constraint met exactly;
* known answers and identities: integer input comes back unchanged, each entry moves less than
  one, the hierarchy / geography / matrix / parent-array spellings agree;
* bad input: negative, non-finite, inconsistent, non-integer or contradicting invariants --
  a ``ValueError`` naming the node (and column).
"""
from __future__ import annotations

import numpy as np
import pytest
import cvxpy as cp
import scipy.sparse as sp

import cvxdp
from cvxdp.solvers.tree.forest import Forest
from conftest import random_parent


def random_tree(rng, n: int) -> np.ndarray:
    """A random forest on ``n`` nodes with shuffled labels (one root, sometimes two)."""
    return random_parent(rng, n, root_prob=0.05)


def consistent(rng, parent: np.ndarray, k: int, integral: float = 0.2) -> np.ndarray:
    """Leaves drawn at random (a share of them integers, many zero), summed up the tree."""
    n = parent.size
    is_leaf = np.ones(n, bool)
    is_leaf[parent[parent >= 0]] = False
    x = np.zeros((n, k))
    for leaf in np.flatnonzero(is_leaf):
        val = rng.uniform(0, 6, k) * (rng.random(k) < 0.7)
        ints = rng.random(k) < integral
        val[ints] = np.round(val[ints])
        v = leaf
        while v >= 0:
            x[v] += val
            v = parent[v]
    return x


def mip(parent, x, w, fixed=None) -> float:
    n, k = x.shape
    X = cp.Variable((n, k), integer=True)
    cons = [X >= np.floor(x + 1e-9), X <= np.ceil(x - 1e-9)]
    for v in range(n):
        kids = np.flatnonzero(parent == v)
        if kids.size:
            cons.append(X[v] == cp.sum(X[kids], axis=0))
    if fixed is not None and fixed.any():
        cons.append(X[fixed] == np.round(x[fixed]))
    prob = cp.Problem(cp.Minimize(cp.sum(cp.multiply(w, cp.abs(X - x)))), cons)
    prob.solve(solver=cp.HIGHS)
    assert prob.status == "optimal"
    return prob.value


def check_rounding(parent, x, X, fixed=None):
    assert X.shape == x.shape
    assert np.array_equal(X, np.round(X))
    assert np.all(np.abs(X - x) < 1)
    for v in range(parent.size):
        kids = np.flatnonzero(parent == v)
        if kids.size:
            np.testing.assert_array_equal(X[v], X[kids].sum(axis=0))
    integral = np.isclose(x, np.round(x), rtol=0, atol=1e-9)
    np.testing.assert_array_equal(X[integral], np.round(x[integral]))
    if fixed is not None:
        np.testing.assert_array_equal(X[fixed], np.round(x[fixed]))


@pytest.mark.parametrize("seed", range(40))
def test_matches_highs_mip(seed):
    rng = np.random.default_rng(seed)
    n, k = int(rng.integers(1, 30)), int(rng.integers(1, 4))
    parent = random_tree(rng, n)
    x = consistent(rng, parent, k)
    w = rng.uniform(0.1, 3.0, (n, k)) if seed % 2 else np.ones((n, k))
    X = cvxdp.round_consistent(parent, x, weights=w)
    check_rounding(parent, x, X)
    ref = mip(parent, x, w)
    assert float((w * np.abs(X - x)).sum()) == pytest.approx(ref, rel=1e-9, abs=1e-9)


@pytest.mark.parametrize("seed", range(10))
def test_invariants_are_kept_and_cost_what_the_mip_says(seed):
    rng = np.random.default_rng(100 + seed)
    n, k = int(rng.integers(3, 25)), 2
    parent = random_tree(rng, n)
    x = consistent(rng, parent, k, integral=0.8)
    integral = np.isclose(x, np.round(x), atol=1e-12)
    nodes = [v for v in range(n) if integral[v].all()]
    inv = {v: np.round(x[v]) for v in nodes[:3]}
    fixed = np.zeros((n, k), bool)
    fixed[list(inv)] = True
    X = cvxdp.round_consistent(parent, x, invariants=inv)
    check_rounding(parent, x, X, fixed)
    assert float(np.abs(X - x).sum()) == pytest.approx(mip(parent, x, np.ones((n, k)), fixed), abs=1e-9)


def test_spellings_agree_and_input_is_not_modified():
    h = cvxdp.workloads.hierarchy(13, 3)
    rng = np.random.default_rng(3)
    x = h.queries @ rng.uniform(0, 4, 13)
    keep = x.copy()
    a = cvxdp.round_consistent(h, x)
    b = cvxdp.round_consistent(h.consistency, x)
    c = cvxdp.round_consistent(np.array(h.parent), x)
    d = cvxdp.round_consistent(cvxdp.workloads.geography(np.array(h.parent)), x)
    for other in (b, c, d):
        np.testing.assert_array_equal(a, other)
    np.testing.assert_array_equal(x, keep)
    assert a.shape == (h.n_nodes,)


def test_integers_come_back_unchanged_and_a_tie_is_consistent():
    geo = cvxdp.workloads.geography({"US": {"PA": ["Centre", "Erie"], "NY": ["Kings"]}})
    x = geo.aggregate(np.array([[3.0, 0.0], [1.0, 7.0], [2.0, 2.0]]))
    np.testing.assert_array_equal(cvxdp.round_consistent(geo, x), x)
    # two halves under an integer parent: one goes up, one down
    y = geo.aggregate(np.array([0.5, 0.5, 1.0]))
    Y = cvxdp.round_consistent(geo, y)
    assert Y[geo.index("PA")] == 1 and Y[geo.index("US")] == 2
    assert sorted(Y[[geo.index("Centre"), geo.index("Erie")]]) == [0, 1]


def test_a_large_tree_is_fast_enough_to_run_here():
    rng = np.random.default_rng(0)
    parent = np.r_[-1, np.zeros(50, int), rng.integers(1, 51, 3000), rng.integers(51, 3051, 20000)]
    x = consistent(rng, parent, 8)
    X = cvxdp.round_consistent(parent, x)
    check_rounding(parent, x, X)


@pytest.mark.parametrize("case, match", [
    ("negative", "negative at node 3, column 1"),
    ("nan", "not finite at node 4, column 0"),
    ("inconsistent", "not consistent at node 1, column 0"),
    ("fractional_invariant", "invariant at node 1, column 0 is not an integer"),
    ("contradicting_invariants", "invariants contradict at node 1, column 1"),
    ("unmet_invariant", "x does not meet the invariant at node 2, column 0"),
    ("bad_matrix", "row 0 is not one parent"),
    ("two_parents", "node 3 is a child in two rows"),
    ("cycle", "cycle"),
])
def test_bad_input_names_the_node(case, match):
    parent = np.array([-1, 0, 0, 1, 1, 2])
    geo = cvxdp.workloads.geography(parent)
    x = geo.aggregate(np.array([[1.5, 2.0], [0.5, 0.5], [2.0, 1.0]]))
    cons, kwargs = geo, {}
    if case == "negative":
        x[3, 1] = -0.5
    elif case == "nan":
        x[4, 0] = np.nan
    elif case == "inconsistent":
        x[3, 0] += 0.25
    elif case == "fractional_invariant":
        kwargs["invariants"] = {1: [2.5, np.nan]}
    elif case == "contradicting_invariants":
        x = geo.aggregate(np.array([[1.0, 2.0], [0.0, 1.0], [2.0, 1.0]]))
        kwargs["invariants"] = {1: [1.0, 4.0], 3: [1.0, 2.0], 4: [0.0, 1.0]}
    elif case == "unmet_invariant":
        kwargs["invariants"] = {2: [3.0, np.nan]}
    elif case == "bad_matrix":
        cons = sp.csr_matrix(np.array([[1.0, 1.0, -1.0, 0, 0, 0]]))
    elif case == "two_parents":
        cons = sp.csr_matrix(np.array([[1.0, -1.0, -1.0, 0, 0, 0], [0, 1.0, 0, -1.0, 0, 0],
                                       [0, 0, 1.0, -1.0, 0, 0]]))
    elif case == "cycle":
        cons = np.array([1, 2, 0, -1, 3, 3])
    with pytest.raises(ValueError, match=match):
        cvxdp.round_consistent(cons, x, **kwargs)


def test_forest_of_refuses_other_types():
    with pytest.raises(TypeError, match="consistency must be"):
        cvxdp.round_consistent("tree", np.zeros(3))
    assert isinstance(cvxdp.estimates.rounding.forest_of(np.array([-1, 0])), Forest)

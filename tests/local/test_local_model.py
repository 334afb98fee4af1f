"""cvxdp.estimates.local_model.fit_model: a bounded junction-tree model fitted to a LocalPolytope's
consistent marginals -- exact on the kept cliques, reported on the dropped ones."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import cvxpy as cp

import cvxdp
from cvxdp.estimates.local_model import ModelFit, _acyclic, bic_score, fit_model, total_correlation


# ---------------------------------------------------------------------------- helpers
def random_records(rng, sizes, n):
    """Records from a random tree-shaped Bayesian network (so the attributes are dependent)."""
    cols = [rng.integers(0, sizes[0], n)]
    for j in range(1, len(sizes)):
        par = cols[rng.integers(0, j)]
        cpt = rng.dirichlet(np.full(sizes[j], 0.4), size=int(max(sizes))).cumsum(axis=1)
        cols.append(np.minimum((rng.random(n)[:, None] > cpt[par]).sum(axis=1), sizes[j] - 1))
    return np.column_stack(cols)


def solved(dom, data, cliques, *, sigma=3.0, seed=0, total="N"):
    """LocalPolytope of noisy marginals on ``cliques``, least squares, solved by cvxdp.ADMM."""
    rng = np.random.default_rng([seed, 1])
    n = len(data)
    mu = {c: cp.Variable(dom.shape(c)) for c in cliques}
    y = {c: dom.count(data, c) + rng.normal(0, sigma, dom.shape(c)) for c in cliques}
    con = cvxdp.LocalPolytope(mu, dom, total=n if total == "N" else total)
    prob = cp.Problem(cp.Minimize(sum(cp.sum_squares(mu[c] - y[c]) for c in cliques)), [con])
    prob.solve(method="cvxdp", solver=cvxdp.ADMM)
    assert prob.status == "optimal"
    return con


def all_pairs(seed, d=None, n=2000):
    rng = np.random.default_rng(seed)
    d = d or int(rng.integers(4, 7))
    sizes = [int(s) for s in rng.integers(2, 5, d)]
    dom = cvxdp.Domain({f"a{i}": s for i, s in enumerate(sizes)})
    data = random_records(rng, sizes, n)
    return dom, data, solved(dom, data, list(itertools.combinations(dom.names, 2)), seed=seed)


def assert_exact(model, con, cliques):
    tol = 1e-6 * model.total
    for c in cliques:
        diff = np.abs(model.marginal(c) - con.marginal(c)).max()
        assert diff <= tol, f"{c}: model differs from the LocalPolytope by {diff}"


_CASES: dict = {}


@pytest.fixture(params=[0, 1, 2, 3])
def pairs_case(request):
    if request.param not in _CASES:
        _CASES[request.param] = all_pairs(request.param)
    return _CASES[request.param]


# ---------------------------------------------------------------------------- exactness
def test_all_pairs_kept_cliques_are_exact_and_form_the_chow_liu_tree(pairs_case):
    dom, data, con = pairs_case
    model = fit_model(con, score="total_correlation")
    info = model.info
    assert isinstance(info, ModelFit) and info.method == "decomposable"
    assert info.score == "total_correlation"
    assert model.total == pytest.approx(len(data))
    assert model.domain == dom
    assert set(info.kept) | set(info.dropped) == set(con.cliques)
    assert not set(info.kept) & set(info.dropped)
    # a spanning tree of the attributes (all pairs are positive-score candidates)
    assert len(info.kept) == len(dom) - 1
    assert _acyclic([frozenset(c) for c in info.kept])
    assert_exact(model, con, info.kept)
    assert_exact(model, con, [(a,) for a in dom.names])          # every one-way marginal
    assert info.max_error("kept") <= 1e-6 * model.total
    assert all(info.reasons[c] == "cycle" for c in info.dropped)
    # the report's errors are the model's L1 distance to the LocalPolytope
    for c in con.cliques:
        assert info.errors[c] == pytest.approx(np.abs(model.marginal(c) - con.marginal(c)).sum(),
                                               abs=1e-9 * model.total)
    # greedy by mutual information = a maximum spanning tree (Chow-Liu): brute force
    best = max(sum(info.scores[c] for c in tree)
               for tree in itertools.combinations(con.cliques, len(dom) - 1)
               if _acyclic([frozenset(c) for c in tree])
               and len(set().union(*map(set, tree))) == len(dom))
    assert sum(info.scores[c] for c in info.kept) == pytest.approx(best, rel=1e-12)
    for c in con.cliques:
        assert info.scores[c] == pytest.approx(total_correlation(con.marginal(c)))
    assert "dropped" in info.describe() and "NOT exact" in info.describe()


def test_junction_tree_clique_set_keeps_every_clique_and_reproduces_every_marginal():
    rng = np.random.default_rng(5)
    dom = cvxdp.Domain({"a": 3, "b": 2, "c": 4, "d": 3, "e": 2, "f": 4})
    data = random_records(rng, dom.sizes, 3000)
    cliques = [("a", "b", "c"), ("b", "c", "d"), ("d", "e"), ("f", "e"), ("c",)]
    con = solved(dom, data, cliques, seed=5)
    for method in ("decomposable", "mirror_descent"):
        model = fit_model(con, method=method)
        info = model.info
        assert set(info.kept) == set(cliques) and info.dropped == ()       # whatever the scores
        assert_exact(model, con, cliques)
        # every marginal inside a clique, e.g. the subsets
        assert_exact(model, con, [("a", "c"), ("d",), ("c", "b"), ("e",)])
        assert {frozenset(c) for c in info.junction_tree} == {frozenset(c) for c in cliques[:4]}
    assert info.solve["status"] == "optimal"


def test_a_triangulation_clique_gets_the_product_marginal():
    """Cliques (u, s), (u, t), (s, p, q), (t, v, w): decomposable, but eliminating u first (the
    cheapest) joins s and t, so the junction tree has a clique (s, t, u) made from two selected
    cliques; its table is the junction-tree product's marginal."""
    rng = np.random.default_rng(2)
    dom = cvxdp.Domain({"u": 2, "s": 2, "t": 2, "p": 4, "q": 4, "v": 4, "w": 4})
    data = random_records(rng, dom.sizes, 3000)
    cliques = [("u", "s"), ("u", "t"), ("s", "p", "q"), ("t", "v", "w")]
    con = solved(dom, data, cliques, seed=2)
    model = fit_model(con)
    jt = {frozenset(c) for c in model.info.junction_tree}
    assert frozenset({"s", "t", "u"}) in jt
    assert set(model.info.kept) == set(cliques)
    assert_exact(model, con, cliques)
    # s and t are independent given u in the model
    st = model.marginal(("u", "s", "t"))
    prod = np.einsum("us,ut->ust", con.marginal(("u", "s")), con.marginal(("u", "t"))) \
        / con.marginal("u")[:, None, None]
    np.testing.assert_allclose(st, prod, atol=1e-9 * model.total)


def test_small_max_cells_drops_cliques_and_says_which(pairs_case):
    dom, data, con = pairs_case
    model = fit_model(con, max_cells=8, score="total_correlation")
    info = model.info
    big = {c for c in con.cliques if dom.size(c) > 8}
    assert big, "the random domain should have a pair above 8 cells"
    assert big <= set(info.dropped)
    assert all(info.reasons[c] == "cells" for c in big)
    assert all(dom.size(c) <= 8 for c in info.kept)
    assert info.largest_cells <= 8
    assert_exact(model, con, info.kept)
    assert_exact(model, con, [(a,) for a in dom.names])
    assert set(info.errors) == set(con.cliques)
    # what was dropped is not reproduced in general, and the report says by how much
    assert info.max_error("dropped") > 1e-3 * model.total


def test_bic_score_ranks_an_independent_attribute_last_and_a_custom_score_orders():
    rng = np.random.default_rng(11)
    dom = cvxdp.Domain({"a": 3, "b": 4, "c": 2, "free": 3})
    data = random_records(rng, [3, 4, 2], 2000)
    data = np.column_stack([data, rng.integers(0, 3, 2000)])          # independent of the rest
    con = solved(dom, data, list(itertools.combinations(dom.names, 2)), seed=11)
    model = fit_model(con)
    info = model.info
    assert info.score == "bic"
    for c in con.cliques:
        assert info.scores[c] == pytest.approx(bic_score(con.marginal(c), model.total))
    free = [c for c in con.cliques if "free" in c]
    assert max(info.scores[c] for c in free) < 0
    assert max(info.scores[c] for c in free) < min(info.scores[c] for c in con.cliques if c not in free)
    # a spanning tree: the dependent pairs first, then the best of the independent attribute's
    assert len(info.kept) == 3 and sum("free" in c for c in info.kept) == 1
    assert info.selected[-1] == max(free, key=info.scores.get)
    assert_exact(model, con, info.kept)
    # a custom score: prefer the smallest tables
    small = fit_model(con, score=lambda table, total: 1.0 / table.size)
    assert small.info.score == "<lambda>"
    assert small.info.selected[0] == ("c", "free") or dom.size(small.info.selected[0]) == 6
    assert_exact(small, con, small.info.kept)


def test_cliques_argument_gives_the_order_and_the_candidates():
    dom, data, con = all_pairs(0, d=5)
    order = [("a3", "a4"), ("a0", "a1"), ("a1", "a4"), ("a0", "a4"), ("a2",)]
    model = fit_model(con, cliques=order)
    info = model.info
    # (a0, a4) closes the cycle a0 - a1 - a4; a2 is covered by its one-way marginal only
    assert info.selected == (("a3", "a4"), ("a0", "a1"), ("a1", "a4"), ("a2",))
    assert info.reasons[("a0", "a4")] == "cycle"
    assert set(info.kept) == {("a3", "a4"), ("a0", "a1"), ("a1", "a4")}
    assert all(info.reasons[c] == "not listed" for c in info.dropped if c != ("a0", "a4"))
    assert_exact(model, con, [("a3", "a4"), ("a0", "a1"), ("a1", "a4"), ("a2",)])


def test_mirror_descent_fits_a_bounded_junction_tree_with_cycles():
    dom, data, con = all_pairs(1, d=4)
    model = fit_model(con, method="mirror_descent", max_cells=2 ** 20)
    info = model.info
    assert info.dropped == ()                        # the whole table fits
    assert info.largest_cells == dom.size()
    assert info.solve["status"] in ("optimal", "optimal_inaccurate")
    # the residual on the kept cliques is the reported error (the cycle may make it > 0)
    for c in con.cliques:
        assert info.errors[c] == pytest.approx(np.abs(model.marginal(c) - con.marginal(c)).sum(),
                                               abs=1e-9 * model.total)
    assert info.max_error("kept") <= 0.05 * model.total
    small = fit_model(con, method="mirror_descent", max_cells=int(max(dom.size(c) for c in con.cliques)))
    assert small.info.largest_cells <= max(dom.size(c) for c in con.cliques)
    assert small.info.dropped and all(small.info.reasons[c] == "junction tree"
                                      for c in small.info.dropped)


def test_free_total_and_an_unmeasured_attribute():
    rng = np.random.default_rng(3)
    dom = cvxdp.Domain({"a": 3, "b": 4, "c": 2, "z": 3})
    data = random_records(rng, dom.sizes, 1500)
    con = solved(dom, data, [("a", "b"), ("b", "c"), ("a", "c")], seed=3, total=None)
    model = fit_model(con)
    assert model.total == pytest.approx(con.fitted_total)
    assert model.info.unmeasured == ("z",)
    np.testing.assert_allclose(model.marginal("z"), np.full(3, model.total / 3))
    np.testing.assert_allclose(model.marginal(("a", "z")),
                               np.outer(con.marginal("a"), np.full(3, 1 / 3)), atol=1e-9 * model.total)
    assert_exact(model, con, model.info.kept)


# ---------------------------------------------------------------------------- synthetic data
def test_synthetic_data_in_original_values(pairs_case):
    dom0, data, con0 = pairs_case
    labels = {a: [f"{a}={v}" for v in range(dom0[a])] for a in dom0.names}
    dom = cvxdp.Domain(labels)
    mu = {c: cp.Variable(dom.shape(c)) for c in con0.cliques}
    con = cvxdp.LocalPolytope(mu, dom, total=con0.total)
    for c, v in zip(con0.cliques, con0.args):      # same values, labelled domain
        mu[c].value = v.value
    model = fit_model(con)
    syn = model.synthetic_data(rng=0)
    cols = syn if isinstance(syn, dict) else {a: syn[a].to_numpy() for a in syn.columns}
    assert all(len(cols[a]) == round(model.total) for a in dom.names)
    assert all(set(cols[a]) <= set(labels[a]) for a in dom.names)
    n = 20_000
    a = model.synthetic_data(n, rng=1)
    b = model.synthetic_data(n, rng=1)
    ca = a if isinstance(a, dict) else {k: a[k].to_numpy() for k in a.columns}
    cb = b if isinstance(b, dict) else {k: b[k].to_numpy() for k in b.columns}
    for name in dom.names:
        assert len(ca[name]) == n
        assert np.array_equal(ca[name], cb[name])             # seeded
        emp = np.array([(ca[name] == lab).sum() for lab in labels[name]])
        l1 = np.abs(emp / n - model.marginal(name) / model.total).sum()
        assert l1 < 0.03, f"{name}: synthetic one-way marginal {l1:.3f} from the model's"


# ---------------------------------------------------------------------------- arguments
@pytest.fixture(scope="module")
def small_con():
    return all_pairs(7, d=4)[2]


@pytest.mark.parametrize("kwargs, word", [
    (dict(max_cells=0), "max_cells"),
    (dict(max_cells=-5), "max_cells"),
    (dict(max_cells=2.5), "max_cells"),
    (dict(max_cells=True), "max_cells"),
    (dict(max_cells=1), "max_cells"),              # below an attribute's size
    (dict(method="junction"), "method"),
    (dict(score="mi"), "score"),
    (dict(score=3), "score"),
    (dict(score=lambda t, n: float("nan")), "score"),
    (dict(cliques=[]), "cliques"),
    (dict(cliques="a0"), "cliques"),
    (dict(cliques=[("a0", "nope")]), "cliques"),
    (dict(cliques=[("a0", "a0")]), "cliques"),
    (dict(cliques=[("a0", "a1", "a2")]), "cliques"),
    (dict(cliques=[("a0", "a1"), ("a1", "a0")]), "cliques"),
    (dict(solve_options=[1]), "solve_options"),
    (dict(solve_options={"max_iters": 5}), "solve_options"),
])
def test_invalid_arguments_raise_value_error_naming_them(small_con, kwargs, word):
    with pytest.raises(ValueError, match=word):
        fit_model(small_con, **kwargs)


def test_constraint_must_be_a_solved_local_polytope():
    dom = cvxdp.Domain({"a": 2, "b": 3})
    mu = {("a", "b"): cp.Variable((2, 3))}
    with pytest.raises(ValueError, match="constraint"):
        fit_model(cvxdp.MarginalPolytope(mu, dom, total=10))
    with pytest.raises(ValueError, match="constraint"):
        fit_model(None)
    with pytest.raises(ValueError, match="solve"):
        fit_model(cvxdp.LocalPolytope(mu, dom, total=10))

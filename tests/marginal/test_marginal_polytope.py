"""MarginalPolytope and MIRROR_DESCENT against Clarabel (local polytope and full table),
the junction-tree oracle against brute force, known answers, unknown totals, bad input."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import cvxpy as cp
import scipy.sparse as sp

import cvxdp
from cvxdp.solvers.marginal.junction_tree import JunctionTree, ModelTooLarge


# ---------------------------------------------------------------- helpers
def full_table_marginal(p: np.ndarray, names, clique):
    axes = tuple(i for i, a in enumerate(names) if a not in clique)
    m = p.sum(axis=axes)
    kept = [a for a in names if a in clique]
    return np.transpose(m, [kept.index(a) for a in clique])


def random_instance(seed, sizes, cliques, sigma=1.0, n_records=200, noise="gaussian"):
    rng = np.random.default_rng(seed)
    names = [f"a{i}" for i in range(len(sizes))]
    dom = cvxdp.Domain(dict(zip(names, sizes)))
    data = np.column_stack([rng.integers(0, s, n_records) for s in sizes])
    cl = [tuple(names[i] for i in c) for c in cliques]
    ys = {}
    for c in cl:
        t = dom.count(data, c)
        noise_draw = rng.normal(0, sigma, t.shape) if noise == "gaussian" else rng.laplace(0, sigma, t.shape)
        ys[c] = t + noise_draw
    return dom, data, cl, ys


def build(dom, cl, ys, sigma=1.0, total=None, noise="gaussian", flat=False):
    mus = {c: cp.Variable(dom.size(c) if flat else dom.shape(c)) for c in cl}
    ms = {c: cvxdp.Measurement(sp.identity(dom.size(c)), ys[c].ravel(), noise, sigma) for c in cl}
    obj = sum(cvxdp.nll(ms[c], mus[c]) for c in cl)
    mp = cvxdp.MarginalPolytope(mus, dom, total=total)
    return cp.Problem(cp.Minimize(obj), [mp]), mus, mp


def full_table_reference(dom, cl, ys, sigma, total, noise="gaussian"):
    """The same problem over an explicit full table (tiny domains only)."""
    p = cp.Variable(dom.size(), nonneg=True)
    terms = []
    for c in cl:
        idx = [dom.names.index(a) for a in c]
        # marginalise the C-order full table onto c (in c's order) with a 0/1 matrix
        grid = np.unravel_index(np.arange(dom.size()), dom.sizes)
        rows = np.ravel_multi_index(tuple(grid[i] for i in idx), dom.shape(c))
        S = sp.csr_matrix((np.ones(dom.size()), (rows, np.arange(dom.size()))), shape=(dom.size(c), dom.size()))
        r = S @ p - ys[c].ravel()
        terms.append(cp.sum_squares(r) / (2 * sigma ** 2) if noise == "gaussian" else cp.norm1(r) / sigma)
    cons = [cp.sum(p) == total] if total is not None else []
    prob = cp.Problem(cp.Minimize(sum(terms)), cons)
    prob.solve(solver=cp.CLARABEL)
    return prob.value


# ---------------------------------------------------------------- junction tree oracle
CYCLIC = [(0, 1), (1, 2), (2, 3), (3, 0), (1, 3, 4)]


@pytest.mark.parametrize("factors", [CYCLIC, [(0, 1, 2), (2, 3)], [(4, 0), (3,)]])
def test_oracle_matches_brute_force(factors):
    rng = np.random.default_rng(1)
    sizes = [2, 3, 2, 3, 2, 2]                     # attribute 5 is in no factor
    jt = JunctionTree(sizes, factors)
    theta = [rng.normal(scale=4, size=jt.factor_shape(k)) for k in range(len(factors))]
    logp = np.zeros(sizes)
    for x in itertools.product(*map(range, sizes)):
        logp[x] = sum(theta[k][tuple(x[a] for a in f)] for k, f in enumerate(factors))
    p = np.exp(logp - logp.max())
    p /= p.sum()
    mus, probs, log_z = jt.marginals(theta, total=7.0)
    assert log_z == pytest.approx(np.log(np.exp(logp - logp.max()).sum()) + logp.max(), rel=1e-12)
    names = list(range(len(sizes)))
    for k, f in enumerate(factors):
        np.testing.assert_allclose(mus[k], 7.0 * full_table_marginal(p, names, f), atol=1e-12)
    assert jt.max_value(theta) == pytest.approx(logp.max(), rel=1e-12)
    for c, b in zip(jt.cliques, probs):            # clique beliefs are the exact clique marginals
        np.testing.assert_allclose(b, full_table_marginal(p, names, c), atol=1e-12)


def test_oracle_is_stable_at_extreme_parameters():
    jt = JunctionTree([3, 3, 3], [(0, 1), (1, 2)])
    theta = [np.array([[1e4, -1e4, 0], [0, 5e3, -5e3], [1, 2, 3]]), np.full((3, 3), -1e5)]
    mus, _, log_z = jt.marginals(theta, total=10.0)
    assert all(np.all(np.isfinite(m)) for m in mus) and np.isfinite(log_z)
    assert mus[0].sum() == pytest.approx(10.0)


def test_model_too_large_is_refused_before_allocation():
    with pytest.raises(ModelTooLarge, match="cells"):
        JunctionTree([1000] * 4, [(0, 1, 2, 3)])                      # 1e12 cells
    dom = cvxdp.Domain({f"a{i}": 100 for i in range(6)})
    mus = {(f"a{i}", f"a{(i + 1) % 6}", f"a{(i + 3) % 6}"): cp.Variable(10 ** 6) for i in range(6)}
    with pytest.raises(cvxdp.ModelTooLarge, match="max_cells"):
        cvxdp.MarginalPolytope(mus, dom, total=1.0)


def test_summary_reports_the_tree():
    dom = cvxdp.Domain({"a": 2, "b": 3, "c": 4, "d": 5})
    mp = cvxdp.MarginalPolytope({("a", "b"): cp.Variable((2, 3)), ("b", "c"): cp.Variable((3, 4)),
                                 ("c", "a"): cp.Variable((4, 2))}, dom, total=5)
    s = mp.summary()
    assert s.largest_cells == 24 and s.n_attributes == 4
    assert "largest clique (a, b, c)" in mp.describe()


# ---------------------------------------------------------------- against Clarabel
CASES = [
    ([2, 3, 2, 2], [(0, 1), (1, 2), (2, 3)]),                # a chain
    ([2, 3, 2, 2], [(0, 1), (1, 2), (2, 0), (3,)]),         # a cycle: needs triangulation
    ([3, 2, 2, 2, 2], [(0, 1), (2, 3)]),                     # attribute 4 measured by nothing
]


@pytest.mark.parametrize("sizes,cliques", CASES)
@pytest.mark.parametrize("algorithm", ["accelerated", "mirror_descent", "dual_averaging"])
def test_l2_matches_clarabel_on_local_polytope_and_full_table(sizes, cliques, algorithm):
    dom, data, cl, ys = random_instance(3, sizes, cliques, sigma=2.0, n_records=100)
    prob, mus, mp = build(dom, cl, ys, sigma=2.0, total=100.0)
    # plain mirror descent is slow near the boundary (zero cells): a looser target for it
    eps = 1e-6 if algorithm == "mirror_descent" else 1e-8
    prob.solve(method="cvxdp", solver=cvxdp.MIRROR_DESCENT, eps_rel=eps, max_iters=50000,
               algorithm=algorithm)
    ours = prob.value
    assert prob.status == "optimal"
    assert mp.residual < 1e-8 * 100
    got = {c: mus[c].value.copy() for c in cl}
    prob.solve(method="cvxdp", solver=cp.CLARABEL)
    assert prob.status == "optimal"
    ref_local = prob.value
    ref_full = full_table_reference(dom, cl, ys, 2.0, 100.0) if dom.size() <= 64 else ref_local
    assert ref_local == pytest.approx(ref_full, rel=1e-6, abs=1e-6)      # the canonicalisation is exact
    assert ours == pytest.approx(ref_local, rel=max(eps, 1e-7) * 2, abs=1e-6)
    for c in cl:                                                          # L2 on marginals: unique
        np.testing.assert_allclose(got[c], mus[c].value, atol=1e-3 if eps < 1e-7 else 2e-2)


def test_l1_matches_clarabel():
    dom, data, cl, ys = random_instance(5, [2, 3, 2], [(0, 1), (1, 2)], sigma=1.0, noise="laplace")
    prob, mus, mp = build(dom, cl, ys, sigma=1.0, total=200.0, noise="laplace")
    prob.solve(method="cvxdp", solver=cvxdp.MIRROR_DESCENT, eps_rel=1e-5, max_iters=50000)
    ours, status = prob.value, prob.status
    assert status in ("optimal", "optimal_inaccurate")
    lb = prob.solver_stats.extra_stats["lower_bound"]
    prob.solve(method="cvxdp", solver=cp.CLARABEL)
    ref = prob.value
    assert lb <= ref * (1 + 1e-7) + 1e-7                                   # the bound is a bound
    assert ours == pytest.approx(ref, rel=1e-4)


def test_plain_spellings_and_flat_variables():
    dom, data, cl, ys = random_instance(7, [3, 2, 2], [(0, 1), (1, 2)], sigma=1.0)
    mus = {c: cp.Variable(dom.size(c)) for c in cl}
    obj = cp.sum_squares(mus[cl[0]] - ys[cl[0]].ravel()) + 0.5 * cp.norm1(mus[cl[1]] - ys[cl[1]].ravel())
    prob = cp.Problem(cp.Minimize(obj), [cvxdp.MarginalPolytope(mus, dom, total=200)])
    prob.solve(method="cvxdp", solver=cvxdp.MIRROR_DESCENT, eps_rel=1e-6, max_iters=50000)
    ours = prob.value
    prob.solve(method="cvxdp", solver=cp.CLARABEL)
    assert ours == pytest.approx(prob.value, rel=1e-4)


def test_exact_marginals_are_reproduced():
    """Noise-free marginals of a random table: the optimum is the truth, loss zero."""
    rng = np.random.default_rng(11)
    dom = cvxdp.Domain({"a": 3, "b": 2, "c": 4})
    p = rng.dirichlet(np.ones(24)).reshape(3, 2, 4) * 50
    cl = [("a", "b"), ("b", "c"), ("a", "c")]
    mus = {c: cp.Variable(dom.shape(c)) for c in cl}
    truth = {c: full_table_marginal(p, dom.names, c) for c in cl}
    obj = sum(cp.sum_squares(mus[c] - truth[c]) for c in cl)
    prob = cp.Problem(cp.Minimize(obj), [cvxdp.MarginalPolytope(mus, dom, total=50)])
    prob.solve(method="cvxdp", solver=cvxdp.MIRROR_DESCENT, eps_abs=1e-12, eps_rel=1e-12, max_iters=5000)
    for c in cl:
        np.testing.assert_allclose(mus[c].value, truth[c], atol=1e-4)


def test_unknown_total_is_optimised_and_all_paths_agree():
    """total=None: the total is free, fitted with the marginals (the MLE), by MIRROR_DESCENT,
    by the local polytope on a standard solver and by cvxpy's own canonicalisation alike;
    appendix E.1's estimate is only MIRROR_DESCENT's starting point."""
    dom, data, cl, ys = random_instance(13, [2, 3, 2], [(0,), (0, 1), (1, 2)], sigma=3.0, n_records=300)
    prob, mus, mp = build(dom, cl, ys, sigma=3.0, total=None)
    prob.solve(method="cvxdp", solver=cvxdp.MIRROR_DESCENT, eps_rel=1e-8, max_iters=20000)
    assert prob.status == "optimal"
    info = prob.solver_stats.extra_stats["info"]
    w = np.array([1.0 / (9.0 * dom.size(c)) for c in cl])             # inverse variances of the sums
    expected = float(np.dot(w, [ys[c].sum() for c in cl]) / w.sum())
    assert info["total_start"] == pytest.approx(expected, rel=1e-12)
    assert info["total_given"] is False
    for c in cl:
        assert float(mus[c].value.sum()) == pytest.approx(info["total"], rel=1e-9)
    ours, total = prob.value, info["total"]
    prob.solve(method="cvxdp", solver=cp.CLARABEL)
    assert ours == pytest.approx(prob.value, rel=1e-6)
    assert mp.fitted_total == pytest.approx(total, rel=1e-6)
    prob.solve(solver=cp.CLARABEL)
    assert ours == pytest.approx(prob.value, rel=1e-6)
    assert mp.fitted_total == pytest.approx(total, rel=1e-6)


def test_unknown_total_without_a_spanning_measurement_is_an_error():
    dom = cvxdp.Domain({"a": 2, "b": 2})
    x = cp.Variable((2, 2))
    prob = cp.Problem(cp.Minimize(cp.square(x[0, 0] - 3)), [cvxdp.MarginalPolytope({("a", "b"): x}, dom)])
    with pytest.raises(ValueError, match="total is not identified"):
        prob.solve(method="cvxdp", solver=cvxdp.MIRROR_DESCENT)


def test_model_answers_unmeasured_marginals_and_samples():
    dom, data, cl, ys = random_instance(17, [2, 3, 2, 2], [(0, 1), (1, 2), (2, 3)], sigma=0.5, n_records=400)
    prob, mus, mp = build(dom, cl, ys, sigma=0.5, total=400.0)
    prob.solve(method="cvxdp", solver=cvxdp.MIRROR_DESCENT, eps_rel=1e-7, max_iters=20000)
    model = mp.model
    assert isinstance(model, cvxdp.GraphicalModel)
    np.testing.assert_allclose(model.marginal(cl[1]), mus[cl[1]].value, atol=1e-3)
    m03 = model.marginal(("a3", "a0"))                                 # unmeasured pair
    assert m03.shape == (2, 2) and m03.sum() == pytest.approx(400.0)
    np.testing.assert_allclose(m03.sum(axis=0), mus[cl[0]].value.sum(axis=1), atol=1e-3)
    recs = model.sample(1000, rng=0)
    assert recs.shape == (1000, 4) and recs.min() >= 0 and np.all(recs.max(axis=0) < dom.sizes)


# ---------------------------------------------------------------- bad input
def test_bad_input_is_named():
    dom = cvxdp.Domain({"a": 2, "b": 3})
    with pytest.raises(KeyError, match="unknown attribute"):
        cvxdp.MarginalPolytope({("a", "z"): cp.Variable(6)}, dom, total=1)
    with pytest.raises(ValueError, match=r"shape \(2, 3\) or \(6,\)"):
        cvxdp.MarginalPolytope({("a", "b"): cp.Variable((3, 2))}, dom, total=1)
    with pytest.raises(ValueError, match="total must be positive"):
        cvxdp.MarginalPolytope({("a", "b"): cp.Variable(6)}, dom, total=-1)
    with pytest.raises(ValueError, match="total must be positive"):
        cvxdp.MarginalPolytope({("a", "b"): cp.Variable(6)}, dom, total=float("nan"))
    for bad in (-2, 0, float("nan"), 2.5):
        with pytest.raises(ValueError, match="positive integer"):
            cvxdp.Domain({"a": bad})
    with pytest.raises(ValueError, match="sigma must be positive"):
        cvxdp.modelling.losses.gaussian(cp.Variable(2), 0.0)
    with pytest.raises(ValueError, match="scale"):
        cvxdp.Measurement(np.eye(2), np.zeros(2), "laplace", -1.0)


def test_other_constraints_are_not_recognised():
    dom = cvxdp.Domain({"a": 2, "b": 2})
    x = cp.Variable((2, 2))
    prob = cp.Problem(cp.Minimize(cp.sum_squares(x - 1)),
                      [cvxdp.MarginalPolytope({("a", "b"): x}, dom, total=4), x[0, 0] <= 0.5])
    with pytest.raises(cvxdp.NotRecognised, match="another constraint"):
        prob.solve(method="cvxdp", solver=cvxdp.MIRROR_DESCENT)
    prob.solve(method="cvxdp", solver=cp.CLARABEL)                    # the standard path still works
    assert prob.status == "optimal" and x.value[0, 0] <= 0.5 + 1e-7


def test_domain_counts_dataframe_and_array_alike():
    pd = pytest.importorskip("pandas")
    dom = cvxdp.Domain({"a": 2, "b": 3})
    arr = np.array([[0, 1], [1, 2], [1, 2], [0, 0]])
    np.testing.assert_array_equal(dom.count(arr, ("b", "a")),
                                  dom.count(pd.DataFrame(arr, columns=["a", "b"]), ("b", "a")))
    assert dom.count(arr, ("b", "a"))[2, 1] == 2
    with pytest.raises(ValueError, match="outside"):
        dom.count(np.array([[0, 3]]), "b")


@pytest.mark.parametrize("solver", [cp.CLARABEL, cp.SCS, cp.OSQP])
def test_plain_cvxpy_solve_canonicalises_to_the_local_polytope(solver):
    """Without method="cvxdp" the constraint still means what it says (never silently dropped)."""
    dom, data, cl, ys = random_instance(19, [2, 2, 3], [(0, 1), (1, 2)], sigma=1.0, n_records=50)
    prob, mus, mp = build(dom, cl, ys, sigma=1.0, total=50.0)
    prob.solve(solver=solver)
    plain = prob.value
    assert prob.status == "optimal" and mp.residual < 1e-4 * 50
    prob.solve(method="cvxdp", solver=cvxdp.MIRROR_DESCENT, eps_rel=1e-7, max_iters=20000)
    assert plain == pytest.approx(prob.value, rel=1e-4 if solver == cp.SCS else 1e-6)

"""GraphicalModel: marginals, factored queries (appendix B, Algorithm 3) and sampling, checked
against the explicit full table on small models."""
import itertools

import numpy as np
import pytest
from scipy import stats

from cvxdp.solvers.marginal.junction_tree import JunctionTree
from cvxdp.solvers.marginal import inference as inf
from cvxdp.solvers.marginal.inference import GraphicalModel


# ---------------------------------------------------------------------------- brute force
def full_table(sizes, factors, theta, total):
    """``total * p`` as a dense array with axes 0..d-1 (stable log-sum-exp normalisation)."""
    d = len(sizes)
    lp = np.zeros(sizes)
    for f, t in zip(factors, theta):
        lp = lp + np.transpose(t, np.argsort(f)).reshape([sizes[a] if a in f else 1 for a in range(d)])
    p = np.exp(lp - lp.max())
    return total * p / p.sum()


def brute_marginal(p, attrs):
    rest = tuple(a for a in range(p.ndim) if a not in attrs)
    m = p.sum(axis=rest) if rest else p
    srt = sorted(attrs)
    return np.transpose(m, [srt.index(a) for a in attrs])


def brute_query(p, Q):
    full = np.ones((1, 1))
    for a, n in enumerate(p.shape):
        full = np.kron(full, Q.get(a, np.ones((1, n))))
    return (full @ p.ravel()).reshape([Q[a].shape[0] for a in sorted(Q)])


def make(sizes, factors, seed, scale=1.0, total=1000.0):
    rng = np.random.default_rng(seed)
    tree = JunctionTree(sizes, factors)
    theta = [scale * rng.normal(size=tree.factor_shape(k)) for k in range(len(factors))]
    return GraphicalModel(tree, theta, total), full_table(sizes, factors, theta, total)


# (sizes, factors): a triangle needing no fill, attribute 4 in no factor; a 4-cycle needing a
# chord plus a pendant pair; factors listed in non-sorted attribute order.
TRIANGLE = ([3, 2, 4, 3, 2], [(0, 1), (2, 1), (2, 0), (3,), (3, 2)])
SQUARE = ([2, 3, 2, 4, 3, 2], [(1, 0), (1, 2), (3, 2), (0, 3), (5, 4), (3, 4)])
CHAIN = ([2, 3, 4, 2, 3, 2], [(0, 1), (2, 1), (2, 3), (4, 3), (5, 4)])


def random_structure(seed):
    rng = np.random.default_rng(seed)
    d = int(rng.integers(3, 7))
    sizes = [int(s) for s in rng.integers(2, 5, d)]
    factors = []
    for _ in range(int(rng.integers(2, 6))):
        k = int(rng.integers(1, 4))
        factors.append(tuple(int(a) for a in rng.permutation(d)[:k]))
    return sizes, factors


STRUCTURES = [TRIANGLE, SQUARE, CHAIN] + [random_structure(s) for s in range(6)]


# ---------------------------------------------------------------------------- marginals
@pytest.mark.parametrize("case", range(len(STRUCTURES)))
def test_marginals_on_every_attribute_tuple(case):
    sizes, factors = STRUCTURES[case]
    gm, p = make(sizes, factors, seed=case)
    d = len(sizes)
    rng = np.random.default_rng(case)
    tuples = [A for r in range(1, 4) for A in itertools.permutations(range(d), r)]
    tuples += [tuple(rng.permutation(d)) for _ in range(3)] + [tuple(range(d))]
    for A in tuples:
        np.testing.assert_allclose(gm.marginal(A), brute_marginal(p, A), rtol=1e-9, atol=1e-10,
                                   err_msg=str(A))
    assert gm.marginal(()) == pytest.approx(1000.0)


def test_triangle_is_triangulated_and_spanning_marginals_need_elimination():
    gm, p = make(*TRIANGLE, seed=1)
    assert (0, 1, 2) in gm.tree.cliques
    # (0, 3), (1, 3, 4) and (4, 0) lie in no single clique
    for A in [(3, 0), (1, 3, 4), (4, 0), (3, 1, 0)]:
        assert not any(set(A) <= set(c) for c in gm.tree.cliques)
        np.testing.assert_allclose(gm.marginal(A), brute_marginal(p, A), rtol=1e-10)


def test_factor_marginals_match_and_sum_to_total():
    sizes, factors = SQUARE
    gm, p = make(sizes, factors, seed=3)
    for f, m in zip(factors, gm.factor_marginals()):
        np.testing.assert_allclose(m, brute_marginal(p, f), rtol=1e-10)
        assert m.sum() == pytest.approx(1000.0)


def test_marginal_max_cells_is_enforced():
    gm, _ = make(*CHAIN, seed=0)
    with pytest.raises(ValueError, match="max_cells"):
        gm.marginal((0, 5), max_cells=10)
    with pytest.raises(ValueError, match="max_cells"):
        gm.marginal(tuple(range(6)), max_cells=100)


# ---------------------------------------------------------------------------- factored queries
def table2_queries(sizes, rng):
    n = sizes
    f2 = rng.integers(0, 2, n[2])
    f2[:2] = [0, 1]
    return {
        "identity": {0: inf.identity(n[0]), 3: inf.identity(n[3])},
        "total": {1: inf.total(n[1])},
        "empty": {},
        "evidence": {0: inf.evidence(n[0], 1), 2: inf.evidence(n[2], {0, n[2] - 1})},
        "cdf": {1: inf.cdf(n[1]), 3: inf.cdf(n[3])},
        "compress": {2: inf.compress(f2), 4: inf.identity(n[4])},
        "mean": {3: inf.mean(n[3]), 0: inf.identity(n[0])},
        "moments": {2: inf.moments(n[2], 3, values=np.linspace(-1, 2, n[2])), 1: inf.identity(n[1])},
        "negative": {a: rng.normal(size=(int(rng.integers(1, 4)), n[a])) for a in (0, 2, 3)},
        "mixed": {0: inf.cdf(n[0]), 1: inf.evidence(n[1], 0), 3: inf.moments(n[3], 2),
                  4: rng.normal(size=(2, n[4]))},
    }


@pytest.mark.parametrize("structure", [TRIANGLE, SQUARE, CHAIN], ids=["triangle", "square", "chain"])
def test_factored_queries_match_kronecker_product(structure):
    sizes, factors = structure
    gm, p = make(sizes, factors, seed=5)
    for name, Q in table2_queries(sizes, np.random.default_rng(7)).items():
        ans = gm.query(Q)
        ref = brute_query(p, Q)
        assert ans.shape == ref.shape, name
        np.testing.assert_allclose(ans, ref, rtol=1e-9, atol=1e-9, err_msg=name)


def test_identity_query_is_the_marginal_in_sorted_order():
    gm, p = make(*SQUARE, seed=2)
    Q = {5: inf.identity(2), 1: inf.identity(3)}
    np.testing.assert_allclose(gm.query(Q), gm.marginal((1, 5)), rtol=1e-12)


def test_table2_helpers():
    np.testing.assert_array_equal(inf.cdf(3), [[1, 0, 0], [1, 1, 0], [1, 1, 1]])
    np.testing.assert_array_equal(inf.compress([0, 2, 2, 1]), [[1, 0, 0, 0], [0, 0, 0, 1], [0, 1, 1, 0]])
    np.testing.assert_array_equal(inf.evidence(4, [1, 3]), [[0, 1, 0, 1]])
    np.testing.assert_array_equal(inf.moments(3, 2), [[0, 1, 2], [0, 1, 4]])
    np.testing.assert_array_equal(inf.mean(3, [5, 6, 7]), [[5, 6, 7]])
    np.testing.assert_array_equal(inf.total(2), [[1, 1]])
    for bad in [lambda: inf.identity(0), lambda: inf.evidence(3, 3), lambda: inf.evidence(3, []),
                lambda: inf.compress([0.5, 1]), lambda: inf.compress([0, 3], r=2),
                lambda: inf.moments(3, 0), lambda: inf.mean(3, [1, 2])]:
        with pytest.raises(ValueError):
            bad()


# ---------------------------------------------------------------------------- sampling
def test_samples_follow_the_exact_joint():
    sizes, factors = TRIANGLE                       # 144 cells, attribute 4 in no factor
    gm, p = make(sizes, factors, seed=11, total=1.0)
    n = 200_000
    x = gm.sample(n, rng=2024)
    assert x.shape == (n, 5) and np.issubdtype(x.dtype, np.integer)
    assert np.all((x >= 0) & (x < np.array(sizes)))
    counts = np.bincount(np.ravel_multi_index(x.T, sizes), minlength=p.size)
    expected = n * p.ravel()
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < stats.chi2.ppf(1 - 1e-6, p.size - 1), chi2
    freq = counts / n
    assert np.max(np.abs(freq - p.ravel()) / np.sqrt(p.ravel() / n)) < 6


def test_sample_conditioning_is_right_across_cliques():
    sizes, factors = CHAIN                          # a path of cliques joined by one-attribute separators
    tree = JunctionTree(sizes, factors)
    rng = np.random.default_rng(4)
    # parity-agreement couplings, so dependence survives along the path
    theta = [2.5 * np.equal.outer(*(np.arange(sizes[a]) % 2 for a in f)) + 0.3 * rng.normal(size=tree.factor_shape(k))
             for k, f in enumerate(factors)]
    gm = GraphicalModel(tree, theta, 1.0)
    p = full_table(sizes, factors, theta, 1.0)
    n = 200_000
    x = gm.sample(n, rng=np.random.default_rng(3))
    for A in [(0, 5), (3, 1), (0, 3), (2, 5)]:
        assert not any(set(A) <= set(c) for c in gm.tree.cliques)
        m = brute_marginal(p, A)
        emp = np.bincount(np.ravel_multi_index(x[:, A].T, m.shape), minlength=m.size) / n
        indep = np.outer(m.sum(1), m.sum(0)).ravel()
        sd = np.sqrt(m.ravel() * (1 - m.ravel()) / n)
        assert np.max(np.abs(emp - m.ravel()) / sd) < 6, A
        assert np.max(np.abs(m.ravel() - indep) / sd) > 20, A   # independence would fail the check


def test_sample_is_reproducible_and_handles_edge_cases():
    gm, _ = make(*SQUARE, seed=0)
    np.testing.assert_array_equal(gm.sample(100, 5), gm.sample(100, np.random.default_rng(5)))
    assert gm.sample(0).shape == (0, 6)
    c = gm.synthetic_counts(500, rng=1, attrs=(3, 0))
    assert c.shape == (4, 2) and c.sum() == 500


# ---------------------------------------------------------------------------- numerics
def test_large_parameters_stay_finite_and_exact():
    sizes, factors = SQUARE
    rng = np.random.default_rng(9)
    tree = JunctionTree(sizes, factors)
    theta = [500.0 * rng.choice([-1.0, 1.0], size=tree.factor_shape(k)) + rng.normal(size=tree.factor_shape(k))
             for k in range(len(factors))]
    gm = GraphicalModel(tree, theta, 100.0)
    p = full_table(sizes, factors, theta, 100.0)
    assert np.isfinite(gm.log_partition)
    for A in [(0,), (3, 0), (5, 1, 2), tuple(range(6))]:
        m = gm.marginal(A)
        assert np.all(np.isfinite(m)) and m.sum() == pytest.approx(100.0)
        np.testing.assert_allclose(m, brute_marginal(p, A), atol=1e-9)
    q = {0: inf.cdf(2), 4: rng.normal(size=(2, 3))}
    assert np.all(np.isfinite(gm.query(q)))
    np.testing.assert_allclose(gm.query(q), brute_query(p, q), atol=1e-8)
    x = gm.sample(1000, 0)
    assert np.all((x >= 0) & (x < np.array(sizes)))


def test_inputs_are_copied():
    sizes, factors = TRIANGLE
    tree = JunctionTree(sizes, factors)
    theta = [np.zeros(tree.factor_shape(k)) for k in range(len(factors))]
    gm = GraphicalModel(tree, theta, 10.0)
    before = gm.marginal((0, 3))
    theta[0][:] = 50.0
    np.testing.assert_array_equal(gm.marginal((0, 3)), before)
    m = gm.marginal((0, 1, 2))                      # a clique belief: must be a fresh array
    m[:] = -1
    np.testing.assert_allclose(gm.marginal((0, 1, 2)).sum(), 10.0)
    Q = {0: inf.identity(3)}
    a = gm.query(Q)
    Q[0][:] = 0
    np.testing.assert_array_equal(gm.query({0: inf.identity(3)}), a)


# ---------------------------------------------------------------------------- bad input
def test_bad_input_raises_value_error_naming_the_argument():
    sizes, factors = TRIANGLE
    tree = JunctionTree(sizes, factors)
    good = [np.zeros(tree.factor_shape(k)) for k in range(len(factors))]
    with pytest.raises(ValueError, match="theta"):
        GraphicalModel(tree, good[:-1], 1.0)
    with pytest.raises(ValueError, match=r"theta\[0\]"):
        GraphicalModel(tree, [np.zeros((2, 3))] + good[1:], 1.0)
    with pytest.raises(ValueError, match=r"theta\[1\]"):
        GraphicalModel(tree, [good[0], np.full(tree.factor_shape(1), np.nan)] + good[2:], 1.0)
    with pytest.raises(ValueError, match="total"):
        GraphicalModel(tree, good, -1.0)
    gm = GraphicalModel(tree, good, 1.0)
    for A in [(5,), (0, -1), (1, 1), 3]:
        with pytest.raises(ValueError, match="attrs"):
            gm.marginal(A)
    with pytest.raises(ValueError, match="factors"):
        gm.query({7: np.ones((1, 2))})
    with pytest.raises(ValueError, match=r"factors\[1\]"):
        gm.query({1: np.ones((1, 3))})              # attribute 1 has 2 values
    with pytest.raises(ValueError, match=r"factors\[2\]"):
        gm.query({2: np.ones(4)})                   # not a matrix
    with pytest.raises(ValueError, match="factors"):
        gm.query([np.ones((1, 3))])
    for n in [-1, 2.5, True]:
        with pytest.raises(ValueError, match="n must"):
            gm.sample(n)


def test_query_on_many_attributes_and_long_chains():
    # 60 binary attributes on a chain: evidence on all of them is one cell of p, exp(sum theta - log Z)
    d = 60
    factors = [(a, a + 1) for a in range(d - 1)]
    tree = JunctionTree([2] * d, factors)
    rng = np.random.default_rng(0)
    theta = [rng.normal(size=(2, 2)) for _ in factors]
    gm = GraphicalModel(tree, theta, 1.0)
    x = rng.integers(0, 2, d)
    ans = gm.query({a: inf.evidence(2, int(x[a])) for a in range(d)})
    assert ans.shape == (1,) * d
    exact = np.exp(sum(t[x[a], x[a + 1]] for a, t in enumerate(theta)) - gm.log_partition)
    assert ans.item() == pytest.approx(exact, rel=1e-9)
    # the two ends of the chain: variable elimination through 58 attributes
    m = gm.marginal((d - 1, 0))
    ref = np.eye(2)
    for t in theta:
        ref = ref @ np.exp(t)
    np.testing.assert_allclose(m, (ref / ref.sum()).T, rtol=1e-9)

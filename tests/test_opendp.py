"""Against the real OpenDP package (the ``mbi`` extra; skipped without it unless
CVXDP_REQUIRE_EXTRAS names opendp, as .ci/extras does):

* ``hierarchy(n, k, layout="opendp")`` is the node order of ``make_b_ary_tree`` (rows, padding,
  sensitivity), its GLS is ``make_consistent_b_ary_tree``, and a ``count_by_categories >>
  then_b_ary_tree >> then_laplace`` release is a ``cvxdp.Measurement`` that ``cvxdp.ADMM``
  solves on its tree route;
* ``cvxdp.mechanisms.laplace`` / ``gaussian`` with ``sampler="opendp"``: the scale OpenDP's
  privacy map certifies, integers for integer answers, and the noise's variance (unseeded
  draws, within five standard errors of the sample variance)."""
from __future__ import annotations

import importlib
import math
import os

import numpy as np
import pytest
import cvxpy as cp

import cvxdp
from cvxdp.modelling import workloads as W
from tests.conftest import CLARABEL_TIGHT, sparse_counts

REQUIRED = {m.strip() for m in os.environ.get("CVXDP_REQUIRE_EXTRAS", "").split(",") if m.strip()}


@pytest.fixture(scope="module")
def dp():
    if "opendp" in REQUIRED:
        importlib.import_module("opendp")
    else:
        pytest.importorskip("opendp")
    import opendp.prelude as dp
    dp.enable_features("contrib")
    return dp


def _tree_transformation(dp, n: int, k: int):
    space = dp.vector_domain(dp.atom_domain(T=int)), dp.l1_distance(T=int)
    return space >> dp.t.then_b_ary_tree(leaf_count=n, branching_factor=k)


# ------------------------------------------------------------------------- the layout
def _sizes():
    rng = np.random.default_rng(1)
    out = [(1000, 4), (1, 2), (2, 2), (1, 16)]
    for k in range(2, 17):
        near = {k ** j + d for j in range(1, 9) for d in (-1, 0, 1) if 1 <= k ** j + d <= 5000}
        out += [(n, k) for n in sorted(near | set(rng.integers(1, 5001, 8).tolist()))]
    return out


def test_rows_are_make_b_ary_tree_node_order(dp):
    """``H @ x`` is OpenDP's tree of ``x`` entry by entry (padding of the internal levels
    included), and the sensitivity is its map of one record."""
    rng = np.random.default_rng(0)
    for n, k in _sizes():
        H = W.hierarchy(n, k, layout="opendp")
        tree = _tree_transformation(dp, n, k)
        x = rng.integers(0, 1000, n)
        np.testing.assert_array_equal(H.queries @ x, np.asarray(tree(x.tolist())), err_msg=f"{(n, k)}")
        assert tree.map(1) == H.sensitivity, (n, k)
    assert W.hierarchy(1000, 4, layout="opendp").n_nodes == 1341


@pytest.mark.parametrize("n,k", [(5, 2), (10, 3), (1000, 4), (64, 4), (300, 16), (4097, 2)])
def test_gls_is_opendps_consistent_postprocessor(dp, n, k):
    """``H.project`` (the GLS, empty nodes fixed at zero) gives OpenDP's
    ``make_consistent_b_ary_tree`` leaves on an integer release."""
    H = W.hierarchy(n, k, layout="opendp")
    rng = np.random.default_rng(n)
    release = H.queries @ sparse_counts(n, rng) + rng.integers(-20, 21, H.n_nodes)
    theirs = np.asarray(dp.t.make_consistent_b_ary_tree(branching_factor=k)(
        release.astype(np.int64).tolist()))
    ours = H.project(release)[H.leaves]
    np.testing.assert_allclose(ours, theirs, rtol=1e-12, atol=1e-9 * np.abs(release).max())


def test_a_then_b_ary_tree_release_is_a_measurement(dp):
    """Records -> ``count_by_categories`` (the unknown-category count last) -> b-ary tree ->
    Laplace, as OpenDP users release it: the cvxdp Measurement of that vector takes the
    lifted tree route and matches Clarabel."""
    n, k, eps = 200, 4, 1.0
    rng = np.random.default_rng(7)
    counts = sparse_counts(n, rng).astype(int)
    records = np.r_[np.repeat(np.arange(n), counts), [n + 5] * 3]     # 3 outside the categories
    space = dp.vector_domain(dp.atom_domain(T=int)), dp.symmetric_distance()
    histogram = space >> dp.t.then_count_by_categories(categories=list(range(n)))
    np.testing.assert_array_equal(histogram(records.tolist()), np.r_[counts, 3])
    tree_t = histogram >> dp.t.then_b_ary_tree(leaf_count=n + 1, branching_factor=k)
    scale = dp.binary_search_param(lambda s: tree_t >> dp.m.then_laplace(scale=s), d_in=1, d_out=eps)
    tree = W.hierarchy(n + 1, k, layout="opendp")
    assert scale == pytest.approx(tree.sensitivity / eps)
    release = (tree_t >> dp.m.then_laplace(scale=scale))(records.tolist())
    y = cvxdp.Measurement(tree.queries, release, noise="laplace", scale=scale)
    x = cp.Variable(n + 1)
    prob = cp.Problem(cp.Minimize(cvxdp.nll(y, x)), [x >= 0])
    prob.solve(method="cvxdp", solver=cvxdp.ADMM, eps_rel=1e-9)
    assert prob.status == cp.OPTIMAL
    assert prob.solver_stats.extra_stats["info"]["route"] == "ADMM lifted separable/tree"
    ours = prob.value
    assert ours == pytest.approx(prob.solve(solver=cp.CLARABEL, **CLARABEL_TIGHT), rel=1e-7)


# ------------------------------------------------------------------------ the samplers
def _variance_within(e: np.ndarray, expected: float, k: float = 5.0) -> None:
    """The sample variance of ``e`` within ``k`` standard errors of ``expected``."""
    c = e - e.mean()
    s2 = float(np.mean(c ** 2))
    se = math.sqrt(max(float(np.mean(c ** 4)) - s2 ** 2, 0.0) / e.size)
    assert abs(s2 - expected) <= k * se, (s2, expected, se)


def test_laplace_sampler_integer_and_float(dp):
    N, eps = 40_000, 0.5
    b = 1 / eps
    x = np.arange(N) % 9
    m = cvxdp.mechanisms.laplace(W.identity(N), x, eps, sampler="opendp")
    assert isinstance(m, cvxdp.Measurement) and m.noise == "laplace" and m.scale == b
    e = m.answers - x
    assert np.all(e == np.round(e))                           # the discrete Laplace
    p = math.exp(-1 / b)
    _variance_within(e, 2 * p / (1 - p) ** 2)                 # its variance, below 2 b^2
    mf = cvxdp.mechanisms.laplace(W.identity(N), x + 0.25, eps, sampler="opendp")
    ef = mf.answers - (x + 0.25)
    assert mf.scale == b and np.mean(ef != np.round(ef)) > 0.99
    _variance_within(ef, 2 * b * b)
    # a scale that needs rounding up: OpenDP's map at the returned scale is within epsilon
    H = W.hierarchy(64, 4)
    m3 = cvxdp.mechanisms.laplace(H.queries, np.ones(64), 0.3, sampler="opendp")
    space = dp.vector_domain(dp.atom_domain(T="i64")), dp.l1_distance(T=float)
    assert (space >> dp.m.then_laplace(scale=m3.scale)).map(float(H.sensitivity)) <= 0.3
    assert m3.scale == pytest.approx(H.sensitivity / 0.3, rel=1e-12)


def test_gaussian_sampler_by_rho_and_by_epsilon_delta(dp):
    N = 40_000
    x = np.arange(N) % 5
    m = cvxdp.mechanisms.gaussian(W.identity(N), x, rho=0.02, sampler="opendp")
    sigma = 1 / math.sqrt(2 * 0.02)
    assert m.noise == "gaussian" and m.scale == pytest.approx(sigma, rel=1e-12)
    e = m.answers - x
    assert np.all(e == np.round(e))                           # the discrete Gaussian
    k = np.arange(-200, 201)
    w = np.exp(-k ** 2 / (2 * sigma ** 2))
    _variance_within(e, float(np.sum(k ** 2 * w) / np.sum(w)))
    mf = cvxdp.mechanisms.gaussian(W.identity(N), x + 0.5, sigma=3.0, sampler="opendp")
    assert mf.scale == 3.0
    _variance_within(mf.answers - (x + 0.5), 9.0)
    # (epsilon, delta): the smallest sigma OpenDP's zCDP conversion certifies
    H = W.hierarchy(32, 2)
    me = cvxdp.mechanisms.gaussian(H.queries, np.ones(32), epsilon=1.0, delta=1e-6, sampler="opendp")
    analytic = cvxdp.mechanisms.gaussian(H.queries, np.ones(32), epsilon=1.0, delta=1e-6, rng=0)
    assert analytic.scale < me.scale < 1.15 * analytic.scale
    space = dp.vector_domain(dp.atom_domain(T="i64")), dp.l2_distance(T=float)

    def approx(s):
        return dp.c.make_fix_delta(dp.c.make_zCDP_to_approxDP(space >> dp.m.then_gaussian(scale=s)),
                                   delta=1e-6)
    d2 = cvxdp.mechanisms.l2_sensitivity(H.queries)
    assert approx(me.scale).map(d2)[0] <= 1.0 < approx(0.999 * me.scale).map(d2)[0]


def test_a_seed_with_the_exact_sampler_is_refused(dp):
    with pytest.raises(ValueError, match="rng has no effect"):
        cvxdp.mechanisms.laplace(W.identity(3), np.ones(3), 1.0, rng=0, sampler="opendp")
    with pytest.raises(ValueError, match="rng has no effect"):
        cvxdp.mechanisms.gaussian(W.identity(3), np.ones(3), rho=1.0, rng=0, sampler="opendp")


def test_tutorial_8_on_the_real_package(dp, tmp_path):
    """Tutorial 8's OpenDP path (fast mode): OpenDP's post-processor equals cvxdp's GLS to
    rounding and is in the table."""
    pytest.importorskip("matplotlib")
    from tests.test_tutorials import run_tutorial

    proc = run_tutorial("08_opendp_release.py", tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("largest difference"))
    assert float(line.rsplit(":", 1)[1]) < 1e-9
    assert any(ln.startswith("OpenDP consistent") for ln in proc.stdout.splitlines())
    assert "SKIPPED" not in proc.stdout and "SIMULATED" not in proc.stdout

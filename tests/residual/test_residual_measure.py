"""Measuring a marginal workload with a residual design and reconstructing its marginals:
exact without noise, unbiased with the design's per-cell variance (checked by simulation),
the privacy accounting (cost = 2 rho, scale_to_rho), the samplers, and bad input."""
from __future__ import annotations

import importlib
import os

import numpy as np
import pytest
import cvxpy as cp

import cvxdp
from cvxdp.solvers.residual.measure import sub, sub_pinv

REQUIRED = {m.strip() for m in os.environ.get("CVXDP_REQUIRE_EXTRAS", "").split(",") if m.strip()}


def _instance(seed=0, n=400):
    rng = np.random.default_rng(seed)
    dom = cvxdp.Domain({"a": 2, "b": 3, "c": 4, "d": 1, "e": 3})
    recs = np.column_stack([rng.integers(0, k, n) for k in dom.sizes])
    W = cvxdp.workloads.marginal_workload(dom, [("a", "b"), ("b", "c"), ("a", "c", "d"), ("e",)])
    s = cp.Variable(W.n_residuals, pos=True)
    c = np.array([1.0, 2.0, 3.0, 0.5])
    cp.Problem(cp.Minimize(cvxdp.privacy_cost(W, s)), [cvxdp.query_variance(W, s) <= c]).solve(
        method="cvxdp", eps_rel=1e-10)
    return dom, recs, W, s.value, c


def test_sub_and_its_pseudo_inverse():
    rng = np.random.default_rng(0)
    T = rng.normal(size=(3, 4, 2))
    Y = sub(T)
    assert Y.shape == (2, 3, 1)
    # Sub^+ Sub is the projection removing each axis's mean: (x) (I - 11^T / n)
    P = T.copy()
    for ax in range(3):
        P = P - P.mean(axis=ax, keepdims=True)
    np.testing.assert_allclose(sub_pinv(Y, [3, 4, 2]), P, atol=1e-12)
    np.testing.assert_allclose(sub(sub_pinv(Y, [3, 4, 2])), Y, atol=1e-12)


def test_reconstruction_is_exact_without_noise_and_in_any_axis_order():
    dom, recs, W, s, _ = _instance()
    m = cvxdp.mechanisms.residual_gaussian(W, s * 1e-30, recs, rng=1)
    out = cvxdp.reconstruct(W, m)
    assert list(out) == list(W.cliques) and len(out) == 4
    for clique in list(W.cliques) + [("c",), ("a", "c")]:
        np.testing.assert_allclose(out[clique], dom.count(recs, clique), atol=1e-9)
    np.testing.assert_allclose(out[("c", "a")], dom.count(recs, ("c", "a")), atol=1e-9)
    with pytest.raises(KeyError, match="closure"):
        out[("a", "e")]


def test_unbiased_with_the_designed_variance_by_simulation():
    """Over 3,000 draws the mean error of every cell is within 4 standard errors of 0 and the
    empirical variance within 4 standard errors of ``sum_A v_{M,A} s_A`` (the target where
    it binds)."""
    dom, recs, W, s, c = _instance(1)
    draws = 3000
    rng = np.random.default_rng(5)
    for m_idx, clique in enumerate(W.cliques):
        truth = dom.count(recs, clique)
        est = np.array([cvxdp.reconstruct(W, cvxdp.mechanisms.residual_gaussian(W, s, recs, rng=rng))[clique]
                        for _ in range(draws)])
        var = cvxdp.reconstruct(W, cvxdp.mechanisms.residual_gaussian(W, s, recs, rng=0)).variance(clique)
        assert var == pytest.approx((W.basis.V @ s)[m_idx], rel=1e-12)
        assert var <= c[m_idx] * (1 + 1e-9)
        err = est - truth
        assert np.all(np.abs(err.mean(axis=0)) <= 4 * np.sqrt(var / draws))
        assert np.all(np.abs(err.var(axis=0) - var) <= 4 * var * np.sqrt(2.0 / draws))


def test_privacy_accounting_and_scale_to_rho():
    dom, recs, W, s, c = _instance(2)
    cost = cvxdp.privacy_cost(W, s).value
    m = cvxdp.mechanisms.residual_gaussian(W, s, recs, rng=0)
    assert m.privacy_cost == pytest.approx(cost, rel=1e-12)
    assert m.rho == pytest.approx(cost / 2, rel=1e-12)
    assert m.epsilon(1e-6) == pytest.approx(cvxdp.privacy.zcdp_to_dp(cost / 2, 1e-6))
    assert m.rho_marginal_bound >= m.rho
    s1 = cvxdp.mechanisms.scale_to_rho(W, s, 0.25)
    assert cvxdp.privacy_cost(W, s1).value == pytest.approx(0.5, rel=1e-12)
    np.testing.assert_allclose(s1 / s, (cost / 0.5) * np.ones_like(s))
    with pytest.raises(ValueError, match="rho"):
        cvxdp.mechanisms.scale_to_rho(W, s, 0.0)


def test_answers_and_records_as_a_dataframe():
    pd = pytest.importorskip("pandas")
    dom, recs, W, s, _ = _instance(3)
    df = pd.DataFrame(recs, columns=list(dom.names))
    a = cvxdp.mechanisms.residual_gaussian(W, s, recs, rng=7)
    b = cvxdp.mechanisms.residual_gaussian(W, s, df, rng=7)
    for x, y in zip(a.answers, b.answers):
        np.testing.assert_array_equal(x, y)


def test_bad_input_is_refused():
    dom, recs, W, s, _ = _instance(4)
    with pytest.raises(ValueError, match="one variance per residual"):
        cvxdp.mechanisms.residual_gaussian(W, s[:-1], recs)
    bad = s.copy()
    bad[1] = 0.0
    with pytest.raises(ValueError, match="positive"):
        cvxdp.mechanisms.residual_gaussian(W, bad, recs)
    with pytest.raises(ValueError, match="sampler"):
        cvxdp.mechanisms.residual_gaussian(W, s, recs, sampler="exact")
    with pytest.raises(ValueError, match="codes outside"):
        cvxdp.mechanisms.residual_gaussian(W, s, recs + 5)
    other = cvxdp.workloads.marginal_workload(dom, [("a",)])
    m = cvxdp.mechanisms.residual_gaussian(W, s, recs, rng=0)
    with pytest.raises(ValueError, match="workload"):
        cvxdp.reconstruct(other, m)
    with pytest.raises(TypeError, match="ResidualMeasurement"):
        cvxdp.reconstruct(W, s)


def test_exact_sampler_through_opendp():
    if "opendp" in REQUIRED:
        importlib.import_module("opendp")
    else:
        pytest.importorskip("opendp")
    dom, recs, W, s, _ = _instance(5, n=100)
    m = cvxdp.mechanisms.residual_gaussian(W, s, recs, sampler="opendp")
    assert m.sampler == "opendp"
    out = cvxdp.reconstruct(W, m)
    for clique in W.cliques:
        assert out[clique].shape == dom.shape(clique)
        # within 8 standard deviations of the truth in every cell
        assert np.all(np.abs(out[clique] - dom.count(recs, clique)) <= 8 * np.sqrt(out.variance(clique)))

"""Tests for cvxdp.mechanisms: sensitivities, Laplace and Gaussian releases."""
from __future__ import annotations

import math
import sys

import numpy as np
import pytest
import scipy.sparse as sp

from cvxdp import Measurement
from cvxdp.modelling import privacy
from cvxdp.modelling import workloads as W
from cvxdp.modelling.mechanisms import gaussian, l1_sensitivity, l2_sensitivity, laplace


# ------------------------------------------------------------------ sensitivities
def test_sensitivities_explicit():
    assert l1_sensitivity(np.eye(5)) == 1.0 and l2_sensitivity(np.eye(5)) == 1.0
    Q = np.array([[1.0, -2.0, 0.0],
                  [3.0, 0.0, 0.5],
                  [0.0, 2.0, -0.5]])
    # columns: L1 = 4, 4, 1;  L2 = sqrt(10), sqrt(8), sqrt(0.5)
    assert l1_sensitivity(Q) == 4.0
    assert l2_sensitivity(Q) == pytest.approx(math.sqrt(10))
    assert l1_sensitivity(sp.csr_matrix(Q)) == 4.0
    assert l2_sensitivity(sp.csc_matrix(Q)) == pytest.approx(math.sqrt(10))


def test_sensitivities_of_strategies():
    H = W.hierarchy(8, 2).queries
    assert l1_sensitivity(H) == 4.0             # one node per level
    assert l2_sensitivity(H) == 2.0             # sqrt(4)
    assert l1_sensitivity(W.prefix(6)) == 6.0   # cell 0 is in every prefix
    assert l1_sensitivity(W.wavelet(16)) == 5.0
    assert l1_sensitivity(W.marginals((2, 3), [(0,), (1,), ()])) == 3.0


def test_sensitivity_rejects_bad_matrix():
    with pytest.raises(ValueError, match="queries must be a 2-D"):
        l1_sensitivity(np.ones(3))
    with pytest.raises(ValueError, match="queries must be finite"):
        l2_sensitivity(np.array([[1.0, np.nan]]))


# ----------------------------------------------------------------------- Laplace
def test_laplace_measurement_and_noise_variance():
    n = 200000
    x = np.arange(n, dtype=float) % 7
    m = laplace(W.identity(n), x, epsilon=0.25, rng=1)
    assert isinstance(m, Measurement) and m.noise == "laplace"
    b = 1 / 0.25
    assert m.scale == b
    e = m.answers - x
    assert abs(e.mean()) < 0.05
    assert e.var() == pytest.approx(2 * b * b, rel=0.03)
    # Laplace, not Gaussian: mean absolute deviation is b (Gaussian would give 0.8 b)
    assert np.abs(e).mean() == pytest.approx(b, rel=0.02)


def test_laplace_default_scale_is_l1_sensitivity_over_epsilon():
    H = W.hierarchy(16, 2)
    m = laplace(H.queries, np.arange(16.0), epsilon=2.0, rng=0)
    assert m.scale == pytest.approx(5 / 2.0)
    assert m.shape == (31, 16)


def test_laplace_reproducible_and_data_untouched():
    Q = W.hierarchy(10, 3).queries
    x = np.arange(10.0)
    x_copy = x.copy()
    a = laplace(Q, x, 1.0, rng=42).answers
    b = laplace(Q, x, 1.0, rng=42).answers
    c = laplace(Q, x, 1.0, rng=43).answers
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    np.testing.assert_array_equal(x, x_copy)
    g = np.random.default_rng(5)
    np.testing.assert_array_equal(laplace(Q, x, 1.0, rng=g).answers,
                                  laplace(Q, x, 1.0, rng=np.random.default_rng(5)).answers)
    # a contingency table is flattened in C order
    T = np.arange(6.0).reshape(2, 3)
    M = W.marginal((2, 3), (0,))
    np.testing.assert_array_equal(laplace(M, T, 1.0, rng=3).answers,
                                  laplace(M, T.ravel(), 1.0, rng=3).answers)


@pytest.mark.parametrize("eps", [0, -1, float("nan"), float("inf")])
def test_laplace_rejects_bad_epsilon(eps):
    with pytest.raises(ValueError, match="epsilon must be positive"):
        laplace(np.eye(3), np.ones(3), eps)


def test_laplace_rejects_bad_data():
    with pytest.raises(ValueError, match=r"data must be finite \(NaN or inf at index 1\)"):
        laplace(np.eye(3), np.array([1.0, np.nan, 2.0]), 1.0)
    with pytest.raises(ValueError, match=r"data must have 3 entries \(queries have shape "
                                         r"\(3, 3\)\), got shape \(4,\)"):
        laplace(np.eye(3), np.ones(4), 1.0)
    with pytest.raises(ValueError, match="sensitivity must be positive"):
        laplace(np.eye(3), np.ones(3), 1.0, sensitivity=0)
    with pytest.raises(ValueError, match="rng"):
        laplace(np.eye(3), np.ones(3), 1.0, rng=1.5)
    with pytest.raises(ValueError, match="zero L1 sensitivity"):
        laplace(np.zeros((2, 3)), np.ones(3), 1.0)


# ---------------------------------------------------------------------- Gaussian
def test_gaussian_sigma_from_rho():
    H = W.hierarchy(8, 2).queries                 # L2 sensitivity 2
    m = gaussian(H, np.ones(8), rho=0.5, rng=0)
    assert m.noise == "gaussian"
    assert m.scale == pytest.approx(2 / math.sqrt(2 * 0.5))
    assert privacy.zcdp_rho(m.scale, sensitivity=2.0) == pytest.approx(0.5)
    m = gaussian(H, np.ones(8), rho=0.5, sensitivity=3.0, rng=0)
    assert m.scale == pytest.approx(3.0)


def test_gaussian_sigma_from_epsilon_delta():
    H = W.hierarchy(16, 4).queries                # 3 levels, L2 sensitivity sqrt(3)
    m = gaussian(H, np.zeros(16), epsilon=0.7, delta=1e-6, rng=0)
    assert m.scale == pytest.approx(privacy.gaussian_sigma(0.7, 1e-6, math.sqrt(3)), rel=1e-12)
    assert privacy.gaussian_delta(m.scale, 0.7, math.sqrt(3)) == pytest.approx(1e-6, rel=1e-9)


def test_gaussian_noise_and_reproducibility():
    Q = sp.identity(200000, format="csr")
    x = np.full(200000, 5.0)
    x_copy = x.copy()
    m = gaussian(Q, x, sigma=3.0, rng=11)
    e = m.answers - x
    assert e.std() == pytest.approx(3.0, rel=0.01)
    assert np.abs(e).mean() == pytest.approx(3.0 * math.sqrt(2 / math.pi), rel=0.01)
    np.testing.assert_array_equal(m.answers, gaussian(Q, x, sigma=3.0, rng=11).answers)
    np.testing.assert_array_equal(x, x_copy)


def test_gaussian_validation():
    Q, x = np.eye(3), np.ones(3)
    with pytest.raises(ValueError, match="exactly one"):
        gaussian(Q, x)
    with pytest.raises(ValueError, match="exactly one"):
        gaussian(Q, x, sigma=1.0, rho=0.5)
    with pytest.raises(ValueError, match="delta is missing"):
        gaussian(Q, x, epsilon=1.0)
    with pytest.raises(ValueError, match="epsilon is missing"):
        gaussian(Q, x, delta=1e-5)
    with pytest.raises(ValueError, match="exactly one"):
        gaussian(Q, x, rho=0.5, epsilon=1.0, delta=1e-5)
    with pytest.raises(ValueError, match="sigma must be positive"):
        gaussian(Q, x, sigma=-1.0)
    with pytest.raises(ValueError, match="rho must be positive"):
        gaussian(Q, x, rho=0.0)
    with pytest.raises(ValueError, match="delta must be in the open interval"):
        gaussian(Q, x, epsilon=1.0, delta=1.5)
    with pytest.raises(ValueError, match="epsilon must be positive"):
        gaussian(Q, x, epsilon=-1.0, delta=1e-5)
    with pytest.raises(ValueError, match="sensitivity has no effect"):
        gaussian(Q, x, sigma=1.0, sensitivity=2.0)
    with pytest.raises(ValueError, match="data must have 3 entries"):
        gaussian(Q, np.ones((2, 2)), sigma=1.0)
    with pytest.raises(ValueError, match="data must be finite"):
        gaussian(Q, np.array([1.0, np.inf, 0.0]), sigma=1.0)


# ---------------------------------------------------------------------- samplers
def test_sampler_is_validated_before_anything_is_drawn():
    with pytest.raises(ValueError, match="sampler must be one of"):
        laplace(np.eye(3), np.ones(3), 1.0, sampler="exact")
    with pytest.raises(ValueError, match="sampler must be one of"):
        gaussian(np.eye(3), np.ones(3), sigma=1.0, sampler="OpenDP")
    # the numpy sampler stays the default, seeded
    a = laplace(np.eye(3), np.ones(3), 1.0, rng=3, sampler="numpy")
    np.testing.assert_array_equal(a.answers, laplace(np.eye(3), np.ones(3), 1.0, rng=3).answers)


def test_exact_sampler_without_opendp_says_how_to_install(monkeypatch):
    """``sys.modules[name] = None`` makes the import fail as if opendp were not installed."""
    monkeypatch.setitem(sys.modules, "opendp", None)
    monkeypatch.setitem(sys.modules, "opendp.prelude", None)
    with pytest.raises(ImportError, match=r"laplace\(sampler='opendp'\) needs opendp: pip install 'cvxdp\[mbi\]'"):
        laplace(np.eye(3), np.ones(3), 1.0, sampler="opendp")
    with pytest.raises(ImportError, match=r"gaussian\(sampler='opendp'\) needs opendp"):
        gaussian(np.eye(3), np.ones(3), rho=1.0, sampler="opendp")


def test_integer_answers_are_those_exact_as_doubles():
    from cvxdp.modelling.opendp_samplers import is_integral

    assert is_integral(np.array([0.0, -3.0, 2.0 ** 52]))
    assert not is_integral(np.array([1.0, 2.5]))
    assert not is_integral(np.array([2.0 ** 53]))            # beyond: the float mechanism

"""Tests for cvxdp.privacy (analytic Gaussian mechanism, zCDP conversions)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm

from cvxdp.modelling import privacy as P

EPS = [0.05, 0.3, 1.0, 3.0, 10.0]
DELTAS = [1e-3, 1e-6, 1e-10]


def direct_delta(sigma, eps, d=1.0):
    """Balle & Wang Thm 8 written with survival functions (no log-space tricks)."""
    a, b = d / (2 * sigma), eps * sigma / d
    return norm.sf(b - a) - math.exp(eps) * norm.sf(a + b)


def test_delta_known_value():
    # Phi(-0.5) - e Phi(-1.5)
    assert P.gaussian_delta(1.0, 1.0) == pytest.approx(0.3085375387 - math.e * 0.0668072013,
                                                       rel=1e-9)
    # epsilon = 0: total variation 2 Phi(D / (2 sigma)) - 1
    assert P.gaussian_delta(2.0, 0.0, sensitivity=3.0) == pytest.approx(2 * norm.cdf(0.75) - 1,
                                                                         rel=1e-12)


@pytest.mark.parametrize("sigma,eps", [(0.5, 0.1), (1.0, 1.0), (3.0, 0.5), (0.7, 5.0),
                                       (2.0, 3.0), (8.0, 1.0)])
def test_delta_matches_direct_formula(sigma, eps):
    assert P.gaussian_delta(sigma, eps) == pytest.approx(direct_delta(sigma, eps), rel=1e-8)
    # only sigma / sensitivity matters
    assert P.gaussian_delta(3 * sigma, eps, sensitivity=3.0) == pytest.approx(
        P.gaussian_delta(sigma, eps), rel=1e-12)


@pytest.mark.parametrize("eps", EPS)
@pytest.mark.parametrize("delta", DELTAS)
def test_sigma_round_trip(eps, delta):
    s = P.gaussian_sigma(eps, delta)
    assert P.gaussian_delta(s, eps) == pytest.approx(delta, rel=1e-9)
    assert P.gaussian_delta(s, eps) <= delta                  # never below the threshold
    assert P.gaussian_delta(s * (1 - 1e-11), eps) > delta     # and the smallest such sigma
    # linear in the sensitivity
    assert P.gaussian_sigma(eps, delta, sensitivity=2.5) == pytest.approx(2.5 * s, rel=1e-12)


@pytest.mark.parametrize("sigma", [0.3, 1.0, 4.0, 20.0])
@pytest.mark.parametrize("delta", DELTAS)
def test_epsilon_round_trip(sigma, delta):
    e = P.gaussian_epsilon(sigma, delta)
    if e == 0.0:
        assert P.gaussian_delta(sigma, 0.0) <= delta
    else:
        assert P.gaussian_delta(sigma, e) == pytest.approx(delta, rel=1e-9)
        assert P.gaussian_delta(sigma, e * (1 - 1e-11)) > delta
        assert P.gaussian_sigma(e, delta) == pytest.approx(sigma, rel=1e-9)


def test_epsilon_zero_when_noise_is_huge():
    assert P.gaussian_epsilon(100.0, 0.1) == 0.0
    assert P.gaussian_epsilon(1.0, 0.1) > 0.0


@pytest.mark.parametrize("eps", [0.05, 0.2, 0.5, 0.9])
@pytest.mark.parametrize("delta", DELTAS)
def test_analytic_beats_classical(eps, delta):
    classical = math.sqrt(2 * math.log(1.25 / delta)) / eps
    assert P.gaussian_sigma(eps, delta) < classical
    # the classical calibration is valid (it satisfies the exact curve) for eps < 1
    assert P.gaussian_delta(classical, eps) <= delta


def test_monotonicity():
    sig = np.geomspace(0.2, 20, 30)
    d = [P.gaussian_delta(s, 1.0) for s in sig]
    assert np.all(np.diff(d) < 0)
    eps = np.linspace(0, 5, 30)
    d = [P.gaussian_delta(1.0, e) for e in eps]
    assert np.all(np.diff(d) < 0)
    s_eps = [P.gaussian_sigma(e, 1e-5) for e in (0.1, 0.5, 1, 2, 4)]
    assert np.all(np.diff(s_eps) < 0)
    s_delta = [P.gaussian_sigma(1.0, dl) for dl in (1e-9, 1e-6, 1e-3, 1e-1)]
    assert np.all(np.diff(s_delta) < 0)


def test_zcdp_values():
    assert P.zcdp_rho(2.0) == 0.125
    assert P.zcdp_rho(1.0, sensitivity=3.0) == 4.5
    # rho = 1, delta = e^-4: 1 + 2 sqrt(1 * 4) = 5
    assert P.zcdp_to_dp(1.0, math.exp(-4)) == pytest.approx(5.0, rel=1e-12)
    # rho = 0.5, delta = 1e-5: 0.5 + 2 sqrt(0.5 ln 1e5) = 0.5 + 2 * 2.3992629560...
    assert P.zcdp_to_dp(0.5, 1e-5) == pytest.approx(5.2985259122, rel=1e-9)
    assert P.zcdp_to_dp(0.0, 1e-5) == 0.0
    # the zCDP route is looser than the exact curve
    for sigma in (0.5, 2.0, 10.0):
        assert P.gaussian_epsilon(sigma, 1e-6) < P.zcdp_to_dp(P.zcdp_rho(sigma), 1e-6)


def test_validation():
    with pytest.raises(ValueError, match="sigma must be positive"):
        P.gaussian_delta(0.0, 1.0)
    with pytest.raises(ValueError, match="epsilon must be non-negative"):
        P.gaussian_delta(1.0, -1.0)
    with pytest.raises(ValueError, match="delta must be in the open interval"):
        P.gaussian_sigma(1.0, 0.0)
    with pytest.raises(ValueError, match="delta"):
        P.gaussian_sigma(1.0, 1.0)
    with pytest.raises(ValueError, match="sensitivity must be positive"):
        P.gaussian_sigma(1.0, 1e-5, sensitivity=-2)
    with pytest.raises(ValueError, match="rho must be non-negative"):
        P.zcdp_to_dp(-0.1, 1e-5)
    with pytest.raises(ValueError, match="sigma must be positive"):
        P.zcdp_rho(float("nan"))
    with pytest.raises(ValueError, match="epsilon must be a real"):
        P.gaussian_sigma("1", 1e-5)

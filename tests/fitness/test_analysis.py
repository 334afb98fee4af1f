"""Data-independent error analysis: closed forms, explicit matrices, Monte Carlo."""
import numpy as np
import pytest
import scipy.sparse as sp

import cvxdp
from cvxdp.modelling import analysis as an

W_LECTURE = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])     # x1, x2, x1 + x2


def test_lecture_three_query_example():
    eps = 0.5
    # answering all three: sensitivity 2, Laplace scale 2/eps, variance 8/eps^2 per answer
    assert an.noise_variance(W_LECTURE, epsilon=eps) == pytest.approx(8 / eps ** 2)
    # answering x1, x2 and adding: 2/eps^2, 2/eps^2, 4/eps^2
    np.testing.assert_allclose(an.query_errors(W_LECTURE, np.eye(2), epsilon=eps),
                               [2 / eps ** 2, 2 / eps ** 2, 4 / eps ** 2])
    # answering all three and reconstructing by least squares: 8/eps^2 * 2/3 each
    np.testing.assert_allclose(an.query_errors(W_LECTURE, W_LECTURE, epsilon=eps),
                               [16 / (3 * eps ** 2)] * 3)
    assert an.expected_error(W_LECTURE, np.eye(2), epsilon=eps) == pytest.approx(8 / eps ** 2)


@pytest.mark.parametrize("n", [1, 2, 7, 16])
def test_implicit_grams_match_explicit_matrices(n):
    Wr = cvxdp.workloads.all_ranges(n)
    np.testing.assert_array_equal(an.all_ranges_gram(n), (Wr.T @ Wr).toarray())
    P = cvxdp.workloads.prefix(n)
    np.testing.assert_array_equal(an.prefix_gram(n), (P.T @ P).toarray())
    imp = an.implicit_all_ranges(n)
    assert imp.shape == Wr.shape
    assert imp.l1_sensitivity == cvxdp.mechanisms.l1_sensitivity(Wr)
    assert imp.l2_sensitivity == pytest.approx(cvxdp.mechanisms.l2_sensitivity(Wr))
    A = cvxdp.workloads.hierarchy(n, 2).queries
    assert an.expected_error(imp, A) == pytest.approx(an.expected_error(Wr, A), rel=1e-10)


def test_identity_strategy_closed_form():
    # each range of length L costs L noisy cells of variance 2/eps^2: total 2/eps^2 * sum L
    n, eps = 32, 0.3
    lengths_total = n * (n + 1) * (n + 2) / 6
    assert an.expected_error(an.implicit_all_ranges(n), sp.identity(n), epsilon=eps) == \
        pytest.approx(2 / eps ** 2 * lengths_total)


def test_all_ranges_strategy_is_answer_then_no_gain_on_itself():
    # answering the workload itself: LS reconstruction of a full-rank W gives back W's answers
    # only for square invertible W; for all ranges the LS error is below the raw error
    n = 8
    Wr = cvxdp.workloads.all_ranges(n)
    raw = an.noise_variance(Wr, epsilon=1.0) * Wr.shape[0]
    ls = an.expected_error(Wr, Wr, epsilon=1.0)
    assert ls < raw
    assert an.expected_error(an.implicit_all_ranges(n), an.implicit_all_ranges(n)) == pytest.approx(ls)


@pytest.mark.parametrize("make", ["hierarchy2", "hierarchy3", "wavelet", "identity"])
def test_closed_form_agrees_with_monte_carlo(make):
    n = 16 if make != "hierarchy3" else 9
    A = {"hierarchy2": lambda: cvxdp.workloads.hierarchy(n, 2).queries,
         "hierarchy3": lambda: cvxdp.workloads.hierarchy(n, 3).queries,
         "wavelet": lambda: cvxdp.workloads.wavelet(n),
         "identity": lambda: sp.identity(n, format="csr")}[make]()
    W = cvxdp.workloads.all_ranges(n)
    x = np.random.default_rng(1).poisson(5, n).astype(float)
    closed = an.expected_error(W, A, epsilon=1.0)
    mc = an.simulate_error(W, A, x, trials=6000, epsilon=1.0, rng=2)
    assert mc == pytest.approx(closed, rel=0.05)


def test_gaussian_noise_variance_and_monte_carlo():
    A = cvxdp.workloads.hierarchy(8, 2).queries
    assert an.noise_variance(A, noise="gaussian", sigma=3.0) == 9.0
    v = an.noise_variance(A, noise="gaussian", epsilon=1.0, delta=1e-6)
    assert np.sqrt(v) == pytest.approx(cvxdp.privacy.gaussian_sigma(1.0, 1e-6, cvxdp.mechanisms.l2_sensitivity(A)))
    W = cvxdp.workloads.prefix(8)
    closed = an.expected_error(W, A, noise="gaussian", sigma=2.0)
    mc = an.simulate_error(W, A, np.zeros(8), noise="gaussian", sigma=2.0, trials=8000, rng=3)
    assert mc == pytest.approx(closed, rel=0.05)


def test_lecture_rates_identity_n3_hierarchy_below():
    # total error on all ranges: identity grows like n^3, the binary hierarchy like n^2 log^3 n
    errs = {}
    for n in (256, 1024):
        W = an.implicit_all_ranges(n)
        errs[n] = (an.expected_error(W, sp.identity(n)),
                   an.expected_error(W, cvxdp.workloads.hierarchy(n, 2).queries))
    ratio_id = errs[1024][0] / errs[256][0]
    assert ratio_id == pytest.approx(4.0 ** 3, rel=0.05)
    ratio_h = errs[1024][1] / errs[256][1]
    expected_h = 4.0 ** 2 * (np.log2(1024) / np.log2(256)) ** 3
    assert ratio_h == pytest.approx(expected_h, rel=0.25)
    # the tree's larger constant (sensitivity log n) is paid back from about n = 2^10
    assert errs[256][1] > errs[256][0] and errs[1024][1] < errs[1024][0]


def test_unanswerable_workload_has_infinite_error():
    A = np.array([[1.0, 1.0, 0.0]])          # only the sum of the first two cells
    assert an.expected_error(np.eye(3), A) == np.inf


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="epsilon"):
        an.noise_variance(np.eye(2), epsilon=0)
    with pytest.raises(ValueError, match="columns"):
        an.expected_error(np.eye(3), np.eye(2))
    with pytest.raises(ValueError, match="noise"):
        an.noise_variance(np.eye(2), noise="cauchy", epsilon=1)
    with pytest.raises(ValueError, match="n must be"):
        an.implicit_all_ranges(0)


def test_direct_error_and_per_query_monte_carlo():
    eps = 1.0
    assert an.direct_error(W_LECTURE, epsilon=eps) == pytest.approx(3 * 8 / eps ** 2)
    per = an.simulate_error(W_LECTURE, np.eye(2), np.zeros(2), trials=40000, rng=5, per_query=True)
    np.testing.assert_allclose(per, [2.0, 2.0, 4.0], rtol=0.05)
    with pytest.raises(TypeError, match="explicit"):
        an.simulate_error(an.implicit_all_ranges(4), np.eye(4), np.zeros(4), per_query=True)


def test_implicit_gram_is_built_once():
    imp = an.implicit_all_ranges(64)
    assert imp.gram() is imp.gram()

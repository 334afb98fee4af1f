"""The shared loss parser of the recognisers (cvxdp.recognise.losses)."""
from __future__ import annotations

import numpy as np
import pytest
import cvxpy as cp

from cvxdp.errors import NotRecognised
from cvxdp.recognise.losses import collect


def test_weights_kinds_and_constant():
    x = cp.Variable(3)
    y = np.array([1.0, 2.0, 3.0])
    w = np.array([1.0, 2.0, 0.5])
    obj = 2 * cp.norm1(x - y) + cp.sum(cp.multiply(w, cp.square(x))) + cp.sum_squares(x) / 4 + 5.0
    terms, constant = collect(obj, "ADMM", "anything")
    assert constant == 5.0
    assert [t.kind for t in terms] == ["l1", "l2", "l2"]
    assert float(terms[0].weight) == 2.0
    np.testing.assert_allclose(terms[1].weight, 2 * w)       # phi = w2/2 r^2 with w2 = 2 w
    assert float(terms[2].weight) == 0.5


def test_quad_over_lin_and_scalar_power():
    x = cp.Variable(2)
    terms, _ = collect(cp.quad_over_lin(x, 4.0) + cp.square(x[0] - 1), "ADMM", "e")
    assert [t.kind for t in terms] == ["l2", "l2"]
    assert float(terms[0].weight) == 0.5 and float(terms[1].weight) == 2.0


@pytest.mark.parametrize("method", ["ADMM", "MIRROR_DESCENT"])
def test_errors_name_the_calling_method(method):
    x = cp.Variable(2)
    with pytest.raises(NotRecognised) as e:
        collect(cp.norm_inf(x), method, "expected text")
    assert e.value.method == method and e.value.expected == "expected text"
    assert "norm_inf" in e.value.found
    with pytest.raises(NotRecognised) as e:
        collect(-cp.norm1(x), method, "expected text")
    assert e.value.method == method and "negative" in e.value.found


def test_marginal_polytope_errors_do_not_name_admm():
    import cvxdp
    from cvxdp.recognise.clique_marginals import recognise

    a = cp.Variable(2, nonneg=True)
    b = cp.Variable((2, 2), nonneg=True)
    mp = cvxdp.MarginalPolytope({("A",): a, ("A", "B"): b}, domain={"A": 2, "B": 2}, total=10)
    prob = cp.Problem(cp.Minimize(cp.norm_inf(a)), [mp])
    with pytest.raises(NotRecognised) as e:
        recognise(prob)
    assert e.value.method == "MIRROR_DESCENT" and "ADMM" not in str(e.value)

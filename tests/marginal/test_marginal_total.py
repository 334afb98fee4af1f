"""``MarginalPolytope(..., total=None)``: the total is free, optimised with the marginals, on
every path (plain cvxpy, ``method="cvxdp"`` with a standard solver, MIRROR_DESCENT)."""
from __future__ import annotations

import numpy as np
import pytest
import cvxpy as cp

import cvxdp
from cvxdp.solvers.marginal import free_total
from cvxdp.solvers.marginal import mirror_descent as md
from cvxdp.recognise.clique_marginals import recognise

TIGHT = dict(tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10)


def instance(seed, kind, noise, *, shape=None, n_records=None):
    """A random junction-tree model: 2-4 attributes of 2-4 values, a chain or a star of pairs,
    some one-attribute cliques; one loss term per clique (L1, L2 or alternating)."""
    rng = np.random.default_rng(seed)
    na = int(rng.integers(2, 5))
    sizes = [int(x) for x in rng.integers(2, 5, size=na)]
    names = [f"a{i}" for i in range(na)]
    dom = cvxdp.Domain(dict(zip(names, sizes)))
    star = (shape or ("star" if rng.random() < 0.5 else "chain")) == "star"
    cliques = [(0, i) for i in range(1, na)] if star else [(i, i + 1) for i in range(na - 1)]
    cliques += [(int(i),) for i in rng.choice(na, size=int(rng.integers(1, 3)), replace=False)]
    n = n_records or int(rng.integers(5, 80))
    data = rng.integers(0, sizes, size=(n, na))
    mus, terms, ys = {}, [], {}
    for j, c in enumerate(cliques):
        cl = tuple(names[i] for i in c)
        shp = tuple(sizes[i] for i in c)
        y = np.zeros(shp)
        np.add.at(y, tuple(data[:, i] for i in c), 1)
        y = y + noise * rng.normal(size=shp)
        ys[cl] = y
        mus[cl] = cp.Variable(shp)
        k = kind if kind != "mixed" else ("l1" if j % 2 == 0 else "l2")
        w = float(rng.uniform(0.5, 2.0))
        terms.append(w * (cp.norm1(mus[cl] - y) if k == "l1" else cp.sum_squares(mus[cl] - y)))
    mp = cvxdp.MarginalPolytope(mus, dom)
    return cp.Problem(cp.Minimize(sum(terms)), [mp]), mus, mp, n


def three_ways(prob):
    prob.solve(solver=cp.CLARABEL, **TIGHT)
    plain = prob.value
    prob.solve(method="cvxdp", solver=cp.CLARABEL)
    local = prob.value
    prob.solve(method="cvxdp", solver=cvxdp.MIRROR_DESCENT)
    return plain, local, prob.value


@pytest.mark.parametrize("kind", ["l2", "l1", "mixed"])
@pytest.mark.parametrize("seed,noise", [(0, 3.0), (1, 5.0), (2, 1.0), (3, 0.0), (4, 8.0)])
def test_three_paths_agree_on_the_free_total(kind, seed, noise):
    prob, mus, mp, n = instance(seed, kind, noise)
    plain, local, ours = three_ways(prob)
    scale = max(1.0, abs(plain))
    assert abs(local - plain) <= 1e-6 * scale
    assert abs(ours - plain) <= 1e-6 * scale
    xs = prob.solver_stats.extra_stats
    assert prob.status == "optimal"
    assert xs["gap"] <= 1e-4                                  # the default eps_rel
    assert xs["lower_bound"] <= plain + 1e-7 * scale          # a valid bound on the optimum
    info = xs["info"]
    assert info["total_given"] is False
    for v in mus.values():                                    # every marginal sums to the total
        assert float(np.sum(v.value)) == pytest.approx(info["total"], rel=1e-9, abs=1e-9)
    assert mp.fitted_total == pytest.approx(info["total"], rel=1e-12)
    assert info["total"] <= info["total_bound"]
    assert mp.value(1e-8)


@pytest.mark.parametrize("kind", ["l2", "l1", "mixed"])
@pytest.mark.parametrize("shape", ["chain", "star"])
def test_noise_free_data_recover_the_true_total(kind, shape):
    prob, mus, mp, n = instance(7, kind, 0.0, shape=shape, n_records=123)
    prob.solve(method="cvxdp", solver=cvxdp.MIRROR_DESCENT)
    assert prob.status == "optimal"
    assert prob.value == pytest.approx(0.0, abs=1e-6)
    assert prob.solver_stats.extra_stats["info"]["total"] == pytest.approx(123, rel=1e-9)
    prob.solve(solver=cp.CLARABEL, **TIGHT)
    assert mp.fitted_total == pytest.approx(123, rel=1e-6)


def test_the_total_is_optimised_not_the_appendix_e1_estimate():
    """Heavy noise on small counts: non-negativity binds, so the maximum-likelihood total is
    not the inverse-variance mean of the marginals' sums; the secant steps, or the free-total
    polish from the first step's support, find it."""
    found = 0
    for seed in range(6):
        prob, mus, mp, n = instance(seed, "l2", 6.0, n_records=10)
        prob.solve(solver=cp.CLARABEL, **TIGHT)
        ref_value, ref_total = prob.value, mp.fitted_total
        prob.solve(method="cvxdp", solver=cvxdp.MIRROR_DESCENT, eps_rel=1e-9)
        info = prob.solver_stats.extra_stats["info"]
        assert prob.status == "optimal"
        assert prob.value == pytest.approx(ref_value, rel=1e-7)
        assert info["total"] == pytest.approx(ref_total, rel=1e-5)
        if abs(info["total_start"] - info["total"]) > 1e-3 * info["total"]:
            found += 1
            assert (info["total_steps"] > 1 and info["total_route"] == "secant") or \
                info["total_route"] in ("qp", "ipm")
            # the fixed appendix-E.1 total is strictly worse: the old answer is not optimal
            fixed = cp.Problem(prob.objective, [cvxdp.MarginalPolytope(mus, mp.domain,
                                                                       total=info["total_start"])])
            fixed.solve(solver=cp.CLARABEL, **TIGHT)
            assert fixed.value > prob.value + 1e-6 * abs(prob.value)
    assert found >= 2


def test_a_measurement_that_is_not_the_identity_spans_the_total():
    """A noisy row sum of a pair (a matrix measurement) starts and bounds the total."""
    rng = np.random.default_rng(5)
    dom = cvxdp.Domain({"a": 3, "b": 4})
    table = rng.integers(0, 20, size=(3, 4)).astype(float)
    x = cp.Variable((3, 4))
    obj = cp.sum_squares(cp.sum(x, axis=1) - (table.sum(axis=1) + rng.normal(size=3))) \
        + 0.5 * cp.sum_squares(x[:, :2] - (table[:, :2] + rng.normal(size=(3, 2))))
    prob = cp.Problem(cp.Minimize(obj), [cvxdp.MarginalPolytope({("a", "b"): x}, dom)])
    plain, local, ours = three_ways(prob)
    assert prob.status == "optimal"
    assert ours == pytest.approx(plain, rel=1e-6, abs=1e-6)
    assert local == pytest.approx(plain, rel=1e-6, abs=1e-6)
    assert float(x.value.sum()) == pytest.approx(prob.solver_stats.extra_stats["info"]["total"], rel=1e-9)


def test_no_identified_total_is_a_clear_error():
    dom = cvxdp.Domain({"a": 2, "b": 3})
    x = cp.Variable((2, 3))
    y = cp.Variable(2)
    # one cell and a partial sum: nothing sums a whole marginal, the total is not identified
    obj = cp.square(x[0, 0] - 3) + cp.abs(x[1, 0] + x[1, 1] - 2) + cp.sum_squares(y[:1] - 1)
    prob = cp.Problem(cp.Minimize(obj), [cvxdp.MarginalPolytope({("a", "b"): x, ("a",): y}, dom)])
    with pytest.raises(ValueError, match="total is not identified"):
        prob.solve(method="cvxdp", solver=cvxdp.MIRROR_DESCENT)
    # a known total makes the same model well posed
    prob2 = cp.Problem(cp.Minimize(obj), [cvxdp.MarginalPolytope({("a", "b"): x, ("a",): y}, dom,
                                                                 total=10)])
    prob2.solve(method="cvxdp", solver=cvxdp.MIRROR_DESCENT)
    assert prob2.status == "optimal" and float(x.value.sum()) == pytest.approx(10, rel=1e-9)


def test_a_whole_marginal_with_a_zero_weight_row_does_not_bound_the_total():
    dom = cvxdp.Domain({"a": 3})
    x = cp.Variable(3)
    w = np.array([1.0, 1.0, 0.0])
    prob = cp.Problem(cp.Minimize(cp.sum_squares(cp.multiply(w, x - 5))),
                      [cvxdp.MarginalPolytope({("a",): x}, dom)])
    with pytest.raises(ValueError, match="not identified"):
        prob.solve(method="cvxdp", solver=cvxdp.MIRROR_DESCENT)


@pytest.mark.parametrize("kind", ["l2", "l1", "mixed"])
def test_a_known_total_still_works(kind):
    prob, mus, mp, n = instance(11, kind, 2.0)
    fixed = cp.Problem(prob.objective, [cvxdp.MarginalPolytope(mus, mp.domain, total=n)])
    fixed.solve(solver=cp.CLARABEL, **TIGHT)
    ref = fixed.value
    fixed.solve(method="cvxdp", solver=cvxdp.MIRROR_DESCENT, eps_rel=1e-9)
    info = fixed.solver_stats.extra_stats["info"]
    assert fixed.status == "optimal" and fixed.value == pytest.approx(ref, rel=1e-6)
    assert info["total"] == n and info["total_given"] is True
    for v in mus.values():
        assert float(np.sum(v.value)) == pytest.approx(n, rel=1e-9)
    # the free total can only do better
    prob.solve(method="cvxdp", solver=cvxdp.MIRROR_DESCENT)
    assert prob.value <= ref + 1e-6 * max(1.0, ref)


@pytest.mark.parametrize("kind", ["l2", "l1"])
def test_negative_measurements_give_the_empty_table(kind):
    dom = cvxdp.Domain({"a": 2, "b": 2})
    x = cp.Variable((2, 2))
    y = -np.array([[1.0, 2.0], [0.5, 3.0]])
    loss = cp.sum_squares(x - y) if kind == "l2" else cp.norm1(x - y)
    mp = cvxdp.MarginalPolytope({("a", "b"): x}, dom)
    prob = cp.Problem(cp.Minimize(loss), [mp])
    prob.solve(solver=cp.CLARABEL, **TIGHT)
    ref = prob.value
    prob.solve(method="cvxdp", solver=cvxdp.MIRROR_DESCENT)
    assert prob.status == "optimal" and prob.value == pytest.approx(ref, rel=1e-8)
    assert prob.solver_stats.extra_stats["info"]["total"] == 0.0
    np.testing.assert_array_equal(x.value, 0.0)
    assert mp.model is None


def test_warm_start_resumes_at_the_optimised_total(monkeypatch):
    prob, mus, mp, n = instance(1, "l2", 6.0, n_records=10)
    prob.solve(method="cvxdp", solver=cvxdp.MIRROR_DESCENT, eps_rel=1e-9)
    first = prob.solver_stats.extra_stats["info"]
    assert first["total_route"] == "ipm" and first["total_steps"] == 0
    prob.solve(method="cvxdp", solver=cvxdp.MIRROR_DESCENT, eps_rel=1e-9)
    again = prob.solver_stats.extra_stats["info"]
    assert again["total_start"] == pytest.approx(first["total"], rel=1e-12)
    assert again["total"] == pytest.approx(first["total"], rel=1e-9)
    # the secant fallback (no exact program first) resumes from the previous model and total
    monkeypatch.setattr(free_total._FreeTotalRun, "exact_first", lambda self: False)
    prob.solve(method="cvxdp", solver=cvxdp.MIRROR_DESCENT, eps_rel=1e-9)
    secant = prob.solver_stats.extra_stats["info"]
    assert secant["total_route"] != "ipm" and secant["total_steps"] >= 1
    prob.solve(method="cvxdp", solver=cvxdp.MIRROR_DESCENT, eps_rel=1e-9)
    again = prob.solver_stats.extra_stats["info"]
    assert prob.solver_stats.extra_stats["warm_started"]
    assert again["total_start"] == pytest.approx(secant["total"], rel=1e-12)
    assert again["total_steps"] == 1
    assert again["total"] == pytest.approx(secant["total"], rel=1e-9)
    assert again["total"] == pytest.approx(first["total"], rel=1e-7)     # the exact route's


@pytest.mark.parametrize("kind", ["l2", "l1"])
def test_the_certificate_is_valid_before_convergence(kind):
    """A run stopped early still reports a lower bound below the true free-total optimum."""
    prob, mus, mp, n = instance(2, kind, 5.0)
    prob.solve(solver=cp.CLARABEL, **TIGHT)
    opt, opt_total = prob.value, mp.fitted_total
    ext = recognise(prob)
    for iters in (0, 5, 30):
        res = free_total.solve(mp.tree, ext.loss, md.MirrorSettings(max_iters=iters, polish=False,
                                                                    eps_abs=0.0, eps_rel=0.0))
        assert res.lower_bound <= opt + 1e-9 * max(1.0, opt)
        assert res.objective >= opt - 1e-9 * max(1.0, opt)
        assert res.info["total_bound"] >= opt_total * (1 - 1e-9)


def test_total_bound_holds_and_shrinks_with_the_loss():
    prob, mus, mp, n = instance(4, "mixed", 4.0)
    prob.solve(solver=cp.CLARABEL, **TIGHT)
    opt, opt_total = prob.value, mp.fitted_total
    ext = recognise(prob)
    spans = free_total.spanning_terms(ext.loss, ext.offsets)
    assert len(spans) == len(ext.loss.terms)                   # every clique measured whole
    loose = free_total.total_bound(ext.loss, spans, 10 * opt)
    tight = free_total.total_bound(ext.loss, spans, opt)
    assert opt_total <= tight * (1 + 1e-9) <= loose * (1 + 1e-9)


@pytest.mark.parametrize("cls", [cvxdp.MarginalPolytope, cvxdp.LocalPolytope])
def test_a_parameter_total_is_new_data(cls):
    """A Parameter total is one of the problem's Parameters, so a new value is new data for
    the warm-start cache (its state for one total was reused for another before)."""
    from cvxdp.methods.warm_start import fingerprint
    dom = cvxdp.Domain({"a": 2, "b": 3})
    N = cp.Parameter(pos=True, value=20.0)
    mu = {("a", "b"): cp.Variable((2, 3))}
    prob = cp.Problem(cp.Minimize(cp.sum_squares(mu[("a", "b")] - np.arange(6.0).reshape(2, 3))),
                      [cls(mu, dom, total=N)])
    assert any(p is N for p in prob.parameters())
    before = fingerprint(prob)
    N.value = 30.0
    assert fingerprint(prob) != before
    prob.solve(method="cvxdp", solver=cvxdp.ADMM if cls is cvxdp.LocalPolytope
               else cvxdp.MIRROR_DESCENT)
    assert prob.status == "optimal"
    assert float(np.sum(mu[("a", "b")].value)) == pytest.approx(30.0, abs=1e-6)

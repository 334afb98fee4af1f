"""``solver=None``: the cost model's choice between the cvxdp method and Clarabel.

The fitted numbers are machine measurements, so the tests pin the *behaviour* around them:
the choice follows the two estimates (forced both ways by patching the fits), is recorded
with its reason, never overrides a named solver or a method's own options, and a problem
handed to Clarabel is solved as ``problem.solve(solver=CLARABEL)`` would solve it.
"""
import logging
import math

import numpy as np
import pytest
import cvxpy as cp

import cvxdp
from cvxdp import cost_model
from conftest import sparse_counts


def tree_problem(n_leaves=16, seed=0):
    rng = np.random.default_rng(seed)
    tree = cvxdp.workloads.hierarchy(n_leaves, 2)
    y = cvxdp.mechanisms.laplace(tree.queries, sparse_counts(n_leaves, rng), epsilon=1.0, rng=seed)
    x = cp.Variable(tree.n_nodes)
    return cp.Problem(cp.Minimize(cvxdp.nll(y, x)), [cvxdp.consistent(tree, x), x >= 0])


@pytest.fixture
def fits(monkeypatch):
    """Replace the fits of one family: ``force(family, standard_faster)`` (and keep small
    consistency models to recognition, so that the forced family decides)."""
    monkeypatch.setattr(cost_model, "small_limit", lambda *a, **k: 0.0)

    def force(family, standard_faster):
        slow, fast = (0.0, 1.0), (-20.0, 0.1)
        a, b = slow if standard_faster else fast
        c, d = fast if standard_faster else slow
        monkeypatch.setitem(cost_model.FITS, family, (a, b, c, d))
    return force


def test_the_choice_follows_the_estimates_both_ways(fits):
    fits("admm_tree/l1", standard_faster=True)
    prob = tree_problem()
    prob.solve(method="cvxdp")
    choice = prob.solver_stats.extra_stats["choice"]
    assert prob.solver_stats.solver_name == cp.CLARABEL == choice["solver"]
    # every family the tree could be expects Clarabel faster: named together, not told apart
    assert "admm_tree/l1" in choice["family"].split(" | ") and choice["size"] > 0
    assert choice["estimate_cvxdp"] > cost_model.MARGIN * choice["estimate_standard"]
    assert cp.CLARABEL in choice["reason"] and prob.status == cp.OPTIMAL
    via_clarabel = prob.value

    fits("admm_tree/l1", standard_faster=False)
    prob = tree_problem()
    prob.solve(method="cvxdp")
    es = prob.solver_stats.extra_stats
    assert prob.solver_stats.solver_name == cvxdp.ADMM == es["choice"]["solver"]
    assert es["choice"]["estimate_cvxdp"] < es["choice"]["estimate_standard"]
    assert prob.value == pytest.approx(via_clarabel, rel=1e-6)


def test_a_named_solver_is_never_second_guessed(fits):
    fits("admm_tree/l1", standard_faster=True)
    prob = tree_problem()
    prob.solve(method="cvxdp", solver=cvxdp.ADMM)
    es = prob.solver_stats.extra_stats
    assert prob.solver_stats.solver_name == cvxdp.ADMM
    assert es["choice"]["solver"] == cvxdp.ADMM and "given" in es["choice"]["reason"]


@pytest.mark.parametrize("given, why", [(dict(rho=1.0), "rho"),
                                        (dict(callback=lambda info: False), "callback"),
                                        (dict(verify=cp.CLARABEL), "verify")])
def test_options_of_the_method_keep_the_method(fits, given, why):
    fits("admm_tree/l1", standard_faster=True)
    prob = tree_problem()
    prob.solve(method="cvxdp", **given)
    choice = prob.solver_stats.extra_stats["choice"]
    assert prob.solver_stats.solver_name == cvxdp.ADMM == choice["solver"]
    assert why in choice["reason"]


def test_bad_options_and_bad_data_fail_before_clarabel_is_chosen(fits):
    fits("admm_tree/l1", standard_faster=True)
    with pytest.raises(ValueError, match="eps_rel"):
        tree_problem().solve(method="cvxdp", eps_rel=-1.0)
    with pytest.raises(ValueError, match="unknown option"):
        tree_problem().solve(method="cvxdp", tol_gap_rel=1e-3)
    x = cp.Variable(3)
    bad = cp.Problem(cp.Minimize(cp.norm1(x - np.array([1.0, np.nan, 2.0]))), [x[:-1] <= x[1:]])
    with pytest.raises(ValueError, match="nan|NaN"):
        bad.solve(method="cvxdp")


def test_shared_options_reach_clarabel_in_its_names(fits):
    opts = cost_model.standard_options(max_iters=7, eps_abs=1e-5, eps_rel=1e-4, time_limit=3.0)
    assert opts == dict(max_iter=7, time_limit=3.0, tol_gap_abs=1e-4, tol_gap_rel=1e-4,
                        tol_feas=1e-5)
    assert cost_model.standard_options(max_iters=None, eps_abs=None, eps_rel=None,
                                       time_limit=math.inf) == {}
    fits("admm_tree/l1", standard_faster=True)
    prob = tree_problem()
    prob.solve(method="cvxdp", max_iters=1)          # Clarabel cannot finish in one iteration
    assert prob.solver_stats.solver_name == cp.CLARABEL
    assert prob.status not in (cp.OPTIMAL,)
    assert prob.solver_stats.extra_stats["choice"]["solver"] == cp.CLARABEL


def test_exact_families_always_take_the_cvxdp_method(fits):
    rng = np.random.default_rng(3)
    y = np.sort(rng.normal(size=50)) + rng.laplace(size=50)
    x = cp.Variable(50)
    prob = cp.Problem(cp.Minimize(cp.norm1(x - y)), [x[:-1] <= x[1:]])
    prob.solve(method="cvxdp")
    choice = prob.solver_stats.extra_stats["choice"]
    assert choice["family"] == "exact_isotonic" and math.isnan(choice["estimate_cvxdp"])
    assert prob.solver_stats.solver_name == cvxdp.ADMM and prob.status == cp.OPTIMAL


def test_verbose_says_what_was_chosen_and_why(fits, caplog):
    fits("admm_tree/l1", standard_faster=True)
    with caplog.at_level(logging.INFO, logger="cvxdp"):
        tree_problem().solve(method="cvxdp", verbose=True)
    text = caplog.text
    assert "recognised the problem" in text and "admm_tree/l1" in text and cp.CLARABEL in text


@pytest.mark.parametrize("make, family", [
    (lambda: tree_problem(1024), "admm_tree/l1"),     # above the L1 models' small limit
    (lambda: _marginal(cvxdp.MarginalPolytope, "l2"), "marginal_polytope/l2"),
    (lambda: _marginal(cvxdp.LocalPolytope, "l1"), "local_polytope/l1"),
    (lambda: cvxdp.fitness_problem(cvxdp.workloads.prefix(4), np.ones(4)).problem, "newton_cg"),
])
def test_every_family_it_reads_has_a_fit(make, family):
    prob = make()
    prob.solve(method="cvxdp")
    choice = prob.solver_stats.extra_stats["choice"]
    named = choice["family"].split(" | ")        # several: each expects the same solver faster
    assert family in named and all(f in cost_model.FITS for f in named)
    assert np.isfinite(choice["estimate_cvxdp"]) and np.isfinite(choice["estimate_standard"])
    assert prob.solver_stats.solver_name == choice["solver"] and prob.status == cp.OPTIMAL


def _marginal(constraint, loss):
    rng = np.random.default_rng(7)
    dom = cvxdp.Domain({"a": 3, "b": 2, "c": 4})
    data = np.column_stack([rng.integers(0, n, 300) for n in dom.sizes])
    cliques = [("a", "b"), ("b", "c")]
    noisy = {c: dom.count(data, c) + rng.normal(0, 3, dom.shape(c)) for c in cliques}
    mus = {c: cp.Variable(dom.shape(c)) for c in cliques}
    if loss == "l1":
        obj = sum(cp.norm1(mus[c] - noisy[c]) for c in cliques)
    else:
        obj = sum(cp.sum_squares(mus[c] - noisy[c]) for c in cliques)
    return cp.Problem(cp.Minimize(obj), [constraint(mus, dom, total=300.0)])


def test_a_marginal_polytope_handed_to_clarabel_still_has_its_model(fits):
    fits("marginal_polytope/l2", standard_faster=True)
    rng = np.random.default_rng(11)
    dom = cvxdp.Domain({"a": 3, "b": 4, "c": 2, "d": 3})
    data = np.column_stack([rng.integers(0, n, 500) for n in dom.sizes])
    cliques = [("a", "b"), ("b", "c"), ("c", "d"), ("a", "d")]        # a cycle: fill-in
    noisy = {c: dom.count(data, c) + rng.normal(0, 3, dom.shape(c)) for c in cliques}
    mus = {c: cp.Variable(dom.shape(c)) for c in cliques}
    mp = cvxdp.MarginalPolytope(mus, dom, total=500.0)
    assert mp.model is None                                          # before a solve
    prob = cp.Problem(cp.Minimize(sum(cp.sum_squares(mus[c] - noisy[c]) for c in cliques)), [mp])
    prob.solve(method="cvxdp")
    assert prob.solver_stats.solver_name == cp.CLARABEL
    model = mp.model                     # fitted to Clarabel's marginals on first access
    for c in cliques:
        np.testing.assert_allclose(model.marginal(c), mus[c].value, atol=1e-6 * 500)
    assert mp.model is model             # kept while the values stay
    prob.solve(method="cvxdp", solver=cvxdp.MIRROR_DESCENT)
    assert mp.model is not model         # the method's own
    shifted = cp.Problem(cp.Minimize(sum(cp.sum_squares(mus[c] - 1.2 * noisy[c]) for c in cliques)),
                         [mp])
    shifted.solve(solver=cp.CLARABEL)    # plain cvxpy: the old model no longer matches
    for c in cliques:
        np.testing.assert_allclose(mp.model.marginal(c), mus[c].value, atol=1e-6 * 500)


@pytest.mark.parametrize("constraint, loss", [(cvxdp.MarginalPolytope, "l2"),
                                              (cvxdp.MarginalPolytope, "l1"),
                                              (cvxdp.LocalPolytope, "l1"),
                                              (cvxdp.LocalPolytope, "l2")])
def test_polytopes_handed_to_clarabel_skip_recognition(fits, monkeypatch, constraint, loss):
    family = ("marginal_polytope/" if constraint is cvxdp.MarginalPolytope else "local_polytope/") + loss
    method = cvxdp.MIRROR_DESCENT if constraint is cvxdp.MarginalPolytope else cvxdp.ADMM
    prob = _marginal(constraint, loss)
    full = cost_model.choose(method, cvxdp.METHODS[method].recognise(prob))
    assert full.family == family                 # what recognition reads, read without it
    assert cost_model.quick(prob)[1].as_dict() == full.as_dict()
    fits(family, standard_faster=True)

    def refuse(problem):
        raise AssertionError("recognition ran")
    monkeypatch.setattr(cvxdp.METHODS[method], "recognise", refuse)
    with pytest.raises(ValueError, match="unknown option"):
        _marginal(constraint, loss).solve(method="cvxdp", no_such_option=1)
    prob = _marginal(constraint, loss)
    prob.solve(method="cvxdp", eps_rel=1e-7)
    choice = prob.solver_stats.extra_stats["choice"]
    assert prob.solver_stats.solver_name == cp.CLARABEL and prob.status == cp.OPTIMAL
    assert choice["family"] == family and choice["size"] == full.size



@pytest.mark.parametrize("shift, eps_abs, held", [(0.0, None, False), (1e-3, None, True),
                                                  (1e-3, 1e-2, False)])
def test_the_standard_solver_is_held_to_eps_abs(fits, monkeypatch, shift, eps_abs, held):
    """``optimal`` through Clarabel means what it means through a cvxdp method: the point is
    checked by cvxpy, and a violation beyond eps_abs (given, or the method's default; Clarabel's
    own feasibility tolerance is relative to the data's norms) is ``optimal_inaccurate`` with
    the measured violation and the reason.  An inaccurate standard solver is imitated by
    moving its point by ``shift`` after its solve."""
    fits("admm_tree/l1", standard_faster=True)
    prob = tree_problem()
    solve = prob.solve

    def shifted(*args, **kwargs):
        value = solve(*args, **kwargs)
        if kwargs.get("solver") == cp.CLARABEL:
            x = prob.variables()[0]
            x.value = x.value + shift
        return value
    monkeypatch.setattr(prob, "solve", shifted)
    prob.solve(method="cvxdp", eps_abs=eps_abs)
    es = prob.solver_stats.extra_stats
    assert prob.solver_stats.solver_name == cp.CLARABEL
    assert es["violation"] >= shift
    if held:
        assert prob.status == cp.OPTIMAL_INACCURATE
        assert "eps_abs" in es["reason"] and "constraint" in es["reason"]
    else:
        assert prob.status == cp.OPTIMAL and "reason" not in es


@pytest.mark.parametrize("family, make_problem", [("admm_tree/l1", tree_problem)])
def test_a_standard_solver_that_fails_hands_back_to_the_method(fits, monkeypatch, family,
                                                             make_problem):
    """When the standard solver the cost model chose does not return ``optimal`` (seen:
    Clarabel's ``infeasible`` on a feasible tree problem with counts of 1e7), the cvxdp method
    solves the problem under its own contract; the choice says what happened.  The failure
    is imitated by overwriting Clarabel's status after its solve."""
    from cvxdp.methods.compat import set_status
    fits(family, standard_faster=True)
    prob = make_problem()
    solve = prob.solve

    def failing(*args, **kwargs):
        value = solve(*args, **kwargs)
        if kwargs.get("solver") == cp.CLARABEL:
            set_status(prob, cp.INFEASIBLE)
        return value
    monkeypatch.setattr(prob, "solve", failing)
    prob.solve(method="cvxdp")
    choice = prob.solver_stats.extra_stats["choice"]
    assert prob.status == cp.OPTIMAL and prob.solver_stats.solver_name == cvxdp.ADMM
    assert choice["solver"] == cvxdp.ADMM and "returned 'infeasible'" in choice["reason"]
    reference = make_problem()
    reference.solve(solver=cp.CLARABEL)
    assert prob.value == pytest.approx(reference.value, rel=1e-6)


def test_an_infeasible_problem_gets_the_methods_certificate(fits):
    """Clarabel's ``infeasible`` is not taken on its word: the cvxdp method solves the problem
    and certifies infeasibility itself (its certificate in ``extra_stats["info"]``)."""
    fits("admm_general/l1", standard_faster=True)
    fits("admm_tree/l1", standard_faster=True)
    prob = tree_problem()
    x = prob.variables()[0]
    bad = cp.Problem(prob.objective, prob.constraints + [x[0] == -5.0])
    bad.solve(method="cvxdp")
    es = bad.solver_stats.extra_stats
    assert bad.status == cp.INFEASIBLE and bad.solver_stats.solver_name == cvxdp.ADMM
    assert "returned 'infeasible'" in es["choice"]["reason"] and es["info"]


# ----------------------------------------------------------------- small consistency models
def _shapes():
    rng = np.random.default_rng(5)
    y = rng.normal(size=6)
    x = cp.Variable(6)
    E = np.ones((1, 6))
    psd = cp.Variable((2, 2), PSD=True)
    plain = {
        "l1 + bounds": cp.Problem(cp.Minimize(cp.norm1(x - y)), [E @ x == 1, x >= 0]),
        "squared + bound slice": cp.Problem(cp.Minimize(cp.sum_squares(x - y)), [x[:3] <= 2]),
        "l1, equalities only": cp.Problem(cp.Minimize(2 * cp.sum(cp.abs(x - y))), [E @ x == 1]),
        "nonneg attribute": cp.Problem(cp.Minimize(cp.sum_squares(cp.Variable(6, nonneg=True) - y))),
        "tree": tree_problem(8),
        "squared + order chain + bound": cp.Problem(cp.Minimize(cp.sum_squares(x - y)),
                                                    [x[:-1] <= x[1:], x >= 0]),
        "squared + decreasing chain": cp.Problem(cp.Minimize(cp.sum_squares(x - y)),
                                                 [x[1:] <= x[:-1]]),
    }
    z = cp.Variable(6)
    other = {
        "order chain": cp.Problem(cp.Minimize(cp.norm1(x - y)), [x[:-1] <= x[1:]]),
        "order chain, elastic net": cp.Problem(
            cp.Minimize(cp.norm1(x - y) + cp.sum_squares(x - y)), [x[:-1] <= x[1:], x >= 0]),
        "squared + order chain + equality": cp.Problem(
            cp.Minimize(cp.sum_squares(x - y)), [x[:-1] <= x[1:], E @ x == 1]),
        "slices of two variables": cp.Problem(cp.Minimize(cp.sum_squares(x - y) + cp.sum_squares(z)),
                                              [x[:-1] <= z[1:]]),
        "squared, equalities only (exact GLS)": cp.Problem(cp.Minimize(cp.sum_squares(x - y)), [E @ x == 1]),
        "general inequality": cp.Problem(cp.Minimize(cp.norm1(x - y)), [E @ x <= 1]),
        "PSD variable": cp.Problem(cp.Minimize(cp.norm1(x - y) + cp.trace(psd)), [x >= 0]),
        "other atom": cp.Problem(cp.Minimize(cp.norm1(x - y) + cp.norm(x, 2)), [x >= 0]),
        "cube": cp.Problem(cp.Minimize(cp.sum(cp.power(cp.pos(x - y), 3))), [x >= 0]),
    }
    return plain, other


def test_plain_consistency_reads_the_shape_only():
    from cvxdp.recognise.shape import plain_consistency
    plain, other = _shapes()
    for name, prob in plain.items():
        assert plain_consistency(prob), name
    for name, prob in other.items():
        assert not plain_consistency(prob), name


def test_entrywise_losses_are_told_apart_from_loss_matrices():
    from cvxdp.recognise.shape import entrywise_losses
    rng = np.random.default_rng(6)
    y, w = rng.normal(size=6), rng.uniform(1, 2, 6)
    x, z = cp.Variable(6), cp.Variable(3)
    r = x - y
    yes = [cp.norm1(x - y), 2 * cp.sum_squares(x - y) / 3, 0.9 * cp.norm1(r) + 0.1 * cp.sum_squares(r),
           cp.sum(cp.abs(cp.multiply(w, x - y))), cp.norm1(x[:3] - 1) + cp.sum_squares(z - 2),
           cp.norm1(-(y - x))]
    no = [cp.norm1(np.ones((2, 6)) @ x - 1), cp.norm1(x - y) + cp.sum_squares(x - 2 * y),
          cp.norm1(x[:3] - 1) + cp.norm1(x[3:] - 2), cp.sum_squares(cp.sum(x) - 4)]
    for obj in yes:
        assert entrywise_losses(cp.Problem(cp.Minimize(obj), [x >= 0])), obj
    for obj in no:
        assert not entrywise_losses(cp.Problem(cp.Minimize(obj), [x >= 0])), obj


def test_the_loss_kind_is_read_off_the_atoms():
    from cvxdp.recognise.shape import loss_kind
    rng = np.random.default_rng(7)
    y = rng.normal(size=5)
    x = cp.Variable(5)
    cases = {"l1": [cp.norm1(x - y), cp.sum(cp.abs(x - y)), 2 * cp.pnorm(x - y, 1),
                    cvxdp.nll(cvxdp.Measurement(np.eye(5), y, scale=1.0), x)],
             "l2": [cp.sum_squares(x - y), cp.sum(cp.square(x - y)) / 2,
                    cvxdp.nll(cvxdp.Measurement(np.eye(5), y, scale=1.0, noise="gaussian"), x)],
             "mixed": [cp.norm1(x - y) + cp.sum_squares(x - y), cvxdp.elastic_net(cvxdp.Measurement(np.eye(5), y, scale=1.0), x, 0.5)]}
    for kind, objs in cases.items():
        for obj in objs:
            assert loss_kind(cp.Problem(cp.Minimize(obj), [x >= 0])) == kind, obj
    for obj in (cp.norm2(x - y), cp.sum(x), cp.max(x - y)):
        assert loss_kind(cp.Problem(cp.Minimize(obj), [x >= 0])) is None, obj


def test_the_small_limit_of_one_loss_kind_compares_only_its_families(monkeypatch):
    for key in list(cost_model.FITS):
        if key.startswith(("admm_", "general_exact", "histogram_tree")):
            monkeypatch.setitem(cost_model.FITS, key, (0.0, 0.5, -6.0, 1.5))   # crossover e^6
    monkeypatch.setitem(cost_model.FITS, "admm_tree/l2", (0.0, 0.5, -5.0, 1.5))  # e^5
    assert cost_model.small_limit(True, overhead=0.0) == pytest.approx(math.exp(5.0), rel=0.1)
    assert cost_model.small_limit(True, overhead=0.0, loss="l2") == pytest.approx(math.exp(5.0), rel=0.1)
    assert cost_model.small_limit(True, overhead=0.0, loss="l1") == pytest.approx(math.exp(6.0), rel=0.1)
    # an L1 tree between the two limits goes to the standard solver unrecognised...
    n = int(math.exp(5.5))
    choice = cost_model._choose(cvxdp.ADMM, f"{cost_model.SMALL_SEPARABLE}/l1", n, None)
    assert choice.solver == cost_model.STANDARD and "l1 losses" in choice.reason
    # ... where a squared loss of that size, or one whose kind is unknown, is recognised
    for family in (f"{cost_model.SMALL_SEPARABLE}/l2", cost_model.SMALL_SEPARABLE):
        assert cost_model._choose(cvxdp.ADMM, family, n, None).solver == cvxdp.ADMM


def test_an_l1_tree_is_handed_over_with_its_loss_kind(monkeypatch):
    def refuse(problem):
        raise AssertionError("recognised although the shape decided")
    monkeypatch.setattr(cvxdp.METHODS[cvxdp.ADMM], "recognise", refuse)
    h = cvxdp.workloads.hierarchy(20, 3)
    rng = np.random.default_rng(8)
    x = cp.Variable(h.n_nodes)
    prob = cp.Problem(cp.Minimize(cp.norm1(x - rng.normal(5, 1, h.n_nodes))),
                      [cvxdp.consistent(h, x), x >= 0])
    prob.solve(method="cvxdp")
    choice = prob.solver_stats.extra_stats["choice"]
    assert choice["family"] == f"{cost_model.SMALL_SEPARABLE}/l1"
    assert prob.status == cp.OPTIMAL and choice["solver"] == cp.CLARABEL


def test_small_consistency_models_go_to_clarabel_before_recognition(monkeypatch):
    monkeypatch.setattr(cost_model, "small_limit", lambda *a, **k: 1e9)

    def refuse(problem):
        raise AssertionError("recognised although the shape decided")
    monkeypatch.setattr(cvxdp.METHODS[cvxdp.ADMM], "recognise", refuse)
    prob = tree_problem(8)
    prob.solve(method="cvxdp")
    choice = prob.solver_stats.extra_stats["choice"]
    assert prob.status == cp.OPTIMAL and choice["solver"] == cp.CLARABEL
    assert choice["family"].split("/")[0] in (cost_model.SMALL, cost_model.SMALL_SEPARABLE)
    assert "consistency" in choice["reason"]
    monkeypatch.undo()
    # a method's own option keeps the method; below the limit recognition decides as before
    monkeypatch.setattr(cost_model, "small_limit", lambda *a, **k: 1e9)
    prob = tree_problem(8)
    prob.solve(method="cvxdp", rho=1.0)
    assert prob.solver_stats.solver_name == cvxdp.ADMM
    monkeypatch.setattr(cost_model, "small_limit", lambda *a, **k: 0.0)
    prob = tree_problem(8)
    prob.solve(method="cvxdp")
    assert prob.solver_stats.extra_stats["choice"]["family"].split("/")[0] not in (
        cost_model.SMALL, cost_model.SMALL_SEPARABLE)


def test_the_small_limit_is_the_smallest_crossover(monkeypatch):
    for key in list(cost_model.FITS):
        if key.startswith(("admm_", "general_exact", "histogram_tree")):
            monkeypatch.setitem(cost_model.FITS, key, (0.0, 0.5, -6.0, 1.5))   # crossover e^6
    monkeypatch.setitem(cost_model.FITS, "admm_tree/l2", (0.0, 0.5, -5.0, 1.5))  # e^5, first
    assert cost_model.small_limit(overhead=0.0) == pytest.approx(math.exp(5.0), rel=0.1)
    assert cost_model.small_limit(overhead=0.0) >= math.exp(5.0)
    # the recognition the hand-over saves moves the limit up: t_c + overhead <= t_s
    assert cost_model.small_limit(overhead=1.0) > cost_model.small_limit(overhead=0.0)
    monkeypatch.setitem(cost_model.FITS, "admm_tree/l2", (-9.0, 0.5, -4.0, 1.5))
    assert cost_model.small_limit(overhead=0.0) == 0.0
    # a model whose losses read entrywise cannot take the general path: its fits do not count
    monkeypatch.setitem(cost_model.FITS, "admm_tree/l2", (0.0, 0.5, -6.0, 1.5))
    monkeypatch.setitem(cost_model.FITS, "general_exact/l1", (0.0, 0.5, -5.0, 1.5))
    assert cost_model.small_limit(overhead=0.0) == pytest.approx(math.exp(5.0), rel=0.1)
    assert cost_model.small_limit(True, overhead=0.0) == pytest.approx(math.exp(6.0), rel=0.1)
    # measured points are interpolated in log-log
    monkeypatch.setitem(cost_model.FITS, "general_exact/l2", ((100, 0.01, 0.02), (1000, 1.0, 0.2)))
    t_c, t_s = cost_model.estimates("general_exact/l2", 10 ** 2.5)
    assert t_c == pytest.approx(0.1) and t_s == pytest.approx(0.2 / 10 ** 0.5)


def _table(empty, loss, sizes=(12, 10), seed=3):
    rng = np.random.default_rng(seed)
    counts = np.floor(rng.pareto(1.5, int(np.prod(sizes))) * 10) + 1
    counts[rng.random(counts.size) < empty] = 0.0
    Q = cvxdp.workloads.marginals(sizes, [(0,), (1,)])
    y = counts + rng.laplace(0, 2.0, counts.size)
    z = cp.Variable(counts.size)
    obj = cp.sum_squares(z - y) if loss == "l2" else cp.norm1(z - y)
    return cp.Problem(cp.Minimize(obj), [Q @ z == Q @ counts, z >= 0]), y


@pytest.mark.parametrize("empty, loss, family", [
    (0.3, "l2", "admm_general_inside/l2"),      # few noisy answers below zero
    (0.9, "l2", "admm_general/l2"),             # about half of them: the bounds push many
    (0.3, "l1", "admm_general/l1"),             # absolute losses are not split
])
def test_general_equalities_are_told_apart_by_the_targets_outside_their_bounds(empty, loss, family):
    from cvxdp.methods.consistency import _PUSHED_SHARE
    prob, y = _table(empty, loss)
    share = float(np.mean(y < 0))
    assert (share < _PUSHED_SHARE) == (empty == 0.3)
    found, size = cost_model.size_of(cvxdp.ADMM, prob)
    assert (found, size) == (family, y.size) and found in cost_model.FITS
    prob.solve(method="cvxdp", solver=cvxdp.ADMM)
    ref = _table(empty, loss)[0]
    ref.solve(solver=cp.CLARABEL)
    assert prob.status == cp.OPTIMAL and prob.value == pytest.approx(ref.value, rel=1e-6, abs=1e-6)


def test_the_families_a_problem_can_be_are_not_told_apart_when_each_says_the_same(
        fits, monkeypatch):
    """``cost_candidates``: a consistency problem without order chains or a 2-D variable can
    be a tree, general equalities (or, with a loss that does not read the variables
    entrywise, the exact route); when each of these expects the standard solver faster, the
    detections that tell them apart (``cost``) are skipped; when one expects the method
    faster, they decide."""
    from cvxdp.methods.consistency import ConsistencyADMM, _candidates
    for family in ("admm_tree/l1", "admm_general/l1"):
        fits(family, standard_faster=True)
    calls = []
    real_cost = ConsistencyADMM.cost
    monkeypatch.setattr(ConsistencyADMM, "cost", lambda self, ext: calls.append(1) or real_cost(self, ext))
    prob = tree_problem()
    prob.solve(method="cvxdp")
    choice = prob.solver_stats.extra_stats["choice"]
    assert choice["solver"] == cp.CLARABEL and not calls
    assert choice["family"] == "admm_tree/l1 | admm_general/l1" and "one of" in choice["reason"]
    fits("admm_general/l1", standard_faster=False)
    prob = tree_problem()
    prob.solve(method="cvxdp")
    choice = prob.solver_stats.extra_stats["choice"]
    assert calls and choice["family"] == "admm_tree/l1" and choice["solver"] == cp.CLARABEL
    # what can be which family
    x = cp.Variable(4)
    rec = cvxdp.METHODS[cvxdp.ADMM].recognise
    q = rec(cp.Problem(cp.Minimize(cp.sum_squares(np.ones((3, 4)) @ x - 1)), [x >= 0]))
    assert "general_exact/l2" in _candidates(q.extraction.data)
    q = rec(cp.Problem(cp.Minimize(cp.sum_squares(x - 1) + cp.norm1(x - 1)), [x >= 0]))
    assert _candidates(q.extraction.data) == ("admm_tree/mixed", "admm_general/mixed")
    q = rec(cp.Problem(cp.Minimize(cp.norm1(x - 1)), [x[:-1] <= x[1:]]))
    assert _candidates(q.extraction.data) is None

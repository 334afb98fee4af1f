"""L1 (Laplace) and mixed L1 + L2 losses on MarginalPolytope reach a certified gap through the
exact solve of solvers.marginal_lp: against Clarabel on the local polytope, with empty cells,
noise-free measurements, sub-marginal and general linear measurements, the local-polytope
multipliers, the repair of nearly consistent tables and the size limit."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import cvxpy as cp

import cvxdp
from cvxdp.recognise.clique_marginals import recognise
from cvxdp.solvers.marginal import lp as marginal_lp
from cvxdp.solvers.marginal.junction_tree import JunctionTree
from cvxdp.solvers.marginal.loss import LossTerm, MarginalLoss
from cvxdp.solvers.marginal.lp import LocalPolytopeLP, repair
from cvxdp.solvers.marginal.mirror_descent import MarginalProblem, MirrorSettings, solve as md_solve

EPS = 1e-6


def random_model(seed, d, n_records=300, n_values=None, n_cliques=None):
    """``d`` attributes of 2-5 values, ``n_cliques`` random pairs; records drawn from
    ``n_values`` distinct rows (many empty cells) or uniformly."""
    rng = np.random.default_rng(seed)
    sizes = [int(s) for s in rng.integers(2, 6, d)]
    names = [f"a{i}" for i in range(d)]
    dom = cvxdp.Domain(dict(zip(names, sizes)))
    pairs = list(itertools.combinations(range(d), 2))
    rng.shuffle(pairs)
    cl = [tuple(names[i] for i in p) for p in pairs[:n_cliques or d]]
    if n_values:
        rows = np.column_stack([rng.integers(0, s, n_values) for s in sizes])
        data = rows[rng.integers(0, n_values, n_records)]
    else:
        data = np.column_stack([rng.integers(0, s, n_records) for s in sizes])
    return dom, data, cl, rng


def clarabel(prob):
    """The local polytope with tight tolerances (its default 1e-8 feasibility shifts the
    objective by more than the 1e-6 compared)."""
    prob.solve(solver=cp.CLARABEL, tol_feas=1e-11, tol_gap_abs=1e-11, tol_gap_rel=1e-11,
               tol_ktratio=1e-9)
    assert prob.status == "optimal"
    return prob.value


def solve_md(prob, **kw):
    kw.setdefault("eps_rel", EPS)
    prob.solve(method="cvxdp", solver=cvxdp.MIRROR_DESCENT, **kw)
    return prob.value, prob.solver_stats.extra_stats


def assert_feasible(mp, mus, N):
    assert mp.residual <= 1e-9 * N
    for v in mus.values():
        assert v.value.min() >= 0
        assert v.value.sum() == pytest.approx(N, rel=1e-12)


def lp_entries(st):
    return [e for e in st["info"]["polish"] if e.get("kind") == "lp"]


# ---------------------------------------------------------------- against Clarabel
@pytest.mark.parametrize("seed,d,n_values", [(0, 6, 8), (1, 5, 6), (2, 5, 6), (4, 6, 8), (3, 3, None),
                                             (5, 4, 3)])
@pytest.mark.parametrize("algorithm", ["accelerated", "dual_averaging"])
def test_l1_random_junction_trees_reach_the_certified_gap(seed, d, n_values, algorithm):
    dom, data, cl, rng = random_model(seed, d, n_values=n_values)
    N = float(len(data))
    mus = {c: cp.Variable(dom.shape(c)) for c in cl}
    b = 1.5
    ys = {c: dom.count(data, c) + rng.laplace(0, b, dom.shape(c)) for c in cl}
    obj = sum(cp.norm1(mus[c] - ys[c]) / b for c in cl)
    mp = cvxdp.MarginalPolytope(mus, dom, total=N)
    prob = cp.Problem(cp.Minimize(obj), [mp])
    ours, st = solve_md(prob, algorithm=algorithm, max_iters=500)
    assert prob.status == "optimal"
    assert st["gap"] <= EPS
    assert st["lower_bound"] <= ours + 1e-12 * abs(ours)          # roundoff only
    assert_feasible(mp, mus, N)
    got = {c: v.value.copy() for c, v in mus.items()}
    if st["info"]["polished"]:
        # the model is the junction-tree distribution of the exact tables (read before the
        # reference solve below replaces the values, and with them the model: the L1 optimum
        # is not unique)
        for c in cl:
            np.testing.assert_allclose(mp.model.marginal(c), got[c], atol=1e-8 * N)
    ref = clarabel(prob)
    assert st["lower_bound"] <= ref + 1e-7 * abs(ref)          # the certificate is a bound
    assert ours == pytest.approx(ref, rel=EPS)


def test_mirror_descent_alone_misses_what_the_exact_solve_certifies():
    """The reported failure: the same model without the polish ends optimal_inaccurate."""
    dom, data, cl, rng = random_model(1, 5, n_values=6)
    N = float(len(data))
    ys = {c: dom.count(data, c) + rng.laplace(0, 1.0, dom.shape(c)) for c in cl}
    mus = {c: cp.Variable(dom.shape(c)) for c in cl}
    prob = cp.Problem(cp.Minimize(sum(cp.norm1(mus[c] - ys[c]) for c in cl)),
                      [cvxdp.MarginalPolytope(mus, dom, total=N)])
    plain, st_plain = solve_md(prob, polish=False, max_iters=300)
    assert prob.status == "optimal_inaccurate" and st_plain["gap"] > 1e-3
    for v in mus.values():
        v.value = None                                          # cold start
    ours, st = solve_md(prob, max_iters=300)
    assert prob.status == "optimal" and st["gap"] <= EPS and st["info"]["polished"]
    (entry,) = lp_entries(st)
    assert entry["method"] == "highs" and entry["iter"] == 100  # at polish_start
    assert ours <= plain
    assert ours == pytest.approx(clarabel(prob), rel=EPS)


def test_many_empty_cells_are_exactly_empty():
    dom, data, cl, rng = random_model(7, 5, n_values=3, n_records=400)
    N = float(len(data))
    ys = {c: dom.count(data, c) + rng.laplace(0, 0.5, dom.shape(c)) for c in cl}
    mus = {c: cp.Variable(dom.shape(c)) for c in cl}
    mp = cvxdp.MarginalPolytope(mus, dom, total=N)
    prob = cp.Problem(cp.Minimize(sum(2.0 * cp.norm1(mus[c] - ys[c]) for c in cl)), [mp])
    ours, st = solve_md(prob, polish_start=0)
    assert prob.status == "optimal" and st["info"]["polished"] and st["gap"] <= EPS
    assert_feasible(mp, mus, N)
    cells = np.concatenate([v.value.ravel() for v in mus.values()])
    assert (cells == 0).mean() > 0.3                            # a vertex: zeros are zeros
    assert ours == pytest.approx(clarabel(prob), rel=EPS)


def test_noise_free_measurements_are_recovered_exactly():
    """Marginals of a table measured without noise: the optimum is zero loss, and every
    optimum reproduces the measurements."""
    rng = np.random.default_rng(11)
    dom = cvxdp.Domain({"a": 3, "b": 2, "c": 4, "d": 3})
    p = rng.dirichlet(np.full(72, 0.3)).reshape(3, 2, 4, 3) * 500
    names = dom.names
    cl = [("a", "b"), ("b", "c"), ("a", "c"), ("c", "d")]
    truth = {}
    for c in cl:
        m = p.sum(axis=tuple(i for i, a in enumerate(names) if a not in c))
        truth[c] = np.transpose(m, [[a for a in names if a in c].index(a) for a in c])
    mus = {c: cp.Variable(dom.shape(c)) for c in cl}
    mp = cvxdp.MarginalPolytope(mus, dom, total=500.0)
    prob = cp.Problem(cp.Minimize(sum(cp.norm1(mus[c] - truth[c]) for c in cl)), [mp])
    ours, st = solve_md(prob, polish_start=0)
    assert prob.status == "optimal" and st["info"]["polished"]
    assert ours <= 1e-9 * 500 and st["gap"] <= EPS
    for c in cl:
        np.testing.assert_allclose(mus[c].value, truth[c], atol=1e-9 * 500)
    assert_feasible(mp, mus, 500.0)


def test_sub_marginals_and_general_linear_measurements():
    """L1 losses of one-way sums of a three-way marginal and of dense random queries."""
    dom, data, cl, rng = random_model(13, 4, n_values=5)
    N = float(len(data))
    names = dom.names
    tri = (names[0], names[1], names[2])
    cl = [tri, (names[2], names[3])]
    mus = {c: cp.Variable(dom.shape(c)) for c in cl}
    t3 = dom.count(data, tri)
    terms = []
    for axes in [(1, 2), (0, 2), (0, 1)]:                       # the three one-way marginals
        y = t3.sum(axis=axes) + rng.laplace(0, 1.0, t3.sum(axis=axes).shape)
        terms.append(cp.norm1(cp.sum(mus[tri], axis=axes) - y))
    Q = rng.normal(size=(6, dom.size(tri)))
    q = Q @ t3.ravel() + rng.laplace(0, 2.0, 6)
    terms.append(0.5 * cp.norm1(Q @ cp.vec(mus[tri], order="C") - q))
    y23 = dom.count(data, cl[1]) + rng.laplace(0, 1.0, dom.shape(cl[1]))
    terms.append(cp.norm1(mus[cl[1]] - y23))
    mp = cvxdp.MarginalPolytope(mus, dom, total=N)
    prob = cp.Problem(cp.Minimize(sum(terms)), [mp])
    ours, st = solve_md(prob, polish_start=20)
    assert prob.status == "optimal" and st["info"]["polished"] and st["gap"] <= EPS
    assert_feasible(mp, mus, N)
    assert ours == pytest.approx(clarabel(prob), rel=EPS)


@pytest.mark.parametrize("seed,d", [(21, 4), (22, 5), (23, 6)])
def test_mixed_l1_and_l2(seed, d):
    dom, data, cl, rng = random_model(seed, d, n_values=6)
    N = float(len(data))
    mus = {c: cp.Variable(dom.shape(c)) for c in cl}
    terms = []
    for i, c in enumerate(cl):
        if i % 2:
            terms.append(cp.sum_squares(mus[c] - dom.count(data, c) - rng.normal(0, 2.0, dom.shape(c))) / 8)
        else:
            terms.append(cp.norm1(mus[c] - dom.count(data, c) - rng.laplace(0, 2.0, dom.shape(c))) / 2)
    # an L1 and an L2 term on the same marginal, too
    terms.append(0.3 * cp.norm1(cp.sum(mus[cl[1]], axis=0) - dom.count(data, cl[1]).sum(axis=0)))
    mp = cvxdp.MarginalPolytope(mus, dom, total=N)
    prob = cp.Problem(cp.Minimize(sum(terms)), [mp])
    ours, st = solve_md(prob, polish_start=10)
    assert prob.status == "optimal" and st["info"]["polished"] and st["gap"] <= EPS
    (entry,) = lp_entries(st)
    assert entry["method"] == "ipm"
    assert_feasible(mp, mus, N)
    ref = clarabel(prob)
    assert st["lower_bound"] <= ref + 1e-7 * abs(ref)
    assert ours == pytest.approx(ref, rel=EPS)


# ---------------------------------------------------------------- the numerical layer
def _lp_problem(seed=3, mixed=False):
    dom, data, cl, rng = random_model(seed, 4, n_values=5)
    N = float(len(data))
    ys = {c: dom.count(data, c) + rng.laplace(0, 1.0, dom.shape(c)) for c in cl}
    mus = {c: cp.Variable(dom.shape(c)) for c in cl}
    obj = sum((cp.sum_squares(mus[c] - ys[c]) / 4 if mixed and i == 0 else cp.norm1(mus[c] - ys[c]))
              for i, c in enumerate(cl))
    prob = cp.Problem(cp.Minimize(obj), [cvxdp.MarginalPolytope(mus, dom, total=N)])
    ext = recognise(prob)
    return prob, ext, MarginalProblem(prob.constraints[0].tree, ext.loss, N)


@pytest.mark.parametrize("mixed", [False, True])
def test_multipliers_are_kkt_and_price_the_total(mixed):
    prob, ext, P = _lp_problem(mixed=mixed)
    N = P.total
    lp = LocalPolytopeLP(P.tree, ext.loss, N)
    r = lp.solve()
    assert r.method == ("ipm" if mixed else "highs")
    x = np.concatenate([t.ravel() for t in r.x])
    f = ext.loss.value(r.mu)
    lb = P.lower_bound(r.lams)
    if mixed:                                                   # the solver's own L2 multipliers
        lb = max(lb, P.lower_bound(r.alt_lams))
    assert lb <= f * (1 + 1e-12) and f - lb <= 1e-9 * f          # tight, certified
    assert r.dual_bound <= lb + 1e-9 * f                       # the solver's bound is weaker or equal
    scale = max(1.0, float(np.abs(r.s).max()))
    assert r.s.min() >= -1e-8 * scale                          # dual feasibility
    assert np.abs(r.s * x).max() <= 1e-7 * scale * N            # complementarity
    # nu[-1] is d(optimal loss) / d(total): a central difference
    h = 1e-3 * N
    fs = []
    for NN in (N + h, N - h):
        rr = LocalPolytopeLP(P.tree, ext.loss, NN).solve()
        fs.append(ext.loss.value(rr.mu))
    assert (fs[0] - fs[1]) / (2 * h) == pytest.approx(r.nu[-1], rel=1e-3, abs=1e-6)
    # the same multipliers reach SolverResult.duals through mirror descent
    res = md_solve(P, MirrorSettings(polish_start=0, eps_rel=1e-9))
    assert res.status == "optimal" and res.info["clique_tables"] is not None
    assert set(res.duals) == {"local_nonneg", "local_consistency", "loss", "bound"}
    assert res.duals["bound"].shape == (sum(t.b.size for t in ext.loss.terms),)
    assert res.duals["local_nonneg"].shape == (sum(P.tree.cells),)
    assert res.duals["local_consistency"].shape == (lp.E.shape[0],)
    assert res.duals["loss"].shape == (sum(t.b.size for t in ext.loss.terms),)


@pytest.mark.parametrize("mixed", [False, True])
def test_free_total_program_is_the_cone_optimum_and_certified(mixed):
    """free_total=True drops the total row: the optimum over all totals, with nu[-1] = 0,
    reduced costs s >= 0 on the cone, and the free-total bound tight (the old total only
    sets the units)."""
    from cvxdp.solvers.marginal.free_total import free_lower_bound, spanning_terms, total_bound
    prob, ext, P = _lp_problem(mixed=mixed)
    free = cp.Problem(prob.objective, [cvxdp.MarginalPolytope(
        dict(zip(prob.constraints[0].cliques, prob.constraints[0].args)), prob.constraints[0].domain)])
    ref = clarabel(free)
    for unit in (P.total, 0.5 * P.total):
        lp = LocalPolytopeLP(P.tree, ext.loss, unit, free_total=True)
        r = lp.solve()
        f = ext.loss.value(r.mu)
        assert f == pytest.approx(ref, rel=1e-7)
        x = np.concatenate([t.ravel() for t in r.x])
        fitted = float(r.x[P.tree.preorder[0]].sum())
        np.testing.assert_allclose(lp.E_full @ x, np.r_[np.zeros(lp.E_full.shape[0] - 1), fitted],
                                   atol=1e-9 * fitted)
        assert r.nu[-1] == 0.0 and r.nu.shape == (lp.E_full.shape[0],)
        scale = max(1.0, float(np.abs(r.s).max()))
        assert r.s.min() >= -1e-8 * scale
        n_max = total_bound(ext.loss, spanning_terms(ext.loss, P.offsets), f)
        assert n_max >= fitted
        bounds = [free_lower_bound(P, ext.loss, lams) for lams in [r.lams] + ([r.alt_lams] if mixed else [])]
        lb = max(c + min(0.0, m) * n_max for c, m in bounds)
        assert lb <= ref + 1e-9 * ref and f - lb <= 1e-8 * f


def test_highs_and_interior_point_agree_on_a_pure_l1_loss():
    prob, ext, P = _lp_problem(seed=8)
    lp = LocalPolytopeLP(P.tree, ext.loss, P.total)
    a, b = lp.solve(method="highs"), lp.solve(method="ipm")
    fa, fb = ext.loss.value(a.mu), ext.loss.value(b.mu)
    assert fa == pytest.approx(fb, rel=1e-9)
    for r in (a, b):
        assert r.residual <= 1e-11 * P.total
        assert P.lower_bound(r.lams) >= min(fa, fb) * (1 - 1e-9)


def test_lp_rejects_what_it_does_not_cover():
    tree = JunctionTree([3, 2], [(0, 1)])
    l2 = MarginalLoss([LossTerm("l2", slice(0, 6), np.zeros(6), 1.0)], 6)
    with pytest.raises(ValueError, match="LPs only"):       # a quadratic loss: the interior point
        LocalPolytopeLP(tree, l2, 5.0).solve(method="highs")
    mixed = MarginalLoss([LossTerm("l2", slice(0, 6), np.zeros(6), 1.0),
                          LossTerm("l1", slice(0, 6), np.ones(6), 1.0)], 6)
    with pytest.raises(ValueError, match="LPs only"):
        LocalPolytopeLP(tree, mixed, 5.0).solve(method="highs")
    with pytest.raises(ValueError, match="method"):
        LocalPolytopeLP(tree, mixed, 5.0).solve(method="simplex")


def test_size_limit_falls_back_to_mirror_descent(monkeypatch):
    monkeypatch.setattr(marginal_lp, "MAX_LP_SIZE", 10)
    dom, data, cl, rng = random_model(1, 5, n_values=6)
    N = float(len(data))
    ys = {c: dom.count(data, c) + rng.laplace(0, 1.0, dom.shape(c)) for c in cl}
    mus = {c: cp.Variable(dom.shape(c)) for c in cl}
    mp = cvxdp.MarginalPolytope(mus, dom, total=N)
    prob = cp.Problem(cp.Minimize(sum(cp.norm1(mus[c] - ys[c]) for c in cl)), [mp])
    ours, st = solve_md(prob, polish_start=0, max_iters=200)
    (entry,) = lp_entries(st)
    assert "above" in entry["skipped"] and not st["info"]["polished"]
    assert prob.status == "optimal_inaccurate"                  # honest: the gap is measured
    assert st["gap"] > EPS and st["lower_bound"] <= ours
    assert mp.model.theta is not None                           # the mirror-descent model


def test_repair_makes_nearly_consistent_tables_consistent():
    from cvxdp.solvers.marginal.polish import local_polytope_matrices
    tree = JunctionTree([3, 2, 4, 2], [(0, 1), (1, 2), (2, 3), (0,)])
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.full(48, 0.5)).reshape(3, 2, 4, 2)
    p[0, 1] = 0.0                                               # empty cells
    p *= 40 / p.sum()
    tables = [p.sum(axis=tuple(a for a in range(4) if a not in c)) for c in tree.cliques]
    same = repair(tree, tables, 40.0)
    for t, u in zip(tables, same):                              # consistent input: unchanged
        np.testing.assert_allclose(u, t, rtol=1e-13, atol=1e-13)
    noisy = [t + rng.normal(0, 1e-7, t.shape) for t in tables]
    k = tree.cliques.index((0, 1))
    noisy[k] = np.where(tables[k] == 0, -1e-9, noisy[k])        # slightly negative empty cells
    child = tree.preorder[1]
    sep = tree.separators[child]
    first = tuple(0 if a in sep else slice(None) for a in tree.cliques[child])
    noisy[child][first] = 0.0             # the child has no mass where its parent has some
    before = [t.copy() for t in noisy]
    fixed = repair(tree, noisy, 40.0)
    for t, u in zip(noisy, before):                             # inputs are not modified
        np.testing.assert_array_equal(t, u)
    x = np.concatenate([t.ravel() for t in fixed])
    _, E, _ = local_polytope_matrices(tree)
    e = np.zeros(E.shape[0])
    e[-1] = 40.0
    assert x.min() >= 0 and np.abs(E @ x - e).max() <= 1e-12 * 40
    assert fixed[child][first].min() > 0                        # the parent's mass spread evenly
    others = [i for i in range(len(tables)) if i != child]
    assert max(np.abs(fixed[i] - tables[i]).max() for i in others) <= 1e-5


def test_an_uncertified_exact_solve_is_kept_when_mirror_descent_ends_worse(monkeypatch):
    """An interior point stopped early: its gap is above the floor, so mirror descent goes on,
    but its point is returned if the run ends with a higher loss (status optimal_inaccurate)."""
    monkeypatch.setattr(marginal_lp, "_IPM_TOL", 1e-3)
    dom, data, cl, rng = random_model(22, 5, n_values=6)
    N = float(len(data))
    mus = {c: cp.Variable(dom.shape(c)) for c in cl}
    terms = [cp.norm1(mus[c] - dom.count(data, c) - rng.laplace(0, 2.0, dom.shape(c))) / 2 if i % 2 else
             cp.sum_squares(mus[c] - dom.count(data, c) - rng.normal(0, 2.0, dom.shape(c))) / 8
             for i, c in enumerate(cl)]
    mp = cvxdp.MarginalPolytope(mus, dom, total=N)
    prob = cp.Problem(cp.Minimize(sum(terms)), [mp])
    plain, _ = solve_md(prob, polish=False, max_iters=30, eps_rel=1e-12)
    for v in mus.values():
        v.value = None
    ours, st = solve_md(prob, polish_start=0, max_iters=30, eps_rel=1e-12)
    (entry,) = lp_entries(st)
    assert entry["gap"] > 1e-8                                  # not certified to the floor
    assert prob.status == "optimal_inaccurate" and st["info"]["polished"]
    assert ours < plain and st["lower_bound"] <= ours
    assert_feasible(mp, mus, N)


@pytest.mark.parametrize("method", ["highs", "ipm"])
def test_rows_of_weight_zero_play_no_part(method):
    tree = JunctionTree([3, 4, 2], [(0, 1), (1, 2)])
    rng = np.random.default_rng(4)
    b = [rng.normal(4, 3, 12), rng.normal(6, 3, 8)]
    w0 = np.where(rng.random(12) < 0.5, 0.0, 1.0)
    full = MarginalLoss([LossTerm("l1", slice(0, 12), b[0], w0), LossTerm("l1", slice(12, 20), b[1], 0.7)], 20)
    keep = np.flatnonzero(w0)
    A = np.eye(20)[keep]
    part = MarginalLoss([LossTerm("l1", A, b[0][keep], 1.0), LossTerm("l1", slice(12, 20), b[1], 0.7)], 20)
    P = MarginalProblem(tree, full, 48.0)
    r_full = LocalPolytopeLP(tree, full, 48.0).solve(method=method)
    r_part = LocalPolytopeLP(tree, part, 48.0).solve(method=method)
    f = full.value(r_full.mu)
    assert f == pytest.approx(part.value(r_part.mu), rel=1e-9)
    assert np.all(r_full.lams[0][w0 == 0] == 0)
    assert f - P.lower_bound(r_full.lams) <= 1e-9 * f


@pytest.mark.parametrize("free", [False, True])
def test_routed_program_is_the_same_lp_with_fewer_nonzeros(free):
    """A clique holding several measured marginals (a triangle and its one-way marginals, all
    in one junction-tree clique): the routed program HiGHS gets has fewer nonzeros, the same
    optimum as HiGHS on the cvxpy model, and multipliers that are dual feasible and
    complementary in the original variables."""
    rng = np.random.default_rng(5)
    dom = cvxdp.Domain({"a": 8, "b": 6, "c": 10})
    data = np.column_stack([rng.integers(0, n, 200) for n in dom.sizes])
    cl = [("a",), ("b",), ("a", "b"), ("b", "c"), ("a", "c")]
    ys = {c: dom.count(data, c) + rng.laplace(0, 1.0, dom.shape(c)) for c in cl}
    mus = {c: cp.Variable(dom.shape(c)) for c in cl}
    obj = sum(cp.norm1(mus[c] - ys[c]) for c in cl)
    prob = cp.Problem(cp.Minimize(obj), [cvxdp.MarginalPolytope(mus, dom, total=None if free else 200.0)])
    ext = recognise(prob)
    tree = prob.constraints[0].tree
    lp = LocalPolytopeLP(tree, ext.loss, 200.0, free_total=free)
    A_routed, _, _, n_m = lp._routed()
    assert A_routed.nnz < lp.A.nnz and n_m == ext.loss.n
    r = lp.solve()
    assert r.method == "highs"
    x = np.concatenate([t.ravel() for t in r.x])
    scale = max(1.0, float(np.abs(r.s).max()))
    assert r.s.min() >= -1e-8 * scale and np.abs(r.s * x).max() <= 1e-7 * scale * 200.0
    ref = cp.Problem(prob.objective, [cvxdp.MarginalPolytope(mus, dom, total=None if free else 200.0)])
    ref.solve(solver=cp.HIGHS)
    assert ext.loss.value(r.mu) == pytest.approx(ref.value, rel=1e-9, abs=1e-9)


def test_routing_is_skipped_where_it_does_not_cut_nonzeros():
    rng = np.random.default_rng(6)
    dom = cvxdp.Domain({"a": 2, "b": 3})
    data = np.column_stack([rng.integers(0, n, 50) for n in dom.sizes])
    cl = [("a",), ("a", "b")]
    ys = {c: dom.count(data, c) + rng.laplace(0, 1.0, dom.shape(c)) for c in cl}
    mus = {c: cp.Variable(dom.shape(c)) for c in cl}
    prob = cp.Problem(cp.Minimize(sum(cp.norm1(mus[c] - ys[c]) for c in cl)),
                      [cvxdp.MarginalPolytope(mus, dom, total=50.0)])
    ext = recognise(prob)
    lp = LocalPolytopeLP(prob.constraints[0].tree, ext.loss, 50.0)
    A, _, _, n_m = lp._routed()
    assert n_m == 0 and A.nnz == lp.A.nnz
    r = lp.solve()
    prob.solve(solver=cp.HIGHS)
    assert ext.loss.value(r.mu) == pytest.approx(prob.value, rel=1e-9, abs=1e-9)

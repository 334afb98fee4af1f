"""Math identities of the local-polytope building blocks, checked by brute force.

* :class:`~cvxdp.solvers.local.region_graph.RegionGraph`: the regions are every attribute set held
  by two or more cliques; ``project`` equals the dense (weighted) least-squares projection
  onto the affine set of consistent tables, built here from explicit marginalisation matrices
  and a null-space basis; it is idempotent, its correction is orthogonal (in the weighted
  metric) to the consistent directions, totals go where they should, ``residual`` is zero on
  projected points and equals the brute-force disagreement elsewhere.  Both code paths (the
  stored sparse marginalisers and the table-by-table one used for large graphs) are run.
* :func:`~cvxdp.solvers.local.loss.split_loss`: the cell part plus the coupled part equals the
  loss; :meth:`CellLoss.argmin` and ``prox`` against brute-force 1-D minimisation.
* :mod:`~cvxdp.solvers.local.repair`: ``mix`` and ``MarginFitter.fit`` return points of the
  local polytope (non-negative, consistent, right total) near their input.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import scipy.linalg as la
import scipy.sparse as sp

from cvxdp.solvers.local import region_graph as rgmod
from cvxdp.solvers.local.loss import CellLoss, split_loss
from cvxdp.solvers.local.repair import MarginFitter, fit_margins, mix
from cvxdp.solvers.marginal.loss import LossTerm, MarginalLoss
from cvxdp.solvers.local.region_graph import RegionGraph

CASES = {
    "single": ([2, 3], [(0, 1)]),
    "single_reversed": ([2, 3], [(1, 0)]),
    "one_cell": ([1], [(0,)]),
    "chain": ([2, 3, 2], [(0, 1), (1, 2)]),
    "triangle": ([2, 3, 2], [(0, 1), (1, 2), (2, 0)]),
    "pairs4": ([2, 2, 3, 2], list(itertools.combinations(range(4), 2))),
    "nested": ([2, 3, 2], [(0,), (1, 0), (0, 1, 2), (2,)]),
    "disjoint": ([2, 3, 2, 2], [(0, 1), (2, 3)]),
    "size1": ([2, 1, 3], [(0, 1), (1, 2), (2, 0)]),
    "triples": ([2, 2, 2, 2], [(0, 1, 2), (3, 2, 1), (0, 3)]),
    "permuted": ([2, 3, 4], [(2, 0, 1), (1, 2), (0, 2)]),
}


@pytest.fixture(params=["matrix", "blocks"])
def mode(request, monkeypatch):
    """Run each test on both code paths of RegionGraph."""
    if request.param == "blocks":
        monkeypatch.setattr(rgmod, "MATRIX_MAX_NNZ", -1)
    return request.param


def graph(name: str) -> RegionGraph:
    sizes, cliques = CASES[name]
    return RegionGraph(sizes, cliques)


# ---------------------------------------------------------------- brute force
def marg_matrix(G: RegionGraph, k: int, attrs) -> np.ndarray:
    """Dense 0/1 matrix: clique ``k``'s flat table -> its marginal on ``attrs`` (in that
    order, C order), placed in the columns of the stacked vector."""
    clique, shape = G.cliques[k], G.shapes[k]
    idx = np.unravel_index(np.arange(G.cells[k]), shape)
    tshape = tuple(G.sizes[a] for a in attrs)
    rows = np.ravel_multi_index(tuple(idx[clique.index(a)] for a in attrs), tshape) \
        if attrs else np.zeros(G.cells[k], dtype=int)
    out = np.zeros((math.prod(tshape), G.n))
    out[rows, G.offsets[k] + np.arange(G.cells[k])] = 1.0
    return out


def consistency_matrix(G: RegionGraph, with_total: bool) -> np.ndarray:
    """Rows: every pair of cliques agrees on its shared attributes; every clique's total
    equals the first's; (``with_total``) the first's total is zero."""
    rows = []
    for i, j in itertools.combinations(range(len(G.cliques)), 2):
        shared = [a for a in G.cliques[i] if a in G.cliques[j]]
        if shared:
            rows.append(marg_matrix(G, i, shared) - marg_matrix(G, j, shared))
    for k in range(1, len(G.cliques)):
        rows.append(marg_matrix(G, k, ()) - marg_matrix(G, 0, ()))
    if with_total:
        rows.append(marg_matrix(G, 0, ()))
    return np.vstack(rows) if rows else np.zeros((0, G.n))


def null_basis(C: np.ndarray, n: int) -> np.ndarray:
    return la.null_space(C) if C.shape[0] else np.eye(n)


def dense_projection(G: RegionGraph, t: np.ndarray, total, weights=None) -> np.ndarray:
    """``argmin_x sum_k a_k ||x_k - t_k||^2`` over consistent ``x`` with ``total`` (``None``:
    any common total), by a null-space least-squares solve."""
    a = np.ones(len(G.cliques)) if weights is None else np.asarray(weights, dtype=float)
    D = np.repeat(a, G.cells)
    Z = null_basis(consistency_matrix(G, total is not None), G.n)
    x0 = G.uniform(total) if total is not None else np.zeros(G.n)
    sq = np.sqrt(D)
    z, *_ = np.linalg.lstsq(sq[:, None] * Z, sq * (t - x0), rcond=None)
    return x0 + Z @ z


def brute_regions(G: RegionGraph) -> dict:
    held: dict[frozenset, list[int]] = {}
    for k, c in enumerate(G.cliques):
        for r in range(1, len(c) + 1):
            for sub in itertools.combinations(c, r):
                held.setdefault(frozenset(sub), []).append(k)
    return {s: ks for s, ks in held.items() if len(ks) > 1}


def brute_residual(G: RegionGraph, t: np.ndarray, total=None) -> float:
    viol = 0.0
    for s, ks in brute_regions(G).items():
        attrs = sorted(s)
        ms = [marg_matrix(G, k, attrs) @ t for k in ks]
        viol = max([viol] + [float(np.max(np.abs(m - ms[0]))) for m in ms[1:]])
    sums = G.totals(t)
    ref = sums[0] if total is None else total
    return max(viol, float(np.max(np.abs(sums - ref))))


def rand(G: RegionGraph, seed: int, scale: float = 1.0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, scale, G.n)


# ---------------------------------------------------------------- RegionGraph
@pytest.mark.parametrize("name", sorted(CASES))
def test_regions_are_all_shared_attribute_sets(name, mode):
    G = graph(name)
    expect = brute_regions(G)
    got = {frozenset(r.attrs): sorted(int(k) for k in r.members) for r in G.regions}
    assert got == {s: sorted(ks) for s, ks in expect.items()}
    for r in G.regions:
        assert list(r.attrs) == sorted(r.attrs)
        assert r.shape == tuple(G.sizes[a] for a in r.attrs)
        np.testing.assert_array_equal(r.spread, G.cells[r.members] // math.prod(r.shape))


@pytest.mark.parametrize("total", [7.5, None, 0.0])
@pytest.mark.parametrize("name", sorted(CASES))
def test_project_equals_dense_least_squares(name, total, mode):
    G = graph(name)
    for seed in range(2):
        t = rand(G, seed, 3.0)
        P = G.project(t, total)
        Pd = dense_projection(G, t, total)
        np.testing.assert_allclose(P, Pd, atol=1e-10, rtol=0)


@pytest.mark.parametrize("total", [3.0, None])
@pytest.mark.parametrize("name", ["triangle", "nested", "pairs4", "disjoint", "triples",
                                  "permuted"])
def test_weighted_projection_equals_dense_least_squares(name, total, mode):
    G = graph(name)
    rng = np.random.default_rng(5)
    a = rng.uniform(0.2, 5.0, len(G.cliques))
    t = rand(G, 6, 2.0)
    np.testing.assert_allclose(G.project(t, total, a), dense_projection(G, t, total, a),
                               atol=1e-10, rtol=0)


@pytest.mark.parametrize("total", [4.0, None, 0.0])
@pytest.mark.parametrize("name", sorted(CASES))
def test_projection_identities(name, total, mode):
    G = graph(name)
    rng = np.random.default_rng(7)
    a = rng.uniform(0.5, 3.0, len(G.cliques))
    for weights in (None, a):
        D = np.ones(G.n) if weights is None else np.repeat(a, G.cells)
        t = rand(G, 8, 5.0)
        P = G.project(t, total, weights)
        # idempotent
        np.testing.assert_allclose(G.project(P, total, weights), P, atol=1e-11, rtol=0)
        # in the set: consistent, totals
        assert G.residual(P, total) <= 1e-11
        assert brute_residual(G, P, total) <= 1e-11
        s = G.totals(P)
        if total is not None:
            np.testing.assert_allclose(s, total, atol=1e-11)
        else:
            # the a_k / n(C_k)-weighted mean of the input totals (corrections keep totals)
            w = (np.ones(len(G.cliques)) if weights is None else a) / G.cells
            np.testing.assert_allclose(s, np.dot(w, G.totals(t)) / w.sum(), atol=1e-11)
        # the correction is D-orthogonal to the consistent directions (V_0, or V when free)
        Z = null_basis(consistency_matrix(G, total is not None), G.n)
        assert np.max(np.abs(Z.T @ (D * (t - P))), initial=0.0) <= 1e-10
        # and a consistent point is left alone
        np.testing.assert_allclose(G.project(P, total, weights), P, atol=1e-11, rtol=0)


@pytest.mark.parametrize("name", sorted(CASES))
def test_projection_onto_directions_is_linear_and_self_adjoint(name, mode):
    """``project(., 0)`` is the orthogonal projector onto ``V_0``: linear, symmetric."""
    G = graph(name)
    P = np.column_stack([G.project(e, 0.0) for e in np.eye(G.n)])
    np.testing.assert_allclose(P, P.T, atol=1e-12)
    np.testing.assert_allclose(P @ P, P, atol=1e-12)
    Z = null_basis(consistency_matrix(G, True), G.n)
    np.testing.assert_allclose(P, Z @ Z.T, atol=1e-10)
    assert round(float(np.trace(P))) == Z.shape[1]


@pytest.mark.parametrize("name", sorted(CASES))
def test_residual_matches_brute_force(name, mode):
    G = graph(name)
    for seed in range(3):
        t = rand(G, 10 + seed, 2.0)
        assert abs(G.residual(t) - brute_residual(G, t)) <= 1e-12
        assert abs(G.residual(t, 1.5) - brute_residual(G, t, 1.5)) <= 1e-12
        # zero on projected points, at any scale
        for scale in (1e-3, 1.0, 1e7):
            P = G.project(t * scale, 5.0 * scale)
            assert G.residual(P, 5.0 * scale) <= 1e-11 * max(1.0, scale)


@pytest.mark.parametrize("name", sorted(CASES))
def test_uniform_marginal_block_totals(name, mode):
    G = graph(name)
    U = G.uniform(6.0)
    assert np.all(U > 0) and G.residual(U, 6.0) <= 1e-12
    np.testing.assert_allclose(G.totals(U), 6.0)
    t = rand(G, 20)
    for k, c in enumerate(G.cliques):
        tab = G.block(t, k)
        assert tab.shape == G.shapes[k]
        np.testing.assert_array_equal(tab.ravel(), t[G.offsets[k]:G.offsets[k + 1]])
        for r in range(1, len(c) + 1):
            for attrs in itertools.permutations(c, r):
                m = G.marginal(t, k, list(attrs))
                expect = (marg_matrix(G, k, list(attrs)) @ t).reshape([G.sizes[a] for a in attrs])
                np.testing.assert_allclose(m, expect, atol=1e-12)
    np.testing.assert_allclose(G.totals(t), [t[a:b].sum() for a, b in
                                             zip(G.offsets[:-1], G.offsets[1:])])


def test_both_paths_agree_on_a_larger_graph(monkeypatch):
    sizes = [3, 2, 4, 2, 3]
    cliques = list(itertools.combinations(range(5), 2)) + [(0, 2, 4), (1,)]
    t = np.random.default_rng(3).normal(size=RegionGraph(sizes, cliques).n)
    a = np.random.default_rng(4).uniform(0.5, 2, len(cliques))
    G1 = RegionGraph(sizes, cliques)
    monkeypatch.setattr(rgmod, "MATRIX_MAX_NNZ", -1)
    G2 = RegionGraph(sizes, cliques)
    assert G1.matrix_mode and not G2.matrix_mode
    for total in (2.0, None, 0.0):
        np.testing.assert_allclose(G1.project(t, total, a), G2.project(t, total, a), atol=1e-12)
    assert abs(G1.residual(t) - G2.residual(t)) <= 1e-12


def test_components():
    G = RegionGraph([2, 2, 2, 2, 2], [(0, 1), (1, 2), (3,), (3, 4), (4,)])
    c = G.components
    assert c[0] == c[1] and c[2] == c[3] == c[4] and c[0] != c[2]


@pytest.mark.parametrize("cliques,match", [([], "no cliques"), ([(0, 0)], "repeats"),
                                           ([(0, 1), (1, 0)], "twice")])
def test_refusals(cliques, match):
    with pytest.raises(ValueError, match=match):
        RegionGraph([2, 2], cliques)


# ---------------------------------------------------------------- local_loss
def random_loss(seed: int, n: int = 12) -> MarginalLoss:
    """Identity rows (slices), scaled one-cell rows, empty rows, two absolute rows on one
    cell, and rows over several cells."""
    rng = np.random.default_rng(seed)
    terms = [LossTerm("l2", slice(0, 5), rng.normal(size=5), rng.uniform(0, 2, 5)),
             LossTerm("l1", slice(3, 9), rng.normal(size=6), rng.uniform(0, 2, 6))]
    rows, cols, vals = [], [], []
    for r in range(6):                                  # one cell, coefficient != 1
        rows.append(r), cols.append(int(rng.integers(n))), vals.append(float(rng.uniform(-3, 3)))
    A1 = sp.csr_matrix((vals, (rows, cols)), shape=(8, n))      # rows 6, 7 empty
    terms.append(LossTerm("l2", A1, rng.normal(size=8), rng.uniform(0, 2, 8)))
    terms.append(LossTerm("l1", A1, rng.normal(size=8), rng.uniform(0, 2, 8)))
    A2 = rng.normal(size=(3, n)) * (rng.random((3, n)) < 0.4)
    A2[0, 0], A2[0, 1] = 1.0, 1.0                       # at least one multi-cell row
    A2 = sp.csr_matrix(A2)
    terms.append(LossTerm("l2", A2, rng.normal(size=3), rng.uniform(0.5, 2, 3)))
    terms.append(LossTerm("l1", A2, rng.normal(size=3), rng.uniform(0.5, 2, 3)))
    terms.append(LossTerm("l1", slice(4, 6), rng.normal(size=2), 0.0))       # zero weight
    return MarginalLoss(terms, n, constant=0.25)


@pytest.mark.parametrize("seed", range(4))
def test_split_loss_adds_up(seed):
    loss = random_loss(seed)
    cells, coupled = split_loss(loss)
    assert coupled.n == loss.n
    rng = np.random.default_rng(100 + seed)
    for _ in range(5):
        x = rng.normal(0, 3, loss.n)
        total = cells.value(x) + coupled.value(x)
        assert abs(total - loss.value(x)) <= 1e-10 * max(1.0, loss.value(x))
    # every coupled row touches several cells, or is a second absolute row on one cell
    for t in coupled.terms:
        nnz = np.diff(t.A.tocsr().indptr) if not isinstance(t.A, slice) else np.ones(t.b.size)
        assert t.kind == "l1" or np.all(nnz > 1)
    # and is the row of the term ``origin`` names
    assert len(coupled.origin) == len(coupled.terms)
    x = rng.normal(0, 3, loss.n)
    for t, (i, rows) in zip(coupled.terms, coupled.origin):
        src = loss.terms[i]
        assert src.kind == t.kind
        np.testing.assert_allclose(t.apply(x), src.apply(x)[rows], rtol=1e-12, atol=1e-12)
        np.testing.assert_array_equal(t.w, src.w[rows])


def test_split_loss_of_identity_rows_is_all_cells():
    n = 6
    rng = np.random.default_rng(1)
    loss = MarginalLoss([LossTerm("l2", slice(0, n), rng.normal(size=n), 2.0),
                         LossTerm("l1", slice(0, n), rng.normal(size=n), 0.5)], n)
    cells, coupled = split_loss(loss)
    assert coupled.terms == []
    np.testing.assert_allclose(cells.A, 2.0)
    np.testing.assert_allclose(cells.w, 0.5)
    x = rng.normal(size=n)
    assert abs(cells.value(x) - loss.value(x)) <= 1e-12


def brute_min(f, upper: float, anchors) -> float:
    """Minimum of a convex piecewise-quadratic 1-D function over ``[0, upper]``: a fine grid
    plus the candidate points."""
    grid = np.concatenate([np.linspace(0.0, upper, 20001), [0.0, upper],
                           [a for a in anchors if 0.0 <= a <= upper]])
    return float(np.min(f(grid)))


@pytest.mark.parametrize("smooth", [True, False])
@pytest.mark.parametrize("seed", range(3))
def test_cell_argmin_against_brute_force(seed, smooth):
    rng = np.random.default_rng(seed)
    n = 40
    c = CellLoss(n)
    c.A = rng.uniform(0.1, 3, n) * (rng.random(n) < (1.0 if smooth else 0.7))
    c.C = rng.normal(0, 3, n)
    if not smooth:
        c.w = rng.uniform(0, 2, n) * (rng.random(n) < 0.7)
        c.b = rng.normal(1, 2, n)
    c.freeze()
    assert c.smooth == smooth
    for upper in (5.0, 0.5):
        A = c.A if rng.random() < 0.5 else c.A + 0.3         # also a different curvature
        k = rng.normal(0, 4, n)
        x = c.argmin(A, k, upper)
        assert np.all((x >= 0) & (x <= upper))
        for i in range(n):
            def f(v, i=i):
                return 0.5 * A[i] * v * v - k[i] * v + c.w[i] * np.abs(v - c.b[i])
            best = brute_min(f, upper, [c.b[i], k[i] / A[i] if A[i] > 0 else 0.0])
            assert f(x[i]) <= best + 1e-9 * max(1.0, abs(best)), (i, x[i], f(x[i]), best)


def test_cell_argmin_linear_cells():
    """No curvature: the minimiser of a piecewise-linear cell is 0, b or the upper end."""
    c = CellLoss(5)
    c.w = np.array([0.0, 1.0, 1.0, 1.0, 0.0])
    c.b = np.array([0.0, 2.0, 2.0, 2.0, 0.0])
    c.freeze()
    k = np.array([-1.0, 0.5, 3.0, -2.0, 1.0])
    x = c.argmin(np.zeros(5), k, 10.0)
    np.testing.assert_allclose(x, [0.0, 2.0, 10.0, 0.0, 10.0])
    assert np.isinf(c.argmin(np.zeros(5), k, np.inf)[4])


@pytest.mark.parametrize("seed", range(3))
def test_cell_prox_against_brute_force(seed):
    rng = np.random.default_rng(seed)
    n = 30
    c = CellLoss(n)
    c.A = rng.uniform(0, 2, n) * (rng.random(n) < 0.6)
    c.C = rng.normal(0, 2, n)
    c.w = rng.uniform(0, 2, n) * (rng.random(n) < 0.6)
    c.b = rng.normal(1, 2, n)
    c.freeze()
    rho = 1.7
    v = rng.normal(1, 3, n)
    x = c.prox(v, rho)
    assert np.all(x >= 0)
    for i in range(n):
        def f(z, i=i):
            return (0.5 * c.A[i] * z * z - c.C[i] * z + c.w[i] * np.abs(z - c.b[i])
                    + 0.5 * rho * (z - v[i]) ** 2)
        best = brute_min(f, 20.0, [c.b[i], v[i]])
        assert f(x[i]) <= best + 1e-9 * max(1.0, abs(best))


# ---------------------------------------------------------------- local_repair
def consistent_with_negatives(G: RegionGraph, seed: int, total: float, noise: float):
    """A consistent table with total ``total`` near a positive one, with negative cells."""
    rng = np.random.default_rng(seed)
    base = G.project(rng.uniform(0.5, 1.5, G.n) * G.uniform(total), total)
    base = mix(G, base, total)                       # positive, consistent
    x = G.project(base + rng.normal(0, noise, G.n) * G.uniform(total), total)
    return base, x


def in_polytope(G: RegionGraph, x: np.ndarray, total, tol: float) -> None:
    assert np.all(x >= 0)
    assert G.residual(x, total) <= tol
    assert brute_residual(G, x, total) <= tol


@pytest.mark.parametrize("total", [10.0, None])
@pytest.mark.parametrize("name", ["triangle", "pairs4", "nested", "disjoint", "triples", "size1"])
def test_mix_returns_a_nearby_point_of_the_polytope(name, total, mode):
    G = graph(name)
    for seed in range(3):
        _, x = consistent_with_negatives(G, seed, 10.0, 0.8)
        out = mix(G, x, total)
        N = total if total is not None else float(np.mean(G.totals(x)))
        in_polytope(G, out, total, 1e-10 * max(1.0, N))
        np.testing.assert_allclose(G.totals(out), N, atol=1e-10)
        if np.any(x < 0):
            # the least s: some negative cell lands on zero, and out = (1-s) x + s U
            U = G.uniform(N)
            s = float(np.max(-x[x < 0] / (U[x < 0] - x[x < 0])))
            np.testing.assert_allclose(out, np.maximum((1 - s) * x + s * U, 0), atol=1e-12)
            assert 0 < s < 1
        else:
            np.testing.assert_array_equal(out, x)


def test_mix_of_a_non_positive_free_total_is_zero():
    G = graph("chain")
    x = G.project(-np.ones(G.n), None)
    np.testing.assert_array_equal(mix(G, x, None), 0.0)


@pytest.mark.parametrize("total", [50.0, None])
@pytest.mark.parametrize("name", ["triangle", "pairs4", "nested", "chain", "triples", "size1"])
def test_margin_fitter_returns_a_nearby_point_of_the_polytope(name, total, mode):
    G = graph(name)
    fitter = MarginFitter(G)
    for seed in range(3):
        base, x = consistent_with_negatives(G, seed, 50.0, 0.3)
        out = fitter.fit(x, total)
        N = total if total is not None else float(np.mean(G.totals(x)))
        in_polytope(G, out, total, 1e-9 * N)
        np.testing.assert_allclose(G.totals(out), N, rtol=1e-12)
        if all(np.all(G.marginal(x, int(r.members[0]), list(r.attrs)) >= 0) for r in G.regions):
            # consistent, non-negative targets: the region marginals are kept
            for r in G.regions:
                k = int(r.members[0])
                np.testing.assert_allclose(G.marginal(out, k, list(r.attrs)),
                                           G.marginal(x, k, list(r.attrs)), atol=1e-6 * N)
        # near x: it moves by about the negative part, and no more than mixing does
        neg = float(np.sum(np.maximum(-x, 0)))
        assert float(np.sum(np.abs(out - x))) <= 4 * neg * len(G.cliques) + 1e-9 * N
        assert np.sum(np.abs(out - x)) <= np.sum(np.abs(mix(G, x, total) - x)) + 1e-9 * N
        # the one-off function is the same
        np.testing.assert_allclose(fit_margins(G, x, total), out, atol=1e-12)


@pytest.mark.parametrize("total", [1.0, None])
def test_margin_fitter_with_negative_region_marginals(total, mode):
    """Region marginals below zero cannot be met: the fit still returns a polytope point."""
    G = graph("chain")
    x = G.project(np.random.default_rng(0).normal(0, 5, G.n), 1.0)
    assert any(np.any(G.marginal(x, int(r.members[0]), list(r.attrs)) < 0) for r in G.regions)
    out = MarginFitter(G).fit(x, total)
    in_polytope(G, out, total, 1e-9)
    np.testing.assert_allclose(G.totals(out), 1.0, rtol=1e-12)


def test_margin_fitter_refuses_a_non_positive_total():
    G = graph("chain")
    assert MarginFitter(G).fit(G.uniform(1.0), -1.0) is None
    assert MarginFitter(G).fit(G.project(-np.ones(G.n), None), None) is None

"""The set-by-set repair behind the non-negative reconstruction's certificate
(:mod:`cvxdp.solvers.residual.repair`): the tables it reads, what it may move, that it ends
non-negative where proportional fitting always works, and that it certifies sooner than the
uniform mixture alone."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from cvxdp.solvers.residual import nonneg
from cvxdp.solvers.residual.nonneg import CliqueResiduals, NonnegSettings, solve
from cvxdp.solvers.residual.repair import repair, set_table


def _closure(cliques):
    out = {()}
    for C in cliques:
        for r in range(1, len(C) + 1):
            out.update(itertools.combinations(C, r))
    return sorted(out, key=lambda A: (len(A), A))


def _components(st, tables):
    """The components of consistent clique tables: ``B^T`` divided by its diagonal."""
    return [cj / st.d[j] for j, cj in enumerate(st.contract(tables))]


def _noisy(seed, sizes, cliques, n=30, noise=3.0):
    """Components of a sparse data set's tables plus noise on every component (consistent,
    with negative cells), and the data's own components."""
    rng = np.random.default_rng(seed)
    st = CliqueResiduals(sizes, cliques, _closure(cliques))
    recs = np.column_stack([rng.integers(0, max(1, k // 2), n) for k in sizes])
    tables = []
    for C in st.cliques:
        T = np.zeros(tuple(sizes[a] for a in C))
        np.add.at(T, tuple(recs[:, list(C)].T), 1.0)
        tables.append(T)
    truth = _components(st, tables)
    u = [t + (0 if t.ndim == 0 else noise * st.center(j, rng.standard_normal(t.shape)))
         for j, t in enumerate(truth)]
    return st, truth, u, float(n)


@pytest.mark.parametrize("seed", range(4))
def test_set_tables_are_the_clique_tables_and_their_marginals(seed):
    st, _, u, _ = _noisy(seed, [3, 1, 4, 2], [(0, 1, 2), (1, 3), (0, 2, 3)])
    for C, T in zip(st.cliques, st.expand(u)):
        np.testing.assert_allclose(set_table(st, u, C), T, atol=1e-12)
        for A in itertools.combinations(C, len(C) - 1):
            drop = tuple(i for i, a in enumerate(C) if a not in A)
            np.testing.assert_allclose(set_table(st, u, A), T.sum(axis=drop), atol=1e-10)


@pytest.mark.parametrize("seed", range(6))
def test_two_way_repair_is_non_negative_and_moves_only_negative_sets(seed):
    """With two-way cliques, proportional fitting of a table to non-negative row and column
    sums of one total always converges, so the pass alone ends non-negative."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 6, 5).tolist()
    cliques = [(0, 1), (1, 2), (0, 2), (2, 3), (3, 4)]
    st, truth, u, N = _noisy(seed, sizes, cliques)
    assert min(T.min() for T in st.expand(u)) < 0
    before = {A: set_table(st, u, A) for A in st.residuals if A}
    out = repair(st, u, N)
    for C, T in zip(st.cliques, st.expand(out)):
        assert T.min() >= -1e-9 * N, C
    for j, A in enumerate(st.residuals):
        if A and before[A].min() >= 0 and all(before[B].min() >= 0 for B in before
                                              if set(B) < set(A)):
            np.testing.assert_array_equal(out[j], u[j])   # nothing below it moved either
    assert float(out[st.index[()]]) == float(u[st.index[()]])   # the total is kept


def test_caller_components_are_not_changed():
    st, truth, u, N = _noisy(0, [3, 3, 3], [(0, 1, 2)])
    copy = [a.copy() for a in u]
    repair(st, u, N)
    for a, b in zip(u, copy):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("seed", range(3))
def test_repair_certifies_sooner_than_the_uniform_mixture(seed, monkeypatch):
    """A sparse instance stopped after one check: the same lower bound, and a feasible point
    (so a certified gap) several times better with the repair than with the uniform mixture
    alone (measured: 0.0011-0.0023 against 0.012-0.015)."""
    sizes = [6, 5, 7, 4, 8]
    cliques = [(0, 1), (1, 2), (0, 2), (2, 3), (3, 4), (0, 4)]
    st, truth, _, N = _noisy(seed, sizes, cliques, n=200, noise=0.0)
    rng = np.random.default_rng(seed)
    z = [t + (0 if t.ndim == 0 else 3.0 * st.center(j, rng.standard_normal(t.shape)))
         for j, t in enumerate(truth)]
    w = np.ones(len(z))
    settings = NonnegSettings(max_iters=10, eps_rel=1e-12, polish=False)
    with_repair = solve(st, z, w, N, settings)
    monkeypatch.setattr(nonneg, "repair", lambda st, u, total: u)
    without = solve(st, z, w, N, settings)
    assert with_repair.lower_bound == pytest.approx(without.lower_bound, rel=1e-12)
    assert with_repair.gap < 0.25 * without.gap
    assert np.min(with_repair.x) >= -1e-9 * N

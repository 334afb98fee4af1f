"""The set-by-set repair of the local polytope's certificate
(:class:`cvxdp.solvers.local.repair.SetRepair`): a point of the polytope (non-negative,
consistent, the total kept) from a consistent iterate with negative cells, cliques in any axis
order, and a far better one than the uniform mixture where the cliques overlap in pairs."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from cvxdp.solvers.local.region_graph import RegionGraph
from cvxdp.solvers.local.repair import SetRepair, mix


def _consistent_noisy(seed, sizes, cliques, n=40, noise=2.0):
    """Clique tables of sparse records plus consistent noise (the projection of noisy tables
    onto the consistent ones), stacked as the region graph stores them; and the truth."""
    rng = np.random.default_rng(seed)
    G = RegionGraph(sizes, cliques)
    recs = np.column_stack([rng.integers(0, max(1, k // 2), n) for k in sizes])
    truth = []
    for c, shape in zip(G.cliques, G.shapes):
        T = np.zeros(shape)
        np.add.at(T, tuple(recs[:, list(c)].T), 1.0)
        truth.append(T.ravel())
    truth = np.concatenate(truth)
    x = G.project(truth + noise * rng.standard_normal(truth.size), float(n))
    return G, x, truth, float(n)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("total_known", [True, False])
def test_a_point_of_the_polytope_from_a_negative_iterate(seed, total_known):
    rng = np.random.default_rng(100 + seed)
    sizes = rng.integers(1, 5, 5).tolist()
    cliques = [tuple(rng.permutation(c)) for c in itertools.combinations(range(5), 3)][:6]
    G, x, _, N = _consistent_noisy(seed, sizes, cliques)
    assert x.min() < 0 and G.residual(x, N) < 1e-9
    x0 = x.copy()
    pt = SetRepair(G)(x, N if total_known else None)
    np.testing.assert_array_equal(x, x0)                     # the caller's array is kept
    assert pt.min() >= 0
    assert G.residual(pt, N) <= 1e-8 * N


@pytest.mark.parametrize("seed", range(3))
def test_closer_than_the_uniform_mixture_on_three_way_cliques(seed):
    """All three-way cliques of 5 attributes on sparse data: the repaired point is nearer the
    iterate than the uniform mixture, by a wide margin (measured: 6.7-7.4x)."""
    sizes = [3, 4, 2, 5, 3]
    cliques = list(itertools.combinations(range(5), 3))
    G, x, _, N = _consistent_noisy(seed, sizes, cliques, n=60, noise=0.5)
    d_sets = np.linalg.norm(SetRepair(G)(x, N) - x)
    d_mix = np.linalg.norm(mix(G, x, N) - x)
    assert d_sets < 0.5 * d_mix


def test_too_many_sets_is_no_repair(monkeypatch):
    from cvxdp.solvers.local import repair as module
    monkeypatch.setattr(module, "_MAX_SETS", 4)
    G, x, _, N = _consistent_noisy(0, [2, 2, 2], [(0, 1, 2)])
    assert SetRepair(G)(x, N) is None

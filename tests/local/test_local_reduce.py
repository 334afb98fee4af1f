"""Unmeasured cliques eliminated from the local polytope before the solve
(``cvxdp.solvers.local.reduce``).

Every instance (chosen, and random structures with nested cliques and size-one attributes) is
solved through ``prob.solve`` and checked against Clarabel on the whole
problem by ``test_local_polytope.check`` (objective, lower bound, the returned tables in the
*whole* local polytope, duals by a KKT check); here it is also checked which cliques were
eliminated (acyclic overlaps only, repeatedly, never a measured clique or the last one), that
the filled-in tables meet their overlaps' marginals exactly, that the dual Newton now runs
where an eliminated clique was the only unmeasured part, and that warm starts still work.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.sparse as sp

import cvxdp

from cvxdp.solvers.local import admm as LA
from cvxdp.solvers.local import reduce as local_reduce
from cvxdp.solvers.marginal.loss import LossTerm, MarginalLoss
from cvxdp.solvers.local.region_graph import RegionGraph

from test_local_polytope import check, make

PAIRS4 = list(itertools.combinations(range(4), 2))
PAIRS5 = list(itertools.combinations(range(5), 2))


def info(inst) -> dict:
    return inst.prob.solver_stats.extra_stats["info"]


@pytest.mark.parametrize("total", [50.0, None])
@pytest.mark.parametrize("loss", ["l2", "l1", "mixed"])
def test_unmeasured_pairs_eliminated_and_the_optimum_kept(loss, total):
    # each unmeasured pair overlaps the others in two single attributes: acyclic (Clarabel's
    # tight reference fails on most seeds with a size-3 attribute and absolute rows)
    inst = make(41, [2, 2, 2, 2, 2], PAIRS5, loss=loss, total=total, unmeasured=(1, 6, 9))
    st = check(inst, unique=False)
    assert info(inst)["eliminated"] == 3
    if st["duals_certified"]:
        for k in (1, 6, 9):                    # no loss on them: zero multipliers
            assert np.max(np.abs(inst.con.dual_value[k])) <= 1e-9


def test_dual_newton_runs_once_the_unmeasured_cliques_are_gone():
    inst = make(32, [2, 3, 2, 2, 3], PAIRS5, loss="l2", total=80.0, noise=2.0, unmeasured=(0, 5))
    check(inst, unique=False)
    assert info(inst)["eliminated"] == 2
    newton = info(inst)["dual_newton"]
    assert newton is not None and newton["converged"], newton


def test_cyclic_overlaps_keep_the_clique():
    # the triple's overlaps are its three pairs: a cycle, so a table meeting them may not
    # exist (the local polytope differs from the marginal polytope there); it stays
    inst = make(33, [2, 3, 2], [(0, 1), (1, 2), (0, 2), (0, 1, 2)], loss="l2", unmeasured=(3,))
    check(inst, unique=False)
    assert info(inst)["eliminated"] == 0


def test_path_overlaps_filled_exactly():
    # the triple overlaps the others in {0, 1} and {1, 2}: a path
    inst = make(34, [3, 2, 4, 2], [(0, 1), (1, 2), (2, 3), (0, 1, 2)], loss="l1", unmeasured=(3,))
    check(inst, unique=False)
    assert info(inst)["eliminated"] == 1


def test_one_elimination_opens_another():
    # (0, 1, 2)'s overlaps {0, 1}, {1, 2} and, through (0, 2, 3), {0, 2} form a cycle; (0, 2, 3)
    # overlaps the rest in {0, 2} only, so it goes first, and then (0, 1, 2) can go
    inst = make(35, [2, 3, 2, 2], [(0, 1), (1, 2), (0, 1, 2), (0, 2, 3)], loss="l2",
                unmeasured=(2, 3))
    check(inst, unique=False)
    assert info(inst)["eliminated"] == 2


def test_measured_cliques_stay():
    inst = make(36, [2, 3], [(0,), (1,), (0, 1)], loss="l2", unmeasured=(0, 1))
    check(inst, unique=False)
    assert info(inst)["eliminated"] == 2


def test_warm_start_reuses_the_smaller_problem_state():
    inst = make(37, [2, 3, 2, 2, 3], PAIRS5, loss="l1", total=60.0, unmeasured=(2, 7))
    check(inst, unique=False)
    cold = inst.prob.solver_stats.num_iters
    inst.prob.solve(method="cvxdp", solver=cvxdp.ADMM, eps_rel=1e-6, warm_start=True)
    st = inst.prob.solver_stats.extra_stats
    assert st["warm_started"] and inst.prob.solver_stats.num_iters <= cold


def test_parameter_total_and_a_new_value():
    inst = make(38, [2, 3, 2, 2], [(0, 1), (1, 2), (2, 3), (0, 3)], loss="l2", total=30.0,
                unmeasured=(1,), param_total=True)
    check(inst, unique=False)
    assert info(inst)["eliminated"] == 1
    inst.total.value = 45.0                # a new total: the same elimination, a cold start
    inst.prob.solve(method="cvxdp", solver=cvxdp.ADMM, eps_rel=1e-8, warm_start=True)
    assert inst.prob.status == "optimal" and info(inst)["eliminated"] == 1
    assert not inst.prob.solver_stats.extra_stats["warm_started"]
    assert inst.con.residual <= 1e-6
    assert abs(sum(float(np.sum(v.value)) for v in inst.mus.values()) - 45.0 * 4) <= 1e-6


@pytest.mark.parametrize("total, noise, loss", [(1e-3, 1e-4, "l2"), (1e-3, 1e-4, "l1"),
                                                (1e7, 1e2, "l2"), (1e7, 1e2, "l1")])
def test_extreme_scales(total, noise, loss):
    """The filled table divides marginals by marginals: totals of 1e-3 and 1e7 alike."""
    inst = make(39, [2, 3, 2, 2], PAIRS4, loss=loss, total=total, noise=noise, unmeasured=(1, 4))
    check(inst, unique=False)
    assert info(inst)["eliminated"] == 2


def _random_structure(seed: int):
    """Random attributes (sizes 1-3), cliques of one to three of them (nested ones too), a
    random non-empty set left unmeasured, a random loss and total."""
    rng = np.random.default_rng([seed, 22])
    na = int(rng.integers(3, 6))
    sizes = [int(v) for v in rng.integers(1, 4, na)]
    pool = [c for r in (1, 2, 3) for c in itertools.combinations(range(na), r)]
    k = int(rng.integers(2, min(7, len(pool)) + 1))
    cliques = [pool[i] for i in sorted(rng.choice(len(pool), k, replace=False))]
    unmeasured = tuple(int(i) for i in rng.choice(k, int(rng.integers(1, k)), replace=False))
    loss = str(rng.choice(["l2", "l1", "mixed"]))
    return sizes, cliques, unmeasured, loss, (None if rng.random() < 0.3 else 40.0)


@pytest.mark.parametrize("seed", range(8))
def test_random_structures_match_clarabel(seed):
    sizes, cliques, unmeasured, loss, total = _random_structure(seed)
    inst = make(seed, sizes, cliques, loss=loss, total=total, unmeasured=unmeasured)
    check(inst, unique=False)


# ---------------------------------------------------------------- on arrays
def _problem(sizes, cliques, measured, seed=0, total=30.0, coupled=None):
    rng = np.random.default_rng(seed)
    G = RegionGraph(sizes, cliques)
    terms = [LossTerm("l2", slice(int(G.offsets[k]), int(G.offsets[k + 1])),
                      rng.uniform(0, 2 * total / G.cells[k], G.cells[k]), 1.0) for k in measured]
    if coupled is not None:
        terms.append(coupled(G))
    return LA.LocalProblem(G, MarginalLoss(terms, G.n), total)


def test_fill_meets_every_overlap_and_the_total():
    sizes = [2, 3, 2, 3, 2]
    # clique 4 overlaps the others in {0, 1}, {1, 2}, {3} and nothing on attribute 4 (free)
    cliques = [(0, 1), (1, 2), (3,), (2, 3), (4, 0, 1, 2, 3)]
    p = _problem(sizes, cliques, measured=[0, 1, 2, 3])
    red = local_reduce.reduce(p)
    assert red is not None and [f.k for f in red.filled] == [4]
    # a point of the smaller polytope: the marginals of one random table
    rng = np.random.default_rng(1)
    table = rng.dirichlet(np.ones(int(np.prod(sizes)))).reshape(sizes) * 30.0
    small = red.problem.graph
    x = np.concatenate([table.sum(axis=tuple(a for a in range(5) if a not in c)).transpose(
        np.argsort(np.argsort(c))).ravel() for c in small.cliques])
    full = red.expand(x)
    G = p.graph
    assert full.min() >= 0.0
    assert G.residual(full, 30.0) <= 1e-12
    t4 = G.block(full, 4)
    # axes (4, 0, 1, 2, 3): the overlaps {0, 1}, {1, 2}, {3} met, attribute 4 spread evenly
    for axes, of_table in (((0, 3, 4), (2, 3, 4)), ((0, 1, 4), (0, 3, 4)), ((0, 1, 2, 3), (0, 1, 2, 4))):
        np.testing.assert_allclose(t4.sum(axis=axes), table.sum(axis=of_table), atol=1e-12)
    np.testing.assert_allclose(t4, np.broadcast_to(t4[:1], t4.shape), atol=1e-15)
    assert p.loss.value(full) == pytest.approx(red.problem.loss.value(x), rel=1e-14)


def test_a_coupled_row_on_a_clique_keeps_it():
    def coupled(G):                        # one query summing a cell of cliques 0 and 2
        A = sp.csr_matrix(([1.0, 1.0], ([0, 0], [0, int(G.offsets[2])])), shape=(1, G.n))
        return LossTerm("l1", A, [3.0], 1.0)
    p = _problem([2, 2, 2], [(0, 1), (1, 2), (0, 2)], measured=[0], coupled=coupled)
    red = local_reduce.reduce(p)
    assert red is not None and [f.k for f in red.filled] == [1]    # (1, 2) only
    p2 = _problem([2, 2, 2], [(0, 1), (1, 2), (0, 2)], measured=[0, 1, 2])
    assert local_reduce.reduce(p2) is None


def test_never_the_last_clique():
    p = _problem([2, 3], [(0,), (1,), (0, 1)], measured=[])
    red = local_reduce.reduce(p)
    assert red is not None and len(red.filled) == 2 and red.keep.tolist() == [2]


def test_the_callers_loss_is_left_alone():
    p = _problem([2, 3, 2], [(0, 1), (1, 2), (0, 2)], measured=[0])
    before = [(t.b.copy(), t.w.copy(), t.A) for t in p.loss.terms]
    res = LA.solve(p, LA.LocalSettings(eps_rel=1e-8))
    assert res.status == "optimal" and res.info["eliminated"] == 2
    for (b, w, A), t in zip(before, p.loss.terms):
        np.testing.assert_array_equal(b, t.b)
        np.testing.assert_array_equal(w, t.w)
        assert A == t.A
    assert res.x.size == p.graph.n and p.graph.residual(res.x, 30.0) <= 1e-9

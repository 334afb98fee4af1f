"""Proximal point steps with dual Newton inner solves (``cvxdp.solvers.local.proximal``): the
absolute (Laplace) rows on the local polytope.

Each instance is checked against Clarabel by ``test_local_polytope.check`` (objective, lower
bound, point, duals, KKT) and it is checked that the proximal method certified it; on random
and degenerate clique structures, mixed absolute and squared rows, extreme scales and a warm
start; cells under no row (unmeasured cliques, zero weights) take it too.
"""
from __future__ import annotations

import numpy as np
import pytest

from cvxdp.solvers.local import newton as local_newton
from cvxdp.solvers.local import proximal as local_proximal
from cvxdp.solvers.local.admm import LocalProblem
from cvxdp.solvers.marginal.loss import LossTerm, MarginalLoss
from cvxdp.solvers.local.region_graph import RegionGraph

from test_local_newton import CASES
from test_local_polytope import check, make, solve_admm


def newton_info(inst):
    return inst.prob.solver_stats.extra_stats["info"]["dual_newton"]


@pytest.mark.parametrize("loss", ["l1", "mixed"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_proximal_certifies_and_matches_clarabel(name, loss):
    sizes, cliques = CASES[name]
    inst = make(sum(map(ord, name)) + 7, sizes, cliques, loss=loss, total=100.0, noise=2.0)
    check(inst)
    info = newton_info(inst)
    assert info is not None and info["converged"], info


@pytest.mark.parametrize("total, noise", [(1e-3, 1e-4), (1e-3, 1e3), (1e7, 1e4), (1e7, 1e2)])
def test_extreme_scales(total, noise):
    """Totals 1e-3 and 1e7, noise from 1e-4 to 1e4.  (Counts of 1e7 measured to 10 or 1 are
    past the floor where the bound's last digits run out: neither method certifies 1e-7
    there, the proximal steps ending nearer, at 3.3e-6 and 4.5e-5, against the ADMM's
    0.13.)"""
    inst = make(41, [2, 3, 2], [(0, 1), (1, 2), (0, 2)], loss="l1", total=total, noise=noise)
    check(inst)
    assert newton_info(inst)["converged"]


@pytest.mark.parametrize("name", ["pairs4", "loop", "single clique", "disjoint"])
def test_free_total(name):
    """An unknown total: the proximal steps certify with the ADMM's free-total bound (a
    proven bound on the optimal total from the point's loss)."""
    sizes, cliques = CASES[name]
    inst = make(sum(map(ord, name)) + 11, sizes, cliques, loss="l1", total=None, noise=2.0)
    check(inst)
    assert newton_info(inst)["converged"]


@pytest.mark.parametrize("loss", ["l1", "l2", "mixed"])
def test_unmeasured_cells_take_the_proximal_steps(loss):
    """A clique without a measurement (cells with neither row) that cannot be eliminated
    (its overlaps, the three pairs, form a cycle): the proximal term is those cells' only
    curvature; certified, with duals that pass the KKT check."""
    inst = make(44, [2, 3, 2], [(0, 1), (1, 2), (0, 2), (0, 1, 2)], loss=loss, noise=2.0,
                unmeasured=(3,))
    check(inst, unique=False)
    info = inst.prob.solver_stats.extra_stats["info"]
    assert info["route"] == "proximal dual Newton" and newton_info(inst)["converged"]
    assert info["duals_certified"]


@pytest.mark.parametrize("seed", range(4))
def test_zero_weight_cells_write_duals(seed):
    """Squared rows with some weights zero (cells without curvature): the plain dual Newton
    does not apply, the proximal steps do, and the multipliers certify the gap."""
    inst = make(seed, [2, 3, 2], [(0, 1), (1, 2), (0, 2)], loss="l2", noise=2.0,
                zero_frac=0.3)
    check(inst, unique=False)
    info = inst.prob.solver_stats.extra_stats["info"]
    assert info["route"] == "proximal dual Newton" and info["duals_certified"]


def test_an_eliminated_unmeasured_clique_leaves_it_eligible():
    """The unmeasured pair overlaps the others in single attributes: it is eliminated
    (``cvxdp.solvers.local.reduce``) and the proximal steps certify the rest."""
    inst = make(44, [2, 3, 2], [(0, 1), (1, 2), (0, 2)], loss="l1", noise=2.0, unmeasured=(1,))
    check(inst)
    assert newton_info(inst)["converged"]


def test_warm_start_resumes_the_proximal_steps():
    """A second solve starts from the first's multiplier and point: the same answer in at
    most a few Newton steps."""
    inst = make(45, [2, 3, 2, 2], [(0, 1), (1, 2), (2, 3), (0, 3)], loss="l1", noise=2.0)
    solve_admm(inst, warm_start=True)
    v1, it1 = inst.prob.value, newton_info(inst)["iterations"]
    st = solve_admm(inst, warm_start=True)
    assert st["warm_started"] and inst.prob.status == "optimal"
    assert abs(inst.prob.value - v1) <= 2e-7 * max(1.0, abs(v1))
    assert newton_info(inst)["iterations"] < it1


def test_step_dual_gradient_and_weak_duality():
    """The step's dual value has the stated gradient (finite differences along a projected
    direction), and the bound at the multipliers it visits never exceeds a feasible loss."""
    rng = np.random.default_rng(3)
    G = RegionGraph([3, 2, 4], [(0, 1), (1, 2), (0, 2)])
    y = rng.laplace(4.0, 3.0, G.n)
    terms = [LossTerm("l1", slice(int(a), int(b)), y[a:b], rng.uniform(0.5, 2.0, int(b - a)))
             for a, b in zip(G.offsets[:-1], G.offsets[1:])]
    p = LocalProblem(G, MarginalLoss(terms, G.n), 30.0)
    assert local_proximal.eligible(p) and not local_newton.eligible(p)
    d = local_proximal._ProxDual(p, G.uniform(30.0), 2.0)
    z = local_newton._start(d)
    g, _, grad = d.evaluate(z)
    for _ in range(5):
        v = d.project(rng.normal(size=z.size))
        h = 1e-6
        assert (d.evaluate(z + h * v)[0] - d.evaluate(z - h * v)[0]) / (2 * h) == \
            pytest.approx(float(grad @ v), rel=1e-4, abs=1e-6)
    bounds = []

    def bound(lam, point, value):
        from cvxdp.solvers.local.admm import _orthogonal, lower_bound
        lam = _orthogonal(p, lam)
        b = lower_bound(p, lam, [], 30.0, 30.0, raw=float(np.abs(lam).max()))
        bounds.append(b)
        return b
    out = local_proximal.solve(p, bound=bound, eps_rel=1e-9, max_iters=500,
                               deadline=float("inf"))
    assert out.converged
    assert max(bounds) <= out.objective + 1e-9 * abs(out.objective)



def test_exact_root_of_piecewise_linear_clique_sums():
    """With absolute rows only the clique sums are step functions: the root found by sorting
    the breakpoints reaches the target (and the sum just below it does not), and the bound at
    it is at least the bound at bisection's multiplier."""
    from cvxdp.solvers.local import tau as local_tau
    from cvxdp.solvers.local.admm import _orthogonal
    rng = np.random.default_rng(5)
    G = RegionGraph([3, 2, 4, 2], [(0, 1), (1, 2), (0, 2), (2, 3)])
    for _ in range(20):
        y = rng.laplace(4.0, 3.0, G.n)
        terms = [LossTerm("l1", slice(int(a), int(b)), y[a:b], rng.uniform(0.5, 2.0, int(b - a)))
                 for a, b in zip(G.offsets[:-1], G.offsets[1:])]
        N = float(rng.uniform(5.0, 100.0))
        p = LocalProblem(G, MarginalLoss(terms, G.n), N)
        g = _orthogonal(p, rng.normal(0.0, 1.0, G.n))
        t = local_tau.tau_root(p, g, N, N)
        c = p.cells
        sums = np.add.reduceat(c.argmin(c.A, c.C - g + local_tau.per_cell(p, t + 1e-9), N),
                               G.offsets[:-1])
        below = np.add.reduceat(c.argmin(c.A, c.C - g + local_tau.per_cell(p, t - 1e-9), N),
                                G.offsets[:-1])
        assert np.all(sums >= N * (1 - 1e-12)) and np.all(below <= N * (1 + 1e-12))
        bis = local_tau.tau_bisect(p, g, N, N)
        value = [float(np.sum(c.cell_values(x) + (g - local_tau.per_cell(p, tau)) * x))
                 + N * float(tau.sum())
                 for tau in (t, bis)
                 for x in [c.argmin(c.A, c.C - g + local_tau.per_cell(p, tau), N)]]
        assert value[0] >= value[1] - 1e-9 * max(1.0, abs(value[1]))


@pytest.mark.parametrize("N", [70.0, 69.9, 70.2])
def test_root_next_to_a_plateau_of_elastic_net_sums(N):
    """Elastic-net cells hold at their kink ``b`` over an interval of ``tau``, so the clique
    sum has a plateau at ``sum b`` (70.097 here).  The safeguarded Newton counted those cells'
    slope and stalled on the plateau short of a target just off it (stress kind
    ``local_mixed``: the bound stayed below the optimum for 10,000 iterations); the root must
    reach the target and the bound equal Clarabel's optimum."""
    import cvxpy as cp

    import cvxdp

    dom = cvxdp.Domain({"a0": 2})
    x = cp.Variable(2)
    r = 0.52497272 * (x - np.array([0.15817694, 69.93914582]))
    prob = cp.Problem(cp.Minimize(0.9 * cp.norm1(r) + 0.1 * cp.sum_squares(r)),
                      [cvxdp.LocalPolytope({("a0",): x}, dom, total=N)])
    prob.solve(method="cvxdp", solver=cvxdp.ADMM, eps_rel=1e-8, max_iters=300)
    assert prob.status == cp.OPTIMAL
    ours, bound = prob.value, prob.solver_stats.extra_stats["lower_bound"]
    ref = prob.solve(solver=cp.CLARABEL, tol_gap_abs=1e-12, tol_gap_rel=1e-12, tol_feas=1e-12)
    assert bound <= ref + 1e-9 and ours == pytest.approx(ref, rel=1e-7, abs=1e-9)


@pytest.mark.parametrize("seed", range(6))
def test_weighted_kinks_take_the_best_subgradient(seed):
    """Weighted absolute rows (``cp.multiply(w, mu - y)``, read as one-entry matrix rows)
    beside squared ones: at a cell on its kink the written multiplier takes the subgradient
    that the step's dual asks for, not ``sign(0) = 0``, so the duals certify."""
    inst = make(100 + seed, [2, 3, 2], [(0, 1), (1, 2), (0, 2), (0, 1, 2)], loss="mixed",
                noise=2.0)
    check(inst, unique=False)
    assert inst.prob.solver_stats.extra_stats["info"]["duals_certified"]


@pytest.mark.parametrize("seed", range(6))
def test_free_total_duals_have_a_bounded_lagrangian(seed):
    """A free total: the gradient of a point certified to 1e-10 leaves a slope of about
    -1e-7 along the cone, which would make the written multipliers' Lagrangian unbounded;
    it is levelled on a clique under squared rows and the duals certify."""
    inst = make(200 + seed, [2, 3, 2, 2], [(0, 1), (1, 2), (2, 3), (0, 3)], loss="l2",
                total=None, noise=2.0)
    check(inst, unique=False)
    assert inst.prob.solver_stats.extra_stats["info"]["duals_certified"]


@pytest.mark.parametrize("seed", range(8))
def test_proximal_points_pursued_until_the_multipliers_certify(seed):
    """Squared rows with an unmeasured clique: a proximal point's gradient pairs with its own
    proximal problem's multiplier, so the certified gap (1e-12) left the linearised bound
    ~1e-6 short; the steps go on until the multipliers certify."""
    inst = make(300 + seed, [2, 3, 2], [(0, 1), (1, 2), (0, 2), (0, 1, 2)], loss="l2",
                noise=2.0, unmeasured=(3,))
    check(inst, unique=False)
    info = inst.prob.solver_stats.extra_stats["info"]
    assert info["route"] == "proximal dual Newton" and info["duals_certified"]


@pytest.mark.parametrize("seed", range(8))
def test_free_total_levelled_through_absolute_rows(seed):
    """A free total under absolute rows only: the cone slope is raised through the duals of
    one-cell absolute rows with room in ``[-w, w]`` (no squared row to shift)."""
    inst = make(400 + seed, [2, 3, 2, 2], [(0, 1), (1, 2), (2, 3), (0, 3)], loss="l1",
                total=None, noise=2.0)
    check(inst, unique=False)
    assert inst.prob.solver_stats.extra_stats["info"]["duals_certified"]

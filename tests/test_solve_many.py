"""``cvxdp.solve_many``: a list of problems, one parametrised problem, a builder; in this
process and on a real ``distributed.LocalCluster`` (one per module), with the same bits."""
from __future__ import annotations

import pickle

import numpy as np
import pytest
import scipy.sparse as sp
import cvxpy as cp

import cvxdp
from cvxdp.estimates import many as many_mod


# ---------------------------------------------------------------------- instances
def tree_problem(seed, n=16, infeasible=False):
    rng = np.random.default_rng(seed)
    tree = cvxdp.workloads.hierarchy(n_leaves=n, branching=2)
    y = cvxdp.mechanisms.laplace(tree.queries, rng.poisson(3, n), epsilon=1.0, rng=seed)
    x = cp.Variable(tree.n_nodes, name="x")
    cons = [cvxdp.consistent(tree, x), x >= 0, cvxdp.ordered(x[:3])]
    if infeasible:
        cons.append(x[0] == -3)
    return cp.Problem(cp.Minimize(cvxdp.nll(y, x)), cons)


def template(n=32, seed=0):
    rng = np.random.default_rng(seed)
    tree = cvxdp.workloads.hierarchy(n_leaves=n, branching=2)
    truth = tree.queries @ rng.poisson(3, n)
    y = cp.Parameter(tree.n_nodes, name="y")
    w = cp.Parameter(nonneg=True, name="w", value=1.0)
    x = cp.Variable(tree.n_nodes, name="x")
    prob = cp.Problem(cp.Minimize(w * cp.norm1(x - y)), [cvxdp.consistent(tree, x), x >= 0])
    draws = [truth + rng.laplace(0, 2, truth.size) for _ in range(6)]
    return prob, x, y, w, draws


def local_model(seed=1, total=30.0):
    rng = np.random.default_rng(seed)
    dom = cvxdp.Domain({"a": 2, "b": 3, "c": 2})
    cl = [("a", "b"), ("b", "c")]
    mus = {c: cp.Variable(dom.shape(c)) for c in cl}
    ms = {c: cvxdp.Measurement(sp.identity(dom.size(c)), rng.random(dom.size(c)) * 10,
                               "gaussian", 1.0) for c in cl}
    obj = sum(cvxdp.nll(ms[c], cp.vec(mus[c], order="C")) for c in cl)
    return cp.Problem(cp.Minimize(obj), [cvxdp.LocalPolytope(mus, dom, total=total)])


def marginal_model(seed=2):
    rng = np.random.default_rng(seed)
    dom = cvxdp.Domain({"a": 2, "b": 3, "c": 2})
    cl = [("a", "b"), ("b", "c")]
    mus = {c: cp.Variable(dom.size(c)) for c in cl}
    ms = {c: cvxdp.Measurement(sp.identity(dom.size(c)), rng.random(dom.size(c)) * 10,
                               "laplace", 1.0) for c in cl}
    obj = sum(cvxdp.nll(ms[c], mus[c]) for c in cl)
    return cp.Problem(cp.Minimize(obj), [cvxdp.MarginalPolytope(mus, dom, total=30.0)])


def histogram_model(seed=3, k=3):
    rng = np.random.default_rng(seed)
    geo = cvxdp.workloads.geography(np.array([-1, 0, 0, 1, 1, 2, 2]))
    Y = geo.aggregate(rng.poisson(2.0, (geo.leaves.size, k)).astype(float))
    Y = Y + rng.normal(0, 1, Y.shape)
    X = cp.Variable((geo.n_nodes, k))
    return cp.Problem(cp.Minimize(cp.sum_squares(X - Y)),
                      [cvxdp.HierarchicalHistogram(geo, X), X >= 0])


def mixed():
    """A list of cvxdp models (every kind that ships) and standard-solver problems."""
    return [tree_problem(0), tree_problem(1, infeasible=True), local_model(),
            marginal_model(), histogram_model(), tree_problem(2)]


SOLVERS = [cvxdp.ADMM, cvxdp.ADMM, cvxdp.ADMM, cvxdp.MIRROR_DESCENT, cvxdp.ADMM, cvxdp.ADMM]


def copy(problem):
    return pickle.loads(pickle.dumps(problem))


def state(problem):
    """What a solve leaves in a problem (not the iteration count: the general ADMM's pursuit
    of exact multipliers after convergence is bounded by time, so the count may vary from run
    to run while the point, the value and the duals do not)."""
    return (problem.status, problem.value,
            [None if v.value is None else np.array(v.value) for v in problem.variables()],
            [None if c.dual_value is None else np.array(c.dual_value, dtype=object)
             for c in problem.constraints],
            problem.solver_stats.solver_name)


def same_state(a, b):
    assert a[0] == b[0] and a[1] == b[1] and a[4:] == b[4:]
    for u, v in zip(a[2], b[2]):
        assert (u is None and v is None) or np.array_equal(u, v)
    for u, v in zip(a[3], b[3]):
        assert (u is None) == (v is None)
        if u is not None:
            assert all(np.array_equal(np.asarray(p, dtype=float), np.asarray(q, dtype=float))
                       for p, q in zip(np.atleast_1d(u), np.atleast_1d(v)))


def same_results(r1, r2):
    assert len(r1) == len(r2)
    for a, b in zip(r1, r2):
        assert (a.index, a.status, a.value) == (b.index, b.status, b.value)
        assert a.variables.keys() == b.variables.keys()
        assert all(np.array_equal(a.variables[k], b.variables[k]) for k in a.variables)


# ---------------------------------------------------------------------- in this process
def test_a_list_is_solved_in_order_and_written_back_like_an_in_process_solve():
    problems = [tree_problem(0), tree_problem(1, infeasible=True), tree_problem(2),
                cp.Problem(cp.Minimize(cp.sum_squares(cp.Variable(2, name="z") - 1)))]
    by_hand = [copy(p) for p in problems]
    for p in by_hand[:3]:
        p.solve(method="cvxdp", solver=cvxdp.ADMM)
    res = cvxdp.solve_many(iter(problems[:3]), solver=cvxdp.ADMM, chunk_size=2)
    assert res.backend == "local" and res.workers == 1 and res.chunks == 2
    assert res.statuses == ["optimal", "infeasible", "optimal"] and res.failures == []
    assert [o.index for o in res] == [0, 1, 2]
    for p, q, o in zip(problems[:3], by_hand, res):
        same_state(state(p), state(q))                      # written back
        assert o.value == q.value and o.solver_name == "CVXDP_ADMM"
        assert o.iterations == p.solver_stats.num_iters and o.attempts == 1 and o.error is None
        assert o.extra_stats["objective"] == q.solver_stats.extra_stats["objective"]
    x = problems[0].variables()[0]
    assert np.array_equal(res[0].value_of(x), x.value)
    assert np.array_equal(res[0].value_of("x"), x.value) and res[1].value_of(x) is None
    assert res.task_bytes > 1000 and "per task" in repr(res) and "infeasible 1" in repr(res)
    np.testing.assert_array_equal(res.values[[0, 2]], [by_hand[0].value, by_hand[2].value])
    assert res.values[1] == np.inf
    with pytest.raises(KeyError, match="no variable 'nope'"):
        res[0].value_of("nope")
    # a standard solver, through the same path
    res = cvxdp.solve_many(problems[3:], solver=cp.CLARABEL)
    assert res[0].status == "optimal" and problems[3].status == "optimal"
    np.testing.assert_allclose(problems[3].variables()[0].value, [1, 1], atol=1e-6)


def test_cvxdp_models_survive_the_copy_into_a_task():
    problems = mixed()
    by_hand = [copy(p) for p in problems]
    res = cvxdp.solve_many(problems[2:5], solver=None, chunk_size=1)
    for p, q, s in zip(problems[2:5], by_hand[2:5], SOLVERS[2:5]):
        q.solve(method="cvxdp", solver=None)
        same_state(state(p), state(q))
    assert res.statuses == ["optimal"] * 3


def test_a_parametrised_problem_is_solved_per_dict_and_left_as_it_was():
    prob, x, y, w, draws = template()
    params = [{y: d} for d in draws[:4]] + [{"y": draws[4], "w": 2.0}, {y: draws[5], w: 0.5}]
    res = cvxdp.solve_many(prob, parameters=params, solver=cvxdp.ADMM, chunk_size=4)
    assert res.statuses == ["optimal"] * 6 and res.chunks == 2
    # left as it was
    assert prob.status is None and x.value is None and y.value is None and w.value == 1.0
    # each draw as a fresh solve of the problem with that draw
    for o, d in zip(res, params):
        q = copy(prob)
        qp = {p.name(): p for p in q.parameters()}
        for k, v in d.items():
            qp[k if isinstance(k, str) else k.name()].value = v
        q.solve(method="cvxdp", solver=cvxdp.ADMM)
        assert o.status == q.status and o.value == q.value
        assert np.array_equal(o.value_of(x), q.variables()[0].value)
    assert res.stack(x).shape == (6, x.size)
    # the chunking does not change a bit: every task starts from the shipped state
    same_results(res, cvxdp.solve_many(prob, parameters=params, solver=cvxdp.ADMM, chunk_size=1))
    same_results(res, cvxdp.solve_many(prob, parameters=params, solver=cvxdp.ADMM,
                                       chunk_size=6, warm_start=True))


def test_a_builder_failure_is_retried_then_reported():
    calls = []

    def build(v):
        calls.append(v)
        if v == 3 or (v == 1 and calls.count(1) == 1):
            raise RuntimeError(f"no data for {v}")
        z = cp.Variable(2, name="z")
        return cp.Problem(cp.Minimize(cp.sum_squares(z - v)), [z >= 0])

    res = cvxdp.solve_many(build, parameters=range(5), solver=cp.CLARABEL, retries=2)
    assert res.failures == [3] and res.statuses.count("optimal") == 4
    assert res[3].status == "error" and res[3].attempts == 3 and "no data for 3" in res[3].error
    assert res[3].value is None and res[3].variables == {} and res[3].value_of("z") is None
    assert res[1].status == "optimal" and res[1].attempts == 2        # failed once, then solved
    np.testing.assert_allclose(res[4].value_of("z"), [4, 4], atol=1e-6)
    assert np.isnan(res.stack("z")[3]).all() and np.isnan(res.values[3])
    with pytest.raises(cvxdp.SolveManyError, match=r"(?s)indices 3\b.*no data for 3") as info:
        res.raise_on_error()
    assert info.value.failures == [3]
    ok = cvxdp.solve_many(build, parameters=[0, 2], solver=cp.CLARABEL)
    assert ok.raise_on_error() is ok
    bad = cvxdp.solve_many(lambda v: "not a problem", parameters=[0], retries=0)
    assert bad[0].status == "error" and "not a cvxpy Problem" in bad[0].error


def test_nothing_to_solve():
    res = cvxdp.solve_many([])
    assert len(res) == 0 and res.failures == [] and res.stack("x").shape[0] == 0


@pytest.mark.parametrize("kwargs, err, match", [
    (dict(solver=cvxdp.ADMM, eps_rel=-1.0), ValueError, "eps_rel"),
    (dict(solver=cvxdp.ADMM, bogus=1), ValueError, "bogus"),
    (dict(solver=None, bogus=1), ValueError, "bogus"),
    (dict(solver=cp.CLARABEL, bogus=1), TypeError, "bogus"),
    (dict(solver="NO_SUCH_SOLVER"), ValueError, "NO_SUCH_SOLVER"),
    (dict(solver=cvxdp.ADMM, gp=True), ValueError, "gp"),
    (dict(solver=cvxdp.ADMM, duals="no"), ValueError, "duals"),
    (dict(solver=cp.CLARABEL, duals=1), ValueError, "duals"),
    (dict(method="cvxdp"), TypeError, "method"),
    (dict(backend="spark"), ValueError, "backend"),
    (dict(retries=-1), ValueError, "retries"),
    (dict(chunk_size=0), ValueError, "chunk_size"),
    (dict(workers=0), ValueError, "workers"),
])
def test_bad_options_raise_before_any_work(kwargs, err, match):
    built = []
    with pytest.raises(err, match=match):
        cvxdp.solve_many(lambda v: built.append(v), parameters=[1, 2], **kwargs)
    assert built == []


def test_duals_false_reaches_every_solver():
    probs = [tree_problem(s) for s in range(2)]
    for solver in (cvxdp.ADMM, cp.CLARABEL):
        res = cvxdp.solve_many([copy(p) for p in probs], solver=solver, duals=False)
        assert [o.status for o in res] == [cp.OPTIMAL] * 2
        assert all(o._duals == {} for o in res)


def test_bad_inputs_are_refused():
    prob, x, y, w, draws = template()
    with pytest.raises(ValueError, match="needs parameters"):
        cvxdp.solve_many(prob)
    with pytest.raises(ValueError, match="not with a list"):
        cvxdp.solve_many([prob], parameters=[{}])
    with pytest.raises(ValueError, match=r"parameters\[1\]: no Parameter named 'v'"):
        cvxdp.solve_many(prob, parameters=[{y: draws[0]}, {"v": 1.0}])
    with pytest.raises(ValueError, match=r"parameters\[0\]\['y'\]"):
        cvxdp.solve_many(prob, parameters=[{y: draws[0][:3]}])
    with pytest.raises(ValueError, match=r"parameters\[0\]\['w'\]"):
        cvxdp.solve_many(prob, parameters=[{y: draws[0], w: -1.0}])
    with pytest.raises(ValueError, match=r"gives no value to \['y'\]"):
        cvxdp.solve_many(prob, parameters=[{w: 2.0}])
    with pytest.raises(ValueError, match="not a Parameter of the problem"):
        cvxdp.solve_many(prob, parameters=[{cp.Parameter(name="q"): 1.0}])
    with pytest.raises(TypeError, match=r"problems\[1\]"):
        cvxdp.solve_many([prob, "prob"])
    assert y.value is None and w.value == 1.0                   # restored after the checks


def test_dask_asked_for_without_dask(monkeypatch):
    monkeypatch.setattr(many_mod, "dask_available", lambda: False)
    with pytest.raises(ImportError, match=r"pip install cvxdp\[distributed\]"):
        cvxdp.solve_many([tree_problem(0)], workers=2)
    with pytest.raises(ImportError, match=r"pip install cvxdp\[distributed\]"):
        cvxdp.solve_many([tree_problem(0)], backend="dask")
    assert cvxdp.solve_many([tree_problem(0)], backend="auto").backend == "local"


def test_progress_bar_and_callback(capsys):
    prob, x, y, w, draws = template()
    cvxdp.solve_many(prob, parameters=[{y: d} for d in draws], progress=True, solver=cvxdp.ADMM)
    err = capsys.readouterr().err
    assert "solve_many: [" in err and "6/6" in err and err.endswith("\n")
    ticks = []
    cvxdp.solve_many(prob, parameters=[{y: d} for d in draws[:3]], solver=cvxdp.ADMM,
                     progress=lambda done, total: ticks.append((done, total)))
    assert ticks == [(1, 3), (2, 3), (3, 3)]


# ---------------------------------------------------------------------- on Dask
def test_dask_gives_the_same_bits_and_writes_back(client, capsys):
    problems = mixed() + [cp.Problem(cp.Minimize(cp.sum_squares(cp.Variable(3) - 2)),
                                     [cp.sum(cp.Variable(3)) >= 1])]
    by_hand = [copy(p) for p in problems]
    for q in by_hand:
        q.solve(method="cvxdp", solver=None, fallback=cp.CLARABEL)
    res = cvxdp.solve_many(problems, client=client, chunk_size=2, progress=True,
                           fallback=cp.CLARABEL)
    assert res.backend == "dask" and res.workers == 2 and res.task_bytes > 0
    assert res.statuses == [q.status for q in by_hand] and "infeasible" in res.statuses
    assert {o.solver_name for o in res} >= {"CVXDP_ADMM", "CLARABEL"}
    for p, q, o in zip(problems, by_hand, res):
        assert o.value == q.value
        same_state(state(p), state(q))
    assert "solve_many: [" in capsys.readouterr().err
    assert client.status == "running"                       # a caller's client stays open


def test_dask_parametrised_and_builder_match_this_process(client):
    prob, x, y, w, draws = template()
    params = [{y: d} for d in draws]
    here = cvxdp.solve_many(prob, parameters=params, solver=cvxdp.ADMM)
    there = cvxdp.solve_many(prob, parameters=params, solver=cvxdp.ADMM, client=client)
    assert there.backend == "dask" and (there.chunks, here.chunks) == (6, 3)
    same_results(here, there)
    assert prob.status is None and y.value is None

    def build(v):
        if v == 2:
            raise ValueError("bad draw")
        z = cp.Variable(4, name="z")
        return cp.Problem(cp.Minimize(cp.norm1(z - v)), [z >= 1])

    a = cvxdp.solve_many(build, parameters=range(4), solver=cvxdp.ADMM, retries=1)
    b = cvxdp.solve_many(build, parameters=range(4), solver=cvxdp.ADMM, retries=1,
                         scheduler=client.scheduler.address)      # a client of its own
    assert b.backend == "dask" and client.status == "running"
    same_results(a, b)
    assert b.failures == [2] and b[2].attempts == 2 and "bad draw" in b[2].error


def test_a_pickled_hierarchy_ships_its_layout_and_rebuilds_the_same_matrices():
    tree = cvxdp.workloads.hierarchy(n_leaves=100, branching=3)
    v = np.random.default_rng(0).normal(size=tree.n_nodes)
    built = (tree.queries, tree.consistency, tree.forest, tree.project(v))
    blob = pickle.dumps(tree)
    assert "queries" in vars(tree) and len(blob) < len(pickle.dumps(built[:2]))
    again = pickle.loads(blob)
    assert (again.queries != built[0]).nnz == 0 and (again.consistency != built[1]).nnz == 0
    assert np.array_equal(again.forest.parent, built[2].parent)
    assert np.array_equal(again.project(v), built[3])


def test_a_problem_that_does_not_pickle_is_named():
    x = cp.Variable(2)
    x.note = lambda: None                   # a lambda does not pickle
    good = tree_problem(0)
    with pytest.raises(TypeError, match=r"problems\[1\] cannot be pickled"):
        cvxdp.solve_many([good, cp.Problem(cp.Minimize(cp.sum_squares(x)))], chunk_size=2)
    assert good.status is None                              # nothing solved

"""cvxdp.synth: cvxdp as the estimator of mbi-based synthesizers (the ``cvxdp[mbi]`` extra).

Run with the real packages by ``.ci/extras`` (``pip install -e ".[test,mbi]"``: mbi 1.x and
OpenDP; and mbi 2.x without OpenDP); in the default environment everything that needs mbi is
skipped and only the import guards are checked.
"""
from __future__ import annotations

import dataclasses
import importlib
import io
import itertools
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest
import cvxpy as cp

import cvxdp
import cvxdp.synth as public
from cvxdp.estimates import synth

SOLVE = dict(eps_rel=1e-10)            # both sides solved tightly, so the optimum is compared

# CI names the packages it installed (CVXDP_REQUIRE_EXTRAS=mbi,opendp,...): there a missing one
# fails the test instead of skipping it
REQUIRED = {m.strip() for m in os.environ.get("CVXDP_REQUIRE_EXTRAS", "").split(",") if m.strip()}


def _need(name: str):
    if name.split(".")[0] in REQUIRED:
        return importlib.import_module(name)
    return pytest.importorskip(name)


@pytest.fixture
def mbi():
    return _need("mbi")


# ------------------------------------------------------------------ without mbi
def test_import_cvxdp_needs_neither_mbi_nor_opendp():
    # (not jax: cvxpy itself imports jax when it is installed)
    code = ("import sys, cvxdp, cvxdp.synth; "
            "bad = [m for m in ('mbi', 'opendp') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_missing_mbi_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "mbi", None)         # import mbi -> ImportError
    with pytest.raises(ImportError, match=r"cvxdp\[mbi\]"):
        synth.estimate(None, [])
    with pytest.raises(ImportError, match=r"cvxdp\[mbi\]"):
        public.CvxdpEstimator
    with pytest.raises(ImportError, match=r"cvxdp\[mbi\]"):
        public.CvxdpMarkovRandomField


def test_options_are_checked_when_the_estimator_is_made():
    """A misspelt or out-of-range option fails in estimator() / with_cvxdp(), before any
    release spends budget (no mbi needed)."""
    with pytest.raises(ValueError, match=r"unknown option.*'eps_rell'.*known options.*eps_rel"):
        synth.estimator(eps_rell=1e-6)
    with pytest.raises(ValueError, match="eps_rel"):
        synth.estimator(eps_rel=-1.0)
    with pytest.raises(ValueError, match="norm"):
        synth.estimator(norm="linf")
    with pytest.raises(ValueError, match="polytope"):
        synth.estimator(polytope="global")
    with pytest.raises(ValueError, match="solver"):
        synth.estimator(solver="NO_SUCH_SOLVER")
    with pytest.raises(ValueError, match=r"solve_options.*'rhoo'"):
        synth.estimator(solve_options={"rhoo": 1.0})
    with pytest.raises(ValueError, match="algorithm"):
        synth.estimator(solver=cvxdp.MIRROR_DESCENT, solve_options={"algorithm": "newton"})
    with pytest.raises(ValueError, match="known_total"):
        synth.estimator(known_total=-3)
    with pytest.raises(ValueError, match="callback_fn"):
        synth.estimator(callback_fn=3)
    est = synth.estimator(eps_rel=1e-8, solve_options={"check_every": 5}, iters=10)
    assert est.keywords == {"eps_rel": 1e-8, "solve_options": {"check_every": 5}, "iters": 10}

    @dataclasses.dataclass(frozen=True)
    class Algorithm:                                 # the shape of OpenDP's AIM / MST
        estimator: object = None
        rounds: int = 3

    with pytest.raises(ValueError, match="eps_rell"):
        synth.with_cvxdp(Algorithm(), eps_rell=1e-6)
    alg = synth.with_cvxdp(Algorithm(rounds=7), eps_rel=1e-7)
    assert alg.rounds == 7 and alg.estimator.keywords == {"eps_rel": 1e-7}


# ------------------------------------------------------------------ helpers
def _instance(mbi, seed: int, extra_edges: int = 1):
    """A random domain (3-5 attributes of sizes 2-4), a correlated data set, and Gaussian
    measurements of every 1-way marginal and of a spanning tree plus ``extra_edges`` 2-way
    marginals (noise scales differ per measurement)."""
    rng = np.random.default_rng(seed)
    d = int(rng.integers(3, 6))
    sizes = rng.integers(2, 5, d)
    names = [f"x{i}" for i in range(d)]
    dom = mbi.Domain(names, [int(s) for s in sizes])
    n = int(rng.integers(150, 400))
    cols = [rng.integers(0, sizes[0], n)]
    for i in range(1, d):
        parent = cols[int(rng.integers(0, i))]
        noise = rng.integers(0, sizes[i], n)
        cols.append(np.where(rng.random(n) < 0.6, parent % sizes[i], noise))
    data = np.column_stack(cols)
    edges = [tuple(sorted((names[int(rng.integers(0, i))], names[i]))) for i in range(1, d)]
    pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1:] if (a, b) not in edges]
    rng.shuffle(pairs)
    cliques = [(a,) for a in names] + edges + [tuple(p) for p in pairs[:extra_edges]]
    ms = []
    for cl in cliques:
        idx = [names.index(a) for a in cl]
        shape = tuple(int(sizes[i]) for i in idx)
        x = np.bincount(np.ravel_multi_index(tuple(data[:, idx].T), shape),
                        minlength=int(np.prod(shape))).astype(float)
        sigma = float(rng.uniform(0.5, 3.0))
        ms.append(mbi.LinearMeasurement(x + rng.normal(0, sigma, x.size), cl, stddev=sigma))
    return dom, ms


def _mbi_fit(mbi, dom, ms, iters: int):
    """mbi's own default estimator (mirror descent with its default total estimate)."""
    est = mbi.estimation
    if hasattr(est, "mirror_descent"):                  # mbi 1.x
        return est.mirror_descent(dom, ms, iters=iters)
    return est.MirrorDescent().estimate(dom, ms, iters=iters)   # mbi 2.x


def _loss(model, ms) -> float:
    """mbi's L2 loss sum 0.5 ||(Q mu - y) / sigma||^2 of a model, in float64."""
    out = 0.0
    for m in ms:
        mu = m.query(model.project(m.clique))
        r = (np.asarray(mu, dtype=float) - np.asarray(m.noisy_measurement, dtype=float)) / m.stddev
        out += 0.5 * float(r @ r)
    return out


def _cvxdp_reference(dom, ms, total=None):
    """The same estimate written directly with cvxdp: one marginal variable per measured clique
    (shaped like the clique), the Gaussian nll of cvxdp.Measurement, the marginal polytope."""
    names = list(dom.attributes)
    cdom = cvxdp.Domain({a: int(dom.config[a]) for a in names})
    cliques = list(dict.fromkeys(tuple(m.clique) for m in ms))
    x = {cl: cp.Variable(cdom.shape(cl)) for cl in cliques}
    loss = 0
    for m in ms:
        n = int(np.prod(cdom.shape(m.clique)))
        meas = cvxdp.Measurement(np.eye(n), np.asarray(m.noisy_measurement, dtype=float),
                                 "gaussian", float(m.stddev))
        loss = loss + cvxdp.nll(meas, x[tuple(m.clique)])
    con = cvxdp.MarginalPolytope(x, cdom, total)
    prob = cp.Problem(cp.Minimize(loss), [con])
    prob.solve(method="cvxdp", solver=cvxdp.MIRROR_DESCENT, **SOLVE)
    assert prob.status == "optimal", prob.status
    return con.model, prob.value


def _rel(a, b) -> float:
    a, b = np.asarray(a, dtype=float).ravel(), np.asarray(b, dtype=float).ravel()
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def _tol(mbi) -> float:
    """1e-6 relative; mbi 2.x runs jax in float32 unless the user enables x64."""
    import jax
    return 1e-6 if jax.config.jax_enable_x64 else 1e-5


# ------------------------------------------------------------------ the estimator
@pytest.mark.parametrize("seed", range(5))
def test_estimate_matches_cvxdp_and_beats_mbi(mbi, seed):
    dom, ms = _instance(mbi, seed, extra_edges=seed % 3)
    model = synth.estimate(dom, ms, **SOLVE)
    assert isinstance(model, mbi.MarkovRandomField)

    ref, ref_value = _cvxdp_reference(dom, ms)
    tol = _tol(mbi)
    names = list(dom.attributes)
    # measured marginals, and pairs never measured (these go through the potentials)
    pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1:]]
    for cl in list(dict.fromkeys(tuple(m.clique) for m in ms)) + pairs:
        got = np.asarray(model.project(cl).datavector(flatten=False))
        assert got.shape == tuple(int(dom.config[a]) for a in cl)
        assert _rel(got, ref.marginal(list(cl))) <= tol, cl
    assert abs(float(model.total) - ref.total) <= tol * ref.total
    ours = _loss(model, ms)
    assert abs(ours - ref_value) <= tol * max(1.0, ref_value)

    theirs = _loss(_mbi_fit(mbi, dom, ms, iters=3000), ms)
    assert ours <= theirs + 1e-6 * max(1.0, theirs), (ours, theirs)


def test_known_total_is_kept(mbi):
    dom, ms = _instance(mbi, 7)
    model = synth.estimate(dom, ms, known_total=321.0, **SOLVE)
    ref, _ = _cvxdp_reference(dom, ms, total=321.0)
    assert float(model.total) == pytest.approx(321.0)
    for m in ms:
        assert _rel(model.project(m.clique).datavector(flatten=False), ref.marginal(list(m.clique))) <= _tol(mbi)


def test_cycle_needs_fill_in_and_synthetic_data_follows_the_model(mbi):
    """A 4-cycle of pairs is not chordal: the model lives on the triangulation's cliques."""
    rng = np.random.default_rng(3)
    dom = mbi.Domain(["a", "b", "c", "d"], [3, 2, 4, 2])
    ms = []
    for cl in [("a", "b"), ("b", "c"), ("c", "d"), ("a", "d")]:
        n = int(np.prod([dom.config[a] for a in cl]))
        ms.append(mbi.LinearMeasurement(rng.uniform(5, 30, n), cl, stddev=1.5))
    model = synth.estimate(dom, ms, **SOLVE)
    ref, _ = _cvxdp_reference(dom, ms)
    assert len(model.cliques) == 2 and all(len(c) == 3 for c in model.cliques)
    for cl in [("a", "b"), ("a", "c"), ("b", "d"), ("a", "b", "c", "d")]:
        assert _rel(model.project(cl).datavector(flatten=False), ref.marginal(list(cl))) <= _tol(mbi)
    np.random.seed(0)
    rows = model.synthetic_data(rows=5000).to_dict()
    assert sorted(rows) == ["a", "b", "c", "d"] and all(len(v) == 5000 for v in rows.values())
    counts = np.zeros((3, 2))
    np.add.at(counts, (rows["a"], rows["b"]), 1)
    want = np.asarray(model.project(("a", "b")).datavector(flatten=False), dtype=float)
    assert np.abs(counts / 5000 - want / want.sum()).max() < 0.03


@pytest.mark.parametrize("seed", [0, 3])
def test_model_answers_like_mbi_inference(mbi, seed):
    """The returned model answers ``project`` with cvxdp's numpy inference: the same numbers as
    mbi's own variable elimination / clique marginals on the same model, for measured,
    unmeasured and all-attribute sets and the zero-way total; a plain copy answers through mbi."""
    import dataclasses
    import itertools
    dom, ms = _instance(mbi, seed, extra_edges=2)
    model = synth.estimate(dom, ms, **SOLVE)
    assert isinstance(model, mbi.MarkovRandomField)
    plain = mbi.MarkovRandomField(potentials=model.potentials, marginals=model.marginals,
                                  total=model.total)
    names = list(dom.attributes)
    sets = [()] + [c for r in (1, 2, 3) for c in itertools.combinations(names, r)] + [tuple(names[::-1])]
    for cl in sets:
        ours = np.asarray(model.project(cl).datavector(flatten=False), dtype=float)
        theirs = np.asarray(plain.project(cl).datavector(flatten=False), dtype=float)
        assert ours.shape == theirs.shape
        assert np.abs(ours - theirs).max() <= 1e-5 * max(1.0, float(model.total)), cl
    copy = dataclasses.replace(model)
    np.testing.assert_allclose(np.asarray(copy.project(names[:2]).datavector()),
                               np.asarray(model.project(names[:2]).datavector()), atol=1e-5 * model.total)


def test_total_prefix_and_l1_measurements(mbi):
    """OpenDP's shapes: a zero-way total and a query that drops cells; the L1 (Laplace) loss."""
    rng = np.random.default_rng(5)
    dom = mbi.Domain(["a", "b", "c"], [3, 4, 2])

    def prefix(f):                                     # the first cells of a marginal
        return f.datavector()[:3]

    ms = [mbi.LinearMeasurement(np.array([100.0]), (), stddev=2.0),
          mbi.LinearMeasurement(rng.uniform(10, 30, 3), ("b",), stddev=1.0, query=prefix),
          mbi.LinearMeasurement(rng.uniform(5, 15, 6), ("a", "c"), stddev=1.0),
          mbi.LinearMeasurement(rng.uniform(5, 15, 8), ("c", "b"), stddev=1.0)]
    model = synth.estimate(dom, ms, **SOLVE)
    # reference: the same problem over explicit variables, Clarabel on the local polytope
    cdom = cvxdp.Domain({"a": 3, "b": 4, "c": 2})
    x = {("a", "c"): cp.Variable(6), ("c", "b"): cp.Variable(8)}
    Pb = np.kron(np.ones((1, 2)), np.eye(4))[:3]       # (c, b) -> first 3 cells of b
    obj = (cp.sum_squares(cp.sum(x[("a", "c")]) - 100.0) / 8.0
           + cp.sum_squares(Pb @ x[("c", "b")] - ms[1].noisy_measurement) / 2.0
           + cp.sum_squares(x[("a", "c")] - ms[2].noisy_measurement) / 2.0
           + cp.sum_squares(x[("c", "b")] - ms[3].noisy_measurement) / 2.0)
    prob = cp.Problem(cp.Minimize(obj), [cvxdp.MarginalPolytope(x, cdom)])
    prob.solve(solver=cp.CLARABEL)
    assert _loss(model, ms) <= prob.value + 1e-6 * prob.value
    assert _rel(model.project(("c", "b")).datavector(), x[("c", "b")].value) <= 1e-5
    l1 = synth.estimate(dom, ms, norm="l1", **SOLVE)
    l1_loss = sum(float(np.abs((np.asarray(m.query(l1.project(m.clique)), dtype=float)
                                - m.noisy_measurement) / m.stddev).sum()) for m in ms)
    obj1 = (cp.abs(cp.sum(x[("a", "c")]) - 100.0) / 2.0
            + cp.norm1(Pb @ x[("c", "b")] - ms[1].noisy_measurement)
            + cp.norm1(x[("a", "c")] - ms[2].noisy_measurement)
            + cp.norm1(x[("c", "b")] - ms[3].noisy_measurement))
    p1 = cp.Problem(cp.Minimize(obj1), [cvxdp.MarginalPolytope(x, cdom)])
    p1.solve(solver=cp.CLARABEL)
    assert l1_loss <= p1.value + 1e-5 * p1.value


def test_unmeasured_attribute_zero_total_and_a_standard_solver(mbi):
    rng = np.random.default_rng(6)
    dom = mbi.Domain(["a", "b", "c", "e"], [3, 2, 4, 3])
    ms = [mbi.LinearMeasurement(rng.uniform(5, 20, 6), ("a", "b"), stddev=1.0),
          mbi.LinearMeasurement(rng.uniform(5, 20, 8), ("b", "c"), stddev=1.0)]
    model = synth.estimate(dom, ms, **SOLVE)
    e = np.asarray(model.project(("e",)).datavector())
    assert np.allclose(e, float(model.total) / 3)           # unmeasured: uniform
    # a chain is a junction tree, so a standard solver's marginals make the same model
    other = synth.estimate(dom, ms, solver=cp.CLARABEL)
    assert _rel(other.project(("a", "c", "e")).datavector(),
                model.project(("a", "c", "e")).datavector()) <= 1e-6
    ms.append(mbi.LinearMeasurement(rng.uniform(5, 20, 12), ("a", "c"), stddev=1.0))
    # a cycle: Clarabel leaves only the marginals, and the model is fitted to them
    # (MarginalPolytope.model); on the measured cliques it answers as the cvxdp method's
    cyc_std = synth.estimate(dom, ms, solver=cp.CLARABEL)
    cyc_md = synth.estimate(dom, ms, **SOLVE)
    for c in (("a", "b"), ("b", "c"), ("a", "c")):
        assert _rel(cyc_std.project(c).datavector(), cyc_md.project(c).datavector()) <= 1e-5
    # all answers negative: the fitted total is 0, and the model is the empty table
    zero = synth.estimate(dom, [mbi.LinearMeasurement(-np.ones(6), ("a", "b"), stddev=1.0)])
    assert float(zero.total) == 0.0
    assert np.all(np.asarray(zero.project(("a", "c")).datavector()) == 0)


def test_bad_input(mbi):
    dom, ms = _instance(mbi, 0)

    def own_loss(*args):                              # a user's jax function: not readable
        return 0.0

    foreign = (mbi.MarginalLossFn([("x0",)], own_loss) if hasattr(mbi, "DatavectorQuery")
               else mbi.MarginalLossFn([("x0",)], lambda mu: 0.0))
    with pytest.raises(TypeError, match="cannot read"):
        synth.estimate(dom, foreign)
    with pytest.raises(TypeError, match="mbi.Constraint"):
        synth.estimate(dom, ms, constraints=[object()])
    with pytest.raises(TypeError, match="unexpected"):
        synth.estimate(dom, ms, stepsizee=1.0)
    with pytest.raises(ValueError, match="norm"):
        synth.estimate(dom, ms, norm="linf")
    loss_l1 = mbi.marginal_loss.from_linear_measurements(ms, domain=dom, norm="l1")
    with pytest.raises(ValueError, match="norm"):
        synth.estimate(dom, loss_l1, norm="l2")       # the loss carries its own norm
    # mbi's mirror-descent keywords are accepted (drop-in for scripts calling mirror_descent)
    model = synth.estimate(dom, ms, iters=10, callback_fn=lambda *_: None, potentials=None,
                           stepsize=0.1, tol=1e-6)
    assert isinstance(model, mbi.MarkovRandomField)


def test_too_large_for_a_junction_tree(mbi):
    dom, ms = _instance(mbi, 1)
    with pytest.raises(cvxdp.ModelTooLarge):
        synth.estimate(dom, ms, polytope="marginal", max_cells=2)


def test_local_polytope_route(mbi):
    dom, ms = _instance(mbi, 2, extra_edges=0)           # a tree: local = marginal polytope
    model = synth.estimate(dom, ms, polytope="local", **SOLVE)
    ref, _ = _cvxdp_reference(dom, ms)
    assert isinstance(model, mbi.MarkovRandomField)
    for m in ms:
        assert _rel(model.project(m.clique).datavector(flatten=False), ref.marginal(list(m.clique))) <= 1e-4


def test_estimator_class(mbi):
    """CvxdpEstimator: an mbi 2.x Estimator (with mbi 1.x a callable of its Estimator
    protocol); options are dataclass fields (replace keeps them, pickling too), checked when
    it is made."""
    est = public.CvxdpEstimator(**SOLVE)
    assert est == public.CvxdpEstimator(**SOLVE) and est.eps_rel == SOLVE["eps_rel"]
    dom, ms = _instance(mbi, 4)
    if hasattr(mbi.Estimator, "estimate"):                  # mbi 2.x
        assert isinstance(est, mbi.Estimator)
        model = est.estimate(dom, ms)
    else:
        model = est(dom, ms)
    ref, _ = _cvxdp_reference(dom, ms)
    for m in ms:
        assert _rel(model.project(m.clique).datavector(flatten=False), ref.marginal(list(m.clique))) <= _tol(mbi)
    copy = dataclasses.replace(est, norm="l1")
    assert copy.eps_rel == SOLVE["eps_rel"] and copy.norm == "l1" and copy.polytope == "auto"
    assert dataclasses.replace(public.CvxdpEstimator(eps_rel=1e-4)).eps_rel == 1e-4
    assert pickle.loads(pickle.dumps(copy)) == copy
    assert public.CvxdpEstimator(stepsize=0.01).stepsize == 0.01       # mbi's keyword, unused
    with pytest.raises(ValueError, match=r"unknown option.*'eps_rell'.*known options"):
        public.CvxdpEstimator(eps_rell=1e-4)
    with pytest.raises(ValueError, match="eps_rel"):
        public.CvxdpEstimator(eps_rel=0.0)
    with pytest.raises(ValueError, match="eps_rel"):
        dataclasses.replace(est, eps_rel="tight")


# ------------------------------------------------------------------ mbi's losses
def _full_table_reference(dom, rows, total=None, zero=None, kind="l2"):
    """The estimate over one explicit nonnegative table ``p`` (every cell a variable; small
    domains only), Clarabel: ``rows`` are ``(clique, y, sigma)`` of identity measurements
    (``kind`` "l2" / "l1") or ``(clique, t, None)`` MLE targets (``kind`` "mle"); ``zero``:
    a boolean table of forbidden cells.  Returns ``(optimal value, p)``."""
    names = list(dom.attributes)
    shape = tuple(int(dom.config[a]) for a in names)
    n = int(np.prod(shape))
    p = cp.Variable(n, nonneg=True)
    coords = np.unravel_index(np.arange(n), shape)

    def margin(cl):
        sub = tuple(int(dom.config[a]) for a in cl)
        rows_ = (np.ravel_multi_index(tuple(coords[names.index(a)] for a in cl), sub) if cl
                 else np.zeros(n, dtype=int))
        import scipy.sparse as sps
        return sps.csr_matrix((np.ones(n), (rows_, np.arange(n))), shape=(int(np.prod(sub)), n))

    obj = 0
    for cl, y, s in rows:
        r = margin(cl) @ p
        if kind == "l2":
            obj = obj + cp.sum_squares(r - y) / (2 * s ** 2)
        elif kind == "l1":
            obj = obj + cp.norm1(r - y) / s
        else:
            pos = np.flatnonzero(y > 0)
            obj = obj - y[pos] @ cp.log(r[pos])
    cons = [] if total is None else [cp.sum(p) == total]
    if zero is not None:
        cons.append(p[np.flatnonzero(np.asarray(zero).ravel())] == 0)
    prob = cp.Problem(cp.Minimize(obj), cons)
    prob.solve(solver=cp.CLARABEL)
    assert prob.status == "optimal", prob.status
    return prob.value, p.value.reshape(shape)


def _value(model, ms, norm="l2"):
    out = 0.0
    for m in ms:
        r = (np.asarray(m.query(model.project(m.clique)), dtype=float)
             - np.asarray(m.noisy_measurement, dtype=float)) / m.stddev
        out += 0.5 * float(r @ r) if norm == "l2" else float(np.abs(r).sum())
    return out


@pytest.mark.parametrize("norm", ["l2", "l1"])
def test_marginal_loss_fn_of_linear_measurements(mbi, norm):
    """The MarginalLossFn mbi builds (its README's and tests' form) is read back: the same
    estimate as the list, optimal for that loss against a full-table reference; normalised
    losses at a fixed total have the same minimiser and report the normalised value."""
    dom, ms = _instance(mbi, 8, extra_edges=1)
    loss = mbi.marginal_loss.from_linear_measurements(ms, domain=dom, norm=norm)
    got = synth.estimate(dom, loss, **SOLVE)
    same = synth.estimate(dom, ms, norm=norm, **SOLVE)
    info = dict(got.solve_info)
    assert info["loss"] == norm and info["status"] == "optimal" and not info["total_given"]
    ref_value, _ = _full_table_reference(dom, [(tuple(m.clique), m.noisy_measurement, m.stddev)
                                               for m in ms], kind=norm)
    ours = _value(got, ms, norm)
    assert abs(ours - _value(same, ms, norm)) <= 1e-6 * max(1.0, ours)
    assert ours <= ref_value + 1e-5 * max(1.0, ref_value), (ours, ref_value)
    assert abs(info["objective"] - ours) <= 1e-5 * max(1.0, ours)
    # normalised: the same minimiser at the given total, the normalised value reported
    N = float(got.total)
    normed = mbi.marginal_loss.from_linear_measurements(ms, domain=dom, norm=norm, normalize=True)
    fixed = synth.estimate(dom, normed, known_total=N, **SOLVE)
    plain = synth.estimate(dom, ms, norm=norm, known_total=N, **SOLVE)
    assert dict(fixed.solve_info)["loss"] == norm + " normalised"
    for m in ms:
        assert _rel(fixed.project(m.clique).datavector(), plain.project(m.clique).datavector()) <= 1e-4
    raw = _value(plain, ms, norm) / len(ms) / N
    want = np.sqrt(raw) if norm == "l2" else raw
    assert dict(fixed.solve_info)["objective"] == pytest.approx(want, rel=1e-5)


def _targets(mbi, dom, cliques, seed, perturb=0.0):
    rng = np.random.default_rng(seed)
    names = list(dom.attributes)
    P = rng.uniform(0.5, 3.0, tuple(int(dom.config[a]) for a in names))
    out = {}
    for cl in cliques:
        axes = tuple(i for i, a in enumerate(names) if a not in cl)
        t = P.sum(axis=axes)
        t = np.transpose(t, [sorted(cl, key=names.index).index(a) for a in cl])
        if perturb:
            t = t * rng.uniform(1 - perturb, 1 + perturb, t.shape)
        out[cl] = mbi.Factor(dom.project(cl), np.asarray(t))
    return mbi.CliqueVector(dom, list(cliques), out), P


def _mle(mbi, targets, total):
    if hasattr(mbi.marginal_loss, "mle_loss_fn"):            # mbi 2.x
        return synth.estimate(targets.domain, mbi.marginal_loss.mle_loss_fn(targets),
                              known_total=total)
    return synth.mle_from_marginals(targets, total)


def test_mle_loss_consistent_targets_are_certified(mbi):
    """mle_loss_fn / mle_from_marginals: consistent targets (a table's marginals) on a cycle;
    the estimate is the scaled targets, certified by the per-clique bound, and equals a
    full-table exponential-cone reference."""
    dom = mbi.Domain(["a", "b", "c", "d"], [2, 3, 4, 2])
    cliques = [("a", "b"), ("b", "c"), ("c", "a"), ("d",)]
    targets, P = _targets(mbi, dom, cliques, 0)
    N = 2.0 * float(P.sum())
    model = _mle(mbi, targets, N)
    info = dict(model.solve_info)
    assert info["loss"] == "mle" and info["status"] == "optimal"
    assert "consistent" in info["route"] and 0.0 <= info["gap"] <= 1e-6
    for cl in cliques:
        want = 2.0 * np.asarray(targets[cl].datavector())
        assert _rel(model.project(cl).datavector(), want) <= 1e-6
    rows = [(cl, np.asarray(targets[cl].datavector(), dtype=float), None) for cl in cliques]
    ref, _ = _full_table_reference(dom, rows, total=N, kind="mle")
    assert info["objective"] == pytest.approx(ref, rel=1e-6)


def test_mle_loss_inconsistent_targets_go_to_a_conic_solver(mbi):
    dom = mbi.Domain(["a", "b", "c"], [2, 3, 2])
    cliques = [("a", "b"), ("b", "c"), ("a", "c")]
    targets, P = _targets(mbi, dom, cliques, 1, perturb=0.4)
    N = float(P.sum())
    model = _mle(mbi, targets, N)
    info = dict(model.solve_info)
    assert info["status"] == "optimal" and info["gap"] is None
    assert "no cvxdp method solves the log loss" in info["route"] and "CLARABEL" in info["route"]
    rows = [(cl, np.asarray(targets[cl].datavector(), dtype=float), None) for cl in cliques]
    ref, _ = _full_table_reference(dom, rows, total=N, kind="mle")
    assert info["objective"] == pytest.approx(ref, rel=1e-6)
    got = -sum(float(np.asarray(targets[cl].datavector(), dtype=float)
                     @ np.log(np.asarray(model.project(cl).datavector(), dtype=float)))
               for cl in cliques)
    assert got == pytest.approx(ref, rel=1e-5)


def test_no_measurements_give_the_uniform_model(mbi):
    dom = mbi.Domain(["a", "b", "c"], [2, 3, 4])
    for loss in ([], mbi.marginal_loss.from_linear_measurements([], domain=dom)):
        model = synth.estimate(dom, loss)
        assert float(model.total) == 1.0                       # mbi's default total
        np.testing.assert_allclose(model.project(("a", "c")).datavector(), np.full(8, 1 / 8))
    model = synth.estimate(dom, [], known_total=48.0)
    np.testing.assert_allclose(model.project(("c", "b", "a")).datavector(), np.full(24, 2.0))
    assert dict(model.solve_info)["status"] == "optimal"


# ------------------------------------------------------------------ structural constraints
def _constraint_case(mbi, seed):
    """Attributes a(3) b(4) c(2) d(3) e(2); b -> c and d -> e functional dependencies, two
    (a, d) combinations forbidden; records drawn from the allowed ones; noisy measurements of
    (a, b), (c, d), (b, d) and a (e is never measured)."""
    rng = np.random.default_rng(seed)
    names = ["a", "b", "c", "d", "e"]
    sizes = [3, 4, 2, 3, 2]
    dom = mbi.Domain(names, sizes)
    bc, de = np.array([0, 1, 1, 0]), np.array([0, 1, 1])
    bad_ad = np.array([[0, 0], [2, 1]])
    cons = [mbi.Constraint(domain=dom.project(("b", "c")), mapping=bc),
            mbi.Constraint(domain=dom.project(("a", "d")), invalid=bad_ad),
            mbi.Constraint(domain=dom.project(("d", "e")), mapping=de)]
    allowed = np.ones(sizes, dtype=bool)
    for b in range(4):
        for c in range(2):
            if bc[b] != c:
                allowed[:, b, c] = False
    for a, d in bad_ad:
        allowed[a, :, :, d, :] = False
    for d in range(3):
        for e in range(2):
            if de[d] != e:
                allowed[:, :, :, d, e] = False
    cells = np.flatnonzero(allowed.ravel())
    data = np.zeros(allowed.size)
    np.add.at(data, rng.choice(cells, 300, p=rng.dirichlet(np.ones(cells.size))), 1)
    table = data.reshape(sizes)
    ms = []
    for cl in [("a", "b"), ("c", "d"), ("b", "d"), ("a",)]:
        axes = tuple(i for i, a in enumerate(names) if a not in cl)
        x = table.sum(axis=axes).ravel()
        ms.append(mbi.LinearMeasurement(x + rng.normal(0, 2.0, x.size), cl, stddev=2.0))
    return dom, ms, cons, ~allowed


@pytest.mark.parametrize("seed", [0, 1])
def test_structural_constraints(mbi, seed):
    if not hasattr(mbi, "Constraint"):
        pytest.skip("structural constraints are mbi 2.x's")
    dom, ms, cons, forbidden = _constraint_case(mbi, seed)
    model = synth.estimate(dom, ms, constraints=cons, **SOLVE)
    info = dict(model.solve_info)
    assert info["status"] == "optimal" and info["gap"] <= 1e-9
    ref_value, p = _full_table_reference(dom, [(tuple(m.clique), m.noisy_measurement, m.stddev)
                                               for m in ms], zero=forbidden)
    ours = _value(model, ms)
    assert abs(ours - ref_value) <= 1e-6 * max(1.0, ref_value), (ours, ref_value)
    names = list(dom.attributes)
    for m in ms:                                         # the measured marginals are unique
        axes = tuple(i for i, a in enumerate(names) if a not in m.clique)
        assert _rel(model.project(m.clique).datavector(), p.sum(axis=axes).ravel()) <= 1e-5
    # forbidden records have probability zero, in every view of the model
    full = np.asarray(model.project(tuple(names)).datavector(flatten=False), dtype=float)
    assert full[forbidden].max() <= 1e-9 * float(model.total)
    assert abs(full.sum() - float(model.total)) <= 1e-6 * float(model.total)
    assert model.constraints == tuple(cons)
    # e is measured nowhere and fixed by d: the folded constraint carries it
    assert not any("e" in c for c in model.cliques)
    de = np.asarray(model.project(("d", "e")).datavector(flatten=False), dtype=float)
    assert de[0, 1] <= 1e-9 and de[1, 0] <= 1e-9 and de[2, 0] <= 1e-9 and de.sum() > 0
    np.random.seed(seed)
    rows = model.synthetic_data(rows=400).to_dict()
    recs = np.column_stack([rows[a] for a in names])
    assert not forbidden[tuple(recs.T)].any()


def test_structural_constraints_without_measurements_of_them(mbi):
    """mbi's own case: a mapping between x and an unmeasured xp: the model's cliques are the
    measured ones, and the mapping holds in the model."""
    if not hasattr(mbi, "Constraint"):
        pytest.skip("structural constraints are mbi 2.x's")
    dom = mbi.Domain(["x", "xp", "y"], [4, 2, 3])
    c = mbi.Constraint(domain=dom.project(("x", "xp")), mapping=np.array([0, 0, 1, 1]))
    y = np.random.default_rng(0).uniform(1, 5, 12)
    model = synth.estimate(dom, [mbi.LinearMeasurement(y, ("x", "y"))], known_total=float(y.sum()),
                           constraints=[c], **SOLVE)
    assert set(model.cliques) == {("x", "y")}
    np.testing.assert_allclose(model.project(("x", "y")).datavector(), y, rtol=1e-6)
    xxp = np.asarray(model.project(("x", "xp")).datavector(flatten=False), dtype=float)
    assert np.all(xxp[[0, 1], 1] <= 1e-9) and np.all(xxp[[2, 3], 0] <= 1e-9)
    empty = synth.estimate(dom, [], constraints=[c])       # uniform over the allowed records
    np.testing.assert_allclose(empty.project(("x", "xp")).datavector(flatten=False),
                               np.array([[1, 0], [1, 0], [0, 1], [0, 1]]) / 4)


# ------------------------------------------------------------------ callbacks
def test_callback_gets_marginals_and_the_certified_gap(mbi):
    dom, ms = _instance(mbi, 5, extra_edges=1)
    seen, plain = [], []

    def cb(marginals, gap=None):
        seen.append((marginals, gap))

    # a given total: mirror descent's exact finish reports the returned point itself, so the
    # last call comes from cvxdp's own check (its iterate read back into mbi's cliques)
    model = synth.estimate(dom, ms, known_total=300.0, callback_fn=cb, eps_rel=1e-10,
                           solve_options={"polish_start": 40})
    assert len(seen) >= 2, "callback not called at the checks"
    cliques = {frozenset(c) for c in seen[-1][0].cliques}
    maximal = {frozenset(m.clique) for m in ms
               if not any(set(m.clique) < set(o.clique) for o in ms)}
    assert cliques == maximal
    assert all(isinstance(m, mbi.CliqueVector) and isinstance(g, float) for m, g in seen)
    assert seen[-1][1] == pytest.approx(dict(model.solve_info)["gap"], rel=1e-2, abs=1e-12)
    for c in seen[-1][0].cliques:                     # the last call: the returned estimate
        assert _rel(seen[-1][0][c].datavector(), model.project(c).datavector()) <= 1e-6
    # a free total: the final call (the returned estimate, its certified gap)
    seen.clear()
    model = synth.estimate(dom, ms, callback_fn=cb, eps_rel=1e-10)
    assert seen[-1][1] == dict(model.solve_info)["gap"]
    for c in seen[-1][0].cliques:
        assert _rel(seen[-1][0][c].datavector(), model.project(c).datavector()) <= 1e-6
    # mbi's one-argument form, and mbi's own logging callback
    synth.estimate(dom, ms, callback_fn=lambda mu: plain.append(mu))
    assert plain and all(isinstance(m, mbi.CliqueVector) for m in plain)
    import inspect
    kw = {"domain": dom} if "domain" in inspect.signature(mbi.callbacks.default).parameters else {}
    log = mbi.callbacks.default(ms, **kw)              # mbi's own logging callback
    lines = []
    if hasattr(mbi.callbacks, "set_log_fn"):            # mbi 2.x
        mbi.callbacks.set_log_fn(lambda *a, **k: lines.append(a))
    try:
        synth.estimate(dom, ms, callback_fn=log)
    finally:
        if hasattr(mbi.callbacks, "set_log_fn"):
            mbi.callbacks.set_log_fn(print)
    if hasattr(mbi.callbacks, "set_log_fn"):
        assert len(lines) >= 3                          # header, rule, one row per call


# ------------------------------------------------------------------ the model as a jax pytree
def test_model_is_a_pytree_that_pickles_and_saves(mbi):
    import jax
    dom, ms = _instance(mbi, 6, extra_edges=2)
    model = synth.estimate(dom, ms, **SOLVE)
    assert isinstance(model, public.CvxdpMarkovRandomField)
    leaves = jax.tree_util.tree_leaves(model)
    assert leaves and all(np.asarray(leaf).dtype.kind == "f" for leaf in leaves)  # arrays, total
    names = list(dom.attributes)
    far = (names[0], names[-1])
    want = np.asarray(model.project(far).datavector(), dtype=float)
    jitted = jax.jit(lambda m: m.project(far).datavector())(model)
    np.testing.assert_allclose(np.asarray(jitted, dtype=float), want, atol=1e-4 * float(model.total))
    doubled = jax.tree_util.tree_map(lambda x: x, model)
    assert type(doubled) is type(model) and doubled.solve_info == model.solve_info
    back = pickle.loads(pickle.dumps(model))
    assert type(back) is type(model) and back.solve_info == model.solve_info
    np.testing.assert_allclose(np.asarray(back.project(far).datavector()), want, rtol=1e-6)
    if hasattr(mbi, "save"):                                    # mbi 2.x
        buf = io.BytesIO()
        mbi.save(model, buf)
        buf.seek(0)
        loaded = mbi.load(buf)
        assert type(loaded) is type(model) and loaded.solve_info == model.solve_info
        np.testing.assert_allclose(np.asarray(loaded.project(far).datavector()), want, rtol=1e-6)
        for c in itertools.islice(model.cliques, 3):
            np.testing.assert_allclose(np.asarray(loaded.project(c).datavector()),
                                       np.asarray(model.project(c).datavector()))


# ------------------------------------------------------------------ OpenDP's AIM and MST
def _opendp_table(algorithm, n=400, seed=11):
    """A seeded tiny data set (OpenDP's noise itself comes from its own secure RNG)."""
    dp = _need("opendp.prelude")
    pl = _need("polars")
    _need("pandas")                    # mbi's Dataset.df, used by synthesize()
    dp.enable_features("contrib")
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 3, n)
    b = (a + rng.integers(0, 2, n)) % 3
    c = rng.integers(0, 2, n)
    d = (c + (rng.random(n) < 0.2)) % 2
    df = pl.DataFrame({"A": a, "B": b, "C": c, "D": d}).cast(pl.Int64)
    keys = {"A": [0, 1, 2], "B": [0, 1, 2], "C": [0, 1]}    # D unkeyed: a prefix query and delta
    context = dp.Context.compositor(data=df.lazy(), privacy_unit=dp.unit_of(contributions=1),
                                    privacy_loss=dp.loss_of(rho=0.5, delta=1e-7))
    table = (context.query(rho=0.5, delta=1e-7).select("A", "B", "C", "D")
             .contingency_table(keys=keys, algorithm=algorithm).release())
    return table, keys


@pytest.mark.parametrize("name", ["MST", "AIM"])
def test_opendp_synthesizer_runs_on_cvxdp(mbi, monkeypatch, name):
    dp = _need("opendp.prelude")
    base = dp.mbi.MST() if name == "MST" else dp.mbi.AIM(queries=2, rounds=4)
    calls = []
    real = synth.estimate

    def counted(domain, loss_fn, **kw):
        model = real(domain, loss_fn, **kw)
        calls.append(dict(model.solve_info))
        return model

    monkeypatch.setattr(synth, "estimate", counted)
    table, keys = _opendp_table(synth.with_cvxdp(base))
    assert calls, "OpenDP did not call the estimator"
    # every round's estimate is certified optimal
    assert all(c["status"] == "optimal" and c["gap"] <= 1e-4 for c in calls), calls
    model = table.model
    assert isinstance(model, mbi.MarkovRandomField)
    # the release's model and measurements pickle (the ContingencyTable itself does not, with
    # mbi's estimator either: OpenDP 0.16 keeps ctypes pointers in its __opendp_dict__)
    back = pickle.loads(pickle.dumps((table.model, table.marginals)))[0]
    assert type(back) is type(model)
    np.testing.assert_allclose(np.asarray(back.project(["A", "D"]).datavector()),
                               np.asarray(model.project(["A", "D"]).datavector()))
    records = table.synthesize()
    assert records.columns == ["A", "B", "C", "D"]
    assert abs(records.height - float(model.total)) <= 1
    for col, ks in keys.items():
        assert set(records[col].drop_nulls().to_list()) <= set(ks)
    # the final model is at least as good as mbi's default on the same released measurements
    ms = table.marginals.flatten()
    ours = _loss(model, ms)
    theirs = _loss(_mbi_fit(mbi, model.domain, ms, iters=3000), ms)
    assert ours <= theirs + 1e-6 * max(1.0, theirs), (ours, theirs)


def test_with_cvxdp_replaces_only_the_estimator():
    dp = _need("opendp.prelude")
    _need("mbi")
    base = dp.mbi.AIM(queries=2, max_size=10.0)
    alg = synth.with_cvxdp(base, eps_rel=1e-8)
    assert alg.queries == 2 and alg.max_size == 10.0 and alg.estimator.keywords == {"eps_rel": 1e-8}
    with pytest.raises(TypeError, match="estimator"):
        synth.with_cvxdp(object())
    with pytest.raises(ValueError, match=r"eps_rell.*known options"):
        synth.with_cvxdp(base, eps_rell=1e-8)         # before any budget is spent
    # CvxdpEstimator is a callable of mbi 1.x's Estimator protocol: OpenDP takes it too
    est = public.CvxdpEstimator(eps_rel=1e-8)
    assert dataclasses.replace(base, estimator=est).estimator.eps_rel == 1e-8

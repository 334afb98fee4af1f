"""cvxdp.synth: cvxdp as the estimator of mbi-based synthesizers (the ``cvxdp[mbi]`` extra).

Run with the real packages by ``.ci/extras`` (``pip install -e ".[test,mbi]"``: mbi 1.x and
OpenDP; and mbi 2.x without OpenDP); in the default environment everything that needs mbi is
skipped and only the import guards are checked.
"""
from __future__ import annotations

import importlib
import os
import subprocess
import sys

import numpy as np
import pytest
import cvxpy as cp

import cvxdp
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
        synth.CvxdpEstimator


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
    names = list(dom.attrs)
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
    with pytest.raises(TypeError, match="list of mbi.LinearMeasurement"):
        synth.estimate(dom, mbi.marginal_loss.from_linear_measurements(ms, domain=dom))
    with pytest.raises(NotImplementedError, match="constraints"):
        synth.estimate(dom, ms, constraints=[object()])
    with pytest.raises(TypeError, match="unexpected"):
        synth.estimate(dom, ms, stepsizee=1.0)
    with pytest.raises(ValueError, match="norm"):
        synth.estimate(dom, ms, norm="linf")
    # mbi's mirror-descent keywords are accepted (drop-in for scripts calling mirror_descent)
    model = synth.estimate(dom, ms, iters=10, callback_fn=lambda *_: None, potentials=None)
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


def test_mbi2_estimator_class(mbi):
    if not isinstance(getattr(mbi, "Estimator", None), type) or not hasattr(mbi.Estimator, "estimate"):
        with pytest.raises(ImportError, match="mbi>=2"):
            synth.CvxdpEstimator
        return
    est = synth.CvxdpEstimator(**SOLVE)
    assert isinstance(est, mbi.Estimator) and est == synth.CvxdpEstimator(**SOLVE)
    dom, ms = _instance(mbi, 4)
    model = est.estimate(dom, ms)
    ref, _ = _cvxdp_reference(dom, ms)
    for m in ms:
        assert _rel(model.project(m.clique).datavector(flatten=False), ref.marginal(list(m.clique))) <= _tol(mbi)


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
        calls.append(len(loss_fn))
        return real(domain, loss_fn, **kw)

    monkeypatch.setattr(synth, "estimate", counted)
    table, keys = _opendp_table(synth.with_cvxdp(base))
    assert calls, "OpenDP did not call the estimator"
    model = table.model
    assert isinstance(model, mbi.MarkovRandomField)
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

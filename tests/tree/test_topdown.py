"""``cvxdp.topdown``: the Census-style level-by-level estimate, in this process and on a real
``distributed.LocalCluster``.

Known answers (least squares given the parent: the children's answers shifted equally), the
non-negative children problems against Clarabel, the same bits on every backend and chunk
layout, streamed progress, failures reported with their units (never dropped), a caller's
client left open, and option refusals.
"""
from __future__ import annotations

import numpy as np
import pytest
import cvxpy as cp

import cvxdp


def country(seed=0, sizes=(3, 12, 60), k=4, sigma=1.0):
    rng = np.random.default_rng(seed)
    states, counties, tracts = sizes
    c_per_s = rng.multinomial(counties - states, np.full(states, 1 / states)) + 1
    t_per_c = rng.multinomial(tracts - counties, np.full(counties, 1 / counties)) + 1
    parent = [-1] + [0] * states
    for s, c in enumerate(c_per_s):
        parent += [1 + s] * int(c)
    for c, t in enumerate(t_per_c):
        parent += [1 + states + c] * int(t)
    geo = cvxdp.workloads.geography(np.array(parent))
    truth = geo.aggregate(rng.poisson(1.0, (geo.leaves.size, k)).astype(float))
    ms = [cvxdp.HistogramMeasurement(u, np.eye(k), truth[u] + rng.normal(0, sigma, (u.size, k)), sigma)
          for u in geo.levels]
    return geo, truth, ms


def test_least_squares_given_the_parent_is_the_equal_shift():
    geo, truth, ms = country()
    y = np.zeros_like(truth)
    for m in ms:
        y[m.units] = m.answers
    res = cvxdp.topdown(geo, ms, nonneg=False, backend="local")
    x = res.x
    np.testing.assert_allclose(x[0], y[0])
    for p in geo.internal:
        kids = geo.children(p)
        want = y[kids] + (x[p] - y[kids].sum(axis=0)) / kids.size
        np.testing.assert_allclose(x[kids], want, atol=1e-9)
    np.testing.assert_allclose(geo.consistency @ x, 0, atol=1e-9)
    assert res.backend == "local" and [lv["level"] for lv in res.levels] == [0, 1, 2, 3]


def test_nonnegative_children_problems_match_clarabel():
    geo, truth, ms = country(1, sigma=2.0)
    res = cvxdp.topdown(geo, ms, nonneg=True, eps_rel=1e-9, backend="local")
    x = res.x
    assert np.all(x >= 0)
    np.testing.assert_allclose(geo.consistency @ x, 0, atol=1e-8)
    y = np.zeros_like(truth)
    for m in ms:
        y[m.units] = m.answers
    for p in geo.internal[:6]:
        kids = geo.children(p)
        Z = cp.Variable((kids.size, truth.shape[1]), nonneg=True)
        prob = cp.Problem(cp.Minimize(cp.sum_squares(Z - y[kids])), [cp.sum(Z, axis=0) == x[p]])
        prob.solve(solver=cp.CLARABEL, tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10)
        ours = float(np.sum((x[kids] - y[kids]) ** 2))
        assert ours == pytest.approx(prob.value, rel=1e-6, abs=1e-6)


def test_chunk_layout_changes_nothing_but_rounding():
    """Chunks are independent problems: least squares is the same to rounding however the
    parents are grouped; the non-negative solves agree to their certified accuracy; a
    layout run twice gives the same bits."""
    geo, truth, ms = country(2, sizes=(4, 20, 120))
    a = cvxdp.topdown(geo, ms, backend="local", nonneg=False, chunk_units=10000).x
    b = cvxdp.topdown(geo, ms, backend="local", nonneg=False, chunk_units=7).x
    np.testing.assert_allclose(a, b, atol=1e-9)
    c = cvxdp.topdown(geo, ms, backend="local", eps_rel=1e-10, chunk_units=10000).x
    d = cvxdp.topdown(geo, ms, backend="local", eps_rel=1e-10, chunk_units=7).x
    np.testing.assert_allclose(c, d, atol=1e-4)
    assert np.array_equal(cvxdp.topdown(geo, ms, backend="local", chunk_units=7).x,
                          cvxdp.topdown(geo, ms, backend="local", chunk_units=7).x)


def test_local_cluster_gives_the_same_bits_and_streams_progress(client):
    geo, truth, ms = country(3, sizes=(4, 20, 120))
    local = cvxdp.topdown(geo, ms, backend="local", chunk_units=30)
    ticks = []
    res = cvxdp.topdown(geo, ms, client=client, chunk_units=30,
                        progress=lambda level, done, total: ticks.append((level, done, total)))
    assert res.backend == "dask" and res.workers == 2
    assert np.array_equal(res.x, local.x)
    assert ticks[-1][1] == ticks[-1][2] and len(ticks) == sum(lv["chunks"] for lv in res.levels)
    assert client.status == "running"          # a caller's client is left open


def test_a_failed_chunk_is_reported_with_its_units(client):
    geo, truth, ms = country(4)
    # the tracts under county 4 are measured on one cell of four: their problem has no
    # unique answer, and TreeGLS refuses it
    kids = geo.children(4)
    tracts = geo.levels[3]
    others = tracts[~np.isin(tracts, kids)]
    bad = ms[:3] + [cvxdp.HistogramMeasurement(others, np.eye(4), truth[others], 1.0),
                    cvxdp.HistogramMeasurement(kids, np.eye(4)[:1], truth[kids][:, :1], 1.0)]
    with pytest.raises(cvxdp.TopDownError, match="level 3") as info:
        cvxdp.topdown(geo, bad, client=client, nonneg=False, retries=1)
    assert any(np.isin(kids, u).all() for _, u, _ in info.value.failures)
    with pytest.raises(cvxdp.TopDownError, match="level 3"):
        cvxdp.topdown(geo, bad, backend="local", nonneg=False)


@pytest.mark.parametrize("kwargs, match", [
    (dict(backend="spark"), "backend must be"),
    (dict(chunk_units=0), "chunk_units"),
    (dict(retries=-1), "retries"),
    (dict(eps_rel=0.0), "eps_rel"),
])
def test_option_refusals(kwargs, match):
    geo, truth, ms = country()
    with pytest.raises(ValueError, match=match):
        cvxdp.topdown(geo, ms, **kwargs)


def test_measurement_refusals():
    with pytest.raises(ValueError, match="answer 1 of unit 5 is not finite"):
        cvxdp.HistogramMeasurement([5], np.eye(2), [[1.0, np.nan]], 1.0)
    with pytest.raises(ValueError, match="scale must be positive"):
        cvxdp.HistogramMeasurement([5], np.eye(2), [[1.0, 2.0]], 0.0)
    with pytest.raises(ValueError, match="one row per unit"):
        cvxdp.HistogramMeasurement([5, 6], np.eye(2), [[1.0, 2.0]], 1.0)

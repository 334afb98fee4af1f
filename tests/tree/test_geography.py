"""``cvxdp.workloads.geography``: any tree of named units, its levels and consistency matrix."""
from __future__ import annotations

import numpy as np
import pytest

import cvxdp

NESTED = {"US": {"PA": {"Centre": ["t1", "t2"], "Erie": ["t3"]}, "NY": {"Kings": ["t4", "t5", "t6"]}}}


def test_three_spellings_give_the_same_tree():
    a = cvxdp.workloads.geography(NESTED)
    assert a.names == ["US", "PA", "NY", "Centre", "Erie", "Kings", "t1", "t2", "t3", "t4", "t5", "t6"]
    assert a.parent.tolist() == [-1, 0, 0, 1, 1, 2, 3, 3, 4, 5, 5, 5]
    b = cvxdp.workloads.geography(dict(zip(a.names, [None] + [a.names[p] for p in a.parent[1:]])))
    c = cvxdp.workloads.geography(a.parent.copy())
    assert b.names == a.names and b.parent.tolist() == a.parent.tolist()
    assert c.parent.tolist() == a.parent.tolist() and c.names == list(range(12))


def test_structure():
    geo = cvxdp.workloads.geography(NESTED)
    assert [lv.tolist() for lv in geo.levels] == [[0], [1, 2], [3, 4, 5], list(range(6, 12))]
    assert geo.children("Kings").tolist() == [9, 10, 11] and geo.children(0).tolist() == [1, 2]
    assert geo.leaves.tolist() == list(range(6, 12)) and geo.internal.tolist() == list(range(6))
    assert geo.depth.tolist() == [0, 1, 1, 2, 2, 2, 3, 3, 3, 3, 3, 3]
    assert geo.index("Erie") == 4
    assert "per level: 1, 2, 3, 6" in repr(geo)


@pytest.mark.parametrize("k", [None, 4])
def test_aggregate_is_consistent_and_matches_the_aggregation_matrix(k):
    geo = cvxdp.workloads.geography(NESTED)
    rng = np.random.default_rng(0)
    leaves = rng.normal(size=(6,) if k is None else (6, k))
    x = geo.aggregate(leaves)
    np.testing.assert_allclose(geo.consistency @ x, 0, atol=1e-12)
    np.testing.assert_allclose(geo.aggregation @ leaves, x, atol=1e-12)
    np.testing.assert_allclose(x[geo.leaves], leaves)
    assert geo.consistency.shape == (6, 12)


def test_consistency_matches_hierarchy_rows():
    h = cvxdp.workloads.hierarchy(9, 3)
    geo = cvxdp.workloads.geography(np.array(h.parent))
    assert (geo.consistency != h.consistency).nnz == 0


@pytest.mark.parametrize("parents, err, match", [
    ({"a": None, "b": "c"}, ValueError, "parent 'c' of 'b' is not a unit"),
    (np.array([1, 0]), ValueError, "cycle"),
    (np.array([-1, 5]), ValueError, "parent entries"),
    (np.array([0.5, -1]), TypeError, "integer parent array"),
    ({"a": {"b": 3}}, TypeError, "children of 'b'"),
])
def test_refusals(parents, err, match):
    with pytest.raises(err, match=match):
        cvxdp.workloads.geography(parents)


def test_duplicate_names_and_unknown_units():
    with pytest.raises(ValueError, match="used twice"):
        cvxdp.workloads.Geography(np.array([-1, 0]), ["a", "a"])
    geo = cvxdp.workloads.geography(NESTED)
    with pytest.raises(KeyError, match="no unit called 'Ohio'"):
        geo.index("Ohio")

"""``cvxdp.solvers._blas.threads``: the BLAS thread counts of numpy's and scipy's OpenBLAS set
for a block and restored after it, nested and from several Python threads at once."""
from __future__ import annotations

import threading

import numpy as np
import pytest
import scipy.linalg  # noqa: F401  (loads scipy's OpenBLAS)

from cvxdp.solvers import _blas


def counts():
    return [get() for _, get in _blas._libs()]


@pytest.fixture
def libs():
    if not _blas._libs():
        pytest.skip("no OpenBLAS found in this process (another BLAS or platform)")
    return counts()


def test_a_block_sets_and_restores(libs):
    with _blas.threads(1):
        assert counts() == [1] * len(libs)
        with _blas.threads(None):
            assert counts() == libs
        assert counts() == [1] * len(libs)
    assert counts() == libs


def test_restored_after_an_error(libs):
    with pytest.raises(RuntimeError):
        with _blas.threads(1):
            raise RuntimeError("inside")
    assert counts() == libs


def test_blocks_on_several_threads_restore_the_first_counts(libs):
    barrier = threading.Barrier(4)

    def work():
        with _blas.threads(1):
            barrier.wait()
            np.linalg.cholesky(np.eye(50) * 2.0)

    ts = [threading.Thread(target=work) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert counts() == libs


def test_the_interior_point_leaves_the_counts_as_they_were(libs):
    from cvxdp.solvers.consistency.dense_kkt import DenseKKT
    import scipy.sparse as sp
    H = (sp.random(40, 40, density=0.2, random_state=0) + sp.identity(40) * 5.0)
    H = (H @ H.T).tocsc()
    H.sort_indices()
    kkt = DenseKKT(40, sp.csr_matrix((0, 40)), (H.indptr, H.indices))
    assert kkt.factor(H.data.copy(), 1e-10)
    assert counts() == libs

"""Affine expressions as ``(M, c)`` with ``vec(expr) = M x + c``.

``x`` stacks the problem's variables (each flattened in column-major order, as
cvxpy does).  The common atoms are walked directly with sparse algebra, which is
fast at millions of entries; any other affine atom is handed to cvxpy's own
canonicalization backend for that subtree, so every affine expression cvxpy
accepts is understood.  Parameters are read at call (solve) time.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from cvxpy.atoms.affine.add_expr import AddExpression
from cvxpy.atoms.affine.cumsum import cumsum
from cvxpy.atoms.affine.binary_operators import DivExpression, MulExpression, multiply
from cvxpy.atoms.affine.index import index, special_index
from cvxpy.atoms.affine.promote import Promote
from cvxpy.atoms.affine.sum import Sum
from cvxpy.atoms.affine.transpose import transpose
from cvxpy.atoms.affine.reshape import reshape
from cvxpy.atoms.affine.unary_operators import NegExpression
from cvxpy.expressions.constants.constant import Constant
from cvxpy.expressions.constants.parameter import Parameter
from cvxpy.expressions.variable import Variable

__all__ = ["Linearizer", "constant_value"]

# Atoms :meth:`Linearizer._selection` reads without the general walk.
_SCALED_SELECTIONS = (AddExpression, NegExpression, multiply)

# Atoms that only rearrange or repeat entries: their action is read off by
# evaluating them on an array of (1-based) source positions.
_SELECTION_ATOMS = (index, special_index, transpose, reshape, Promote)


def constant_value(expr) -> np.ndarray | None:
    """Numeric value of a constant (or parameter) expression, else ``None``."""
    if isinstance(expr, (Constant, Parameter)) or (expr.is_constant()):
        val = expr.value
        if val is None:
            raise ValueError(f"parameter {expr.name()} has no value")
        return val.toarray() if sp.issparse(val) else np.asarray(val, dtype=float)
    return None


class Linearizer:
    """Maps affine expressions of the given variables to ``(M, c)``."""

    def __init__(self, variables: list[Variable]) -> None:
        self.variables = variables
        self.offsets: dict[int, int] = {}
        off = 0
        for v in variables:
            self.offsets[v.id] = off
            off += v.size
        self.n = off

    def __call__(self, expr) -> tuple[sp.csr_matrix, np.ndarray]:
        M, c = self._lin(expr)
        return sp.csr_matrix(M), np.asarray(c, dtype=float).ravel()

    # ------------------------------------------------------------------
    def _lin(self, e):
        size = e.size
        if isinstance(e, Variable):
            if e.id not in self.offsets:
                raise KeyError(e.id)
            # CSR arrays directly: one entry per row (scipy's COO conversion cost 4x as much)
            off = self.offsets[e.id]
            M = sp.csr_matrix((np.ones(size), off + np.arange(size), np.arange(size + 1)),
                              shape=(size, self.n))
            return M, np.zeros(size)
        val = constant_value(e) if e.is_constant() else None
        if val is not None:
            return sp.csr_matrix((size, self.n)), np.asarray(val, dtype=float).ravel(order="F")
        sel = self._selection(e) if isinstance(e, _SCALED_SELECTIONS) else None
        if sel is not None:
            cols, coef, c = sel
            keep = coef != 0
            rows = np.flatnonzero(keep)
            indptr = np.zeros(size + 1, dtype=np.int64)
            indptr[rows + 1] = 1
            return sp.csr_matrix((coef[keep], cols[keep], np.cumsum(indptr)),
                                 shape=(size, self.n)), c
        if isinstance(e, AddExpression):
            M, c = None, None
            for a in e.args:
                Ma, ca = self._lin(a)
                if a.size != size:
                    Ma, ca = _broadcast(Ma, ca, a.shape, e.shape)
                # a constant term adds no coefficients: skip the sparse sum (a large copy)
                M = Ma if M is None or M.nnz == 0 else M if Ma.nnz == 0 else M + Ma
                c = ca if c is None else c + ca
            return M, c
        if isinstance(e, NegExpression):
            M, c = self._lin(e.args[0])
            return -M, -c
        if type(e) is multiply:
            return self._elementwise(e)
        if isinstance(e, DivExpression):
            num, den = e.args
            dval = constant_value(den) if den.is_constant() else None
            if dval is not None and np.ndim(dval) == 0 or (dval is not None and np.size(dval) == 1):
                M, c = self._lin(num)
                d = float(np.asarray(dval).ravel()[0])
                return M / d, c / d
            if dval is not None and den.shape == num.shape:
                M, c = self._lin(num)
                inv = 1.0 / np.asarray(dval, dtype=float).ravel(order="F")
                return sp.diags(inv) @ M, inv * c
            return self._fallback(e)
        if type(e) is MulExpression:
            return self._matmul(e)
        if isinstance(e, Sum) and e.axis is None:
            M, c = self._lin(e.args[0])
            return sp.csr_matrix(M.sum(axis=0)), np.array([c.sum()])
        if isinstance(e, cumsum) and e.args[0].ndim <= 1:
            M, c = self._lin(e.args[0])
            k = e.args[0].size
            # running sums of rows: a lower-triangular ones matrix, built as a prefix sum
            L = sp.csr_matrix(np.tril(np.ones((k, k)))) if k <= 4096 else None
            if L is not None:
                return L @ M, np.cumsum(c)
            M = sp.csr_matrix(M)
            rows = [M[0]]
            acc = M[0]
            for i in range(1, k):          # large k: cumulative sparse rows
                acc = acc + M[i]
                rows.append(acc)
            return sp.vstack(rows).tocsr(), np.cumsum(c)
        if isinstance(e, _SELECTION_ATOMS):
            arg = e.args[0]
            src = np.arange(1, arg.size + 1, dtype=float).reshape(arg.shape, order="F") \
                if arg.ndim else np.array(1.0)
            picked = np.asarray(e.numeric([src]), dtype=float).ravel(order="F")
            rows = np.flatnonzero(picked > 0)
            cols = picked[rows].astype(np.int64) - 1
            if isinstance(arg, Variable) and arg.id in self.offsets:
                # entries of one variable: the rows of the result directly
                return (sp.csr_matrix((np.ones(rows.size), (rows, self.offsets[arg.id] + cols)),
                                      shape=(size, self.n)), np.zeros(size))
            M, c = self._lin(arg)
            sel = sp.csr_matrix((np.ones(rows.size), (rows, cols)), shape=(size, arg.size))
            return sel @ M, sel @ c
        return self._fallback(e)

    def _selection(self, e):
        """``(cols, coef, c)`` with ``vec(e) = coef * x[cols] + c`` when ``e`` scales one whole
        variable entrywise and adds constants (``x - y``, ``-x``, ``w * (x - y)``, ``0 - x``:
        most losses and bounds), else ``None``.  Built as one CSR matrix at the end: the general
        walk makes a sparse matrix per node, and scipy's constructors and sums cost 20-40 us
        each, a quarter of a small model's recognition."""
        if isinstance(e, Variable):
            if e.id not in self.offsets:
                return None
            return (self.offsets[e.id] + np.arange(e.size), np.ones(e.size), np.zeros(e.size))
        if e.is_constant():
            return None
        if isinstance(e, NegExpression):
            inner = self._selection(e.args[0])
            return None if inner is None else (inner[0], -inner[1], -inner[2])
        if type(e) is multiply or isinstance(e, AddExpression):
            varying = [a for a in e.args if not a.is_constant()]
            if len(varying) != 1 or varying[0].shape != e.shape:
                return None
            inner = self._selection(varying[0])
            if inner is None:
                return None
            cols, coef, c = inner
            for a in e.args:
                if a is varying[0]:
                    continue
                val = constant_value(a)
                if val is None or sp.issparse(val) or not _broadcasts(np.shape(val), e.shape):
                    return None
                v = np.broadcast_to(np.asarray(val, dtype=float), e.shape).ravel(order="F")
                if type(e) is multiply:
                    coef, c = coef * v, c * v
                else:
                    c = c + v
            return cols, coef, c
        return None

    def _elementwise(self, e):
        a, b = e.args
        aval = constant_value(a) if a.is_constant() else None
        bval = constant_value(b) if b.is_constant() else None
        if aval is None and bval is None:
            raise ValueError("not affine: product of two non-constant expressions")
        const, other = (aval, b) if aval is not None else (bval, a)
        M, c = self._lin(other)
        cv = np.asarray(const, dtype=float)
        if cv.size == 1:
            s = float(cv.ravel()[0])
            if other.size != e.size:
                M, c = _broadcast(M, c, other.shape, e.shape)
            return M * s, c * s
        if other.size != e.size:
            M, c = _broadcast(M, c, other.shape, e.shape)
        w = np.broadcast_to(cv, e.shape).ravel(order="F")
        return sp.diags(w) @ M, w * c

    def _matmul(self, e):
        # constant factors are read with .value, which keeps scipy sparse matrices sparse
        a, b = e.args
        if a.is_constant() and b.ndim <= 1:
            A = a.value
            A = sp.csr_matrix(A) if sp.issparse(A) else np.atleast_2d(np.asarray(A, dtype=float))
            if A.shape[1] != b.size:
                return self._fallback(e)
            if isinstance(b, Variable) and b.id in self.offsets:
                # A @ x: A's columns moved to x's place (the product with x's selection
                # matrix cost scipy's overhead several times over)
                return _shifted(A, self.offsets[b.id], self.n), np.zeros(A.shape[0])
            M, c = self._lin(b)
            return sp.csr_matrix(A @ M), np.asarray(A @ c).ravel()
        if b.is_constant() and a.ndim <= 1:
            B = b.value
            B = sp.csr_matrix(B) if sp.issparse(B) else np.atleast_2d(np.asarray(B, dtype=float))
            if B.ndim == 2 and B.shape[0] == a.size:
                M, c = self._lin(a)
                BT = B.T
                return sp.csr_matrix(BT @ M), np.asarray(BT @ c).ravel()
        if a.ndim == 2 and b.ndim == 2 and (a.is_constant() or b.is_constant()):
            return self._matmul_2d(a, b)
        return self._fallback(e)

    def _matmul_2d(self, a, b):
        """``A @ Y`` or ``Y @ B`` with a constant matrix and a 2-D expression ``Y``: in
        column-major vec, ``vec(Y B) = (B^T kron I_m) vec(Y)`` and ``vec(A Y) = (I_k kron
        A) vec(Y)`` -- sparse, where cvxpy's backend is slow on large ``Y``."""
        right = b.is_constant()
        C = (b if right else a).value
        C = sp.csr_matrix(C) if sp.issparse(C) else sp.csr_matrix(np.asarray(C, dtype=float))
        Y = a if right else b
        M, c = self._lin(Y)
        if _is_identity(C):
            return M, c                       # e.g. X[units] @ np.eye(k): the detailed cells
        m, k = Y.shape
        cm = c.reshape((m, k), order="F")
        if right:
            K = sp.kron(C.T, sp.identity(m, format="csr"), format="csr")
            cc = (C.T @ cm.T).T
        else:
            K = sp.kron(sp.identity(k, format="csr"), C, format="csr")
            cc = C @ cm
        return sp.csr_matrix(K @ M), np.asarray(cc, dtype=float).ravel(order="F")

    def _fallback(self, e):
        """cvxpy's canonicalization backend for any other affine atom."""
        from cvxpy.cvxcore.python import canonInterface
        from cvxpy.lin_ops import lin_op as lo

        if not e.is_affine():
            raise ValueError(f"not affine: {e}")
        frozen = _freeze_parameters(e)
        try:
            op = frozen.canonical_form[0]
        except NotImplementedError:
            return self._probe(frozen)
        id_map = {}
        for v in frozen.variables():
            if v.id not in self.offsets:
                raise KeyError(v.id)
            id_map[v.id] = self.offsets[v.id]
        tensor = canonInterface.get_problem_matrix(
            [op], self.n, id_map, {lo.CONSTANT_ID: 1}, {lo.CONSTANT_ID: 0}, e.size, "SCIPY")
        A, c = canonInterface.get_matrix_from_tensor(tensor, None, self.n)
        return sp.csr_matrix(A), np.atleast_1d(np.asarray(c, dtype=float))


    def _probe(self, e):
        """Jacobian of a linear atom (one that cvxpy canonicalizes with auxiliary
        variables, e.g. cumsum along an axis) by evaluating it on unit vectors."""
        if len(e.args) != 1 or e.args[0].size > _PROBE_LIMIT:
            raise ValueError(f"cannot linearize the affine atom {type(e).__name__} of this size")
        arg = e.args[0]
        M, c = self._lin(arg)
        base = np.asarray(e.numeric([np.zeros(arg.shape)]), dtype=float).ravel(order="F")
        cols = []
        for j in range(arg.size):
            unit = np.zeros(arg.size)
            unit[j] = 1.0
            out = np.asarray(e.numeric([unit.reshape(arg.shape, order="F")]), dtype=float)
            cols.append(out.ravel(order="F") - base)
        J = sp.csr_matrix(np.column_stack(cols))
        return J @ M, J @ c + base


# Largest argument size for which an atom's Jacobian is probed column by column.
_PROBE_LIMIT = 4096


def _is_identity(C: sp.csr_matrix) -> bool:
    n = C.shape[0]
    if C.shape[1] != n or C.nnz != n:
        return False
    C = C.tocoo()
    return bool(np.all(C.row == C.col) and np.all(C.data == 1.0))


def _shifted(A, offset: int, n: int) -> sp.csr_matrix:
    """``A`` (dense or sparse, ``m x k``) as the columns ``offset .. offset + k`` of an
    ``m x n`` CSR matrix."""
    A = sp.csr_matrix(A, dtype=float)
    # copies: the caller's matrix may share these arrays, and the result is cleaned in place
    out = sp.csr_matrix((A.data.copy(), A.indices + offset, A.indptr.copy()), shape=(A.shape[0], n))
    out.sum_duplicates()
    return out


def _broadcasts(shape: tuple, to: tuple) -> bool:
    """Does numpy broadcast ``shape`` to exactly ``to``?"""
    try:
        return np.broadcast_shapes(shape, to) == tuple(to)
    except ValueError:
        return False


def _broadcast(M, c, from_shape, to_shape):
    """Rows of a (numpy-style) broadcast from ``from_shape`` to ``to_shape``."""
    src = np.arange(int(np.prod(from_shape)) if from_shape else 1).reshape(from_shape or (), order="F")
    idx = np.broadcast_to(src, to_shape).ravel(order="F")
    return sp.csr_matrix(M)[idx], np.asarray(c)[idx]


def _freeze_parameters(e):
    """A copy of ``e`` with every Parameter replaced by a Constant of its value."""
    if isinstance(e, Parameter):
        if e.value is None:
            raise ValueError(f"parameter {e.name()} has no value")
        return Constant(e.value)
    if not e.args:
        return e
    if not e.parameters():
        return e
    return e.copy([_freeze_parameters(a) for a in e.args])

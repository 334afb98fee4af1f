"""Numerical layer of cvxdp: numpy/scipy only, never imports cvxpy.

Every method takes arrays and returns a :class:`cvxdp.solvers.result.SolverResult`.
"""
from .result import SolverResult

__all__ = ["SolverResult"]

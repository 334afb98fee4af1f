"""Solver interfaces: one module per cvxdp method (recognise, solve, write back)."""

"""The layering rules: the numerical layer never imports cvxpy, and cvxdp's own
import names cannot be shadowed by a user's files."""
from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import cvxdp

SOLVERS = pathlib.Path(cvxdp.__file__).parent / "solvers"


def _imported_modules(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module:
                names.add(node.module)
            elif node.level >= 2:      # from ..x import y leaves the numerical layer
                names.add("." * node.level + (node.module or ""))
    return names


def test_numerical_layer_imports_no_cvxpy_and_nothing_above_it():
    files = sorted(SOLVERS.glob("*.py"))
    assert len(files) >= 10
    offenders = {}
    for f in files:
        bad = {m for m in _imported_modules(f)
               if m.split(".")[0] in ("cvxpy", "cvxdp") or m.startswith("..")}
        if bad:
            offenders[f.name] = sorted(bad)
    assert offenders == {}


def test_a_users_solvers_module_does_not_shadow_cvxdp(tmp_path):
    (tmp_path / "solvers.py").write_text("raise RuntimeError('user module imported')\n")
    code = ("import cvxpy as cp, cvxdp\n"
            "x = cp.Variable(3)\n"
            "p = cp.Problem(cp.Minimize(cp.norm1(x - [1, 2, 3])), [x >= 0])\n"
            "p.solve(method='cvxdp', solver=cvxdp.ADMM)\n"
            "print(p.status)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "optimal"

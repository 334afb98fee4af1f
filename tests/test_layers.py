"""The layering rules, read from the source: the numerical layer never imports cvxpy nor
anything of cvxdp above it, no module imports (directly or through others) a module that
imports it back -- imports inside functions count -- and cvxdp's own import names cannot be
shadowed by a user's files."""
from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import cvxdp

PACKAGE = pathlib.Path(cvxdp.__file__).parent
SOLVERS = PACKAGE / "solvers"


def _module_name(path: pathlib.Path) -> tuple[str, bool]:
    """``(dotted name, is a package)`` of a file of the package."""
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def _modules() -> dict[str, pathlib.Path]:
    return {_module_name(p)[0]: p for p in PACKAGE.rglob("*.py")}


def _imports(path: pathlib.Path, known: dict[str, pathlib.Path],
             where: tuple[str, bool] | None = None) -> set[str]:
    """Every module ``path`` imports, anywhere in the file (functions included), as absolute
    names; ``from package import submodule`` counts as importing the submodule only (the
    package is initialised first in any case, as for every import of a submodule).  ``where``:
    the file's ``(dotted name, is a package)`` (default: read off its place in cvxdp)."""
    name, is_pkg = where or _module_name(path)
    here = name.split(".") if is_pkg else name.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = here[:len(here) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            subs = {f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known}
            out |= subs
            if len(subs) < len(node.names):     # a name defined in ``base`` itself
                out.add(base)
    return out


def _graph() -> dict[str, set[str]]:
    known = _modules()
    return {m: {i for i in _imports(p, known) if i in known and i != m} for m, p in known.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_import_reader_sees_imports_inside_functions(tmp_path):
    known = _modules()
    graph = _graph()
    # cvxdp/__init__.py imports dispatch; every module of the package is in the graph
    assert "cvxdp.dispatch" in graph["cvxdp"]
    assert set(graph) == set(known)
    src = tmp_path / "probe.py"
    src.write_text("def f():\n    from ..solvers import result\n\n"
                   "class C:\n    def g(self):\n        import cvxpy\n")
    found = _imports(src, known, where=("cvxdp.methods.probe", False))
    assert {"cvxdp.solvers.result", "cvxpy"} <= found


def test_no_import_cycles_anywhere_in_the_package():
    assert _cycles(_graph()) == []


def test_numerical_layer_imports_no_cvxpy_and_nothing_above_it():
    files = sorted(SOLVERS.rglob("*.py"))
    assert len(files) >= 40
    assert any(f.parent != SOLVERS for f in files)          # the family subpackages are read
    known = _modules()
    offenders = {}
    for f in files:
        bad = {m for m in _imports(f, known)
               if m.split(".")[0] == "cvxpy"
               or (m.split(".")[0] == "cvxdp" and not m.startswith("cvxdp.solvers"))}
        if bad:
            offenders[str(f.relative_to(SOLVERS))] = sorted(bad)
    assert offenders == {}


def test_numerical_layer_is_grouped_by_family():
    top = sorted(p.name for p in SOLVERS.glob("*.py"))
    assert len(top) <= 8, top
    families = sorted(p.name for p in SOLVERS.iterdir() if (p / "__init__.py").exists())
    assert {"consistency", "tree", "marginal", "local", "fitness"} <= set(families)


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

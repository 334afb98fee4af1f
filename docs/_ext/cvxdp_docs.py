"""Sphinx directives that read cvxdp itself, so the pages cannot drift from the code.

``.. cvxdp-options:: ADMM``
    The options of one method, from its validated settings layer
    (``cvxdp.METHODS[name].options``, :mod:`cvxdp.methods.options`): name, default, allowed
    values, meaning.  ``:only: own`` / ``:only: shared`` restricts the rows.

``.. cvxdp-shared-options::``
    The shared options, one default column per method.

``.. cvxdp-extra-stats::``
    The keys of ``solver_stats.extra_stats`` (:data:`cvxdp.methods.base.EXTRA_STATS_KEYS`);
    the content gives each key's meaning as ``key: text`` lines, and a key missing from the
    code or from the content is a build warning.

``.. cvxdp-info-keys:: example``
    The keys of ``extra_stats["info"]`` of one method, as ``key: text`` lines (``key?`` for a
    key that appears only in some cases).  At build time a small problem of that family is
    solved and its keys are compared with the documented ones: any difference is a warning.

And a check at the end of reading: every name in ``cvxdp.__all__`` is documented as
``cvxdp.<name>``.
"""
from __future__ import annotations

import math
import re
from typing import Any

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

LOGGER = logging.getLogger(__name__)

_METHODS = ("ADMM", "MIRROR_DESCENT", "NEWTON_CG")


def _method(name: str):
    import cvxdp

    key = getattr(cvxdp, name.strip().upper().removeprefix("CVXDP_"), None)
    if key not in cvxdp.METHODS:
        raise ValueError(f"unknown cvxdp method {name!r}; expected one of {_METHODS}")
    return cvxdp.METHODS[key]


def _default(option) -> str:
    value = option.default
    if value is None:
        return "None"
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    return repr(value)


def _kind(option) -> str:
    return {"number": "float", "integer": "int", "bool": "bool", "choice": "str",
            "callable": "callable", "solver": "str (cvxpy solver name)",
            "array": "2-d array"}.get(option.kind, option.kind)


# --------------------------------------------------------------------------- tables
def _cell(content) -> nodes.entry:
    entry = nodes.entry()
    if isinstance(content, nodes.Node):
        entry += content
    elif isinstance(content, list):
        para = nodes.paragraph()
        para.extend(content)
        entry += para
    else:
        entry += nodes.paragraph(text=str(content))
    return entry


def _literal(text: str) -> nodes.paragraph:
    para = nodes.paragraph()
    para += nodes.literal(text=text)
    return para


def table(headers: list[str], rows: list[list[Any]], widths: list[int],
          classes: tuple[str, ...] = ()) -> nodes.table:
    tab = nodes.table(classes=["cvxdp-table", "colwidths-given", *classes])
    group = nodes.tgroup(cols=len(headers))
    tab += group
    for w in widths:
        group += nodes.colspec(colwidth=w)
    head = nodes.thead()
    group += head
    row = nodes.row()
    for h in headers:
        row += _cell(h)
    head += row
    body = nodes.tbody()
    group += body
    for cells in rows:
        row = nodes.row()
        for c in cells:
            row += _cell(c)
        body += row
    return tab


class OptionsDirective(SphinxDirective):
    required_arguments = 1
    option_spec = {"only": lambda arg: directives.choice(arg, ("own", "shared", "all"))}

    def run(self):
        from cvxdp.methods.options import SHARED_NAMES

        method = _method(self.arguments[0])
        only = self.options.get("only", "all")
        rows = []
        for name, opt in method.options.options.items():
            shared = name in SHARED_NAMES
            if (only == "own" and shared) or (only == "shared" and not shared):
                continue
            rows.append([_literal(name), _kind(opt), _literal(_default(opt)), opt.allowed(),
                         opt.doc])
        return [table(["option", "type", "default", "allowed values", "meaning"], rows,
                      [14, 10, 12, 22, 42], ("cvxdp-options",))]


class CostModelDirective(SphinxDirective):
    """The fitted cost model of ``solver=None`` (``cvxdp.cost_model.FITS``) as a table: the
    two fits and the size above which the cvxdp method is expected to be faster."""

    def run(self):
        import math
        from cvxdp import cost_model

        rows = []
        for family, fit in cost_model.FITS.items():
            if isinstance(fit[0], tuple):        # measured points, interpolated in log-log
                faster = [n for n, tc, ts in fit if tc <= cost_model.MARGIN * ts]
                pts = ", ".join(f"{n:,}: {tc:.3g} s" for n, tc, _ in fit)
                std = ", ".join(f"{n:,}: {ts:.3g} s" for n, _, ts in fit)
                when = ("measured faster at " + ", ".join(f"{n:,}" for n in faster)) if faster else "never"
                rows.append([_literal(family), pts, std, when])
                continue
            a, b, c, d = fit
            # log t_cvxdp - log t_std - log MARGIN = (a - c - log m) + (b - d) log s
            a0 = a - c - math.log(cost_model.MARGIN)
            if b == d:
                when = "always" if a0 <= 0 else "never"
            else:
                cross = math.exp(-a0 / (b - d))
                if b < d:
                    when = "always" if cross <= 1 else f"{cross:,.0f} and above"
                else:
                    when = "never" if cross < 1 else f"up to {cross:,.0f}"
            rows.append([_literal(family), f"{math.exp(a):.2g} s x size^{b:.2f}",
                         f"{math.exp(c):.2g} s x size^{d:.2f}", when])
        rows.append([_literal(cost_model.SMALL), "", "",
                     f"below {cost_model.small_limit():,.0f} unknowns: never (decided before "
                     "recognition)"])
        # the limits when the objective's atoms show one loss kind and read entrywise
        for loss in ("l1", "l2", "mixed"):
            rows.append([_literal(f"{cost_model.SMALL_SEPARABLE}/{loss}"), "", "",
                         f"below {cost_model.small_limit(True, loss=loss):,.0f} unknowns: never"])
        for family in cost_model.EXACT:
            rows.append([_literal(family), "one direct solve", "", "always"])
        return [table(["family / loss", "cvxdp method", str(cost_model.STANDARD),
                       "cvxdp method chosen at sizes"], rows, [24, 24, 24, 20])]


class SharedOptionsDirective(SphinxDirective):
    def run(self):
        from cvxdp.methods.options import SHARED_NAMES

        methods = [_method(m) for m in _METHODS]
        rows = []
        for name in SHARED_NAMES:
            first = methods[0].options.options[name]
            rows.append([_literal(name)] + [_literal(_default(m.options.options[name]))
                                            for m in methods] + [first.allowed(), first.doc])
        # a zero-width space lets the long method names wrap in the narrow columns
        heads = ["ADMM", "MIRROR_\u200bDESCENT", "NEWTON_\u200bCG"]
        return [table(["option", *heads, "allowed values", "meaning"], rows,
                      [12, 8, 10, 9, 20, 41], ("cvxdp-options",))]


class _KeyTable(SphinxDirective):
    """Base: content lines ``key: meaning`` (``key?`` marks an optional key)."""

    has_content = True

    def documented(self) -> list[tuple[str, bool, str]]:
        out = []
        for line in self.content:
            if not line.strip():
                continue
            key, _, text = line.partition(":")
            if not text:
                raise self.error(f"expected 'key: meaning', got {line!r}")
            key = key.strip()
            optional = key.endswith("?")
            out.append((key.rstrip("?"), optional, text.strip()))
        return out

    def render(self, entries, header: str):
        rows = []
        for key, optional, text in entries:
            parsed, messages = self.state.inline_text(text, self.lineno)
            note = [nodes.emphasis(text="(only in some cases) ")] if optional else []
            rows.append([_literal(key), note + parsed + messages])
        return [table([header, "meaning"], rows, [22, 78], ("cvxdp-keys",))]


class ExtraStatsDirective(_KeyTable):
    def run(self):
        from cvxdp.methods.base import EXTRA_STATS_KEYS

        entries = self.documented()
        keys = [k for k, _, _ in entries]
        if keys != list(EXTRA_STATS_KEYS):
            LOGGER.warning("cvxdp-extra-stats: the page documents %s but the code has %s",
                           keys, list(EXTRA_STATS_KEYS), location=self.get_location())
        return self.render(entries, "key")


# small problems whose info keys are checked against the page
def _example(name: str) -> dict:
    import numpy as np
    import cvxpy as cp
    import cvxdp

    rng = np.random.default_rng(0)
    if name == "admm":
        tree = cvxdp.workloads.hierarchy(n_leaves=16, branching=2)
        y = cvxdp.mechanisms.laplace(tree.queries, rng.poisson(3, 16), epsilon=1.0, rng=0)
        x = cp.Variable(tree.n_nodes)
        prob = cp.Problem(cp.Minimize(cvxdp.nll(y, x)), [cvxdp.consistent(tree, x), x >= 0])
        prob.solve(method="cvxdp", solver=cvxdp.ADMM)
        return prob.solver_stats.extra_stats["info"]
    if name in ("admm-local", "mirror-descent", "mirror-descent-free-total"):
        dom = cvxdp.Domain({"a": 2, "b": 3, "c": 2})
        data = rng.integers(0, [2, 3, 2], size=(200, 3))
        mus = {("a", "b"): cp.Variable((2, 3)), ("b", "c"): cp.Variable((3, 2))}
        loss = sum(cp.sum_squares(v - (dom.count(data, cl) + rng.normal(0, 2, v.shape)))
                   for cl, v in mus.items())
        if name == "admm-local":
            con, solver = cvxdp.LocalPolytope(mus, dom, total=200), cvxdp.ADMM
        else:
            total = 200 if name == "mirror-descent" else None
            con, solver = cvxdp.MarginalPolytope(mus, dom, total=total), cvxdp.MIRROR_DESCENT
        prob = cp.Problem(cp.Minimize(loss), [con])
        prob.solve(method="cvxdp", solver=solver)
        return prob.solver_stats.extra_stats["info"]
    if name == "newton-cg":
        W = np.vstack([np.eye(4), np.ones((1, 4))])
        prob = cvxdp.fitness_problem(W, np.ones(5)).problem
        prob.solve(method="cvxdp", solver=cvxdp.NEWTON_CG)
        return prob.solver_stats.extra_stats["info"]
    if name == "admm-residual":
        dom = cvxdp.Domain({"a": 2, "b": 3, "c": 2})
        data = rng.integers(0, [2, 3, 2], size=(50, 3))
        Wm = cvxdp.workloads.marginal_workload(dom, [("a", "b"), ("b", "c")])
        s = cp.Variable(Wm.n_residuals, pos=True)
        cp.Problem(cp.Minimize(cvxdp.privacy_cost(Wm, s)),
                   [cvxdp.query_variance(Wm, s) <= 20.0]).solve(method="cvxdp")
        meas = cvxdp.mechanisms.residual_gaussian(Wm, s.value, data, rng=0)
        mus = {c: cp.Variable(dom.shape(c)) for c in Wm.cliques}
        prob = cp.Problem(cp.Minimize(cvxdp.nll(meas, mus)), [cvxdp.LocalPolytope(mus, dom)])
        prob.solve(method="cvxdp", solver=cvxdp.ADMM)
        return prob.solver_stats.extra_stats["info"]
    if name == "newton-cg-residual":
        Wm = cvxdp.workloads.marginal_workload([2, 3, 4], [(0, 1), (1, 2), (1,)])
        s = cp.Variable(Wm.n_residuals, pos=True)
        prob = cp.Problem(cp.Minimize(cvxdp.privacy_cost(Wm, s)),
                          [cvxdp.query_variance(Wm, s) <= np.array([1.0, 2.0, 0.1])])
        prob.solve(method="cvxdp", solver=cvxdp.NEWTON_CG)
        return prob.solver_stats.extra_stats["info"]
    raise ValueError(f"no example {name!r}")


class InfoKeysDirective(_KeyTable):
    required_arguments = 1
    option_spec = {"also": directives.unchanged}

    def run(self):
        entries = self.documented()
        examples = [self.arguments[0]] + self.options.get("also", "").split()
        seen: set[str] = set()
        for example in examples:
            try:
                info = _example(example)
            except Exception as exc:          # the page still builds; the warning fails -W
                LOGGER.warning("cvxdp-info-keys %s: the example failed: %r", example, exc,
                               location=self.get_location())
                continue
            seen |= set(info)
        required = {k for k, opt, _ in entries if not opt}
        documented = {k for k, _, _ in entries}
        if seen and (seen - documented or required - seen):
            LOGGER.warning("cvxdp-info-keys %s: undocumented keys %s; documented but absent %s",
                           examples, sorted(seen - documented), sorted(required - seen),
                           location=self.get_location())
        return self.render(entries, "info key")


# --------------------------------------------------------------------------- docstrings
_SECTIONS = ("Parameters", "Other Parameters", "Attributes", "Returns", "Yields", "Raises")
_ENTRY = re.compile(r"^(\s*)(\*{0,2}[A-Za-z_]\w*(?:\s*,\s*\*{0,2}[A-Za-z_]\w*)*)\s+:\s+(\S.*)$")
_TYPE_LIKE = re.compile(r"[\w.\[\], |]+?(, optional)?")


def numpy_sections(app, what, name, obj, options, lines) -> None:
    """The project's docstrings write ``name : description`` in their Parameters /
    Attributes sections (the text after the colon is the description, not a type, with
    continuation lines indented).  Rewrite such entries as ``name`` plus an indented
    description, which napoleon reads correctly, and end a section at a blank line followed
    by free text (napoleon would read that text as more entries): it becomes Notes.  Runs
    before napoleon (priority 400 < 500)."""
    out: list[str] = []
    i, section, base, kind = 0, False, 0, ""
    while i < len(lines):
        line = lines[i]
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if line.strip() in _SECTIONS and re.fullmatch(r"\s*-{3,}\s*", nxt):
            section, base, kind = True, len(line) - len(line.lstrip()), line.strip()
            out += [line, nxt]
            i += 2
            continue
        if section and line.strip():
            indent = len(line) - len(line.lstrip())
            m = _ENTRY.match(line)
            if indent == base and m:
                cont = []
                j = i + 1
                while j < len(lines) and lines[j].strip() and \
                        len(lines[j]) - len(lines[j].lstrip()) > base:
                    cont.append(lines[j].strip())
                    j += 1
                text = m.group(3)
                if cont and _TYPE_LIKE.fullmatch(text) and len(text) < 40:
                    out.append(line)          # a real "name : type" entry
                    i += 1
                    continue
                pad = " " * (base + 4)
                # napoleon reads "a, b" as several names only in Parameters sections
                names = [m.group(2)] if "Parameters" in kind else \
                    [n.strip() for n in m.group(2).split(",")]
                for name in names:
                    out += [" " * base + name, pad + text] + [pad + c for c in cont]
                i = j
                continue
            if indent == base and out and not out[-1].strip():
                section = False
                if not re.fullmatch(r"\s*-{3,}\s*", nxt):
                    out += [" " * base + "Notes", " " * base + "-----"]
        out.append(line)
        i += 1
    lines[:] = out


def _balanced_summary(extract):
    """Sphinx's autosummary cuts the first sentence at ". " even inside an inline literal
    (``x[0] <= ... <= x[-1]``) or a parenthesis ("(VLDB 2021, sec. 7)"), leaving an
    unterminated literal or a dangling "(": cut at the first sentence end outside both."""
    def balanced(text: str) -> bool:
        return text.count("``") % 2 == 0 and text.count("(") <= text.count(")")

    def extract_summary(doc, settings):
        summary = extract(doc, settings)
        if balanced(summary):
            return summary
        stanza = []
        for line in doc:
            if not line.strip():
                if stanza:
                    break
                continue
            stanza.append(line.strip())
        text = " ".join(stanza)
        for m in re.finditer(r"\.(\s|$)", text):
            if balanced(text[:m.start() + 1]):
                return text[:m.start() + 1]
        return text
    return extract_summary


# --------------------------------------------------------------------------- API coverage
def check_public_api(app, env) -> None:
    import cvxdp

    objects = env.get_domain("py").objects
    modules = env.get_domain("py").data.get("modules", {})
    missing = [n for n in cvxdp.__all__
               if f"cvxdp.{n}" not in objects and f"cvxdp.{n}" not in modules]
    if missing:
        LOGGER.warning("the API reference does not document cvxdp.%s (in cvxdp.__all__)",
                       ", cvxdp.".join(missing))


def setup(app):
    from sphinx.ext import autosummary

    autosummary.extract_summary = _balanced_summary(autosummary.extract_summary)
    app.connect("autodoc-process-docstring", numpy_sections, priority=400)
    app.add_directive("cvxdp-options", OptionsDirective)
    app.add_directive("cvxdp-shared-options", SharedOptionsDirective)
    app.add_directive("cvxdp-cost-model", CostModelDirective)
    app.add_directive("cvxdp-extra-stats", ExtraStatsDirective)
    app.add_directive("cvxdp-info-keys", InfoKeysDirective)
    app.connect("env-check-consistency", check_public_api)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}

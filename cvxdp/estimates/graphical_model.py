"""The graphical model an estimate over the marginal polytope leaves behind, by attribute name.

After ``solver=cvxdp.MIRROR_DESCENT``, ``constraint.model`` is the mirror-descent model, the
maximum-entropy distribution with its marginals (McKenna, Sheldon, Miklau, ICML 2019,
theorem 1), ``p(x) ∝ exp(sum_k theta_k(x_{C_k}))``, scaled to the total; when the active-set
polish produced the solution (a quadratic loss), it is instead the junction-tree distribution
``prod_C mu_C / prod_S mu_S`` of the polished clique tables, which reproduces the estimated
marginals exactly, empty cells included (no finite ``theta`` does).  It answers marginals on any
attribute set, measured or not, factored queries (appendix B), and samples synthetic records
in the attributes' original values.  The numerics live in :mod:`cvxdp.solvers.marginal.inference`.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Iterable, Sequence

import numpy as np

from ..solvers.marginal.inference import GraphicalModel as _Model
from ..solvers.marginal.junction_tree import JunctionTree

from ..modelling.domain import Domain

__all__ = ["GraphicalModel"]


class GraphicalModel:
    """A junction-tree graphical model over a :class:`Domain`, scaled to ``total`` records."""

    def __init__(self, domain: Domain, tree: JunctionTree, theta: Sequence[np.ndarray],
                 total: float) -> None:
        self.domain = domain
        self._model = _Model(tree, theta, total)

    @classmethod
    def from_clique_tables(cls, domain: Domain, tree: JunctionTree, tables: Sequence[np.ndarray],
                           total: float) -> "GraphicalModel":
        """The junction-tree distribution of consistent clique tables (``tree.cliques`` order)."""
        self = cls.__new__(cls)
        self.domain = domain
        self._model = _Model.from_clique_tables(tree, tables, total)
        return self

    @property
    def theta(self) -> dict[tuple[str, ...], np.ndarray] | None:
        """The log-potentials per measured clique (by attribute names), or ``None`` for a
        model built from polished clique tables (a boundary point no finite theta reaches)."""
        th = self._model.theta
        if th is None:
            return None
        n = self.domain.names
        return {tuple(n[a] for a in f): t for f, t in zip(self._model.tree.factors, th)}

    @property
    def total(self) -> float:
        return float(self._model.total)

    @property
    def cliques(self) -> list[tuple[str, ...]]:
        """The junction tree's cliques, by attribute name."""
        n = self.domain.names
        return [tuple(n[a] for a in c) for c in self._model.tree.cliques]

    def summary(self) -> str:
        return self._model.tree.summary().describe(self.domain.names)

    def marginal(self, attrs: str | Iterable[str]) -> np.ndarray:
        """The estimated counts on ``attrs`` (any attributes, in the order given)."""
        attrs = self.domain.clique(attrs)
        return self._model.marginal([self.domain.index(a) for a in attrs])

    def query(self, factors: Mapping[str, np.ndarray]) -> np.ndarray:
        """Factored query ``(Q_1 ⊗ ... ⊗ Q_d) p`` (appendix B, algorithm 3): ``factors`` maps
        attribute names to matrices with one column per value; other attributes are summed
        out.  Axes of the result follow the domain's attribute order."""
        if not isinstance(factors, Mapping):
            raise TypeError("query: factors must map attribute names to matrices")
        return self._model.query({self.domain.index(self.domain.clique(a)[0]): np.asarray(q, dtype=float)
                                  for a, q in factors.items()})

    def sample(self, n: int, rng=None) -> np.ndarray:
        """``n`` synthetic records as integer codes, one column per attribute (domain order)."""
        return self._model.sample(n, rng)

    def synthetic_data(self, n: int | None = None, rng=None):
        """``n`` synthetic records (default: the rounded total) in the attributes' original
        values: a pandas DataFrame when pandas is installed, else a dict of columns."""
        if n is None:
            n = int(round(self.total))
        codes = self.sample(n, rng)
        cols = {a: self.domain.decode(a, codes[:, i]) for i, a in enumerate(self.domain.names)}
        try:
            import pandas as pd
        except ImportError:
            return cols
        return pd.DataFrame(cols)

"""Attributes, their sizes, and counting a data set into marginals.

A :class:`Domain` is an ordered mapping from attribute names to the number of values each
takes (values are integer codes ``0 .. size-1``).  ``Domain.from_json`` reads the mapping files
used in the graphical-model DP literature (e.g. ``adult-domain.json``)::

    dom = cvxdp.Domain.from_json("adult-domain.json")
    counts = dom.count(data, ("race", "sex"))      # a 5 x 2 array of record counts

``data`` is an integer array with one column per attribute (in domain order) or a pandas
DataFrame whose columns include the attributes.  An attribute may be given by its list of
values instead of its size (``{"sex": ["female", "male"]}``); records are then coded by
position, and synthetic data is decoded back to these values.
"""
from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

__all__ = ["Domain"]


class Domain(Mapping):
    """Ordered attribute names -> sizes (positive integers)."""

    def __init__(self, attributes: Mapping[str, int] | Iterable[tuple[str, int]] | None = None,
                 sizes: Sequence[int] | None = None) -> None:
        if sizes is not None:                          # Domain(names, sizes)
            names = list(attributes)  # type: ignore[arg-type]
            pairs = list(zip(names, sizes))
            if len(names) != len(sizes):
                raise ValueError(f"Domain: {len(names)} names but {len(sizes)} sizes")
        elif isinstance(attributes, Mapping):
            pairs = list(attributes.items())
        else:
            pairs = list(attributes or [])
        self._names: tuple[str, ...] = tuple(str(n) for n, _ in pairs)
        if len(set(self._names)) != len(self._names):
            raise ValueError(f"Domain: attribute names must be distinct, got {self._names}")
        sz = []
        self._labels: dict[str, tuple] = {}
        for n, s in pairs:
            if not isinstance(s, (str, bytes)) and hasattr(s, "__len__"):
                labels = tuple(s)
                if not labels:
                    raise ValueError(f"Domain: attribute {n!r} has no values")
                self._labels[str(n)] = labels
                s = len(labels)
            try:
                f = float(s)
            except (TypeError, ValueError):
                raise TypeError(f"Domain: size of attribute {n!r} must be a positive integer, got {s!r}") from None
            if not math.isfinite(f) or f != int(f) or f < 1:
                raise ValueError(f"Domain: size of attribute {n!r} must be a positive integer, got {s!r}")
            sz.append(int(f))
        self._sizes = tuple(sz)
        self._index = {n: i for i, n in enumerate(self._names)}

    # Mapping protocol
    def __getitem__(self, name: str) -> int:
        try:
            return self._sizes[self._index[name]]
        except KeyError:
            raise KeyError(f"unknown attribute {name!r}; the domain has {list(self._names)}") from None

    def __iter__(self):
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __repr__(self) -> str:
        return "Domain(" + ", ".join(f"{n}: {s}" for n, s in zip(self._names, self._sizes)) + ")"

    def __eq__(self, other: Any) -> bool:
        return (isinstance(other, Domain) and self._names == other._names
                and self._sizes == other._sizes and self._labels == other._labels)

    __hash__ = None  # type: ignore[assignment]

    @property
    def names(self) -> tuple[str, ...]:
        return self._names

    @property
    def sizes(self) -> tuple[int, ...]:
        return self._sizes

    def labels(self, name: str) -> tuple | None:
        """The values of attribute ``name`` if the domain was given them, else ``None``."""
        self[name]
        return self._labels.get(name)

    def decode(self, name: str, codes: np.ndarray) -> np.ndarray:
        """Map integer codes of ``name`` to its values (codes unchanged without labels)."""
        lab = self.labels(name)
        codes = np.asarray(codes)
        return codes if lab is None else np.asarray(lab, dtype=object)[codes]

    @classmethod
    def from_json(cls, path: str | Path) -> "Domain":
        with open(path) as fh:
            return cls(json.load(fh))

    def index(self, name: str) -> int:
        if name not in self._index:
            raise KeyError(f"unknown attribute {name!r}; the domain has {list(self._names)}")
        return self._index[name]

    def clique(self, attrs: str | Iterable[str]) -> tuple[str, ...]:
        """Validate an attribute tuple (a single name is a 1-tuple)."""
        attrs = (attrs,) if isinstance(attrs, str) else tuple(attrs)
        if not attrs:
            raise ValueError("a clique must name at least one attribute")
        unknown = [a for a in attrs if a not in self._index]
        if unknown:
            raise KeyError(f"clique {attrs} names unknown attribute(s) {unknown}; "
                           f"the domain has {list(self._names)}")
        if len(set(attrs)) != len(attrs):
            raise ValueError(f"clique {attrs} repeats an attribute")
        return attrs

    def shape(self, attrs: str | Iterable[str]) -> tuple[int, ...]:
        return tuple(self[a] for a in self.clique(attrs))

    def size(self, attrs: str | Iterable[str] | None = None) -> int:
        """Number of cells of the marginal on ``attrs`` (the whole table if ``None``)."""
        return math.prod(self._sizes if attrs is None else self.shape(attrs))

    def project(self, attrs: str | Iterable[str]) -> "Domain":
        attrs = self.clique(attrs)
        return Domain([(a, self._labels.get(a, self[a])) for a in attrs])

    # ------------------------------------------------------------------ data
    def _codes(self, data, attrs: tuple[str, ...]) -> np.ndarray:
        if hasattr(data, "columns"):                      # pandas DataFrame
            missing = [a for a in attrs if a not in data.columns]
            if missing:
                raise KeyError(f"data has no column(s) {missing}")
            cols = np.column_stack([np.asarray(data[a]) for a in attrs]) if attrs else np.zeros((len(data), 0))
        else:
            arr = np.asarray(data)
            if arr.ndim != 2 or arr.shape[1] != len(self):
                raise ValueError(f"data must be a 2-D array with one column per attribute "
                                 f"({len(self)}), got shape {arr.shape}")
            cols = arr[:, [self._index[a] for a in attrs]]
        if cols.size and not np.issubdtype(cols.dtype, np.integer):
            if not np.all(np.isfinite(cols)) or np.any(cols != np.round(cols)):
                raise ValueError("data must hold integer codes")
            cols = cols.astype(np.int64)
        for j, a in enumerate(attrs):
            c = cols[:, j]
            if c.size and (c.min() < 0 or c.max() >= self[a]):
                raise ValueError(f"data column {a!r} has codes outside 0..{self[a] - 1}")
        return cols

    def count(self, data, attrs: str | Iterable[str]) -> np.ndarray:
        """The contingency table (record counts) of ``data`` on ``attrs``, shaped by their sizes."""
        attrs = self.clique(attrs)
        cols = self._codes(data, attrs)
        flat = np.ravel_multi_index(tuple(cols.T), self.shape(attrs)) if len(cols) else np.zeros(0, int)
        return np.bincount(flat, minlength=self.size(attrs)).reshape(self.shape(attrs)).astype(float)

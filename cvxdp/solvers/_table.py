"""A fixed-width per-iteration table written through :mod:`logging`."""
from __future__ import annotations

import logging

LOGGER = logging.getLogger("cvxdp")


class IterationTable:
    """Formats rows of named numbers under a header, like OSQP/SCS verbose output."""

    def __init__(self, columns: list[tuple[str, str]], enabled: bool) -> None:
        self.columns = columns              # (name, format) pairs
        self.enabled = enabled
        self._header_done = False

    def _emit(self, line: str) -> None:
        LOGGER.info(line)

    def header(self, title: str) -> None:
        if not self.enabled:
            return
        names = " ".join(f"{name:>11s}" for name, _ in self.columns)
        rule = "-" * len(names)
        self._emit(rule)
        self._emit(title)
        self._emit(rule)
        self._emit(names)
        self._header_done = True

    def row(self, values: dict) -> None:
        if not self.enabled:
            return
        cells = []
        for name, fmt in self.columns:
            v = values.get(name)
            cells.append(f"{'':>11s}" if v is None else f"{v:>11{fmt}}")
        self._emit(" ".join(cells))

    def footer(self, text: str) -> None:
        if self.enabled:
            self._emit(text)

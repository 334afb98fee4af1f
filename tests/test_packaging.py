"""Packaging claims what CI checks: the floors in pyproject.toml are the pins CI runs on."""
from __future__ import annotations

import pathlib
import re
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _floors() -> dict[str, str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    out = {}
    for d in deps:
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*>=\s*([^,;\s]+)", d.strip())
        assert m, f"dependency {d!r} has no plain >= floor"
        out[m.group(1).lower()] = m.group(2)
    return out


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / ".ci" / "lowest.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            pins[name.strip().lower()] = version.strip()
    return pins


def test_every_floor_is_pinned_for_the_lowest_ci_run():
    assert _floors() == _pins()


def test_ci_runs_the_suite_on_the_lowest_versions():
    run = (ROOT / ".ci" / "run").read_text()
    assert "-c .ci/lowest.txt" in run and run.count("python -m pytest") == 2


def test_no_build_metadata_is_tracked():
    assert not (ROOT / "cvxdp.egg-info" / "PKG-INFO").exists() or \
        "*.egg-info/" in (ROOT / ".gitignore").read_text()

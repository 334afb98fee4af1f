"""Tutorial 0 (workload strategies) runs end to end in fast mode and writes its figures."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

SCRIPT = Path(__file__).resolve().parents[1] / "tutorials" / "00_workload_strategies.py"
FIGURES = ["strategies_error_vs_n.png", "strategies_branching_factor.png"]


def test_tutorial_00_runs_and_writes_figures(tmp_path):
    env = dict(os.environ, CVXDP_TUTORIAL_FAST="1", CVXDP_TUTORIAL_OUT=str(tmp_path),
               MPLBACKEND="Agg")
    proc = subprocess.run([sys.executable, str(SCRIPT)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"tutorial 00 failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    for name in FIGURES:
        png = tmp_path / name
        assert png.is_file(), f"tutorial 00 did not write {name}; wrote {sorted(os.listdir(tmp_path))}"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the 3-query example's closed forms are printed (8, 2/2/4 and 16/3 per query)
    assert "relative objective gap" in proc.stdout
    assert "5.333" in proc.stdout

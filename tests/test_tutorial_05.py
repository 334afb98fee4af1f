"""Tutorial 5 (constrained inference) runs end to end in fast mode and writes its figures."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

SCRIPT = Path(__file__).resolve().parents[1] / "tutorials" / "05_constrained_inference.py"
FIGURES = ["constrained_tree_consistency.png", "constrained_sorted_histogram.png",
           "constrained_kgram_estimators.png"]


def test_tutorial_05_runs_and_writes_figures(tmp_path):
    env = dict(os.environ, CVXDP_TUTORIAL_FAST="1", CVXDP_TUTORIAL_OUT=str(tmp_path),
               MPLBACKEND="Agg")
    proc = subprocess.run([sys.executable, str(SCRIPT)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"tutorial 05 failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    for name in FIGURES:
        png = tmp_path / name
        assert png.is_file(), f"tutorial 05 did not write {name}; wrote {sorted(os.listdir(tmp_path))}"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = proc.stdout
    assert "relative objective gap" in out
    # the k-gram prefix constraints, given as a plain sparse A @ x == 0, are found to be a forest
    assert "extra_stats['splitting'] = 'separable/tree'" in out

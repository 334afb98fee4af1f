"""The main job, ``python -m cvxdp tour``, in its fast mode."""
import subprocess
import sys

from cvxdp.tour import format_rows, run_tour


def test_tour_rows_agree_with_the_reference():
    rows = run_tour(fast=True)
    assert len(rows) >= 4
    for r in rows:
        assert abs(r.gap) <= 1e-5, (r.problem, r.gap)
        assert r.time > 0 and r.reference_time > 0
    text = format_rows(rows)
    assert "speed-up" in text and "ADMM" in text


def test_tour_command_runs():
    out = subprocess.run([sys.executable, "-m", "cvxdp", "tour", "--fast"], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "hierarchy L1" in out.stdout

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
    assert "speed-up" in text and all(r.method in text for r in rows)


def test_tour_command_runs():
    out = subprocess.run([sys.executable, "-m", "cvxdp", "tour", "--fast"], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "hierarchy L1" in out.stdout


def test_command_line_help_version_and_streaming():
    from cvxdp import __version__
    bare = subprocess.run([sys.executable, "-m", "cvxdp"], capture_output=True, text=True, timeout=120)
    assert bare.returncode == 0 and "tour" in bare.stdout and "CVXDP_ADULT_DIR" in bare.stdout
    helped = subprocess.run([sys.executable, "-m", "cvxdp", "--help"], capture_output=True, text=True,
                            timeout=120)
    assert helped.returncode == 0 and "--fast" in helped.stdout and "minutes" in helped.stdout
    ver = subprocess.run([sys.executable, "-m", "cvxdp", "--version"], capture_output=True, text=True,
                         timeout=120)
    assert ver.returncode == 0 and __version__ in ver.stdout


def test_rows_stream_and_columns_align():
    from cvxdp.tour import format_header, format_row
    seen = []
    rows = run_tour(fast=True, on_row=seen.append)
    assert seen == rows
    width = len(format_header().splitlines()[0])
    assert all(len(format_row(r)) == width for r in rows)
    # solver=None: each row's cvxdp method or Clarabel, as the cost model chose
    assert {r.method for r in rows} <= {"ADMM", "NEWTON_CG", "MIRROR_DESCENT", "CLARABEL"}

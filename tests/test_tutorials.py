"""The tutorials run end to end (fast mode) and write their figures."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

TUTORIALS = Path(__file__).resolve().parents[1] / "tutorials"

CASES = {
    "00_workload_strategies.py": ["strategies_error_vs_n.png", "strategies_branching_factor.png"],
    "01_hierarchical_histogram.py": ["hierarchical_mse_by_range.png"],
    "02_contingency_table.py": ["contingency_mse_vs_epsilon.png", "contingency_zero_vs_nonzero.png"],
    "03_marginal_polytope.py": ["marginals_error_vs_epsilon.png", "marginals_synthetic.png",
                                "marginals_local_polytope.png"],
    "04_fitness_for_use.py": ["fitness_variance_ratios.png", "fitness_identity_total.png"],
    "05_constrained_inference.py": ["constrained_tree_consistency.png",
                                    "constrained_sorted_histogram.png",
                                    "constrained_kgram_estimators.png"],
    "06_national_hierarchy.py": ["national_error_by_level.png"],
    "07_designing_noise.py": ["designing_noise_targets.png"],
    "08_opendp_release.py": ["opendp_release_mse.png"],
    "09_error_bars.py": ["error_bars_intervals.png"],
}
# what each tutorial must print besides the "relative objective gap" line (cvxdp method vs reference)
EXPECTED_OUTPUT = {
    "00_workload_strategies.py": ["5.333"],             # 16/3 per query, the 3-query example
    "03_marginal_polytope.py": ["optimised total (total=None: free", "unmeasured marginals",
                                "unmeasured three-way marginals"],
    "04_fitness_for_use.py": ["same seed, same answers: True", "solved by CVXDP_NEWTON_CG"],
    "05_constrained_inference.py": ["extra_stats['info']['route'] = 'ADMM separable/tree'"],  # k-gram forest
    "06_national_hierarchy.py": ["tree GLS (exact)", "every parent = sum of children: True"],
    "07_designing_noise.py": ["route 'residual Newton-CG'", "mean squared error / designed variance"],
    "08_opendp_release.py": ["route'] = 'ADMM lifted separable/tree'", "MSE ratio"],
    "09_error_bars.py": ["method 'exact'", "bootstrap, 20 draws (0 failed)", "noise= spelling",
                         "coverage of the nominal 90% intervals", "GLS+ relaxed"],
}


def run_tutorial(script: str, out: Path, **extra_env: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, CVXDP_TUTORIAL_FAST="1", CVXDP_TUTORIAL_OUT=str(out), MPLBACKEND="Agg",
               **extra_env)
    return subprocess.run([sys.executable, str(TUTORIALS / script)], env=env, cwd=out,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("script", sorted(CASES))
def test_tutorial_runs_and_writes_figures(script, tmp_path):
    proc = run_tutorial(script, tmp_path)
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    for name in CASES[script]:
        png = tmp_path / name
        assert png.is_file(), f"{script} did not write {name}; wrote {sorted(os.listdir(tmp_path))}"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "relative objective gap" in proc.stdout
    for text in EXPECTED_OUTPUT.get(script, []):
        assert text in proc.stdout, f"{script} did not print {text!r}"


@pytest.mark.parametrize("script", ["02_contingency_table.py", "03_marginal_polytope.py"])
def test_adult_tutorials_fall_back_to_synthetic_data(script, tmp_path):
    """Without the Adult files the tutorial still runs, on synthetic data, and says so."""
    proc = run_tutorial(script, tmp_path, CVXDP_ADULT_DIR=str(tmp_path / "no-such-dir"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "SYNTHETIC" in proc.stdout
    for name in CASES[script]:
        assert (tmp_path / name).is_file()


def test_opendp_tutorial_without_opendp_simulates_and_says_so(tmp_path):
    """An ``opendp`` package that fails to import stands in for a missing one: tutorial 8
    still runs (on simulated releases), writes its figure and says what it skipped."""
    fake = tmp_path / "fake"
    (fake / "opendp").mkdir(parents=True)
    (fake / "opendp" / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    path = os.pathsep.join(p for p in (str(fake), os.environ.get("PYTHONPATH", "")) if p)
    proc = run_tutorial("08_opendp_release.py", tmp_path, PYTHONPATH=path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "opendp is not installed" in proc.stdout and "SIMULATED" in proc.stdout
    assert "SKIPPED: OpenDP's make_consistent_b_ary_tree" in proc.stdout
    assert not any(ln.startswith("OpenDP consistent") for ln in proc.stdout.splitlines())
    assert (tmp_path / "opendp_release_mse.png").is_file()

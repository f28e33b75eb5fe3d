"""The device script (benchmarks/gpu_validation.sh) fits its budget by its own plan and runs end to
end without a GPU, saying which steps it skipped: a device session has 15 minutes, with a margin
for one rerun, and no second chance to find a typo (issue 24)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_validation.sh"


def run(tmp_path, **env) -> subprocess.CompletedProcess:
    environ = {**os.environ, "OUT": str(tmp_path / "out"), "PYTHON": sys.executable, "PYTHONPATH": str(ROOT / "src"),
               "TMPDIR": str(tmp_path), **env}
    return subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=120)


def test_the_script_parses():
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0


def test_the_whole_plan_fits_420_s_with_its_packing_reserve(tmp_path):
    done = run(tmp_path, PLAN_ONLY="1")
    assert done.returncode == 0, done.stderr
    assert "total 390 s + 20 s packing of 420 s" in done.stdout
    assert not (tmp_path / "out").exists()  # a plan runs nothing


@pytest.mark.parametrize("env, words", [({"STEPS": "gil,bogus"}, "unknown step 'bogus'"),
                                        ({"BUDGET_S": "300"}, "does not fit its budget")])
def test_a_plan_that_cannot_run_is_refused_before_anything_runs(tmp_path, env, words):
    done = run(tmp_path, PLAN_ONLY="1", **env)
    assert done.returncode == 2 and words in done.stderr


def test_without_a_gpu_every_step_says_why_and_the_summary_comes_back(tmp_path):
    done = run(tmp_path)
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert done.returncode == 0, done.stderr
    for step in ("run", "gemm", "copies", "context", "gil"):
        assert f"note: {step}: skipped, no CUDA device" in summary
    assert (tmp_path / "out" / "gpu-validation.tar.gz").exists()

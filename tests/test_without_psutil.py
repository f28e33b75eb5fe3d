"""A broken install without psutil still judges captures and reads what facts it can: never a
traceback (psutil is a declared dependency, but environments lose packages)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def env_without_psutil(tmp_path):
    blocker = tmp_path / "psutil"
    blocker.mkdir()
    (blocker / "__init__.py").write_text('raise ImportError("No module named \'psutil\'")\n')
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT / "src")])
    return env


def gpuvet(env, tmp_path, *argv):
    return subprocess.run([sys.executable, "-m", "gpuvet", *argv], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("capture", ["smi_xml/gt-1030-x4-470.74-v11.xml",
                                     "smi_text/q-8x-h100-sxm-vm-swpowercap-535.183.01.txt"])
def test_inspect_needs_no_psutil(env_without_psutil, tmp_path, capture):
    done = gpuvet(env_without_psutil, tmp_path, "inspect", str(FIXTURES / capture))
    assert "Traceback" not in done.stderr and done.returncode in (0, 1), done.stderr
    assert "GPUs:" in done.stdout


def test_run_quick_without_psutil_says_which_facts_it_could_not_read(env_without_psutil, tmp_path):
    done = gpuvet(env_without_psutil, tmp_path, "run", "--quick", "--no-save", "--json")
    assert "Traceback" not in done.stderr and done.returncode in (0, 1), done.stderr
    assert "psutil is not installed" in done.stdout  # the host facts it needed say why they are missing

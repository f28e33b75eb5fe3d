"""A broken install without psutil or nvidia-ml-py (pynvml) still judges captures and reads what
facts it can: never a traceback (both are declared dependencies, but environments lose packages)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"


def env_without(tmp_path: Path, module: str) -> dict[str, str]:
    blocker = tmp_path / "blocked" / module
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text(f'raise ImportError("No module named {module!r}")\n')
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "blocked"), str(ROOT / "src")])
    return env


@pytest.fixture
def env_without_psutil(tmp_path):
    return env_without(tmp_path, "psutil")


@pytest.fixture
def env_without_pynvml(tmp_path):
    return env_without(tmp_path, "pynvml")


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


@pytest.mark.parametrize("capture", ["smi_xml/quadro-p400-418.43.xml", "smi_text/q-h200-mig-vm-590.48.01-idle.txt",
                                     "topo/h100-vm-1gpu-ansi-underline-590.48.01.txt"])
def test_inspect_needs_no_pynvml(env_without_pynvml, tmp_path, capture):
    done = gpuvet(env_without_pynvml, tmp_path, "inspect", str(FIXTURES / capture))
    assert "Traceback" not in done.stderr and done.returncode in (0, 1), done.stderr


def test_run_quick_without_pynvml_says_why_it_sees_no_gpu(env_without_pynvml, tmp_path):
    done = gpuvet(env_without_pynvml, tmp_path, "run", "--quick", "--no-save")
    assert "Traceback" not in done.stderr and done.returncode in (0, 1), done.stderr
    assert "nvidia-ml-py cannot be imported" in done.stdout


def test_the_nvml_replay_without_pynvml_is_one_line_and_exit_2(env_without_pynvml, tmp_path):
    env = {**env_without_pynvml, "GPUVET_NVML_REPLAY": str(FIXTURES / "smi_xml/quadro-p400-418.43.xml")}
    done = gpuvet(env, tmp_path, "run", "--quick", "--no-save")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip() == ("gpuvet: GPUVET_NVML_REPLAY needs nvidia-ml-py (`pip install nvidia-ml-py`): "
                                   "No module named 'pynvml'")


@pytest.fixture
def env_without_rich(tmp_path):
    return env_without(tmp_path, "rich")


@pytest.mark.parametrize("capture", ["smi_xml/quadro-p400-418.43.xml", "smi_text/q-8x-h100-sxm-vm-swpowercap-535.183.01.txt"])
def test_inspect_without_rich_prints_the_report_as_plain_text(env_without_rich, tmp_path, capture):
    done = gpuvet(env_without_rich, tmp_path, "inspect", str(FIXTURES / capture))
    assert "Traceback" not in done.stderr and done.returncode in (0, 1), done.stderr
    assert "GPUs:" in done.stdout and "Problems" in done.stdout or "passed" in done.stdout
    assert "[/" not in done.stdout and "[bold" not in done.stdout  # rich's markup is taken out, not printed


def test_run_quick_without_rich_ends_with_its_verdict(env_without_rich, tmp_path):
    done = gpuvet(env_without_rich, tmp_path, "run", "--quick", "--no-save")
    assert "Traceback" not in done.stderr and done.returncode in (0, 1), done.stderr
    assert done.stdout.rstrip().splitlines()[-1].split(":")[0] in ("PASS", "WARN", "FAIL")


def test_what_only_rich_can_draw_says_so_in_one_line(env_without_rich, tmp_path):
    env = {**env_without_rich, "GPUVET_DB": str(tmp_path / "runs.sqlite3")}
    assert gpuvet(env, tmp_path, "import", str(FIXTURES / "records/cpu-quick.json")).returncode == 0
    assert gpuvet(env, tmp_path, "history", "--json").returncode == 0  # the JSON needs no rich
    for argv in (["watch", "--once"], ["history"]):
        done = gpuvet(env, tmp_path, *argv)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and "rich" in done.stderr


def test_a_watch_log_reports_without_psutil_or_rich(tmp_path):
    log = tmp_path / "watch.jsonl"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "GPUVET_DB": str(tmp_path / "runs.sqlite3")}
    written = gpuvet(env, tmp_path, "watch", "--once", "--no-ui", "--log", str(log))
    assert written.returncode == 0 and log.exists(), written.stderr
    for module in ("psutil", "rich"):
        blocked = env_without(tmp_path / module, module)
        for fmt in ("terminal", "md"):
            done = gpuvet(blocked, tmp_path, "report", str(log), "--format", fmt)
            assert done.returncode in (0, 1) and "Traceback" not in done.stderr, (module, done.stderr)
            assert "watch" in done.stdout.lower()


def test_without_prometheus_client_everything_but_its_exports_runs(tmp_path):
    # The device machines that run benchmarks/gpu_validation.sh have no prometheus_client: the CLI must
    # not need it to start; only --textfile (and watch --prometheus) does.
    from gpuvet.cli.fleet import TEXTFILE_NAME
    from gpuvet.fleet.textfile import FILE_NAME

    assert TEXTFILE_NAME == FILE_NAME
    env = env_without(tmp_path, "prometheus_client")
    capture = str(FIXTURES / "smi_text/q-8x-h100-sxm-vm-swpowercap-535.183.01.txt")
    for argv in (["inspect", capture], ["health", "--no-save", "--from", capture], ["checks"]):
        done = gpuvet(env, tmp_path, *argv)
        assert "Traceback" not in done.stderr and done.returncode in (0, 1), (argv, done.stderr[-1000:])

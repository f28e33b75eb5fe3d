"""Nothing a killed gpuvet leaves in /tmp stays there (issue 30): SIGKILL left a multiprocessing
`pymp-*` folder in /tmp every time (19 of 19), and nothing ever removed it. A gpuvet process now
makes one folder it owns the temp folder of everything it starts; the next gpuvet run removes the
folder of a run that is gone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# A gpuvet process as the console script starts one (main with no argv), stopped right after start,
# that then makes multiprocessing's temp folder (what the CPU feed benchmark's forkserver does)
# and is killed with SIGKILL: no exit handler runs.
KILLED = textwrap.dedent("""
    import multiprocessing.util, os, signal, sys
    from gpuvet.cli import base
    base.start_command = lambda age: None
    base.cli.main = lambda **kwargs: None  # the command itself: none
    base.main()
    print(multiprocessing.util.get_temp_dir(), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
""")


def _run(code: str, tmp: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "TMPDIR": str(tmp)}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_a_killed_runs_temp_folder_is_its_own_and_the_next_run_removes_it(tmp_path):
    killed = _run(KILLED, tmp_path)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    pymp = Path(killed.stdout.strip())
    owned = pymp.parent
    assert pymp.name.startswith("pymp-") and owned.parent == tmp_path and owned.name.startswith("gpuvet-tmp-")
    assert pymp.is_dir() and not list(tmp_path.glob("pymp-*"))  # inside gpuvet's folder, not beside it
    finished = _run(KILLED.replace("os.kill(os.getpid(), signal.SIGKILL)", ""), tmp_path)
    assert finished.returncode == 0, finished.stderr
    assert not owned.exists()  # the dead run's folder, with its pymp-*, is gone
    assert list(tmp_path.iterdir()) == []  # and the finished run removed its own at exit


def test_a_report_write_killed_midway_leaves_a_temporary_file_the_next_write_removes(tmp_path):
    """--out writes through a temporary file renamed over the target; kill -9 in between leaves
    it, named after the dead process, and the next write to that folder removes it."""
    code = textwrap.dedent(f"""
        import os, signal, tempfile
        from gpuvet import private_file
        real = os.replace
        os.replace = lambda a, b: os.kill(os.getpid(), signal.SIGKILL)  # dies just before the rename
        private_file.write_private({str(tmp_path / 'report.md')!r}, "# gpuvet report\\n")
    """)
    killed = _run(code, tmp_path)
    assert killed.returncode == -signal.SIGKILL
    left = list(tmp_path.glob(".gpuvet-out-*"))
    assert len(left) == 1 and not (tmp_path / "report.md").exists()
    from gpuvet.private_file import write_private

    write_private(str(tmp_path / "report.md"), "# gpuvet report\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.md"]

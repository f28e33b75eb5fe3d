import os
import sys
from pathlib import Path

# Tests import the package from the source tree even without `pip install -e .`.
sys.path.insert(0, str(Path(__file__).parent.parent / "src"))
os.environ.setdefault("NO_COLOR", "1")

# Runs made by the tests are stored in a throw-away history, never the user's.
import atexit  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

_HISTORY_DIR = tempfile.mkdtemp(prefix="gpuvet-test-")
os.environ["GPUVET_DB"] = os.path.join(_HISTORY_DIR, "runs.sqlite3")
atexit.register(shutil.rmtree, _HISTORY_DIR, ignore_errors=True)  # no /tmp/gpuvet-test-* left behind


import pytest  # noqa: E402


@pytest.fixture
def empty_path(monkeypatch, tmp_path):
    """Hide fio, iperf3 and every other tool from gpuvet: PATH points at an empty directory,
    so the built-in engines are the ones tested."""
    empty = tmp_path / "empty-path"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))

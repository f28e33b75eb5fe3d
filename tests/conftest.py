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

from cli_runner import restore_ctrl_c  # noqa: E402

# Ctrl-C tests pass however the suite is started: a background job (`nohup ./scripts/test &`)
# starts it with SIGINT ignored, which Python would keep for every test and child.
restore_ctrl_c()


@pytest.fixture
def empty_path(monkeypatch, tmp_path):
    """Hide fio, iperf3 and every other tool from gpuvet: PATH points at an empty directory,
    so the built-in engines are the ones tested."""
    empty = tmp_path / "empty-path"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))


# -- every record the tests make matches the JSON Schema gpuvet ships ------------------------------
# What gpuvet writes (run records as JSON, cluster records, watch-log lines) is collected while a
# test runs and checked against its schema when the test ends.
import json as _json  # noqa: E402

from gpuvet.record.run import RunRecord as _RunRecord  # noqa: E402
from gpuvet.report import cluster_view as _cluster_view  # noqa: E402
from gpuvet.watch.log import WatchLog as _WatchLog  # noqa: E402

_WRITTEN: list[tuple[str, object]] = []


def _collecting(kind, write, parse):
    def wrapper(*args, **kwargs):
        result = write(*args, **kwargs)
        _WRITTEN.append((kind, parse(args, result)))
        return result
    return wrapper


_RunRecord.to_json = _collecting("run", _RunRecord.to_json, lambda args, text: text)
_cluster_view.to_json = _collecting("cluster", _cluster_view.to_json, lambda args, text: text)
_WatchLog._write = _collecting("watch", _WatchLog._write, lambda args, result: args[1])


@pytest.fixture(autouse=True)
def _written_records_match_their_schema():
    from record_schemas import problems

    _WRITTEN.clear()
    yield
    seen, found = set(), []
    for kind, item in _WRITTEN:
        data = _json.loads(item) if isinstance(item, str) else item
        key = (kind, _json.dumps(data, sort_keys=True, default=str)[:100_000])
        if key in seen:
            continue
        seen.add(key)
        found += [f"{kind}: {p}" for p in problems(kind, data)[:3]]
    _WRITTEN.clear()
    assert not found, "a record gpuvet wrote does not match `gpuvet schema`: " + "; ".join(found[:5])

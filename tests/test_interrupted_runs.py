"""Interrupted and killed runs leave nothing behind: cleanup cannot be cut by a second Ctrl-C,
a SIGTERM'd worker removes its scratch, a killed run's folders go at the next run (only
gpuvet's, only this host's, only of a pid that is gone), and servers die with gpuvet."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuvet.bench import leftovers

PREFIX = ".gpuvet-disk-"


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid  # reaped: no process has it (until the kernel reuses it, which takes a while)


def test_a_dead_runs_folder_is_removed_and_nothing_else(tmp_path):
    mine = leftovers.owned_prefix(PREFIX)
    tag = mine.rsplit("@", 1)[1]
    dead = tmp_path / f"{PREFIX}{dead_pid()}@{tag}abcd1234"
    alive = tmp_path / f"{PREFIX}{os.getppid()}@{tag}abcd1234"  # a live process's run
    other_host = tmp_path / f"{PREFIX}{dead_pid()}@00000000-abcd1234"  # a node sharing this file system
    user_folder = tmp_path / ".gpuvet-diskette"
    for folder in (dead, alive, other_host, user_folder):
        folder.mkdir()
        (folder / "seq.bin").write_bytes(b"x" * 1024)
    assert leftovers.sweep_stale(PREFIX, str(tmp_path)) == [str(dead)]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in (alive, other_host, user_folder))


@pytest.mark.parametrize("other_thread", [False, True])
def test_ctrl_c_during_cleanup_waits_until_every_file_is_gone(tmp_path, monkeypatch, other_thread):
    """Also with another thread alive (a run has the telemetry sampler's): the kernel hands a
    process's signal to any thread that does not block it, and Python raises it in the main one."""
    import threading

    stop = threading.Event()
    if other_thread:
        threading.Thread(target=stop.wait, daemon=True).start()
    folder = tmp_path / "scratch"
    folder.mkdir()
    for i in range(50):
        (folder / f"small{i}").write_bytes(b"x")
    real_rmtree = leftovers.shutil.rmtree

    def interrupted_rmtree(path, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)  # the user presses Ctrl-C (again) while files are removed
        real_rmtree(path, **kwargs)

    monkeypatch.setattr(leftovers.shutil, "rmtree", interrupted_rmtree)
    try:
        with pytest.raises(KeyboardInterrupt):
            leftovers.remove(str(folder))  # the held-back signal arrives as the cleanup ends
    finally:
        stop.set()
    assert not folder.exists()


CHILD = """
import sys, time
from gpuvet.bench import leftovers
leftovers.exit_on_sigterm()
with leftovers.scratch_dir("gpuvet-allreduce-", sys.argv[1]) as path:
    open(path + "/rank0.json", "w").write("{}")
    print(path, flush=True)
    time.sleep(600)
"""


def test_a_worker_stopped_by_sigterm_removes_its_scratch_folder(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    folder = Path(child.stdout.readline().strip())
    assert folder.is_dir()
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=60) == 143
    assert list(tmp_path.iterdir()) == []


SERVER_PARENT = """
import subprocess, sys, time
from gpuvet.bench.leftovers import die_with_parent
server = subprocess.Popen(["sleep", "600"], preexec_fn=die_with_parent())
print(server.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_server_gpuvet_started_dies_when_gpuvet_is_killed_with_sigkill():
    parent = subprocess.Popen([sys.executable, "-c", SERVER_PARENT], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    server_pid = int(parent.stdout.readline())
    parent.kill()
    parent.wait(timeout=30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _running(server_pid):
        time.sleep(0.05)
    assert not _running(server_pid)


def _running(pid: int) -> bool:
    """Alive and not a zombie waiting for init to reap it."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_signals_wait_while_a_worker_process_starts():
    with pytest.raises(KeyboardInterrupt):
        with leftovers.signals_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            started = True  # not interrupted inside: a child's pickled job is never cut
    assert started


def test_a_sustained_load_on_a_contended_cpu_ends_on_time_with_windows_to_judge(monkeypatch):
    """A contended CPU makes each matmul far slower than the calibration said (the 2 s load once
    took 19 s): each window and the load still end on time."""
    import torch

    from gpuvet.bench import sustained
    from gpuvet.bench.common import BenchContext, Budget

    real_mm = torch.mm
    calls = {"n": 0}

    def contended_mm(a, b, out=None):
        calls["n"] += 1
        if calls["n"] > 4:  # after the calibration the machine gets busy: each call takes 50 ms of wall time
            begun = time.perf_counter()
            while time.perf_counter() - begun < 0.05:
                pass
        return real_mm(a, b, out=out)

    monkeypatch.setattr(sustained.torch, "mm", contended_mm)
    ctx = BenchContext(device="cpu", subject="cpu", budget=Budget(10), params={"duration_s": 1.0, "size": 256})
    start = time.monotonic()
    results = sustained.run(ctx)
    assert time.monotonic() - start < 1.0 + 2.0  # the load, plus set-up and one slowed call at most
    assert len(ctx.series[0]["rows"]) >= 2 and results[0]["value"] > 0

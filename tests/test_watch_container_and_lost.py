"""`gpuvet watch` in a container (NVML lists host pids the container cannot see) and with a GPU that
falls off the bus mid-watch (NVML answers NVML_ERROR_GPU_IS_LOST from then on).

Driven like tests/test_watch.py: test_telemetry's stand-in NVML, a hand-moved clock, tick by tick.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pynvml
import pytest
from rich.console import Console

from gpuvet.watch import exporter as ex
from gpuvet import watch as w
from gpuvet.facts import Host
from gpuvet.watch.loop import _Outputs
from gpuvet.watch.processes import parse_nspid
from test_exporter import _samples
from test_watch import NOT_HERE_PID, _Clock, _machine, _ticks, _two_gpus

LOST_TEXT = ("lost: GPU fell off the bus (NVML: GPU is lost): check `nvidia-smi`, `dmesg | grep -i xid`; "
             "the job on it has failed or will")


def _in_a_container(count: int = 2):
    machine = _machine(count)
    machine.host = Host(hostname="test-node", container="docker")
    return machine


def _render(snap: w.Snapshot, width: int = 220) -> str:
    console = Console(record=True, width=width, file=io.StringIO(), color_system=None)
    console.print(w.render(snap))
    return console.export_text()


# -- a container: NVML's pids are the host's ---------------------------------------------------------

def test_followed_job_in_a_container_is_not_blamed_on_a_neighbour(monkeypatch):
    # Both GPUs list processes under pids this container does not have (the job's own, as the host
    # numbers them): the GPUs are diagnosed on their readings, and the job's line takes them as maybe its.
    _two_gpus(monkeypatch, gpu0_pids=[NOT_HERE_PID], gpu1_pids=[NOT_HERE_PID + 1])
    clock = _Clock()
    m = w.Monitor(interval_s=1.0, pid=os.getpid(), machine=_in_a_container(), threaded=False, clock=clock)
    m.start()
    try:
        snap = _ticks(m, clock, 3)
    finally:
        m.close()
    g0, g1 = snap.gpus
    unseen = "processes NVML lists are not visible in this container (PID namespace): they may be yours"
    assert g0.diagnosis.state == "thermal" and g0.diagnosis.text.endswith(unseen)
    assert g1.diagnosis.state != "neighbour" and g1.diagnosis.text.endswith(unseen) and "--pid" not in g1.diagnosis.text
    assert snap.job.gpus == [] and snap.job.maybe_gpus == [0, 1]
    job = snap.job_diagnosis
    assert job.state == "thermal" and job.text.startswith("thermal: maybe GPUs 0, 1 (the worst: GPU 0): util 99%")
    assert "none of its processes holds a GPU" not in job.text
    text = _render(snap)
    assert "GPUs maybe 0, 1 (this container cannot see whose processes are on them)" in text
    assert "neighbour" not in text and "follow it with --pid" not in text


def test_a_host_pid_is_mapped_to_the_jobs_process_where_nspid_lists_it(monkeypatch):
    # Where /proc shows the pids a process has in the other PID namespaces (NSpid), NVML's host pid
    # is matched to the job's own process. SYNTHETIC NSpid: this process as host pid NOT_HERE_PID.
    _two_gpus(monkeypatch, gpu0_pids=[NOT_HERE_PID], gpu1_pids=[])
    clock = _Clock()
    m = w.Monitor(interval_s=1.0, pid=os.getpid(), machine=_in_a_container(), threaded=False, clock=clock)
    me = os.getpid()
    monkeypatch.setattr(m.host_reader.processes, "ns_pids", lambda pid: (pid, NOT_HERE_PID) if pid == me else (pid,))
    m.start()
    try:
        snap = _ticks(m, clock, 3)
    finally:
        m.close()
    (p,) = snap.gpus[0].extras.processes
    assert (p.pid, p.host_pid, p.visible, p.in_job) == (me, NOT_HERE_PID, True, True)
    assert snap.job.gpus == [0] and snap.job_diagnosis.text.startswith("thermal: GPU 0: ")
    assert f"{me} " in _render(snap) and f"(host pid {NOT_HERE_PID})" in _render(snap)


def test_nspid_lines_of_proc_status():
    assert parse_nspid("Name:\tpython\nNSpid:\t48213\t17\nNSpgid:\t48213\t17\n") == (48213, 17)
    assert parse_nspid("Name:\tpython\nPid:\t5\n") is None  # kernels before 4.1
    assert parse_nspid(Path("/proc/self/status").read_text())[0] == os.getpid()  # this /proc's own number first


# -- a GPU that falls off the bus ---------------------------------------------------------------------

def _lose(monkeypatch, handle: str) -> None:
    """From now on every NVML call on `handle` fails with NVML_ERROR_GPU_IS_LOST, as a GPU that fell
    off the bus answers (Xid 79)."""
    for name in dir(pynvml):
        if name.startswith("nvmlDevice") and name != "nvmlDeviceGetHandleByIndex":
            answer = getattr(pynvml, name)

            def call(h=None, *args, _answer=answer):
                if h == handle:
                    raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
                return _answer(h, *args)

            monkeypatch.setattr(pynvml, name, call)


@pytest.fixture
def lost_midway(monkeypatch, tmp_path):
    """Three seconds of _two_gpus, then gpu1 falls off the bus, then three more seconds; logged."""
    _two_gpus(monkeypatch, gpu1_pids=[os.getpid()])
    clock = _Clock()
    m = w.Monitor(interval_s=1.0, machine=_machine(), threaded=False, clock=clock)
    m.start()
    path = tmp_path / "watch.jsonl"
    changes: list[str] = []
    outputs = _Outputs(log=w.WatchLog(str(path), 1.0, sorted(m._facts.items()), m.hostname), print_changes=changes.append)
    try:
        for _ in range(3):
            clock.now += 1.0
            outputs.publish(m.tick())
        before = m.tick()
        _lose(monkeypatch, "h1")
        for _ in range(3):
            clock.now += 1.0
            snap = m.tick()
            outputs.publish(snap)
    finally:
        outputs.close()
        m.close()
    return before, snap, path, changes


def test_a_gpu_lost_mid_watch_says_so_everywhere(lost_midway):
    before, snap, path, changes = lost_midway
    assert before.gpus[1].diagnosis.state != "lost"
    g0, g1 = snap.gpus
    assert g1.diagnosis.text == LOST_TEXT and g0.diagnosis.state == "thermal"  # the other GPU goes on
    assert g1.sample.power_w is None and g1.extras.unavailable["gone"] == "NVML: GPU is lost"
    # the view
    text = _render(snap)
    assert "no readings: NVML can no longer reach this GPU" in text and f"→ {LOST_TEXT}" in text
    # --once --json
    data = json.loads(json.dumps(w.snapshot_to_dict(snap), allow_nan=False))
    assert data["gpus"][1]["diagnosis"]["state"] == "lost"
    assert data["gpus"][1]["diagnosis"]["evidence"] == {"nvml_error": "NVML: GPU is lost"}
    # headless change lines and the log
    assert changes[-1].endswith(f" gpu1 {LOST_TEXT}")
    (gpu1,) = [s for s in w.read_log(str(path)) if s["name"] == "watch.diagnosis" and s["subject"] == "gpu1"]
    assert gpu1["rows"][-1][1:] == ["lost", LOST_TEXT]


def test_a_gpu_lost_mid_watch_on_metrics(lost_midway):
    _, snap, _, _ = lost_midway
    exporter = ex.Exporter()
    exporter.update(snap)
    samples = _samples(exporter.text())
    (up,) = samples["gpuvet_gpu_telemetry_up"]
    assert up.value == 0 and up.labels["reason"] == "GPU 1 lost (NVML: GPU is lost)"
    states = {(s.labels["gpu"], s.labels["state"]): s.value for s in samples["gpuvet_diagnosis"]}
    assert states[("1", "lost")] == 1 and states[("0", "lost")] == 0
    assert [s.labels["gpu"] for s in samples["DCGM_FI_DEV_POWER_USAGE"]] == ["0"]  # no stale reading of the lost GPU


def test_a_gpu_lost_mid_watch_fails_the_report_of_its_log(lost_midway):
    from gpuvet import runner

    _, _, path, _ = lost_midway
    record = runner.load_watch_log(str(path))
    (lost,) = [f for f in record.findings if f.check == "watch.lost"]
    assert (lost.subject, lost.status) == ("gpu1", "fail") and record.verdict == "fail"

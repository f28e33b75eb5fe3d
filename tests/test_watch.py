"""`gpuvet watch`: the loop driven with a stand-in NVML, the log, --once --json on this machine (no
GPU), following a real process tree, and the live view in a real terminal (tmux).

The stand-in NVML is test_telemetry's: it answers per GPU handle and refuses the rest the way NVML
does. The loop is driven tick by tick (threaded=False) with a hand-moved clock, so nothing here waits
for a sampler thread; the tmux test waits for what the screen shows, with deadlines, never a fixed sleep.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import time
import types
from pathlib import Path

import psutil
import pynvml
import pytest
from rich.console import Console

from gpuvet import watch as w
from gpuvet.facts import Gpu, Host, Machine, NvLink
from gpuvet.telemetry import COLUMNS
from gpuvet.watch.keys import Keys, NoStream
from gpuvet.watch.loop import _Outputs
from test_telemetry import _healthy_gpu_answers, _NvmlStandIn

SRC = Path(__file__).resolve().parents[1] / "src"
NOT_HERE_PID = 4_000_000  # above Linux's pid_max: no process here has it


def _proc(pid: int, mib: int):
    return types.SimpleNamespace(pid=pid, usedGpuMemory=mib * 2**20)


def _two_gpus(monkeypatch, gpu0_pids: list[int] | None = None, gpu1_pids: list[int] | None = None) -> _NvmlStandIn:
    """gpu0: this test's own process, HW thermal slowdown flagged; gpu1: 12 GiB used by a process
    this machine does not have (another container's), no reason flagged."""
    gpu0_pids = [os.getpid()] if gpu0_pids is None else gpu0_pids
    gpu1_pids = [NOT_HERE_PID] if gpu1_pids is None else gpu1_pids
    procs = {"h0": [_proc(pid, 3072) for pid in gpu0_pids], "h1": [_proc(pid, 9216) for pid in gpu1_pids]}
    used = {"h0": 3 * 2**30, "h1": 12 * 2**30}
    answers = _healthy_gpu_answers(
        nvmlDeviceGetCount=2,
        nvmlDeviceGetCurrentClocksEventReasons=lambda h: 0x44 if h == "h0" else 0x0,
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(total=80 * 2**30, used=used[h], free=0),
        nvmlDeviceGetComputeRunningProcesses=lambda h: procs[h],
        nvmlDeviceGetPcieThroughput=lambda h, counter: {pynvml.NVML_PCIE_UTIL_TX_BYTES: 1500,
                                                        pynvml.NVML_PCIE_UTIL_RX_BYTES: 300}[counter],
        nvmlSystemGetProcessName=lambda pid: psutil.Process(pid).name() if psutil.pid_exists(pid) else "train.py",
    )
    return _NvmlStandIn(monkeypatch, answers)


def _machine(count: int = 2) -> Machine:
    gpus = []
    for i in range(count):
        gpu = Gpu(index=i, name="NVIDIA H100 80GB HBM3", uuid=f"GPU-0000000{i}", memory_total_mib=81559)
        gpu.pcie.bus_id = f"0000:0{i}:00.0"
        gpu.clocks.max_sm_mhz = 1980
        gpu.power.default_limit_w = gpu.power.enforced_limit_w = 700.0
        gpu.thermal.slowdown_c = 88.0
        gpus.append(gpu)
    return Machine(gpus=gpus, host=Host(hostname="test-node"))


class _Clock:
    """Monotonic seconds moved by hand: each tick() is a second later, so the once-a-second readings run."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _ticks(monitor: w.Monitor, clock: _Clock, n: int) -> w.Snapshot:
    snap = None
    for _ in range(n):
        clock.now += 1.0
        snap = monitor.tick()
    return snap


@pytest.fixture
def monitor(monkeypatch):
    nvml = _two_gpus(monkeypatch)
    clock = _Clock()
    m = w.Monitor(interval_s=1.0, machine=_machine(), threaded=False, clock=clock)
    m.start()
    yield m, clock, nvml
    m.close()


def test_ticks_give_gpu_blocks_with_readings_processes_and_diagnosis(monitor):
    m, clock, _ = monitor
    snap = _ticks(m, clock, 4)
    assert snap.tick == 4 and snap.gpu_error is None and [g.index for g in snap.gpus] == [0, 1]
    g0, g1 = snap.gpus
    assert (g0.sample.sm_mhz, g0.sample.power_w, g0.sample.reasons) == (1980, 612.345, 0x44)
    assert g0.sm_ratio == 1.0 and round(g0.power_ratio, 3) == 0.875 and g0.slowdown_margin_c == 17.0
    assert g0.reasons == ["sw_power_cap", "hw_thermal_slowdown"]
    assert (g0.extras.pcie_tx_kbs, g0.extras.pcie_rx_kbs) == (1500, 300)
    (mine,) = g0.extras.processes
    assert mine.pid == os.getpid() and mine.visible and mine.user == psutil.Process().username()
    (theirs,) = g1.extras.processes
    assert theirs.pid == NOT_HERE_PID and not theirs.visible and theirs.user is None
    assert g0.diagnosis.state == "thermal" and "HW thermal slowdown active" in g0.diagnosis.text
    assert g1.diagnosis.text == "neighbour: 99% utilization and 12.0 GiB in use by processes you cannot see"
    assert snap.host is not None and snap.host.cpu_count == psutil.cpu_count() and snap.host.mem_total_bytes > 0


def test_the_view_shows_each_block(monitor):
    m, clock, _ = monitor
    snap = _ticks(m, clock, 3)
    console = Console(record=True, width=160, file=io.StringIO(), color_system=None)
    console.print(w.render(snap))
    text = console.export_text()
    assert "gpuvet watch · test-node · 2 GPU(s) · every 1 s · tick 3" in text
    assert "GPU 0  NVIDIA H100 80GB HBM3  0000:00:00.0" in text
    assert "SM 1980 MHz = 100% of 1980 max" in text
    assert "612 W = 87% of the 700 W limit" in text and "71 C, 17 C to slowdown" in text
    assert "reasons  0x44 = sw_power_cap | hw_thermal_slowdown" in text
    assert "PCIe Gen5 x16 tx 1.5 MB/s rx 300.0 kB/s" in text
    assert f"{NOT_HERE_PID} ? train.py 9.0 GiB (not visible here)" in text
    assert "→ neighbour: 99% utilization and 12.0 GiB" in text
    assert "host test-node" in text and "steal" in text and "iowait" in text


def _many_gpus(monkeypatch, count: int) -> w.Snapshot:
    """`count` GPUs like gpu0 of _two_gpus (this test's process on each, HW thermal slowdown flagged)."""
    _NvmlStandIn(monkeypatch, _healthy_gpu_answers(
        nvmlDeviceGetCount=count, nvmlDeviceGetComputeRunningProcesses=lambda h: [_proc(os.getpid(), 3072)],
        nvmlSystemGetProcessName=lambda pid: psutil.Process(pid).name()))
    clock = _Clock()
    m = w.Monitor(interval_s=1.0, machine=_machine(count), threaded=False, clock=clock)
    m.start()
    try:
        return _ticks(m, clock, 3)
    finally:
        m.close()


def _screen(snap: w.Snapshot, width: int, height: int) -> list[str]:
    """The rows a full-screen terminal of width x height shows (rich Live draws the view in a Screen)."""
    from rich.screen import Screen

    console = Console(record=True, width=width, height=height, file=io.StringIO(), color_system=None)
    console.print(Screen(w.render(snap, screen=True)))
    return console.export_text().splitlines()


@pytest.mark.parametrize("gpus, width, height", [(8, 150, 50), (3, 100, 24), (2, 80, 14)])
def test_a_screen_too_short_for_the_blocks_gets_a_compact_view_with_every_gpu_and_the_host(monkeypatch, gpus, width, height):
    rows = _screen(_many_gpus(monkeypatch, gpus), width, height)
    assert len(rows) == height
    text = "\n".join(rows)
    assert "GPUs · compact: enlarge the window for the full view" in text
    assert "util    SM/max  power/limit  temp  margin  memory        reasons" in text
    gpu_rows = [r for r in rows if r.startswith("GPU ")]
    assert [r.split()[1] for r in gpu_rows] == [str(i) for i in range(gpus)]
    assert gpu_rows[0].startswith("GPU 0   99%      100%          87%  71 C    17 C  3.0/80 GiB    sw_power_cap |")
    assert text.count("  → thermal: util 99%, SM clock at 100% of max") == gpus
    assert "host test-node" in text and "  cpu " in text and "  workers " in text  # the whole host block
    assert "more GPUs" not in text


def test_gpus_that_do_not_fit_even_compact_are_counted_not_dropped(monkeypatch):
    rows = _screen(_many_gpus(monkeypatch, 16), 100, 20)
    assert len(rows) == 20
    gpu_rows = [r for r in rows if r.startswith("GPU ")]
    assert len(gpu_rows) == 12 and all("→ thermal" in r for r in gpu_rows)  # one row each, diagnosis inline
    assert "  +4 more GPUs (enlarge the window): thermal ×4" in [r.rstrip() for r in rows]
    assert rows[-4].startswith("host test-node") and rows[-1].startswith("  workers ")


def test_the_full_view_when_it_fits_and_a_print_never_fits(monkeypatch):
    snap = _many_gpus(monkeypatch, 2)
    text = "\n".join(_screen(snap, 160, 50))
    assert "compact" not in text and "  procs    " in text and "  reasons  0x44 = " in text
    console = Console(record=True, width=100, height=10, file=io.StringIO(), color_system=None)
    console.print(w.render(snap))  # --once: printed whole, however short the terminal
    printed = console.export_text()
    assert "compact" not in printed and printed.count("  procs    ") == 2


def _cells(console: Console, renderable, width: int) -> list[list[tuple[str, object]]]:
    """What a screen shows: per line, each character with its style (no style and the null style alike)."""
    lines = console.render_lines(renderable, console.options.update(width=width), pad=False)
    return [[(ch, seg.style or None) for seg in line for ch in seg.text] for line in lines]


def test_the_views_own_line_drawing_looks_exactly_like_rich_text(monitor):
    """The view turns most lines into Segments itself (rich Text per line cost ~1 ms per GPU block
    a frame): each line must look as rich draws the Text it stands for, cut with "…", cropped or
    wrapped, with wide and combining characters, tabs and control characters, at any width."""
    from rich.console import Group

    from gpuvet.judge.diagnose import Diagnosis
    from gpuvet.watch import view

    m, clock, _ = monitor
    snap = _ticks(m, clock, 3)
    lines = list(w.render(snap).lines) + [
        view._row("procs", ("123 alice 名前テスト 1.0 GiB", ""),
                  ("  ·  9 ? e\u0301cole 2.0 GiB (not visible here)", "red")),
        view._row("command", ("python train.py\t--lr 0.1\nsecond line \x07bell", "")),
        view._row("", ("x" * 50, "dim"), ("y" * 50, ""), ("z" * 50, "yellow")),
        view._title("GPU 7  " + "名" * 40 + "  0000:07:00.0", "cyan"),
        view._diagnosis_line(Diagnosis("thermal", "util 100% but SM clock at 62% of max " * 4, {}, ("power_capped", "slowing"))),
    ]
    console = Console(file=io.StringIO(), width=160, force_terminal=True, color_system="truecolor")
    for width in (1, 2, 7, 40, 61, 80, 150, 160, 400):
        for _ in range(2):  # the second time, lines rich had to draw come from the view's cache
            as_rich = Group(*[line.to_text() for line in lines])
            assert _cells(console, view._Frame(lines), width) == _cells(console, as_rich, width), width


def test_reads_once_a_second_whatever_the_tick_rate(monkeypatch):
    nvml = _two_gpus(monkeypatch)
    clock = _Clock()
    m = w.Monitor(interval_s=0.1, machine=_machine(), threaded=False, clock=clock)
    m.start()
    try:
        for _ in range(20):  # two seconds at 10 Hz
            clock.now += 0.1
            m.tick()
    finally:
        m.close()
    assert nvml.calls["nvmlDeviceGetPowerUsage"] == 2 * 21  # every tick and at start, both GPUs
    assert nvml.calls["nvmlDeviceGetPcieThroughput"] == 2 * 2 * 2  # tx and rx, both GPUs, once a second


def test_nvlink_throughput_is_a_rate_of_nvmls_counters(monkeypatch):
    _two_gpus(monkeypatch)
    kib = {"n": 0}

    def field_values(handle, fields):  # cumulative KiB per (field, link): +1000 KiB per NVLink reading
        if all(isinstance(f, tuple) for f in fields):  # (field, link) pairs; other fields (memory temp) leave it
            kib["n"] += 1000
        return [types.SimpleNamespace(nvmlReturn=pynvml.NVML_SUCCESS, value=types.SimpleNamespace(ullVal=kib["n"]))
                for _ in fields]

    monkeypatch.setattr(pynvml, "nvmlDeviceGetFieldValues", field_values)
    machine = _machine()
    machine.gpus[0].nvlinks = [NvLink(link=0, active=True), NvLink(link=1, active=True), NvLink(link=2, active=False)]
    clock = _Clock()
    m = w.Monitor(interval_s=1.0, machine=machine, threaded=False, clock=clock)
    m.start()
    try:
        first = _ticks(m, clock, 1).gpus[0].extras
        second = _ticks(m, clock, 1).gpus[0].extras
    finally:
        m.close()
    assert first.nvlink_tx_bps is None  # one reading is no rate
    assert second.nvlink_tx_bps == second.nvlink_rx_bps == 2 * 1000 * 1024  # two active links, 1000 KiB/s each
    assert "nvlink" not in second.unavailable


def test_pcie_and_nvlink_readings_nvml_cannot_give_say_why(monkeypatch):
    answers = _healthy_gpu_answers(nvmlDeviceGetCount=2)  # no nvmlDeviceGetPcieThroughput: NVML refuses it
    _NvmlStandIn(monkeypatch, answers)
    machine = _machine()
    machine.gpus[1].nvlinks = []  # listed at start: no link active
    clock = _Clock()
    m = w.Monitor(interval_s=1.0, machine=machine, threaded=False, clock=clock)
    m.start()
    try:
        snap = _ticks(m, clock, 2)
    finally:
        m.close()
    console = Console(record=True, width=200, file=io.StringIO(), color_system=None)
    console.print(w.render(snap))
    memory = [line for line in console.export_text().splitlines() if line.startswith("  memory   3.0 GiB")]
    assert memory[0].endswith("PCIe Gen5 x16 throughput n/a (not supported on this GPU or driver)   "
                              "NVLink n/a (links not listed: not read at start)")
    assert memory[1].endswith("NVLink none active")


def test_the_first_host_reading_is_a_baseline_not_a_share_of_start_up():
    reader = w.HostReader()
    reader.scan(None)
    first = reader.read([])
    assert first.cpu_pct is None and first.steal_pct is None and first.disk_read_bps is None and first.net_rx_bps is None
    _cpu_counters_move()
    second = reader.read([])
    assert second.cpu_pct is not None and 0 <= second.cpu_pct <= 100


def test_log_has_a_header_and_rows_in_the_to_series_columns(monitor, tmp_path):
    m, clock, _ = monitor
    path = tmp_path / "watch.jsonl"
    log = w.WatchLog(str(path), 1.0, sorted(m._facts.items()), m.hostname)
    for _ in range(3):
        clock.now += 1.0
        log.write(m.tick())
    log.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    header = lines[0]
    assert header["schema"] == w.LOG_SCHEMA and header["kind"] == "header"
    assert header["series"]["gpu0"]["columns"] == list(COLUMNS) and "telemetry.to_series" in header["note"]
    series = {(s["subject"], s["name"]): s for s in w.read_log(str(path))}
    gpu0 = series[("gpu0", "watch.telemetry")]
    assert gpu0["columns"] == list(COLUMNS) and len(gpu0["rows"]) == 3
    assert [row[COLUMNS.index("power_w")] for row in gpu0["rows"]] == [612.345] * 3
    times = [row[0] for row in gpu0["rows"]]
    assert times == sorted(times) and times[0] >= 0
    host = series[("host", "watch.host")]
    assert host["columns"] == list(w.HOST_COLUMNS) and len(host["rows"]) == 3
    diagnosis = series[("gpu1", "watch.diagnosis")]
    assert diagnosis["rows"][0][1] == "neighbour" and len(diagnosis["rows"]) == 1  # changes only


def write_log(monkeypatch, path: Path, ticks: int = 4, pid: int | None = None) -> Path:
    """A watch log of _two_gpus (gpu0 thermal, gpu1 a neighbour's), `ticks` seconds of a hand-moved
    clock; readings carry the wall clock of the test (the sampler's own t)."""
    _two_gpus(monkeypatch)
    clock = _Clock()
    m = w.Monitor(interval_s=1.0, pid=pid, machine=_machine(), threaded=False, clock=clock)
    m.start()
    log = w.WatchLog(str(path), 1.0, sorted(m._facts.items()), m.hostname, job_pid=pid, driver_version="550.54.15",
                     host=Host(hostname="test-node", cpu_model="AMD EPYC 9654", cpu_logical_cores=192))
    try:
        for _ in range(ticks):
            _cpu_counters_move()  # so each host row has CPU shares
            clock.now += 1.0
            log.write(m.tick())
    finally:
        log.close()
        m.close()
    return path


def _cpu_counters_move() -> None:
    """Until the kernel's CPU counters tick (10 ms): a share needs time to divide, not a duration."""
    before, deadline = psutil.cpu_times(), time.monotonic() + 10
    while psutil.cpu_times() == before and time.monotonic() < deadline:
        pass


def test_log_header_has_the_gpus_facts_and_the_job_has_rows(monkeypatch, tmp_path):
    path = write_log(monkeypatch, tmp_path / "watch.jsonl", pid=os.getpid())
    header = json.loads(path.read_text().splitlines()[0])
    assert header["driver_version"] == "550.54.15" and header["series"]["host"]["facts"]["cpu_logical_cores"] == 192
    facts = header["series"]["gpu0"]["facts"]
    assert (facts["name"], facts["max_sm_mhz"], facts["slowdown_c"], facts["power_limit_w"], facts["default_power_limit_w"]) == \
        ("NVIDIA H100 80GB HBM3", 1980, 88.0, 700.0, 700.0)
    (job,) = [s for s in w.read_log(str(path)) if s["name"] == "watch.job"]
    assert job["columns"] == list(w.JOB_COLUMNS) and len(job["rows"]) == 4
    # alive, this process and whatever children earlier tests left it, on gpu0
    family = 1 + len(psutil.Process().children(recursive=True))
    assert job["rows"][-1][1:3] == [True, family] and job["rows"][-1][-1] == "0"


def test_a_watch_log_becomes_a_record_with_its_gpus_time_and_findings(monkeypatch, tmp_path):
    from gpuvet import runner

    record = runner.load_watch_log(str(write_log(monkeypatch, tmp_path / "watch.jsonl")))
    assert record.options == {"profile": "watch", "log": str(tmp_path / "watch.jsonl")}  # how renderers tell a watch log
    assert [(g.index, g.name, g.clocks.max_sm_mhz, g.thermal.slowdown_c, g.power.default_limit_w) for g in record.machine.gpus] == \
        [(0, "NVIDIA H100 80GB HBM3", 1980, 88.0, 700.0), (1, "NVIDIA H100 80GB HBM3", 1980, 88.0, 700.0)]
    assert record.machine.host.cpu_model == "AMD EPYC 9654" and record.machine.driver.version == "550.54.15"
    assert record.duration_s > 0
    found = {(f.subject, f.check): f for f in record.findings}
    assert set(found) == {("gpu0", "watch.thermal"), ("gpu1", "watch.neighbour")}
    thermal = found[("gpu0", "watch.thermal")]
    assert thermal.status == "fail" and thermal.summary.startswith("thermal 100% of the watched time (")
    assert "HW thermal slowdown active" in thermal.evidence.measured and "nvidia-smi -q -d PERFORMANCE" in thermal.remedy
    assert found[("gpu1", "watch.neighbour")].status == "warn"
    assert record.verdict == "fail"


def test_an_older_log_without_the_header_facts_still_loads(monkeypatch, tmp_path):
    """SYNTHETIC: a log written now, its header cut back to what logs had before the facts were added."""
    from gpuvet import runner

    path = write_log(monkeypatch, tmp_path / "watch.jsonl")
    lines = path.read_text().splitlines()
    header = json.loads(lines[0])
    for key in ("driver_version", "gpu_error"):
        del header[key]
    del header["series"]["host"]["facts"]
    for subject in ("gpu0", "gpu1"):
        del header["series"][subject]["facts"]
    path.write_text("\n".join([json.dumps(header)] + lines[1:]) + "\n")
    record = runner.load_watch_log(str(path))
    assert [(g.name, g.clocks.max_sm_mhz) for g in record.machine.gpus] == [("NVIDIA H100 80GB HBM3", None)] * 2
    assert {f.check for f in record.findings} == {"watch.thermal", "watch.neighbour"}


def test_the_loop_runs_ticks_and_appends_a_second_session(monkeypatch, tmp_path):
    _two_gpus(monkeypatch)
    path = tmp_path / "watch.jsonl"
    for session in range(2):
        m = w.Monitor(interval_s=0.05, machine=_machine(), threaded=False)
        m.start()
        outputs = _Outputs(log=w.WatchLog(str(path), 0.05, sorted(m._facts.items()), m.hostname))
        try:
            w.run_loop(m, outputs, None, Keys(NoStream()), max_ticks=3)
        finally:
            outputs.close()
            m.close()
    series = w.read_log(str(path))
    telemetry = [s for s in series if s["name"] == "watch.telemetry" and s["subject"] == "gpu0"]
    assert len(telemetry) == 2 and [len(s["rows"]) for s in telemetry] == [3, 3]
    assert w.WatchLog.check_path(str(path)) is None  # a watch log may be appended to


def test_log_refuses_a_file_that_is_not_a_watch_log(tmp_path):
    precious = tmp_path / "train.py"
    precious.write_text("print('my model')\n")
    assert "not a gpuvet watch log" in w.WatchLog.check_path(str(precious))
    assert "does not exist" in w.WatchLog.check_path(str(tmp_path / "missing" / "log.jsonl"))
    assert w.watch(log_path=str(precious), once=True) == w.EXIT_USAGE
    assert precious.read_text() == "print('my model')\n"


def test_headless_prints_a_line_when_a_diagnosis_changes(monitor):
    m, clock, _ = monitor
    lines: list[str] = []
    outputs = _Outputs(print_changes=lines.append)
    for _ in range(3):
        clock.now += 1.0
        outputs.publish(m.tick())
    assert len(lines) == 2  # one per GPU, not one per tick
    assert lines[0].endswith("gpu0 " + m.tick().gpus[0].diagnosis.text)
    assert " gpu1 neighbour: " in lines[1]


def test_snapshot_json_is_strict_json(monitor):
    m, clock, _ = monitor
    data = w.snapshot_to_dict(_ticks(m, clock, 2))
    again = json.loads(json.dumps(data, allow_nan=False))
    g0 = again["gpus"][0]
    assert g0["sample"]["sm_mhz"] == 1980 and g0["sm_pct_of_max"] == 100.0 and g0["reasons"] == ["sw_power_cap", "hw_thermal_slowdown"]
    assert g0["diagnosis"]["state"] == "thermal" and g0["pcie"] == {"tx_kbs": 1500, "rx_kbs": 300}
    assert again["host"]["cpu_count"] == psutil.cpu_count()


# -- the process table ------------------------------------------------------------------------------

def _stat_line(pid: int, name: str, ppid: int, ticks: int, start: int = 1000) -> str:
    """A /proc/<pid>/stat line (SYNTHETIC values, the kernel's layout: utime is field 14, starttime 22)."""
    fields = ["S", str(ppid)] + ["0"] * 9 + [str(ticks), "0"] + ["0"] * 6 + [str(start)] + ["0"] * 30
    return f"{pid} ({name}) " + " ".join(fields) + "\n"


class _FakeProc:
    def __init__(self, root: Path):
        self.root = root

    def set(self, pid: int, name: str, ppid: int, ticks: int, start: int = 1000) -> None:
        (self.root / str(pid)).mkdir(exist_ok=True)
        (self.root / str(pid) / "stat").write_text(_stat_line(pid, name, ppid, ticks, start))

    def remove(self, pid: int) -> None:
        shutil.rmtree(self.root / str(pid))


def test_proc_stat_names_with_spaces_and_parentheses():
    stat = w.parse_proc_stat(_stat_line(42, "pt_data_worker (2)", 7, 250, start=99))
    assert stat == w.ProcStat(ppid=7, name="pt_data_worker (2)", ticks=250, start=99)
    real = w.parse_proc_stat(Path("/proc/self/stat").read_text())
    assert real.ppid == os.getppid() and real.name == psutil.Process().name()


def test_process_table_shares_full_and_focused_scans(tmp_path):
    proc, clock = _FakeProc(tmp_path), _Clock()
    hz = os.sysconf("SC_CLK_TCK")
    proc.set(1, "init", 0, 0)
    proc.set(10, "python", 1, 0)
    proc.set(11, "python", 10, 0)
    proc.set(50, "sshd", 1, 0)
    table = w.ProcessTable(str(tmp_path), clock=clock)
    table.scan(set())  # the first scan is always full
    assert table.children[10] == [11] and table.cpu == {}
    clock.now += 1.0
    proc.set(11, "python", 10, hz)  # a whole core for the second
    proc.set(50, "sshd", 1, hz // 2)
    proc.set(12, "python", 10, 0)  # a new worker
    table.scan({10})  # focused: the job and the children it had
    assert table.cpu[11] == pytest.approx(100.0)
    assert 50 not in table.cpu and 12 not in table.stats  # not read until the next full scan
    clock.now += w.ProcessTable.FULL_SCAN_S
    proc.set(50, "sshd", 1, hz)
    proc.remove(11)
    table.scan({10})
    assert 12 in table.stats and 11 not in table.stats and table.children[10] == [12]
    # sshd was last read at the first full scan (0 ticks): its share is over the 6 s since then.
    assert table.cpu[50] == pytest.approx(100.0 / (1.0 + w.ProcessTable.FULL_SCAN_S))
    assert table.ensure(12).name == "python" and table.ensure(999) is None


def test_a_reused_pid_has_no_share_from_the_old_process(tmp_path):
    proc, clock = _FakeProc(tmp_path), _Clock()
    proc.set(10, "python", 1, 5000, start=100)
    table = w.ProcessTable(str(tmp_path), clock=clock)
    table.scan(None)
    clock.now += 1.0
    proc.set(10, "bash", 1, 3, start=900)  # the pid now belongs to a process that started later
    table.scan(None)
    assert table.stats[10].name == "bash" and 10 not in table.cpu


# -- this machine: no NVIDIA driver ------------------------------------------------------------------

def test_once_json_here_has_the_host_and_says_why_there_is_no_gpu():
    out = io.StringIO()
    code = w.watch(once=True, as_json=True, console=Console(file=out, width=200))
    assert code == w.EXIT_OK
    data = json.loads(out.getvalue())
    if data["gpus"]:  # pragma: no cover - only where a GPU is present
        pytest.skip("this machine has an NVIDIA GPU")
    assert data["schema"] == w.LOG_SCHEMA and data["gpus"] == []
    assert "driver" in data["gpu_error"] or "NVML" in data["gpu_error"]
    host = data["host"]
    assert host["cpu_pct"] is not None and 0 <= host["cpu_pct"] <= 100
    assert host["mem_total_bytes"] == psutil.virtual_memory().total and host["cpu_count"] == psutil.cpu_count()


def test_once_text_here_says_the_host_part_still_works():
    out = io.StringIO()
    assert w.watch(once=True, console=Console(file=out, width=200, color_system=None)) == w.EXIT_OK
    text = out.getvalue()
    if "no GPU data" not in text:  # pragma: no cover - only where a GPU is present
        pytest.skip("this machine has an NVIDIA GPU")
    assert "the host part still works" in text and "host " in text and "q quits" not in text
    assert "A 0.5 s snapshot: two readings, so the diagnoses above are a first look" in text


@pytest.mark.parametrize("kwargs, words", [
    (dict(pid=NOT_HERE_PID), "--pid 4000000: no such process"),
    (dict(interval_s=0), "--interval 0: give a positive number"),
    (dict(prometheus="localhost:http"), "--prometheus localhost:http: expected [HOST:]PORT"),
    (dict(once=False, as_json=True), "--json prints one snapshot: use it with --once"),
])
def test_bad_options_exit_2_with_a_reason(kwargs, words, capsys):
    assert w.watch(**{"once": True, **kwargs}) == w.EXIT_USAGE
    assert words in capsys.readouterr().err


def test_headless_runs_until_sigterm_and_logs(tmp_path):
    log = tmp_path / "watch.jsonl"
    runner = f"import sys; from gpuvet.watch import watch; sys.exit(watch(interval_s=0.2, ui=False, log_path={str(log)!r}))"
    child = subprocess.Popen([sys.executable, "-c", runner], env={**os.environ, "PYTHONPATH": str(SRC)},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not (log.exists() and log.read_text().count('"subject":"host"') >= 2):
            assert child.poll() is None and time.monotonic() < deadline, child.communicate()
            time.sleep(0.05)
        child.terminate()  # SIGTERM, as `docker stop` or systemd send it
        out, err = child.communicate(timeout=20)
    finally:
        child.kill()
    assert child.returncode == 0, err
    assert "gpuvet watch: watching" in err and "Traceback" not in err
    (host,) = [s for s in w.read_log(str(log)) if s["subject"] == "host"]
    assert len(host["rows"]) >= 2 and host["columns"] == list(w.HOST_COLUMNS)


# -- following a job (--pid) -----------------------------------------------------------------------

_JOB = """
import multiprocessing as mp, time
def spin():
    while True:
        pass
if __name__ == "__main__":
    worker = mp.get_context("fork").Process(target=spin, daemon=True)
    worker.start()
    print(worker.pid, flush=True)
    time.sleep(120)
"""


def test_follows_a_job_tree_its_busy_worker_its_gpu_and_its_end(monkeypatch):
    job = subprocess.Popen([sys.executable, "-c", _JOB], stdout=subprocess.PIPE, text=True)
    try:
        worker_pid = int(job.stdout.readline())
        _two_gpus(monkeypatch, gpu0_pids=[worker_pid], gpu1_pids=[NOT_HERE_PID])
        m = w.Monitor(interval_s=0.2, pid=job.pid, machine=_machine(), threaded=False, slow_every_s=0.2)
        m.start()
        try:
            snap = m.tick()
            deadline = time.monotonic() + 30
            while not (snap.host.worker_list and snap.job.cpu_pct) and time.monotonic() < deadline:
                time.sleep(0.2)  # CPU shares need wall time between readings; wait for them, not for a duration
                snap = m.tick()
            assert snap.job.alive and snap.job.processes == 2 and snap.job.gpus == [0]
            assert [wk.pid for wk in snap.host.worker_list] == [worker_pid]
            assert snap.host.workers == 1
            assert w.WORKER_MIN_CPU_PCT <= snap.job.cpu_pct <= 100 * psutil.cpu_count() + 10  # a share of the cores
            assert snap.gpus[0].extras.processes[0].in_job is True
            assert snap.job_diagnosis is not None and snap.job_diagnosis.text.startswith(snap.gpus[0].diagnosis.label)
            os.kill(worker_pid, 9)
            job.kill()
            job.wait(10)  # reaped: the pid is gone from the process table
            deadline = time.monotonic() + 10
            while snap.job.alive and time.monotonic() < deadline:
                time.sleep(0.05)
                snap = m.tick()
            assert not snap.job.alive and snap.job_diagnosis.state == "job_gone"
        finally:
            m.close()
    finally:
        job.kill()
        job.wait(10)


# -- the live view in a real terminal --------------------------------------------------------------

def _tmux() -> str:
    path = shutil.which("tmux")
    if path is None:
        if os.environ.get("GPUVET_NO_EXTERNAL_TOOLS") == "1":
            pytest.skip("tmux not installed and GPUVET_NO_EXTERNAL_TOOLS=1")
        pytest.fail("tmux is not installed: `apt-get install -y tmux` (scripts/test installs it)")
    return path


class _Terminal:
    """A detached tmux session on its own server socket (never the user's tmux)."""

    def __init__(self, tmp_path: Path, columns: int = 150, rows: int = 50):
        self.tmux = _tmux()
        self.socket = str(tmp_path / "tmux.sock")  # inside the test's folder: nothing left behind
        self._run("new-session", "-d", "-s", "w", "-x", str(columns), "-y", str(rows), "bash --norc --noprofile")

    def _run(self, *args: str) -> str:
        return subprocess.run([self.tmux, "-S", self.socket, *args], check=True, capture_output=True, text=True).stdout

    def send(self, *keys: str) -> None:
        self._run("send-keys", "-t", "w", *keys)

    def screen(self) -> str:
        return self._run("capture-pane", "-p", "-t", "w")

    def wait_for(self, predicate, what: str, timeout_s: float = 30.0) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            screen = self.screen()
            if predicate(screen):
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"the terminal never showed {what}; it shows:\n{screen}")
            time.sleep(0.05)

    def close(self) -> None:
        subprocess.run([self.tmux, "-S", self.socket, "kill-server"], capture_output=True)


def _tick(screen: str) -> int | None:
    for line in screen.splitlines():
        if "gpuvet watch ·" in line and "· tick " in line:
            return int(line.split("· tick ")[1].split()[0])
    return None


@pytest.mark.parametrize("quit_keys", [("q",), ("C-c",)], ids=["q", "ctrl-c"])
def test_live_view_in_a_terminal_renders_refreshes_and_restores_it(tmp_path, quit_keys):
    term = _Terminal(tmp_path)
    try:
        runner = "import sys; from gpuvet.watch import watch; sys.exit(watch(interval_s=0.2))"
        command = (f"stty -g > {tmp_path}/before; PYTHONPATH={SRC} {sys.executable} -c '{runner}'; "
                   f"echo \"EXIT=$?\"; stty -g > {tmp_path}/after; echo FINI''SHED")  # '': not matched in the echoed command
        term.send(command, "Enter")
        first = term.wait_for(lambda s: _tick(s) is not None and "host " in s, "the watch view")
        assert "q quits" in first
        seen = _tick(first)
        term.wait_for(lambda s: (_tick(s) or 0) > seen, "a refresh (a later tick)")
        term.send(*quit_keys)
        after = term.wait_for(lambda s: "FINISHED" in s, "the shell prompt back")
        assert "EXIT=0" in after
        assert "gpuvet watch ·" not in after  # the alternate screen is gone: the shell's screen is back
        assert (tmp_path / "before").read_text() == (tmp_path / "after").read_text()  # tty modes restored
    finally:
        term.close()


@pytest.mark.parametrize("gpus, columns, rows", [(8, 150, 50), (3, 100, 24)])
def test_live_view_in_a_small_terminal_shows_every_gpu_and_the_host(tmp_path, gpus, columns, rows):
    """benchmarks/watch_cost.py's stand-in NVML answers for `gpus` busy GPUs; the full blocks need
    more rows than the terminal has, so the view turns compact and nothing falls off the screen."""
    term = _Terminal(tmp_path, columns, rows)
    try:
        bench = Path(__file__).resolve().parents[1] / "benchmarks"
        runner = (f'import sys; sys.path.insert(0, "{bench}"); from watch_cost import install_stand_in_nvml; '
                  f'install_stand_in_nvml({gpus}); from gpuvet.watch import watch; sys.exit(watch(interval_s=0.2))')
        term.send(f"PYTHONPATH={SRC} {sys.executable} -c '{runner}'; echo \"EXIT=$?\"", "Enter")
        screen = term.wait_for(lambda s: "host " in s and "  workers " in s and (_tick(s) or 0) > 1, "the host block")
        lines = screen.splitlines()
        assert "GPUs · compact: enlarge the window for the full view" in screen
        assert [line.split()[1] for line in lines if line.startswith("GPU ")] == [str(i) for i in range(gpus)]
        assert sum("  → ok: 97% busy" in line for line in lines) == gpus
        term.send("q")
        term.wait_for(lambda s: "EXIT=0" in s, "the watch quitting")
    finally:
        term.close()

"""gpuvet watch: a live view of a running job that says why it is slow, and a Prometheus endpoint.

One `telemetry.Sampler` reads every GPU at the chosen interval on its own thread; each tick of the
watch takes `Sampler.latest()`, keeps a window of it, and once a second reads what is slower or
costlier to read: the host (CPU, steal, IO wait, memory, disk and network rates, DataLoader-like
worker processes), the processes on each GPU, and PCIe/NVLink throughput (nvmlDeviceGetPcieThroughput
blocks ~20 ms per call, so a helper thread reads it and the view never waits for it). The judge's
`diagnose` rules turn the window into one line per GPU.

Outputs, any together: the live view (rich Live, q or Ctrl-C quits and restores the terminal),
`--once` (one snapshot, `--json` for JSON), `--log FILE` (JSON lines, rows in the columns of
`telemetry.to_series`; `read_log()` turns them back into run-record series), `--prometheus`
(`exporter.py`), and `--no-ui` for servers: it prints a line when a GPU's diagnosis changes.

Without a GPU or NVML the host part works and the GPU part says why it is empty.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import select
import signal
import socket
import sys
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import psutil
from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from . import __version__
from .facts import CLOCK_EVENT_REASONS, Gpu, GpuProcess, Machine
from .judge import diagnose
from .judge.diagnose import Diagnosis, GpuProcessSeen, HostSample
from .probe import nvml
from .telemetry import COLUMNS, Sample, Sampler, _is_permanent, _next_tick, to_series

EXIT_OK, EXIT_USAGE = 0, 2
LOG_SCHEMA = "gpuvet.watch/1"
SLOW_EVERY_S = 1.0  # host, processes, PCIe/NVLink throughput and the diagnosis: at most once a second
HOST_KEEP_S = diagnose.WINDOW_S + 5
WORKER_MIN_CPU_PCT = 10.0  # a worker using less than this is waiting, not feeding the GPU
ONCE_GAP_S = 0.5  # --once: CPU shares and rates need two readings this far apart
HOST_COLUMNS = ("t", "cpu_pct", "steal_pct", "iowait_pct", "mem_used_bytes", "disk_read_bps", "disk_write_bps",
                "net_rx_bps", "net_tx_bps", "workers", "workers_cpu_pct")
_FAULT_REASONS = {"hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown", "hw_power_brake_slowdown"}


# -- what one tick shows ---------------------------------------------------------------------------

@dataclass
class ProcessView:
    """A process on a GPU: NVML's entry plus what this machine's process table says about it."""

    pid: int
    name: str | None = None
    user: str | None = None
    used_mib: int | None = None
    visible: bool = True  # False: NVML lists it but this machine (container) has no such process
    in_job: bool | None = None


@dataclass
class GpuExtras:
    """The once-a-second readings of one GPU."""

    pcie_tx_kbs: int | None = None  # KB/s over NVML's 20 ms window
    pcie_rx_kbs: int | None = None
    nvlink_tx_bps: float | None = None  # all active links, bytes/s since the last reading
    nvlink_rx_bps: float | None = None
    processes: list[ProcessView] | None = None  # None: NVML cannot list them here
    unavailable: dict[str, str] = field(default_factory=dict)


@dataclass
class WorkerView:
    pid: int
    name: str
    cpu_pct: float


@dataclass
class HostReading(HostSample):
    """The host at one tick; the HostSample fields feed the diagnosis, the rest is for reading."""

    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    disk_read_bps: float | None = None
    disk_write_bps: float | None = None
    net_rx_bps: float | None = None
    net_tx_bps: float | None = None
    worker_list: list[WorkerView] = field(default_factory=list)


@dataclass
class JobReading:
    """The followed job (--pid): its process tree's CPU and storage IO, and the GPUs it holds."""

    pid: int
    alive: bool = True
    name: str | None = None
    cmdline: str | None = None
    processes: int = 0
    cpu_pct: float | None = None  # % of one core, the whole tree
    read_bps: float | None = None
    write_bps: float | None = None
    gpus: list[int] = field(default_factory=list)


@dataclass
class GpuView:
    index: int
    facts: Gpu
    sample: Sample | None
    extras: GpuExtras
    diagnosis: Diagnosis

    @property
    def name(self) -> str | None:
        return self.facts.name

    @property
    def uuid(self) -> str | None:
        return self.facts.uuid

    @property
    def bus_id(self) -> str | None:
        return self.facts.pcie.bus_id

    @property
    def sm_ratio(self) -> float | None:
        top = self.facts.clocks.max_sm_mhz
        return self.sample.sm_mhz / top if self.sample and self.sample.sm_mhz is not None and top else None

    @property
    def power_ratio(self) -> float | None:
        s = self.sample
        return s.power_w / s.power_limit_w if s and s.power_w is not None and s.power_limit_w else None

    @property
    def slowdown_margin_c(self) -> float | None:
        slowdown = self.facts.thermal.slowdown_c
        return slowdown - self.sample.temp_c if self.sample and self.sample.temp_c is not None and slowdown else None

    @property
    def reasons(self) -> list[str] | None:
        mask = self.sample.reasons if self.sample else None
        if mask is None:
            return None
        return [CLOCK_EVENT_REASONS.get(1 << i, f"0x{1 << i:x}") for i in range(mask.bit_length()) if mask & (1 << i)]


@dataclass
class Snapshot:
    t: float
    tick: int
    hostname: str
    interval_s: float
    gpus: list[GpuView]
    gpu_error: str | None  # why the GPU part is empty (or incomplete)
    host: HostReading | None
    job: JobReading | None = None
    job_diagnosis: Diagnosis | None = None
    driver_version: str | None = None


# -- pure helpers ----------------------------------------------------------------------------------

def cpu_shares(before: Any, after: Any) -> tuple[float, float, float] | None:
    """(busy %, steal %, iowait %) of all CPUs between two psutil.cpu_times() readings.
    guest/guest_nice are already inside user/nice, so they are not added again."""
    b, a = before._asdict(), after._asdict()
    delta = {k: a[k] - b.get(k, 0.0) for k in a}
    total = sum(v for k, v in delta.items() if k not in ("guest", "guest_nice"))
    if total <= 0:
        return None
    idle = delta.get("idle", 0.0) + delta.get("iowait", 0.0)
    return (100.0 * (total - idle) / total, 100.0 * delta.get("steal", 0.0) / total, 100.0 * delta.get("iowait", 0.0) / total)


def _rate(before: float | None, after: float | None, seconds: float) -> float | None:
    if before is None or after is None or seconds <= 0 or after < before:  # a counter reset is no rate
        return None
    return (after - before) / seconds


def _round1(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _looks_like_python(name: str) -> bool:
    return name.startswith(("python", "pt_")) or "python" in name.lower()


def descendants(children: dict[int, list[int]], root: int) -> list[int]:
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def same_process(nvml_name: str | None, local_names: tuple[str, ...]) -> bool:
    """Does NVML's name for a pid belong to the local process with that pid? In a container with its
    own PID namespace, NVML reports host pids: a local process with the same number is someone else."""
    if not nvml_name:
        return True
    base = os.path.basename(nvml_name.strip())
    for local in local_names:
        local = os.path.basename(local or "")
        if local and (base == local or base.startswith(local) or local.startswith(base[:15])):
            return True
    return False


# -- readers ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ProcStat:
    """What /proc/<pid>/stat says about a process, as the watch needs it."""

    ppid: int
    name: str
    ticks: int  # user + system CPU time, in clock ticks
    start: int  # start time since boot, in ticks: a reused pid has another


def parse_proc_stat(text: str) -> ProcStat:
    """/proc/<pid>/stat. The name sits in parentheses and may hold spaces or parentheses itself."""
    open_, close = text.index("("), text.rindex(")")
    after = text[close + 2:].split()  # fields from the 3rd (state) on
    return ProcStat(ppid=int(after[1]), name=text[open_ + 1:close], ticks=int(after[11]) + int(after[12]), start=int(after[19]))


class ProcessTable:
    """Every process's parent, name and CPU share, from /proc/<pid>/stat.

    A full pass over /proc runs every FULL_SCAN_S; in between only the processes in focus (the job,
    the GPUs' processes) and their known children are read again. A server with 1500 processes and
    kernel threads would otherwise spend ~2% of a core a second on the table alone; new workers
    are found within FULL_SCAN_S. One os.read per process: psutil's process_iter costs ~10x more.
    Off Linux (no /proc), psutil reads everything, every scan."""

    FULL_SCAN_S = 5.0

    def __init__(self, proc_root: str = "/proc", clock: Callable[[], float] = time.monotonic):
        self.proc_root = proc_root
        self.clock = clock
        self.stats: dict[int, ProcStat] = {}
        self.cpu: dict[int, float] = {}  # pid -> % of one core between its last two readings
        self.children: dict[int, list[int]] = {}
        self._read_at: dict[int, float] = {}
        self._full_at: float | None = None
        self._has_proc = os.path.isdir(proc_root)
        self._tick_s = 1.0 / os.sysconf("SC_CLK_TCK") if self._has_proc else 0.01

    def scan(self, focus: set[int] | None = None) -> None:
        """Read the table again: all of it when due (or `focus` is None), else `focus` and its children."""
        now = self.clock()
        full = focus is None or not self._has_proc or self._full_at is None or now - self._full_at >= self.FULL_SCAN_S
        if full:
            fresh = self._read_all() if self._has_proc else self._read_all_psutil()
            asked = set(self.stats) | set(fresh)
            self._full_at = now
        else:
            asked = set(focus)
            for pid in focus:
                asked.update(descendants(self.children, pid))
            fresh = {pid: stat for pid in asked if (stat := self._read_one(pid)) is not None}
        for pid in asked:
            self._update(pid, fresh.get(pid), now)
        self.children = {}
        for pid, stat in self.stats.items():
            self.children.setdefault(stat.ppid, []).append(pid)

    def _update(self, pid: int, stat: ProcStat | None, now: float) -> None:
        before, read_at = self.stats.get(pid), self._read_at.get(pid)
        if stat is None:  # exited
            self.stats.pop(pid, None), self.cpu.pop(pid, None), self._read_at.pop(pid, None)
            return
        if before is not None and before.start == stat.start and read_at is not None and now > read_at:
            self.cpu[pid] = 100.0 * (stat.ticks - before.ticks) * self._tick_s / (now - read_at)
        else:  # new, or its pid reused: no share until the next reading
            self.cpu.pop(pid, None)
        self.stats[pid], self._read_at[pid] = stat, now

    def _read_one(self, pid: int | str) -> ProcStat | None:
        try:  # os.open/os.read: a third of the cost of open() with its text wrapper
            fd = os.open(f"{self.proc_root}/{pid}/stat", os.O_RDONLY)
            try:
                raw = os.read(fd, 4096)
            finally:
                os.close(fd)
            return parse_proc_stat(raw.decode(errors="replace"))
        except (OSError, ValueError, IndexError):  # exited meanwhile, or an odd line
            return None

    def _read_all(self) -> dict[int, ProcStat]:
        stats = {}
        for entry in os.scandir(self.proc_root):
            if entry.name.isdigit() and (stat := self._read_one(entry.name)) is not None:
                stats[int(entry.name)] = stat
        return stats

    @staticmethod
    def _read_all_psutil() -> dict[int, ProcStat]:
        stats = {}
        for proc in psutil.process_iter(["ppid", "name", "cpu_times", "create_time"]):
            info = proc.info
            times = info["cpu_times"]
            ticks = int(100 * (times.user + times.system)) if times else 0  # in the 0.01 s ticks _tick_s assumes
            stats[proc.pid] = ProcStat(info["ppid"] or 0, info["name"] or "", ticks, int(100 * (info["create_time"] or 0)))
        return stats

    def name(self, pid: int) -> str:
        stat = self.stats.get(pid)
        return stat.name if stat else ""

    def ensure(self, pid: int) -> ProcStat | None:
        """The process, read now if the table does not have it yet (it started after the last full
        scan): a job's new process must not look like a stranger's until then."""
        if pid not in self.stats and self._has_proc and (stat := self._read_one(pid)) is not None:
            self._update(pid, stat, self.clock())
            self.children.setdefault(stat.ppid, []).append(pid)
        return self.stats.get(pid)


class HostReader:
    """Host counters and the process table, read at most once a second; rates from the last read."""

    def __init__(self, job_pid: int | None = None, processes: ProcessTable | None = None):
        self.job_pid = job_pid
        self.processes = processes or ProcessTable()
        self._cpu = psutil.cpu_times()
        self._disk = self._disk_bytes()
        self._net = self._net_bytes()
        self._job_io: dict[int, tuple[int, int, int]] = {}  # pid -> (start, read, write)
        self._psutil: dict[int, tuple[int, psutil.Process]] = {}  # for the few processes asked about
        self._users: dict[tuple[int, int], str | None] = {}
        self._last_t = time.monotonic()  # rates are over the time since the last read

    @property
    def table(self) -> dict[int, ProcStat]:
        return self.processes.stats

    @staticmethod
    def _disk_bytes() -> tuple[int, int] | None:
        try:
            io = psutil.disk_io_counters()
        except Exception:
            return None
        return (io.read_bytes, io.write_bytes) if io else None

    @staticmethod
    def _net_bytes() -> tuple[int, int] | None:
        try:
            nics = psutil.net_io_counters(pernic=True)
        except Exception:
            return None
        real = [c for name, c in nics.items() if name != "lo"]
        return (sum(c.bytes_recv for c in real), sum(c.bytes_sent for c in real))

    def scan(self, focus: set[int] | None = None) -> None:
        """The process table: in full when due, else the `focus` processes and their children."""
        self.processes.scan(focus)
        for pid in [pid for pid, (start, _) in self._psutil.items() if self._start(pid) != start]:
            del self._psutil[pid]  # gone, or its pid reused
        for pid in [pid for pid in self._job_io if pid not in self.table]:
            del self._job_io[pid]

    def _start(self, pid: int) -> int | None:
        stat = self.table.get(pid)
        return stat.start if stat else None

    def _process(self, pid: int) -> psutil.Process | None:
        """A psutil handle for a process seen by the last scan (exe, cmdline, user, IO counters)."""
        start = self._start(pid)
        if start is None:
            return None
        if pid not in self._psutil:
            try:
                self._psutil[pid] = (start, psutil.Process(pid))
            except psutil.Error:
                return None
        return self._psutil[pid][1]

    def user_of(self, pid: int) -> str | None:
        key = (pid, self._start(pid) or 0)
        if key not in self._users:
            proc = self._process(pid)
            try:
                self._users[key] = proc.username() if proc else None
            except (psutil.Error, KeyError):  # KeyError: a uid without a passwd entry
                self._users[key] = None
        return self._users[key]

    def local_names(self, pid: int) -> tuple[str, ...] | None:
        """The names a local pid goes by (comm, exe, argv[0]), or None when there is no such process."""
        if self.processes.ensure(pid) is None:
            return None
        names = [self.table[pid].name]
        proc = self._process(pid)
        if proc is not None:
            for getter in (proc.exe, lambda: (proc.cmdline() or [""])[0]):
                try:
                    names.append(getter())
                except psutil.Error:
                    pass
        return tuple(names)

    def workers(self, roots: list[int]) -> list[WorkerView]:
        """DataLoader-like workers: python children of the roots (the job, or the processes on the
        GPUs) busy on CPU. Without roots: children of top-level python processes."""
        table, cpu = self.table, self.processes.cpu
        if not roots:
            roots = [pid for pid, stat in table.items()
                     if _looks_like_python(stat.name) and not _looks_like_python(self.processes.name(stat.ppid))]
        found = []
        for root in roots:
            root_name = self.processes.name(root)
            for pid in descendants(self.processes.children, root):
                name = self.processes.name(pid)
                share = cpu.get(pid)
                if (_looks_like_python(name) or name == root_name) and share is not None and share >= WORKER_MIN_CPU_PCT:
                    found.append(WorkerView(pid, name, round(share, 1)))
        return sorted(found, key=lambda w: -w.cpu_pct)

    def read(self, roots: list[int]) -> HostReading:
        """The host since the last read. Call scan() first: the workers come from that table."""
        now = time.monotonic()
        seconds = now - self._last_t
        cpu, disk, net = psutil.cpu_times(), self._disk_bytes(), self._net_bytes()
        busy, steal, iowait = cpu_shares(self._cpu, cpu) or (None, None, None)
        workers = self.workers(roots)
        memory = psutil.virtual_memory()
        reading = HostReading(
            t=time.time(),
            cpu_pct=_round1(busy),
            steal_pct=_round1(steal),
            iowait_pct=_round1(iowait),
            cpu_count=psutil.cpu_count(),
            workers=len(workers),
            workers_cpu_pct=round(sum(w.cpu_pct for w in workers) / len(workers), 1) if workers else None,
            mem_used_bytes=memory.total - memory.available,
            mem_total_bytes=memory.total,
            disk_read_bps=_rate(self._disk and self._disk[0], disk and disk[0], seconds),
            disk_write_bps=_rate(self._disk and self._disk[1], disk and disk[1], seconds),
            net_rx_bps=_rate(self._net and self._net[0], net and net[0], seconds),
            net_tx_bps=_rate(self._net and self._net[1], net and net[1], seconds),
            worker_list=workers,
        )
        self._cpu, self._disk, self._net, self._last_t = cpu, disk, net, now
        return reading

    def job(self, seconds: float) -> tuple[JobReading, set[int]]:
        """The followed job now, and the pids of its tree. Call after scan()."""
        pid = self.job_pid
        if pid not in self.table:
            return JobReading(pid=pid, alive=False), set()
        tree = [pid] + descendants(self.processes.children, pid)
        job = JobReading(pid=pid, name=self.table[pid].name, processes=len(tree))
        proc = self._process(pid)
        try:
            job.cmdline = " ".join(proc.cmdline())[:200] if proc else None
        except psutil.Error:
            pass
        shares = [self.processes.cpu[p] for p in tree if p in self.processes.cpu]
        job.cpu_pct = round(sum(shares), 1) if shares else None
        job.read_bps, job.write_bps = self._job_io_rates(tree, seconds)
        return job, set(tree)

    def _job_io_rates(self, tree: list[int], seconds: float) -> tuple[float | None, float | None]:
        read = write = 0
        known = False
        for pid in tree:
            proc = self._process(pid)
            try:
                io = proc.io_counters() if proc else None
            except (psutil.Error, AttributeError):  # no permission; no io_counters on this OS
                continue
            if io is None:
                continue
            before = self._job_io.get(pid)
            self._job_io[pid] = (self._start(pid), io.read_bytes, io.write_bytes)
            if before is not None and before[0] == self._start(pid):  # a new process's past IO is not this interval's
                read += io.read_bytes - before[1]
                write += io.write_bytes - before[2]
                known = True
        if not known or seconds <= 0:
            return None, None
        return max(0, read) / seconds, max(0, write) / seconds


class GpuExtrasReader:
    """PCIe and NVLink throughput and the process list of each GPU (NVML must be started).

    A call the GPU or driver lacks is dropped for good with its reason, like telemetry._GpuReader."""

    def __init__(self, gpus: dict[int, Gpu], clock: Callable[[], float] = time.monotonic):
        self.gpus = gpus
        self.clock = clock
        self.unavailable: dict[int, dict[str, str]] = {i: {} for i in gpus}
        self._nvlink_last: dict[int, tuple[float, int, int]] = {}
        self._handles: dict[int, Any] = {}
        for index in gpus:
            try:
                self._handles[index] = nvml.pynvml.nvmlDeviceGetHandleByIndex(index)
            except Exception as err:
                self.unavailable[index]["gpu"] = nvml._reason(err)

    def read_all(self) -> dict[int, tuple[GpuExtras, list[GpuProcess] | None]]:
        return {index: self._read(index, handle) for index, handle in self._handles.items()}

    def _call(self, index: int, what: str, fn: Callable[[], Any]) -> Any:
        if what in self.unavailable[index]:
            return None
        try:
            return fn()
        except Exception as err:
            if _is_permanent(err):
                self.unavailable[index][what] = nvml._reason(err)
            return None

    def _read(self, index: int, handle: Any) -> tuple[GpuExtras, list[GpuProcess] | None]:
        p = nvml.pynvml
        extras = GpuExtras()
        extras.pcie_tx_kbs = self._call(index, "pcie_tx", lambda: p.nvmlDeviceGetPcieThroughput(handle, p.NVML_PCIE_UTIL_TX_BYTES))
        extras.pcie_rx_kbs = self._call(index, "pcie_rx", lambda: p.nvmlDeviceGetPcieThroughput(handle, p.NVML_PCIE_UTIL_RX_BYTES))
        extras.nvlink_tx_bps, extras.nvlink_rx_bps = self._nvlink(index, handle)
        processes = None
        if "processes" not in self.unavailable[index]:
            holder = Gpu(index=index)
            processes = nvml._processes(handle, nvml._Query(holder))
            if processes is None and "processes" in holder.unavailable:
                self.unavailable[index]["processes"] = holder.unavailable["processes"]
        extras.unavailable = dict(self.unavailable[index])
        return extras, processes

    def _nvlink(self, index: int, handle: Any) -> tuple[float | None, float | None]:
        """Bytes/s over the GPU's active NVLinks, from NVML's cumulative KiB counters."""
        links = [link.link for link in self.gpus[index].nvlinks or [] if link.active]
        if not links:
            return None, None
        p = nvml.pynvml
        fields = [(p.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, link) for link in links]
        fields += [(p.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, link) for link in links]
        values = self._call(index, "nvlink", lambda: p.nvmlDeviceGetFieldValues(handle, fields))
        if values is None:
            return None, None
        ok = [v.value.ullVal if v.nvmlReturn == p.NVML_SUCCESS else None for v in values]
        if any(v is None for v in ok):
            return None, None
        tx, rx = sum(ok[: len(links)]) * 1024, sum(ok[len(links):]) * 1024
        now = self.clock()
        last = self._nvlink_last.get(index)
        self._nvlink_last[index] = (now, tx, rx)
        if last is None:
            return None, None
        return _rate(last[1], tx, now - last[0]), _rate(last[2], rx, now - last[0])


class _Periodic:
    """Runs `fn` every `every_s` on a daemon thread and keeps its last result (NVML calls that block)."""

    def __init__(self, fn: Callable[[], Any], every_s: float):
        self._fn, self._every_s = fn, every_s
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._result: Any = None
        self._thread = threading.Thread(target=self._run, name="gpuvet-watch-extras", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        tick = time.monotonic()
        while not self._stop.is_set():
            try:
                result = self._fn()
            except Exception:  # a bug must not kill the view; the last result stays
                result = None
            if result is not None:
                with self._lock:
                    self._result = result
            tick = _next_tick(tick, time.monotonic(), self._every_s)
            self._stop.wait(max(0.0, tick - time.monotonic()))

    def latest(self) -> Any:
        with self._lock:
            return self._result

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)


# -- the monitor -----------------------------------------------------------------------------------

class Monitor:
    """Everything a tick needs: the sampler, the windows, the once-a-second readers, the diagnosis.

    `threaded=False` (tests, --once) samples and reads inline on each tick() instead of on threads;
    `clock` (monotonic seconds) decides when the once-a-second readings are due."""

    def __init__(self, interval_s: float = 1.0, pid: int | None = None, machine: Machine | None = None,
                 threaded: bool = True, clock: Callable[[], float] = time.monotonic,
                 slow_every_s: float = SLOW_EVERY_S):
        if machine is None:
            from .probe import live  # the full facts probe: imported only when watch runs

            machine = live.collect(steal_window_s=0.1, import_torch=False)
        self.machine = machine
        self.interval_s = interval_s
        self.pid = pid
        self.threaded = threaded
        self.clock = clock
        self.slow_every_s = slow_every_s
        self.hostname = (machine.host.hostname if machine.host else None) or socket.gethostname()
        self.in_container = bool(machine.host and machine.host.container)
        self.sampler = Sampler(None, interval_s, max_samples=2)  # the watch keeps its own windows
        self.host_reader = HostReader(pid)
        self.tick_count = 0
        self._facts: dict[int, Gpu] = {}
        self._recent: dict[int, deque[Sample]] = {}
        self._trend: dict[int, deque[Sample]] = {}  # one sample a second, for the 10-minute trend
        self._host: deque[HostReading] = deque()
        self._extras_reader: GpuExtrasReader | None = None
        self._extras_thread: _Periodic | None = None
        self._extras: dict[int, tuple[GpuExtras, list[GpuProcess] | None]] = {}
        self._last_slow: float | None = None
        self._host_now: HostReading | None = None
        self._job: JobReading | None = None
        self._job_tree: set[int] = set()
        self._diagnoses: dict[int, Diagnosis] = {}
        self._job_diagnosis: Diagnosis | None = None
        self._views_extras: dict[int, GpuExtras] = {}

    # lifecycle

    def start(self) -> None:
        if self.sampler.open():
            indices = sorted(self.sampler.sample_once())  # the GPUs that could be opened, and a first reading
            by_index = {g.index: g for g in self.machine.gpus}
            self._facts = {i: by_index.get(i) or Gpu(index=i) for i in indices}
            keep = max(1, math.ceil(diagnose.WINDOW_S / self.interval_s)) + 1
            self._recent = {i: deque(maxlen=keep) for i in indices}
            self._trend = {i: deque(maxlen=int(diagnose.TREND_WINDOW_S / SLOW_EVERY_S) + 1) for i in indices}
            self._extras_reader = GpuExtrasReader(self._facts, self.clock)
            if self.threaded:
                self.sampler.start()
                self._extras_thread = _Periodic(self._extras_reader.read_all, SLOW_EVERY_S)

    def close(self) -> None:
        if self._extras_thread is not None:
            self._extras_thread.stop()
        self.sampler.stop()

    @property
    def gpu_error(self) -> str | None:
        if self.sampler.error:
            return self.sampler.error
        if self.sampler.gpu_errors:
            return "; ".join(self.sampler.gpu_errors.values())
        return None

    # one tick

    def tick(self) -> Snapshot:
        self.tick_count += 1
        if not self.threaded and self._facts:
            self.sampler.sample_once()
        latest = self.sampler.latest()
        for index, sample in latest.items():
            self._keep(index, sample)
        now = self.clock()
        if self._last_slow is None or now - self._last_slow >= self.slow_every_s - 1e-6:
            seconds = now - self._last_slow if self._last_slow is not None else 0.0
            self._last_slow = now
            self._slow(seconds)
        return Snapshot(
            t=time.time(), tick=self.tick_count, hostname=self.hostname, interval_s=self.interval_s,
            gpus=[GpuView(i, self._facts[i], latest.get(i), self._views_extras.get(i) or GpuExtras(),
                          self._diagnoses.get(i) or Diagnosis("no_data", "no reading of this GPU yet"))
                  for i in sorted(self._facts)],
            gpu_error=self.gpu_error, host=self._host_now, job=self._job, job_diagnosis=self._job_diagnosis,
            driver_version=self.machine.driver.version,
        )

    def _keep(self, index: int, sample: Sample) -> None:
        recent = self._recent[index]
        if recent and recent[-1].t >= sample.t:
            return  # the sampler has not read a new one since the last tick
        recent.append(sample)
        trend = self._trend[index]
        if not trend or sample.t - trend[-1].t >= SLOW_EVERY_S:
            trend.append(sample)

    def _slow(self, seconds: float) -> None:
        """The once-a-second part: extras, host, job, diagnosis."""
        if self._extras_reader is not None:
            fresh = self._extras_thread.latest() if self._extras_thread else self._extras_reader.read_all()
            if fresh is not None:
                self._extras = fresh
        self.host_reader.scan(self._focus())
        if self.pid is not None:
            self._job, self._job_tree = self.host_reader.job(seconds)
        self._views_extras = {i: self._with_process_views(extras, procs) for i, (extras, procs) in self._extras.items()}
        # Workers are looked for under the job, or else under the GPUs' processes this machine has.
        gpu_roots = [p.pid for e in self._views_extras.values() for p in e.processes or [] if p.visible]
        reading = self.host_reader.read([self.pid] if self.pid is not None else gpu_roots)
        self._host_now = reading
        self._host.append(reading)
        while self._host and reading.t - self._host[0].t > HOST_KEEP_S:
            self._host.popleft()
        self._diagnose()

    def _focus(self) -> set[int]:
        """The processes read every second: the job, and the GPUs' processes this machine has."""
        focus = {self.pid} if self.pid is not None else set()
        return focus | {p.pid for e in self._views_extras.values() for p in e.processes or [] if p.visible}

    def _with_process_views(self, extras: GpuExtras, procs: list[GpuProcess] | None) -> GpuExtras:
        if procs is None:
            return extras
        views = []
        for p in procs:
            names = self.host_reader.local_names(p.pid)
            visible = names is not None and same_process(p.name, names)
            views.append(ProcessView(
                pid=p.pid, name=os.path.basename(p.name) if p.name else (names[0] if visible else None),
                user=self.host_reader.user_of(p.pid) if visible else None, used_mib=p.used_memory_mib,
                visible=visible, in_job=(p.pid in self._job_tree) if self.pid is not None else None))
        return GpuExtras(extras.pcie_tx_kbs, extras.pcie_rx_kbs, extras.nvlink_tx_bps, extras.nvlink_rx_bps,
                         views, extras.unavailable)

    def _diagnose(self) -> None:
        following = self.pid is not None
        for index, facts in self._facts.items():
            extras = self._views_extras.get(index)
            seen = None
            if extras is not None and extras.processes is not None:
                seen = [GpuProcessSeen(p.pid, p.used_mib, p.visible, p.in_job, p.name) for p in extras.processes]
            self._diagnoses[index] = diagnose.diagnose_gpu(
                list(self._recent[index]), facts, seen, list(self._host), following_job=following,
                in_container=self.in_container, trend=list(self._trend[index]))
        if self._job is not None:
            job_gpus = sorted(i for i, e in self._views_extras.items() if any(p.in_job for p in e.processes or []))
            self._job.gpus = job_gpus
            listed = any(e.processes is not None for e in self._views_extras.values())
            self._job_diagnosis = diagnose.diagnose_job(self._job.alive, {i: self._diagnoses[i] for i in job_gpus}, listed)


# -- JSON ------------------------------------------------------------------------------------------

def _round(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 3) if math.isfinite(value) else None
    return value


def gpu_to_dict(view: GpuView) -> dict[str, Any]:
    s, f, e = view.sample, view.facts, view.extras
    return {
        "index": view.index,
        "name": view.name,
        "uuid": view.uuid,
        "bus_id": view.bus_id,
        "sample": {c: _round(getattr(s, c)) for c in COLUMNS} if s else None,
        "max_sm_mhz": f.clocks.max_sm_mhz,
        "sm_pct_of_max": _round(None if view.sm_ratio is None else 100 * view.sm_ratio),
        "power_pct_of_limit": _round(None if view.power_ratio is None else 100 * view.power_ratio),
        "default_power_limit_w": f.power.default_limit_w,
        "memory_total_mib": f.memory_total_mib,
        "slowdown_margin_c": _round(view.slowdown_margin_c),
        "reasons": view.reasons,
        "pcie": {"tx_kbs": e.pcie_tx_kbs, "rx_kbs": e.pcie_rx_kbs},
        "nvlink": {"tx_bps": _round(e.nvlink_tx_bps), "rx_bps": _round(e.nvlink_rx_bps)},
        "processes": [asdict(p) for p in e.processes] if e.processes is not None else None,
        "unavailable": e.unavailable,
        "diagnosis": view.diagnosis.to_dict(),
    }


def snapshot_to_dict(snap: Snapshot) -> dict[str, Any]:
    host = None
    if snap.host is not None:
        host = {k: _round(v) for k, v in asdict(snap.host).items() if k != "worker_list"}
        host["worker_list"] = [asdict(w) for w in snap.host.worker_list]
    return {
        "schema": LOG_SCHEMA,
        "gpuvet": __version__,
        "t": _round(snap.t),
        "hostname": snap.hostname,
        "driver_version": snap.driver_version,
        "gpu_error": snap.gpu_error,
        "gpus": [gpu_to_dict(g) for g in snap.gpus],
        "host": host,
        "job": asdict(snap.job) if snap.job else None,
        "job_diagnosis": snap.job_diagnosis.to_dict() if snap.job_diagnosis else None,
    }


# -- the log (JSON lines) --------------------------------------------------------------------------

class WatchLog:
    """JSON lines: a header naming the series and their columns, then one line per row.

    GPU rows use telemetry.COLUMNS exactly as telemetry.to_series writes them (t in seconds since
    the header's t0), so the report plots a watch log like a benchmark's telemetry. A file that
    already holds a watch log gets a new session appended; any other existing file is refused."""

    def __init__(self, path: str, interval_s: float, gpus: list[tuple[int, Gpu]], hostname: str):
        self.path = path
        self.t0 = time.time()
        self._file = open(path, "a", encoding="utf-8")
        self._last_t: dict[int, float] = {}
        self._states: dict[str, str] = {}
        header = {
            "schema": LOG_SCHEMA,
            "kind": "header",
            "gpuvet": __version__,
            "hostname": hostname,
            "t0": self.t0,
            "interval_s": interval_s,
            "series": {
                **{f"gpu{i}": {"name": "watch.telemetry", "columns": list(COLUMNS), "gpu": g.name, "uuid": g.uuid}
                   for i, g in gpus},
                "host": {"name": "watch.host", "columns": list(HOST_COLUMNS)},
            },
            "note": "rows of each subject use the columns named here, as telemetry.to_series writes them: "
                    "t is seconds since t0; {\"subject\", \"diagnosis\"} lines record diagnosis changes; "
                    "gpuvet.watch.read_log() turns this file into run-record series",
        }
        self._write(header)

    @staticmethod
    def check_path(path: str) -> str | None:
        """Why `path` cannot take a watch log (None: it can)."""
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            return f"the folder {folder} does not exist"
        if os.path.isdir(path):
            return "is a folder; give a file name"
        if os.path.exists(path) and os.path.getsize(path) > 0:
            with open(path, "rb") as f:
                head = f.read(200)
            if LOG_SCHEMA.encode() not in head:
                return "the file exists and is not a gpuvet watch log; choose another name"
        return None

    def _write(self, obj: dict) -> None:
        self._file.write(json.dumps(obj, separators=(",", ":"), allow_nan=False) + "\n")

    def write(self, snap: Snapshot) -> None:
        for view in snap.gpus:
            s = view.sample
            if s is not None and self._last_t.get(view.index) != s.t:
                self._last_t[view.index] = s.t
                row = to_series([s], "watch.telemetry", f"gpu{view.index}", snap.interval_s)["rows"][0]
                row[0] = round(s.t - self.t0, 3)
                self._write({"subject": f"gpu{view.index}", "row": row})
            self._diagnosis(f"gpu{view.index}", view.diagnosis, snap.t)
        if snap.host is not None and self._last_t.get(-1) != snap.host.t:
            self._last_t[-1] = snap.host.t
            row = [round(snap.host.t - self.t0, 3)] + [_round(getattr(snap.host, c)) for c in HOST_COLUMNS[1:]]
            self._write({"subject": "host", "row": row})
        if snap.job_diagnosis is not None:
            self._diagnosis("job", snap.job_diagnosis, snap.t)
        self._file.flush()

    def _diagnosis(self, subject: str, d: Diagnosis, t: float) -> None:
        if self._states.get(subject) == d.state:
            return
        self._states[subject] = d.state
        self._write({"subject": subject, "t": round(t - self.t0, 3), "diagnosis": {"state": d.state, "text": d.text}})

    def close(self) -> None:
        self._file.close()


def read_log(path: str) -> list[dict[str, Any]]:
    """A watch log -> series like telemetry.to_series makes ({"name", "subject", "interval_s", "t0",
    "columns", "rows"}), one per subject and session, plus a "watch.diagnosis" series (t, state, text)."""
    series: list[dict[str, Any]] = []
    session: dict[str, dict[str, Any]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            obj = json.loads(line)
            if obj.get("kind") == "header":
                session = {}
                for subject, spec in obj["series"].items():
                    session[subject] = {"name": spec["name"], "subject": subject, "interval_s": obj["interval_s"],
                                        "t0": obj["t0"], "columns": spec["columns"], "rows": []}
                    series.append(session[subject])
                continue
            subject = obj.get("subject")
            if "row" in obj and subject in session:
                session[subject]["rows"].append(obj["row"])
            elif "diagnosis" in obj:
                key = f"{subject}.diagnosis"
                if key not in session:
                    any_series = next(iter(session.values()), {"t0": None, "interval_s": None})
                    session[key] = {"name": "watch.diagnosis", "subject": subject, "interval_s": any_series["interval_s"],
                                    "t0": any_series["t0"], "columns": ["t", "state", "text"], "rows": []}
                    series.append(session[key])
                d = obj["diagnosis"]
                session[key]["rows"].append([obj["t"], d["state"], d["text"]])
    return series


# -- the view --------------------------------------------------------------------------------------

_STATE_STYLE = {"ok": "green", "idle": "dim", "no_data": "dim", "underused": "yellow", "input_bound": "yellow",
                "io_bound": "yellow", "cpu_steal": "yellow", "slowing": "yellow", "clocks_held": "yellow",
                "power_capped": "red", "neighbour": "red", "thermal": "red", "hw_slowdown": "red",
                "no_gpu": "yellow", "job_gone": "dim"}


def _num(value: float | None, fmt: str = "{:.0f}", unit: str = "") -> str:
    return "-" if value is None else fmt.format(value) + unit


def _gib(mib: float | None) -> str:
    return "-" if mib is None else f"{mib / 1024:.1f} GiB"


def _bps(value: float | None) -> str:
    if value is None:
        return "-"
    for unit, size in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if value >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value:.0f} B/s"


def _bar(pct: float | None, width: int = 10) -> str:
    if pct is None:
        return " " * width
    filled = max(0, min(width, round(pct / 100 * width)))
    return "█" * filled + "·" * (width - filled)


def _diagnosis_text(d: Diagnosis) -> Text:
    text = Text("  → ", style="bold")
    text.append(d.text, style=_STATE_STYLE.get(d.state, ""))
    if d.also:
        text.append("  (also: " + ", ".join(diagnose.LABELS[s] for s in d.also) + ")", style="dim")
    return text


def _rows(rows: list[tuple[str, str | Text]]) -> Text:
    """Label + value lines. Plain Text, not a rich Table: a table's layout pass costs ~10x more, and
    the view is drawn every tick."""
    out = Text(no_wrap=True, overflow="ellipsis")  # wrapping is most of a frame's cost
    for i, (label, value) in enumerate(rows):
        out.append(("\n" if i else "") + f"  {label:<8} ", style="bold")
        out.append(value)
    return out


def _block(title: str, style: str, *body: Text) -> Group:
    """A titled block. A title line, not a bordered Panel: borders double the cost of a frame."""
    line = Text(no_wrap=True, overflow="crop")  # the dashes run to the screen's edge and are cut there
    line.append(title + " ", style=f"bold {style}")
    line.append("─" * 300, style=style)
    return Group(line, *body)


def _gpu_block(view: GpuView) -> Group:
    s, f, e = view.sample, view.facts, view.extras
    rows: list[tuple[str, str | Text]] = []
    if s is None:
        rows.append(("", "waiting for the first reading"))
    else:
        sm = _num(s.sm_mhz, unit=" MHz") + (f" = {100 * view.sm_ratio:.0f}% of {f.clocks.max_sm_mhz} max" if view.sm_ratio else "")
        util = f"{_num(s.util_pct, unit='%'):>4} {_bar(s.util_pct)}"
        rows.append(("util", f"{util}   SM {sm}   mem clock {_num(s.mem_mhz, unit=' MHz')}"))
        power = _num(s.power_w, unit=" W")
        if view.power_ratio is not None:
            power += f" = {100 * view.power_ratio:.0f}% of the {s.power_limit_w:.0f} W limit"
        if f.power.default_limit_w and s.power_limit_w and abs(f.power.default_limit_w - s.power_limit_w) > 1:
            power += f" (default {f.power.default_limit_w:.0f} W)"
        temp = _num(s.temp_c, unit=" C")
        if view.slowdown_margin_c is not None:
            temp += f", {view.slowdown_margin_c:.0f} C to slowdown"
        rows.append(("power", f"{power}   temp {temp}"))
        memory = f"{_gib(s.mem_used_mib)} of {_gib(f.memory_total_mib)}" if f.memory_total_mib else _gib(s.mem_used_mib)
        link = f"Gen{s.pcie_gen} x{s.pcie_width}" if s.pcie_gen and s.pcie_width else "link -"
        pcie = f"PCIe {link} tx {_bps(e.pcie_tx_kbs and e.pcie_tx_kbs * 1000)} rx {_bps(e.pcie_rx_kbs and e.pcie_rx_kbs * 1000)}"
        nvlink = f"   NVLink tx {_bps(e.nvlink_tx_bps)} rx {_bps(e.nvlink_rx_bps)}" if e.nvlink_tx_bps is not None else ""
        rows.append(("memory", f"{memory}   {pcie}{nvlink}"))
        rows.append(("reasons", _reasons_text(s.reasons, view.reasons)))
    rows.append(("procs", _processes_text(e)))
    title = f"GPU {view.index}  {view.name or 'unknown model'}" + (f"  {view.bus_id}" if view.bus_id else "")
    return _block(title, "cyan", _rows(rows), _diagnosis_text(view.diagnosis))


def _reasons_text(mask: int | None, names: list[str] | None) -> Text:
    if mask is None:
        return Text("not reported", style="dim")
    if not names:
        return Text("none", style="green")
    text = Text(f"0x{mask:x} = ")
    for i, name in enumerate(names):
        text.append((" | " if i else "") + name, style="red" if name in _FAULT_REASONS else "yellow")
    return text


def _processes_text(e: GpuExtras) -> Text:
    if e.processes is None:
        return Text("not listed: " + e.unavailable.get("processes", "no reading yet"), style="dim")
    if not e.processes:
        return Text("none", style="dim")
    text = Text()
    for i, p in enumerate(sorted(e.processes, key=lambda p: -(p.used_mib or 0))[:6]):
        style = "" if p.visible else "red"
        who = f"{p.pid} {p.user or '?'} {p.name or '?'} {_gib(p.used_mib)}" + ("" if p.visible else " (not visible here)")
        text.append(("  ·  " if i else "") + who, style=style)
    if len(e.processes) > 6:
        text.append(f"  · +{len(e.processes) - 6} more", style="dim")
    return text


def _host_block(h: HostReading | None, hostname: str) -> Group:
    rows: list[tuple[str, str | Text]] = []
    if h is None:
        rows.append(("", "first reading in a second"))
    else:
        rows.append(("cpu", f"{_num(h.cpu_pct, unit='%'):>4} {_bar(h.cpu_pct)} of {h.cpu_count} CPUs   "
                            f"steal {_num(h.steal_pct, '{:.1f}', '%')}   iowait {_num(h.iowait_pct, '{:.1f}', '%')}"))
        mem = f"{h.mem_used_bytes / 2**30:.1f} of {h.mem_total_bytes / 2**30:.1f} GiB" if h.mem_total_bytes else "-"
        rows.append(("memory", f"{mem}   disk read {_bps(h.disk_read_bps)} write {_bps(h.disk_write_bps)}   "
                               f"net rx {_bps(h.net_rx_bps)} tx {_bps(h.net_tx_bps)}"))
        if h.worker_list:
            listed = ", ".join(f"{w.pid} {w.name} {w.cpu_pct:.0f}%" for w in h.worker_list[:6])
            more = f", +{len(h.worker_list) - 6} more" if len(h.worker_list) > 6 else ""
            rows.append(("workers", f"{h.workers} busy, {h.workers_cpu_pct:.0f}% CPU each on average: {listed}{more}"))
        else:
            rows.append(("workers", Text("no DataLoader-like worker busy", style="dim")))
    return _block(f"host {hostname}", "blue", _rows(rows))


def _job_block(job: JobReading, d: Diagnosis | None) -> Group:
    if not job.alive:
        rows: list[tuple[str, str | Text]] = [("", Text(f"process {job.pid} is not running", style="dim"))]
    else:
        rows = [("command", job.cmdline or job.name or ""),
                ("tree", f"{job.processes} process(es)   CPU {_num(job.cpu_pct, unit='%')}   read {_bps(job.read_bps)} "
                         f"write {_bps(job.write_bps)}   GPUs {', '.join(map(str, job.gpus)) or 'none'}")]
    body = [_rows(rows)] + ([_diagnosis_text(d)] if d is not None else [])
    return _block(f"job {job.pid} {job.name or ''}", "magenta", *body)


def render(snap: Snapshot, interactive: bool = True) -> Group:
    clock = time.strftime("%H:%M:%S", time.localtime(snap.t))
    head = Text(f"gpuvet watch · {snap.hostname} · {len(snap.gpus)} GPU(s) · every {snap.interval_s:g} s · "
                f"tick {snap.tick} · {clock}", style="bold")
    if interactive:
        head.append("   q quits", style="dim")
    parts: list[Any] = [head]
    if snap.job is not None:
        parts.append(_job_block(snap.job, snap.job_diagnosis))
    parts.extend(_gpu_block(g) for g in snap.gpus)
    if snap.gpu_error:
        words = "no GPU data: " if not snap.gpus else "some GPUs are not shown: "
        tail = "; the host part still works" if not snap.gpus else ""
        parts.append(_block("GPUs", "yellow", Text(f"  {words}{snap.gpu_error}{tail}")))
    parts.append(_host_block(snap.host, snap.hostname))
    return Group(*parts)


# -- the loop --------------------------------------------------------------------------------------

class _Keys:
    """Single key presses from the terminal (cbreak: no Enter needed; Ctrl-C still interrupts).
    Off a terminal it only waits. The terminal's settings are restored on exit, whatever happens."""

    def __init__(self, stream: Any = None):
        self.stream = stream if stream is not None else sys.stdin
        self.fd: int | None = None
        self._saved: Any = None

    def __enter__(self) -> "_Keys":
        try:
            if self.stream is not None and self.stream.isatty():
                import termios
                import tty

                self.fd = self.stream.fileno()
                self._saved = termios.tcgetattr(self.fd)
                tty.setcbreak(self.fd)
        except (OSError, ValueError, ImportError):
            self.fd = None
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.fd is not None and self._saved is not None:
            import termios

            termios.tcsetattr(self.fd, termios.TCSADRAIN, self._saved)

    def wait(self, timeout_s: float) -> str:
        """Keys pressed within `timeout_s` ("" when none)."""
        if self.fd is None:
            time.sleep(max(0.0, timeout_s))
            return ""
        ready, _, _ = select.select([self.fd], [], [], max(0.0, timeout_s))
        return os.read(self.fd, 64).decode(errors="ignore") if ready else ""


class _Stop(Exception):
    """SIGTERM: leave like on q (containers and service managers stop us this way)."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise _Stop()


@dataclass
class _Outputs:
    log: WatchLog | None = None
    exporter: Any = None  # exporter.Exporter
    print_changes: Callable[[str], None] | None = None  # headless: one line per diagnosis change
    _states: dict[str, str] = field(default_factory=dict)

    def publish(self, snap: Snapshot) -> None:
        if self.log is not None:
            self.log.write(snap)
        if self.exporter is not None:
            self.exporter.update(snap)
        if self.print_changes is not None:
            self._changes(snap)

    def _changes(self, snap: Snapshot) -> None:
        clock = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(snap.t))
        subjects = [(f"gpu{g.index}", g.diagnosis) for g in snap.gpus]
        if snap.job_diagnosis is not None:
            subjects.append((f"job {snap.job.pid}", snap.job_diagnosis))
        for subject, d in subjects:
            if d.state != "no_data" and self._states.get(subject) != d.state:
                self._states[subject] = d.state
                self.print_changes(f"{clock} {subject} {d.text}")

    def close(self) -> None:
        if self.log is not None:
            self.log.close()
        if self.exporter is not None:
            self.exporter.close()


def run_loop(monitor: Monitor, outputs: _Outputs, console: Console | None, keys: _Keys,
             max_ticks: int | None = None) -> None:
    """Tick, publish, show, wait for the next tick or a key, until q (or max_ticks, for tests)."""
    live = Live(console=console, screen=True, auto_refresh=False, redirect_stdout=False,
                redirect_stderr=False) if console is not None else None
    next_tick = time.monotonic()
    with live if live is not None else contextlib.nullcontext():
        while True:
            snap = monitor.tick()
            outputs.publish(snap)
            if live is not None:
                live.update(render(snap, interactive=keys.fd is not None), refresh=True)
            if max_ticks is not None and snap.tick >= max_ticks:
                return
            next_tick = _next_tick(next_tick, time.monotonic(), monitor.interval_s)
            while True:
                pressed = keys.wait(next_tick - time.monotonic())
                if "q" in pressed.lower():
                    return
                if time.monotonic() >= next_tick - 1e-3:
                    break


def _once(monitor: Monitor, as_json: bool, console: Console, outputs: _Outputs) -> None:
    """Two readings ONCE_GAP_S apart (CPU shares and rates need a before and an after), shown once."""
    monitor.tick()
    time.sleep(ONCE_GAP_S)
    snap = monitor.tick()
    outputs.publish(snap)
    if as_json:
        console.file.write(json.dumps(snapshot_to_dict(snap), indent=2, allow_nan=False) + "\n")
        console.file.flush()
    else:
        console.print(render(snap, interactive=False))


def _error(message: str) -> int:
    print(f"gpuvet watch: {message}", file=sys.stderr)
    return EXIT_USAGE


def _check_options(interval_s: float, pid: int | None, once: bool, as_json: bool, log_path: str | None,
                   prometheus: str | None) -> str | None:
    if not interval_s or interval_s <= 0 or not math.isfinite(interval_s):
        return f"--interval {interval_s}: give a positive number of seconds"
    if interval_s < 0.05:
        return f"--interval {interval_s}: NVML readings take milliseconds; use 0.05 s or more"
    if as_json and not once:
        return "--json prints one snapshot: use it with --once (--log FILE records JSON lines over time)"
    if pid is not None and not psutil.pid_exists(pid):
        return f"--pid {pid}: no such process"
    if log_path:
        why = WatchLog.check_path(log_path)
        if why:
            return f"--log {log_path}: {why}"
    if prometheus:
        from .exporter import parse_listen

        try:
            parse_listen(prometheus)
        except ValueError as err:
            return f"--prometheus {prometheus}: {err}"
    return None


def watch(interval_s: float = 1.0, pid: int | None = None, once: bool = False, as_json: bool = False,
          log_path: str | None = None, prometheus: str | None = None, ui: bool = True,
          console: Console | None = None, machine: Machine | None = None) -> int:
    """`gpuvet watch`: returns the exit code (0, or 2 for bad options / a port that cannot be bound).

    `machine` (facts read once) is for tests; by default the live probe reads them at start."""
    problem = _check_options(interval_s, pid, once, as_json, log_path, prometheus)
    if problem:
        return _error(problem)
    console = console or Console(highlight=False)
    monitor = Monitor(interval_s, pid, machine=machine, threaded=not once, slow_every_s=0.0 if once else SLOW_EVERY_S)
    outputs = _Outputs()
    old_sigterm = None
    try:
        monitor.start()
        if log_path:
            outputs.log = WatchLog(log_path, interval_s, sorted(monitor._facts.items()), monitor.hostname)
        if prometheus:
            from .exporter import Exporter, parse_listen

            outputs.exporter = Exporter()
            host, port = parse_listen(prometheus)
            try:
                bound = outputs.exporter.serve(host, port)
            except OSError as err:
                return _error(f"--prometheus {prometheus}: cannot listen there ({err.strerror or err})")
            print(f"gpuvet watch: serving http://{host if ':' not in host else f'[{host}]'}:{bound}/metrics", file=sys.stderr)
        if once:
            _once(monitor, as_json, console, outputs)
            return EXIT_OK
        if threading.current_thread() is threading.main_thread():
            old_sigterm = signal.signal(signal.SIGTERM, _on_sigterm)
        interactive = ui and console.is_terminal
        if not interactive:
            outputs.print_changes = lambda line: (print(line), sys.stdout.flush())
            print(_headless_banner(monitor, log_path), file=sys.stderr, flush=True)
        with _Keys(sys.stdin if interactive else _NoStream()) as keys:
            try:
                run_loop(monitor, outputs, console if interactive else None, keys)
            except (KeyboardInterrupt, _Stop):
                pass  # Ctrl-C or SIGTERM: the normal way to stop a monitor
        return EXIT_OK
    finally:
        if old_sigterm is not None:
            signal.signal(signal.SIGTERM, old_sigterm)
        outputs.close()
        monitor.close()


def _headless_banner(monitor: Monitor, log_path: str | None) -> str:
    gpus = f"{len(monitor._facts)} GPU(s)" if monitor._facts else f"the host only (no GPU data: {monitor.gpu_error})"
    logging = f", logging to {log_path}" if log_path else ""
    return (f"gpuvet watch: watching {gpus} every {monitor.interval_s:g} s{logging}; a line is printed when a "
            "diagnosis changes; Ctrl-C or SIGTERM stops")


class _NoStream:
    def isatty(self) -> bool:
        return False

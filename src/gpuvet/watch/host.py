"""The host's samples, read at most once a second: CPU busy / steal / IO wait, memory, disk and
network rates, DataLoader-like workers, and the followed job's CPU and IO (HostReader)."""

from __future__ import annotations

import time
from typing import Any

import psutil

from .processes import ProcessTable, ProcStat, descendants
from .snapshot import HostReading, JobReading, WorkerView

WORKER_MIN_CPU_PCT = 10.0  # a worker using less than this is waiting, not feeding the GPU


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


def rate_per_s(before: float | None, after: float | None, seconds: float) -> float | None:
    if before is None or after is None or seconds <= 0 or after < before:  # a counter reset is no rate
        return None
    return (after - before) / seconds


def _round1(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _looks_like_python(name: str) -> bool:
    return name.startswith(("python", "pt_")) or "python" in name.lower()


class HostReader:
    """Host counters and the process table, read at most once a second; rates from the last read."""

    def __init__(self, processes: ProcessTable | None = None):
        self.processes = processes or ProcessTable()
        # No baseline yet: the first read() only takes one (its CPU shares and rates are None), so no
        # reading covers the milliseconds of gpuvet's own start-up (it read "CPU 100%").
        self._cpu: Any = None
        self._disk: tuple[int, int] | None = None
        self._net: tuple[int, int] | None = None
        self._job_io: dict[int, tuple[int | None, int, int]] = {}  # pid -> (start, read, write)
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
        busy, steal, iowait = (cpu_shares(self._cpu, cpu) if self._cpu is not None else None) or (None, None, None)
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
            disk_read_bps=rate_per_s(self._disk and self._disk[0], disk and disk[0], seconds),
            disk_write_bps=rate_per_s(self._disk and self._disk[1], disk and disk[1], seconds),
            net_rx_bps=rate_per_s(self._net and self._net[0], net and net[0], seconds),
            net_tx_bps=rate_per_s(self._net and self._net[1], net and net[1], seconds),
            worker_list=workers,
        )
        self._cpu, self._disk, self._net, self._last_t = cpu, disk, net, now
        return reading

    def job(self, pid: int, seconds: float) -> tuple[JobReading, set[int]]:
        """The followed job (`pid`) now, and the pids of its tree. Call after scan()."""
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

"""The process table the watch reads from /proc, the job tree, and whether a pid NVML lists on a GPU
is the local process with that number (it may not be, in a container)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable

import psutil


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


def parse_nspid(status: str) -> tuple[int, ...] | None:
    """The NSpid line of /proc/<pid>/status: the process's pid in each PID namespace it is in, from
    the namespace of that /proc's mount inwards (one number outside containers). None: no such line
    (kernels before 4.1)."""
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            return tuple(int(part) for part in line.split()[1:])
    return None


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
        self._ns_pids: dict[tuple[int, int | None], tuple[int, ...]] = {}

    def scan(self, focus: set[int] | None = None) -> None:
        """Read the table again: all of it when due (or `focus` is None), else `focus` and its children."""
        now = self.clock()
        due = not self._has_proc or self._full_at is None or now - self._full_at >= self.FULL_SCAN_S
        if focus is None or due:
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

    def ns_pids(self, pid: int) -> tuple[int, ...]:
        """The pid's numbers in every PID namespace it is in (parse_nspid), read once per process
        (they never change); () when unknown."""
        stat = self.stats.get(pid)
        key = (pid, stat.start if stat else None)
        if key not in self._ns_pids:
            try:
                with open(f"{self.proc_root}/{pid}/status", encoding="utf-8", errors="replace") as f:
                    self._ns_pids[key] = parse_nspid(f.read()) or ()
            except OSError:
                self._ns_pids[key] = ()
            if len(self._ns_pids) > 4096:  # processes come and go over a long watch
                self._ns_pids = {key: self._ns_pids[key]}
        return self._ns_pids[key]

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

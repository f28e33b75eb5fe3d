"""The Monitor: the state kept between ticks (sampler, windows, once-a-second readers) and the
building of each tick's Snapshot with its diagnoses."""

from __future__ import annotations

import dataclasses
import math
import os
import socket
import time
from collections import deque
from typing import Callable

from ..facts import Gpu, GpuProcess, Machine
from ..judge import diagnose
from ..judge.diagnose import Diagnosis, GpuProcessSeen
from ..telemetry import Sample, Sampler
from .gpu_extras import GpuExtrasReader, Periodic
from .host import HostReader
from .processes import same_process
from .snapshot import GpuExtras, GpuView, HostReading, JobReading, ProcessView, Snapshot

SLOW_EVERY_S = 1.0  # host, processes, PCIe/NVLink throughput and the diagnosis: at most once a second
HOST_KEEP_S = diagnose.WINDOW_S + 5


class Monitor:
    """Everything a tick needs: the sampler, the windows, the once-a-second readers, the diagnosis.

    `threaded=False` (tests, --once) samples and reads inline on each tick() instead of on threads;
    `clock` (monotonic seconds) decides when the once-a-second readings are due."""

    def __init__(self, interval_s: float = 1.0, pid: int | None = None, machine: Machine | None = None,
                 threaded: bool = True, clock: Callable[[], float] = time.monotonic,
                 slow_every_s: float = SLOW_EVERY_S):
        if machine is None:
            from ..probe import live  # the full facts probe: imported only when watch runs

            machine = live.collect(steal_window_s=0.1, import_torch=False)
        self.machine = machine
        self.interval_s = interval_s
        self.pid = pid
        self.threaded = threaded
        self.clock = clock
        self.slow_every_s = slow_every_s
        self.hostname = (machine.host.hostname if machine.host else None) or socket.gethostname()
        self.in_container = _in_container(machine)
        self.sampler = Sampler(None, interval_s, max_samples=2)  # the watch keeps its own windows
        self.host_reader = HostReader()
        self.tick_count = 0
        self._facts: dict[int, Gpu] = {}
        self._recent: dict[int, deque[Sample]] = {}
        self._trend: dict[int, deque[Sample]] = {}  # one sample a second, for the 10-minute trend
        self._host: deque[HostReading] = deque()
        self._extras_reader: GpuExtrasReader | None = None
        self._extras_thread: Periodic | None = None
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
                self._extras_thread = Periodic(self._extras_reader.read_all, SLOW_EVERY_S)

    def close(self) -> None:
        if self._extras_thread is not None:
            self._extras_thread.stop()
        if self._extras_reader is not None and self._extras_reader.xids is not None:
            self._extras_reader.xids.stop()
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
            driver_version=self.machine.driver.version, source=self.machine.source,
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
            self._job, self._job_tree = self.host_reader.job(self.pid, seconds)
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
        mapped: dict[int, int] | None = None
        for p in procs:
            if p.pid is None:  # NVML names every process's pid; without one there is nothing to look up
                continue
            local = p.pid
            names = self.host_reader.local_names(p.pid)
            visible = names is not None and same_process(p.name, names)
            if not visible and self.in_container:  # NVML's pid may be a host pid: map it, where /proc says how
                mapped = self._host_pid_map() if mapped is None else mapped
                if p.pid in mapped:
                    local = mapped[p.pid]
                    names = self.host_reader.local_names(local)
                    visible = names is not None
            views.append(ProcessView(
                pid=local, name=os.path.basename(p.name) if p.name else (names[0] if visible and names else None),
                user=self.host_reader.user_of(local) if visible else None, used_mib=p.used_memory_mib,
                visible=visible, in_job=(local in self._job_tree) if self.pid is not None else None,
                host_pid=p.pid if local != p.pid else None))
        return dataclasses.replace(extras, processes=views)

    def _host_pid_map(self) -> dict[int, int]:
        """NVML pid -> local pid for the followed job's processes, from the pids each has in the other
        PID namespaces it is in (/proc/<pid>/status NSpid). Where this /proc only knows the
        container's own namespace (the usual container) there is nothing to map: {}."""
        table = self.host_reader.processes
        return {other: pid for pid in self._job_tree for other in table.ns_pids(pid) if other != pid}

    def _diagnose(self) -> None:
        following = self.pid is not None
        lost = self.sampler.lost
        for index, facts in self._facts.items():
            extras = self._views_extras.get(index)
            seen = None
            if extras is not None and extras.processes is not None:
                seen = [GpuProcessSeen(p.pid, p.used_mib, p.visible, p.in_job, p.name) for p in extras.processes]
            self._diagnoses[index] = diagnose.diagnose_gpu(
                list(self._recent[index]), facts, seen, list(self._host), following_job=following,
                in_container=self.in_container, trend=list(self._trend[index]), lost=lost.get(index))
        if self._job is not None:
            job_gpus = sorted(i for i, e in self._views_extras.items() if any(p.in_job for p in e.processes or []))
            # In a container, a GPU whose processes none of this container's are may run the job itself.
            maybe = sorted(i for i, e in self._views_extras.items()
                           if self.in_container and e.processes and not any(p.visible for p in e.processes))
            self._job.gpus, self._job.maybe_gpus = job_gpus, ([] if job_gpus else maybe)
            listed = any(e.processes is not None for e in self._views_extras.values())
            self._job_diagnosis = diagnose.diagnose_job(self._job.alive, {i: self._diagnoses[i] for i in job_gpus}, listed,
                                                        {i: self._diagnoses[i] for i in self._job.maybe_gpus})


def _in_container(machine: Machine) -> bool:
    """Whether this process runs in a container (where NVML's pids are the host's): the facts probe's
    answer, or, without host facts, the same markers read now (/.dockerenv, /proc/1/cgroup...)."""
    if machine.host is not None:
        return bool(machine.host.container)
    from ..probe.host import container_from

    try:
        with open("/proc/1/cgroup", encoding="utf-8", errors="replace") as f:
            cgroup = f.read()
    except OSError:
        cgroup = None
    return container_from(os.path.exists("/.dockerenv"), os.path.exists("/run/.containerenv"), os.environ, cgroup) is not None

"""Which benchmarks run where, in what order, with what time budget; and running them.

Every benchmark ends as measurements, or as a `bench.<name>` entry saying why it skipped or
failed, so the judge can say so. GPUs someone else is using are left alone unless forced.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .. import catalog, telemetry
from ..facts import DRIVER_SOURCES, Gpu, Machine, PcieLink
from ..probe import sysfs_pcie
from ..record import Series
from ..record.details import BenchNote
from . import context_child, schedule
from .common import Skip, measurement
from .session import Worker, WorkerError

ALL = schedule.GPU_BENCHMARKS
CPU_CAPABLE = schedule.CPU_CAPABLE
BUDGET_S, CPU_BUDGET_S = schedule.BENCH_BUDGET_S, schedule.CPU_BUDGET_S  # `gpuvet bench`'s budgets
SLACK_S = 45.0  # first CUDA use loads cuBLAS and builds kernels; a deadline must not mistake that for a hang
# Benchmarks that start fresh processes on a GPU (context start-up, all-reduce ranks): in an exclusive
# compute mode they need a worker that has not opened the GPU yet. (The workload trains in the worker
# itself, so its fresh-process resume cannot run there and says so.)
FRESH_PROCESS = tuple(b.name for b in catalog.BENCHMARKS if b.fresh_process)
TELEMETRY_INTERVAL_S = 0.1
# A long soak samples less often, so the whole load stays in the record (the sampler keeps at most
# about an hour at 10 Hz per GPU) and the record stays a few MB.
TELEMETRY_MAX_SAMPLES = 36_000


# Switches that make cuBLAS run fp32 matmuls as TF32 (or TF32 ones as fp32) whatever torch asks:
# set in some containers and launchers for training speed. The worker measures the hardware, so it
# runs without them; the user's own jobs keep them.
TF32_OVERRIDES = ("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "NVIDIA_TF32_OVERRIDE")


def worker_env(environ: dict[str, str] | None = None) -> dict[str, str | None]:
    """The worker's environment changes (None: removed). cuda:N numbered as nvidia-smi numbers GPUs
    (PCI bus order), unless the user chose an order or a CUDA_VISIBLE_DEVICES list: its numbers mean
    their order (the default puts the fastest first), so forcing ours would pick other GPUs on a
    host with mixed models."""
    environ = dict(os.environ) if environ is None else environ
    changes: dict[str, str | None] = {name: None for name in TF32_OVERRIDES if name in environ}
    if "CUDA_DEVICE_ORDER" not in environ and "CUDA_VISIBLE_DEVICES" not in environ:
        changes["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return changes


@dataclass
class Outcome:
    measurements: list[dict[str, Any]] = field(default_factory=list)
    series: list[Series] = field(default_factory=list)
    wall_s: dict[str, float] = field(default_factory=dict)  # each benchmark's wall time, to hold against the plan

    def note(self, name: str, subject: str, outcome: str, reason: str) -> None:
        """A benchmark that did not measure: skipped (does not apply) or failed (broke, hung)."""
        self.measurements.append({"name": f"bench.{name}", "value": None, "unit": "", "subject": subject,
                                  "details": BenchNote(outcome=outcome, reason=reason)})


@dataclass
class Target:
    gpu: Gpu | None  # None: the CPU
    device: str  # "cuda:N" / "cpu"
    subject: str


def run(machine: Machine, names: list[str], device: str = "cuda", force: bool = False,
        soak_minutes: float | None = None, progress: Callable[[str], None] = lambda m: None,
        workload: dict[str, Any] | None = None, profile: str = "bench",
        alongside_sustained: Callable[[], None] | None = None) -> Outcome:
    """`workload`: params for the reference workload (steps, path) from the user's options.
    `profile`: "default" takes the default run's budgets (bench/schedule.py), else `gpuvet bench`'s.
    `alongside_sustained`: host work to run in a thread while the GPUs hold the sustained load
    (called at most once; not at all when no sustained load runs: the caller then runs it itself)."""
    outcome = Outcome()
    reason = cannot_run(machine, device)
    if reason:
        for name in names:
            outcome.note(name, device if device == "cpu" else "gpu", "skipped", reason)
        return outcome
    if "latency" in names and device != "cpu":
        progress("latency.context_cold: a first CUDA process before any gpuvet process holds the GPU")
        outcome.measurements.append(cold_context_start())
    progress("starting the benchmark worker (imports PyTorch)")
    try:
        worker = Worker(env=worker_env())  # on Ctrl-C while it starts, it ends itself
    except WorkerError as err:
        for name in names:
            outcome.note(name, "gpu" if device != "cpu" else "cpu", "failed", str(err))
        return outcome
    runner = None
    interrupted = True  # until the benchmarks finish: Ctrl-C, SIGTERM, or a crash stops the worker at once
    try:
        targets = bench_targets(machine, worker, device, force, outcome, names)
        runner = Runner(machine, worker, targets, outcome, progress, soak_minutes, workload or {}, profile,
                         alongside_sustained)
        for name in names:
            t0 = time.monotonic()
            runner.run(name)
            outcome.wall_s[name] = round(time.monotonic() - t0, 2)
        interrupted = False
    finally:  # nothing may keep running on the GPUs
        (runner.worker if runner else worker).close(interrupted=interrupted)
    return outcome


def energy_mean(energy: list[tuple[float, int]], samples: list[telemetry.Sample]) -> dict[str, Any]:
    """The mean power of the samples' span from the energy counter (exact, where NVML's power
    reading is a 1 s average), and its share of the enforced limit; {} without the counter."""
    watts = telemetry.mean_power_w(energy, samples[0].t, samples[-1].t) if samples else None
    if watts is None:
        return {}
    limits = [s.power_limit_w for s in samples if s.power_limit_w]
    share = {"energy_mean_pct_of_limit": round(100 * watts / (sum(limits) / len(limits)), 2)} if limits else {}
    return {"energy_mean_w": round(watts, 2), **share}


def cold_context_start(python: str = sys.executable) -> dict[str, Any]:
    """The first CUDA process's context time on GPU 0, measured before the worker (or any gpuvet
    process) holds a context: with persistence mode off or under vGPU it is what every job's first
    process pays, and the later children, which find the driver kept loaded by the worker, never
    show it."""
    env = {name: value for name, value in {**os.environ, **worker_env()}.items() if value is not None}
    try:
        timing = context_child.run_child(0, env=env, python=python)
    except Skip as why:
        return measurement("latency.context_cold", None, "ms", "gpu0", skipped=str(why))
    except context_child.ContextInitError as err:
        return measurement("latency.context_cold", None, "ms", "gpu0", error=str(err))
    return measurement("latency.context_cold", round(timing.context_ms, 3), "ms", "gpu0", cuinit_ms=round(timing.cuinit_ms, 3),
                       before_any_gpuvet_process=True, measures=context_child.CONTEXT_INIT_WHAT)


def cannot_run(machine: Machine, device: str) -> str | None:
    """Why no GPU benchmark can run here (None: they can)."""
    torch = machine.stack.torch if machine.stack else None
    if torch is None or not torch.installed:
        from ..specs.torch_wheels import torch_install

        pip = f"{sys.executable} -m pip"  # the environment gpuvet runs in, by path: it works when pasted
        return f"PyTorch is not installed: {torch_install(machine, pip)}; gpuvet never installs or replaces it for you"
    if device == "cpu":
        return None
    if not machine.gpus:
        return f"no NVIDIA GPU: {machine.gpu_error or 'none found'}"
    if torch.cuda is None:
        return f"PyTorch {torch.version} is a CPU-only build: install a CUDA build to benchmark the GPUs"
    return None


def bench_targets(machine: Machine, worker: Worker, device: str, force: bool, outcome: Outcome, names: list[str]) -> list[Target]:
    if device == "cpu":
        return [Target(None, "cpu", "cpu")]
    targets = []
    for d in worker.info.get("devices", []):
        gpu = nvml_gpu(machine, d)
        subject = f"gpu{gpu.index}" if gpu else f"cuda{d['ordinal']}"
        if gpu and gpu.compute_mode == "Prohibited":
            for name in names:
                outcome.note(name, subject, "skipped", "compute mode Prohibited: no process may run CUDA on this GPU")
            continue
        busy = schedule.someone_else_on(gpu) if gpu else None
        if busy and not force:
            for name in names:
                outcome.note(name, subject, "skipped", f"{busy}: not loading it (use --force to benchmark anyway)")
            continue
        targets.append(Target(gpu, f"cuda:{d['ordinal']}", subject))
    if not targets and not worker.info.get("devices"):
        for name in names:
            outcome.note(name, "gpu", "skipped", "PyTorch sees no CUDA device (torch.cuda.is_available() is False)")
    return targets


def nvml_gpu(machine: Machine, device: dict[str, Any], environ: dict[str, str] | None = None) -> Gpu | None:
    """The NVML GPU behind a CUDA device of the worker: by PCI bus id, else by UUID (torch without
    the bus id), else by position, which holds only when CUDA numbers the GPUs in bus order: with a
    CUDA_VISIBLE_DEVICES list, cuda:k is the k-th GPU listed. None rather than a guess: telemetry and
    the busy check of the wrong GPU would judge a GPU that never ran the load."""
    environ = dict(os.environ) if environ is None else environ
    by_bus = {g.pcie.bus_id: g for g in machine.gpus if g.pcie.bus_id}
    if device.get("bus_id") in by_bus:
        return by_bus[device["bus_id"]]
    by_uuid = {_uuid_key(g.uuid): g for g in machine.gpus if g.uuid}
    if _uuid_key(device.get("uuid")) in by_uuid:
        return by_uuid[_uuid_key(device["uuid"])]
    ordinal = device["ordinal"]
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    order = environ.get("CUDA_DEVICE_ORDER") or worker_env(environ).get("CUDA_DEVICE_ORDER", "FASTEST_FIRST")
    if order != "PCI_BUS_ID":
        return None
    if visible is not None:
        listed = [v.strip() for v in visible.split(",") if v.strip()]
        if ordinal >= len(listed):
            return None
        entry = listed[ordinal]
        if entry.isdigit():
            return next((g for g in machine.gpus if g.index == int(entry)), None)
        return by_uuid.get(_uuid_key(entry))  # a UUID, or a MIG id that names no whole GPU
    return next((g for g in machine.gpus if g.index == ordinal), None)


def _uuid_key(uuid: str | None) -> str | None:
    """torch prints a GPU's UUID without NVML's "GPU-" prefix."""
    return uuid.strip().lower().removeprefix("gpu-") if uuid else None


class Runner:
    def __init__(self, machine, worker, targets, outcome, progress, soak_minutes, workload, profile="bench",
                 alongside_sustained=None):
        self.machine, self.worker, self.targets = machine, worker, targets
        self.outcome, self.progress, self.soak_minutes = outcome, progress, soak_minutes
        self.workload, self.profile, self.alongside_sustained = workload, profile, alongside_sustained
        self.cpu = bool(targets) and targets[0].device == "cpu"
        self.stopped: str | None = None  # why nothing more can run (the worker could not be restarted)
        self.worker_used = False  # it has run a job: it may hold a CUDA context on the GPUs

    def exclusive(self) -> list[Target]:
        """GPUs in an exclusive compute mode: one process (context) at a time."""
        return [t for t in self.targets if t.gpu is not None and (t.gpu.compute_mode or "").startswith("Exclusive")]

    def sustained_duration(self) -> float:
        return schedule.sustained_s(self.device_kind, self.soak_minutes, self.profile)

    @property
    def device_kind(self) -> str:
        return "cpu" if self.cpu else "cuda"

    def budget(self, name: str) -> float:
        return schedule.gpu_budget_s(name, self.device_kind, self.profile, self.soak_minutes, self.workload.get("steps"))

    def run(self, name: str) -> None:
        if self.stopped:
            machine_wide = name in ("p2p", "allreduce") and not self.cpu
            for subject in ["machine"] if machine_wide else [t.subject for t in self.targets]:
                self.outcome.note(name, subject, "skipped", self.stopped)
            return
        if not self.targets:
            return
        if self.cpu and name not in CPU_CAPABLE:
            self.outcome.note(name, "cpu", "skipped", f"{name} measures GPU hardware: it needs a CUDA GPU")
            return
        self.progress(f"benchmark {name}")
        if name in FRESH_PROCESS and self.exclusive() and self.worker_used:
            self._restart(f"{name} (exclusive compute mode: its fresh processes need GPUs no other process holds)", fresh=True)
            if self.stopped:
                return self.run(name)
        self.worker_used = True
        if name in ("gemm", "membw", "sustained"):
            self._side_by_side(name)
        elif name == "pcie":
            for target in self.targets:  # one at a time: they would share the host's bandwidth
                self._with_link_readings(target, name)
            if len(self.targets) > 1:  # then all at once: a shared switch uplink shows only so
                jobs = [{**self._job(name, t, together=True, **self._numa(t)), "budget_s": schedule.PCIE_TOGETHER_S}
                        for t in self.targets]
                self.run_jobs(jobs, name)
        elif name == "latency":
            self.run_jobs([self._job(name, t) for t in self.targets[:1]], name)
        elif name == "workload":  # one GPU is enough to prove the platform end to end
            target = self.targets[0]
            held = {"exclusive_mode": target.gpu.compute_mode} if target in self.exclusive() else {}
            self.run_jobs([self._job(name, target, **self.workload, **_peak(target.gpu), **held)], name)
        elif name in ("p2p", "allreduce"):
            self._multi_gpu(name)

    def _job(self, name: str, target: Target, **params: Any) -> dict[str, Any]:
        if name == "sustained":
            params.setdefault("duration_s", self.sustained_duration())
        return {"module": name, "device": target.device, "subject": target.subject,
                "budget_s": self.budget(name), "params": params}

    def _show(self, message: dict[str, Any]) -> None:
        """A benchmark's progress line, naming its GPU when several run side by side."""
        several = len(self.targets) > 1 and message.get("subject")
        self.progress(f"{message['subject']}: {message['progress']}" if several else message["progress"])

    def run_jobs(self, jobs: list[dict[str, Any]], name: str) -> list[dict]:
        """Run jobs side by side in the worker. A hang or crash fails the jobs that had not
        finished (named in the reason); those that finished keep their figures."""
        if not jobs:
            return []
        if self.stopped:  # the worker was lost earlier in this benchmark (host copies go GPU by GPU)
            for job in jobs:
                self.outcome.note(name, job["subject"], "skipped", self.stopped)
            return []
        timeout = self.budget(name) * 2 + SLACK_S
        try:
            results = self.worker.run({"parallel": jobs}, timeout_s=timeout, on_progress=self._show)
        except WorkerError as err:
            finished = err.results + [None] * (len(jobs) - len(err.results))
            for job, result in zip(jobs, finished):
                if result is None:
                    self.outcome.note(name, job["subject"], "failed", str(err))
                else:
                    self._keep(name, job, result)
            lost = [job["subject"] for job, result in zip(jobs, finished) if result is None]
            self._restart(f"{name} {'hung' if err.hung else 'failed'} on {', '.join(lost) or 'the worker'}")
            return []
        for job, result in zip(jobs, results):
            self._keep(name, job, result)
        return results

    def _keep(self, name: str, job: dict[str, Any], result: dict[str, Any]) -> None:
        if result.get("ok"):
            self.outcome.measurements += result.get("measurements") or []
            self.outcome.series += result.get("series") or []
        else:
            kind = "skipped" if "skip" in result else "failed"
            self.outcome.note(name, job["subject"], kind, result.get("skip") or result.get("error") or "unknown")

    def _restart(self, after: str, fresh: bool = False) -> None:
        """A new worker: after a hang or crash, or (`fresh`) to free GPUs in an exclusive compute
        mode, where the old worker's CUDA context would keep a fresh process off the GPU."""
        self.worker.close()
        self.worker_used = False
        try:
            self.worker = Worker(env=worker_env())
        except WorkerError as err:  # nothing more can run: later benchmarks say why
            when = "before" if fresh else "after"
            self.stopped = f"not run: the benchmark worker could not be restarted {when} {after}: {err}"

    def _side_by_side(self, name: str) -> None:
        sampler = self.start_sampler(load_s=self.sustained_duration()) if name == "sustained" else None
        host = self._start_alongside() if name == "sustained" else None
        finished = False
        try:
            self.run_jobs([self._job(name, t) for t in self.targets], name)
            finished = True
        finally:
            if sampler is not None:
                self.record_telemetry(sampler, name)
            if host is not None and finished:  # on Ctrl-C the run stops at once: not waiting for the host's
                host.join()

    def _start_alongside(self) -> threading.Thread | None:
        """The host benchmarks that share the sustained load's time (bench/schedule.py says why)."""
        work, self.alongside_sustained = self.alongside_sustained, None
        if work is None:
            return None
        thread = threading.Thread(target=work, name="gpuvet-host-benchmarks", daemon=True)
        thread.start()
        return thread

    def _with_link_readings(self, target: Target, name: str) -> None:
        """PCIe copies, with the link's generation and width read by NVML while they run."""
        sampler = self.start_sampler([target])
        params = self._numa(target)
        try:
            self.run_jobs([self._job(name, target, **params)], name)
        finally:
            if sampler is not None and target.gpu is not None:  # a sampler only for a GPU
                samples = sampler.stop().get(target.gpu.index, [])
                add_loaded_link(target.gpu, samples, self.load_window(target.subject))

    def _numa(self, target: Target) -> dict[str, Any]:
        cpus, where = numa_cpus(self.machine, target.gpu)
        return {"cpu_affinity": cpus, "cpu_affinity_source": where} if target.gpu else {}

    def load_window(self, subject: str) -> tuple[float, float] | None:
        """When the pinned copies held the link busy (epoch seconds, from the pcie job's details)."""
        pinned = next((m for m in self.outcome.measurements if m.get("name") == "pcie.h2d_pinned"
                       and m.get("subject") == subject), None)
        window = (pinned or {}).get("details", {}).get("load_window")
        if not (isinstance(window, list) and len(window) == 2 and all(isinstance(t, (int, float)) for t in window)):
            return None
        return window[0] - 0.001, window[1] + 0.001  # the job rounds to the millisecond

    def _multi_gpu(self, name: str) -> None:
        gpus = [t for t in self.targets if t.gpu is not None]
        if self.cpu and name == "allreduce":
            self.run_jobs([self._job(name, self.targets[0], world_size=2)], name)
            return
        if len(gpus) < 2:
            self.outcome.note(name, "machine", "skipped", f"{name} needs at least two GPUs; this machine offers {len(gpus)}")
            return
        ordinals = [int(t.device.split(":")[1]) for t in gpus]
        job = {"module": name, "device": gpus[0].device, "subject": "machine", "budget_s": self.budget(name),
               "params": {"gpus": ordinals, "world_size": len(ordinals)}}
        self.run_jobs([job], name)

    def start_sampler(self, targets: list[Target] | None = None, load_s: float = 0.0) -> telemetry.Sampler | None:
        indices = [t.gpu.index for t in (targets or self.targets) if t.gpu is not None]
        if not indices:
            return None
        interval = max(TELEMETRY_INTERVAL_S, (load_s + SLACK_S) / TELEMETRY_MAX_SAMPLES)
        sampler = telemetry.Sampler(indices, interval_s=interval, max_samples=TELEMETRY_MAX_SAMPLES + 1000)
        sampler.start()
        return sampler

    def record_telemetry(self, sampler: telemetry.Sampler, name: str) -> None:
        by_gpu = sampler.stop()
        energy = sampler.energy()
        for target in self.targets:
            samples = by_gpu.get(target.gpu.index, []) if target.gpu else []
            samples = self._under_load(samples, name, target.subject)
            if not samples:
                continue
            self.outcome.series.append(telemetry.to_series(samples, f"{name}.telemetry", target.subject, sampler.interval_s))
            details = {**telemetry.summarize(samples), "interval_s": sampler.interval_s,
                       **energy_mean(energy.get(target.gpu.index, []) if target.gpu else [], samples)}
            self.outcome.measurements.append({"name": f"{name}.telemetry", "value": None, "unit": "",
                                              "subject": target.subject, "details": details})


    def _under_load(self, samples: list[telemetry.Sample], name: str, subject: str) -> list[telemetry.Sample]:
        """The samples taken while this GPU's load ran. The sampler starts before the worker sets up
        (context, cuBLAS, random inputs) and stops after the slowest GPU: idle readings (an idle
        clock, the gpu_idle reason) must not be judged as the GPU under load."""
        load = next((s for s in self.outcome.series if s.get("name") == f"{name}.throughput"
                     and s.get("subject") == subject and s.get("rows")), None)
        if load is None or not isinstance(load.get("start"), (int, float)):
            return samples
        begin, end = load["start"], load["start"] + load["rows"][-1][0]
        return [s for s in samples if begin <= s.t <= end]


def _peak(gpu: Gpu | None) -> dict[str, Any]:
    """The GPU's dense bf16/fp16 peak for the workload's MFU (none for an unknown model or the CPU)."""
    from ..specs.reference import match

    ref = match(gpu.name) if gpu else None
    if ref is None:
        return {}
    peaks = {d: ref.number(f"{d}_tensor_tflops_dense") for d in ("bf16", "fp16")}
    return {"peak_tflops": {d: v for d, v in peaks.items() if v}} if any(peaks.values()) else {}


def numa_cpus(machine: Machine, gpu: Gpu | None, root: str = sysfs_pcie.PCI_DEVICES) -> tuple[list[int], str]:
    """CPUs of the GPU's NUMA node, to place host buffers near it, and where they come from: the
    GPU's PCI device in sysfs (`local_cpulist`, what nvbandwidth binds to), else `topo -m`'s CPU
    affinity; cut to the CPUs this process may use."""
    if gpu is None:
        return [], ""
    cpus, source = (sysfs_pcie.local_cpus(gpu.pcie.bus_id, root), "sysfs local_cpulist") if gpu.pcie.bus_id else ([], "")
    if not cpus and machine.topology is not None:
        spec = machine.topology.cpu_affinity.get(f"GPU{gpu.index}", "")
        cpus, source = sysfs_pcie.parse_cpu_list(spec.replace(" ", "")), "nvidia-smi topo -m"
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(cpus)
    cpus = [c for c in cpus if c in allowed]
    return cpus, source if cpus else ""


def add_loaded_link(gpu: Gpu | None, samples: list[telemetry.Sample], window: tuple[float, float] | None = None) -> None:
    """The link as it held while the pinned copies kept it busy: the reading seen most in that window,
    so a link that trains up and then drops under load shows the drop. Without the window (no pinned
    copies), the fastest reading of the job: idle moments in it read a power-saving downshift."""
    if window is not None:
        samples = [s for s in samples if window[0] <= s.t <= window[1]]
    readings = [(s.pcie_gen, s.pcie_width) for s in samples if s.pcie_gen and s.pcie_width]
    if gpu is None or not readings:
        return
    if window is not None:
        gen, width = max(set(readings), key=lambda r: (readings.count(r), r))
    else:
        gen, width = max(readings)
    idle = next((r for r in gpu.pcie.readings if r.source in DRIVER_SOURCES), None)
    gpu.pcie.readings.insert(0, PcieLink(current_gen=gen, max_gen=idle.max_gen if idle else None, current_width=width,
                                         max_width=idle.max_width if idle else None, source="nvml", under_load=True))

"""What a run does, in what order, on which GPUs, with what time budget: the plan `gpuvet run
--plan` prints before anything runs, and the one the run follows (bench/plan.py and the runner
take every budget from here, so the forecast and the run cannot drift apart).

The default `gpuvet run` keeps to about two minutes on an 8-GPU node:
- the CPU feed rate runs alone first: it measures the CPU, so nothing else may use it;
- storage and the loopback network run while the GPUs hold the sustained load: they use the
  disks, the kernel's network stack and a few cores, the load uses the GPUs;
- GEMM, memory bandwidth and the sustained load run on all GPUs at once; host<->GPU copies go one
  GPU at a time (they would share the host's bandwidth);
- the default run's budgets are shorter than `gpuvet bench NAME`'s, which measures one thing
  thoroughly: enough for every check to decide (a slow or throttled GPU is still caught), with
  the sustained load kept at 30 s.

Pure: facts in, plan out. Nothing here imports torch or touches the machine.
"""

from __future__ import annotations

from ..record.plan import BenchPlan, PlanStep as Step
from typing import Any

from .. import catalog
from ..facts import Gpu, Machine
from ..occupancy import someone_else_on  # the judge's gpu.isolation rule: a GPU it calls idle is loaded

GPU_BENCHMARKS = catalog.GPU_BENCHMARKS
HOST_BENCHMARKS = catalog.HOST_BENCHMARKS
ALONGSIDE_SUSTAINED = ("disk", "net")  # host benchmarks that run while the GPUs hold the sustained load

# Seconds each GPU benchmark may use (all GPUs at once where they run side by side; pcie: per GPU).
# `gpuvet bench NAME` budgets: one benchmark, measured thoroughly.
BENCH_BUDGET_S = {b.name: b.budget_s for b in catalog.BENCHMARKS if b.where == "gpu"}
# The default `gpuvet run`: every check decided within two minutes on 8 GPUs (a test holds it).
RUN_BUDGET_S = {b.name: b.run_budget_s or b.budget_s for b in catalog.BENCHMARKS if b.where == "gpu"}
CPU_BUDGET_S = {b.name: b.cpu_budget_s for b in catalog.BENCHMARKS if b.where == "gpu" and b.cpu_budget_s is not None}
HOST_BUDGET_S = {b.name: b.budget_s for b in catalog.BENCHMARKS if b.where == "host"}
# The workload's budget is sized for a number of steps (bench/workload.py SIZES for `gpuvet bench`,
# RUN_WORKLOAD_STEPS for the default run); asking for more steps scales it up.
WORKLOAD_DEFAULT_STEPS = {"cuda": 150, "cpu": 30}
RUN_WORKLOAD_STEPS = 30  # `gpuvet run` proves checkpoint and resume; `gpuvet workload` trains longer
# The sustained load runs for exactly its duration (the budget's figure, or --soak); its budget adds
# this for allocating the matrices and timing the first calls.
SUSTAINED_SETUP_S = 2.0
FACTS_S = 3.0  # NVML, sysfs, /proc and PyTorch's versions read in a subprocess
WORKER_START_S = 5.0  # the benchmark worker imports PyTorch and sees the GPUs
RUN_TARGET_S = 120.0  # the promise for the default run on 8 GPUs
PCIE_TOGETHER_S = 1.0  # every GPU's pinned copies at once, after the GPU-by-GPU ones (0.5 s a direction)

CPU_CAPABLE = tuple(b.name for b in catalog.BENCHMARKS if b.where == "gpu" and b.cpu_capable)
SIDE_BY_SIDE = ("gemm", "membw", "sustained")  # one job per GPU, all at once


def host_budget_s(name: str, paths: int = 1) -> float:
    """A host benchmark's budget: storage grows with the number of paths it tests (sub-linearly)."""
    return HOST_BUDGET_S[name] * (max(1, paths) ** 0.5 if name == "disk" else 1.0)


def gpu_budget_s(name: str, device: str = "cuda", profile: str = "bench", soak_minutes: float | None = None,
                 workload_steps: int | None = None) -> float:
    """A GPU benchmark's budget for one job (pcie: one GPU's copies). `profile` "default" is the
    default `gpuvet run`; anything else measures one benchmark thoroughly."""
    cpu = device == "cpu"
    if name == "sustained":
        return sustained_s(device, soak_minutes, profile) + SUSTAINED_SETUP_S
    budget = _budgets(device, profile)[name]
    if name == "workload" and workload_steps:
        sized_for = RUN_WORKLOAD_STEPS if (profile == "default" and not cpu) else WORKLOAD_DEFAULT_STEPS["cpu" if cpu else "cuda"]
        budget *= max(1.0, workload_steps / sized_for)
    return budget


def sustained_s(device: str = "cuda", soak_minutes: float | None = None, profile: str = "default") -> float:
    """How long the sustained load holds: --soak, else the profile's default."""
    if soak_minutes:
        return soak_minutes * 60.0
    return _budgets(device, profile)["sustained"]


def _budgets(device: str, profile: str) -> dict[str, float]:
    return CPU_BUDGET_S if device == "cpu" else RUN_BUDGET_S if profile == "default" else BENCH_BUDGET_S


class Plan(BenchPlan):
    """A run's plan as schedule.plan() makes it: the record's type (gpuvet.record.plan), with the
    total a default run aims at filled in."""

    def to_dict(self) -> dict[str, Any]:
        self.target_s = RUN_TARGET_S if self.profile == "default" else None
        return super().to_dict()


def plan(machine: Machine, names: list[str], device: str = "cuda", profile: str = "default",
         soak_minutes: float | None = None, force: bool = False, paths: int = 1,
         workload_steps: int | None = None, cannot_run: str | None = None) -> Plan:
    """The steps a run of `names` takes on `machine`, in order. `cannot_run`: why no GPU benchmark
    can run (no PyTorch, no GPU), as bench/plan.py finds it; the host benchmarks still do."""
    gpu_names = [n for n in GPU_BENCHMARKS if n in names]
    host_names = [n for n in HOST_BENCHMARKS if n in names]
    notes: list[str] = []
    gpus = loaded_gpus(machine, force, notes) if device != "cpu" else []
    steps = [Step("facts", "host", FACTS_S, "NVML, sysfs, /proc, the kernel and PyTorch's versions (read-only)")]
    gpu_work = bool(gpu_names) and not cannot_run and (device == "cpu" or bool(gpus))
    # Storage and network wait for the sustained load whenever one is asked for; when it cannot run
    # they follow the GPU steps on their own, as the runner does.
    alongside = [n for n in ALONGSIDE_SUSTAINED if n in host_names] if "sustained" in gpu_names else []
    steps += [_host_step(n, paths) for n in host_names if n not in alongside]
    if gpu_names and not gpu_work:
        why = cannot_run or "no GPU to load: " + "; ".join(notes or ["none found"])
        steps += [Step(n, "gpu", 0.0, "", skipped=why) for n in gpu_names]
        steps += [_host_step(n, paths) for n in alongside]
    elif gpu_names:
        steps.append(Step("worker", "host", WORKER_START_S, "start the benchmark worker (imports PyTorch)"))
        for name in gpu_names:
            step = _gpu_step(name, gpus, device, profile, soak_minutes, workload_steps)
            if name == "sustained" and alongside:
                host_s = sum(host_budget_s(n, paths) for n in alongside)
                step.alongside = alongside
                step.how += f"; meanwhile {' then '.join(alongside)} on the host ({host_s:g} s)"
                step.budget_s = max(step.budget_s, host_s)
            steps.append(step)
    return Plan(profile, device, [g.index for g in gpus], steps, notes)


def loaded_gpus(machine: Machine, force: bool = False, notes: list[str] | None = None) -> list[Gpu]:
    """The GPUs the benchmarks will load: not those in compute mode Prohibited, nor (unless
    forced) those someone else is using."""
    chosen = []
    for gpu in machine.gpus:
        reason: str | None
        if gpu.compute_mode == "Prohibited":
            reason = "compute mode Prohibited: no process may run CUDA on this GPU"
        else:
            busy = someone_else_on(gpu)
            reason = f"{busy}: not loading it (use --force to benchmark anyway)" if busy and not force else None
        if reason:
            if notes is not None:
                notes.append(f"gpu{gpu.index}: {reason}")
            continue
        chosen.append(gpu)
    return chosen


def gpu_span(indices: list[int]) -> str:
    """"gpu0-7", "gpu0,2,5", "gpu3": the GPUs a step loads."""
    if not indices:
        return "gpu"
    if len(indices) > 2 and indices == list(range(indices[0], indices[-1] + 1)):
        return f"gpu{indices[0]}-{indices[-1]}"
    return "gpu" + ",".join(str(i) for i in indices)


def _host_step(name: str, paths: int) -> Step:
    how = {"disk": f"storage: sequential write/read, random reads, small files ({paths} path(s))",
           "net": "loopback TCP throughput and latency, NICs, RDMA",
           "cpu": "CPU feed rate: JPEG decode + augment like a DataLoader, alone on the CPU"}[name]
    return Step(name, "host", host_budget_s(name, paths), how)


def _gpu_step(name: str, gpus: list[Gpu], device: str, profile: str, soak_minutes: float | None,
              workload_steps: int | None) -> Step:
    if device == "cpu":
        if name not in CPU_CAPABLE:
            return Step(name, "cpu", 0.0, "", skipped=f"{name} measures GPU hardware: it needs a CUDA GPU")
        return Step(name, "cpu", gpu_budget_s(name, "cpu", profile, soak_minutes, workload_steps), "on the CPU")
    indices = [g.index for g in gpus]
    budget = gpu_budget_s(name, device, profile, soak_minutes, workload_steps)
    if name in SIDE_BY_SIDE:
        how = {"gemm": "GEMM sweep per dtype", "membw": "device memory copy",
               "sustained": f"GEMM load held {sustained_s(device, soak_minutes, profile):g} s with telemetry"}[name]
        return Step(name, gpu_span(indices), budget, how + (" on all GPUs at once" if len(indices) > 1 else ""))
    if name == "pcie":
        if len(indices) < 2:
            return Step(name, gpu_span(indices), budget, "host<->GPU copies")
        return Step(name, gpu_span(indices), budget * len(indices) + PCIE_TOGETHER_S,
                    f"host<->GPU copies, one GPU at a time ({budget:g} s each), then all at once ({PCIE_TOGETHER_S:g} s)")
    if name == "latency":
        return Step(name, gpu_span(indices[:1]), budget, "CUDA context start-up in fresh processes, kernel launch")
    if name == "workload":
        return Step(name, gpu_span(indices[:1]), budget, "small GPT: train, checkpoint, resume in a fresh process")
    if len(indices) < 2:
        return Step(name, "machine", 0.0, "", skipped=f"{name} needs at least two GPUs; this machine offers {len(indices)}")
    how = {"p2p": "GPU-to-GPU copies, every pair", "allreduce": f"all-reduce across {len(indices)} GPUs (NCCL)"}[name]
    return Step(name, "machine", budget, how)

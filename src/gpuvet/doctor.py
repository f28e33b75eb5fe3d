"""gpuvet doctor: from a symptom to its likely causes, and the checks that tell them apart.

Covers every row of the first seed's troubleshooting table (5.1) and the cases of the second
seed (model.to('cuda') hanging, "no kernel image is available", NCCL hangs, memory figures that
disagree). Given a run record, each cause is answered from it: confirmed (a check failed or
warned, or a fact shows it), ruled out (a check that tests the cause passed: a measurement under
load, or a reading of the very setting at fault), or unknown (not tested: here is the command that
tests it). A passing check that only bears on a cause (an idle snapshot for a slowdown that comes
under load, the core count for a CPU feed rate) is shown, but rules nothing out. Without a record,
doctor says what to run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

from rich.console import Console
from rich.markup import escape

from .judge.gpu_links import link_state
from .judge.host import preemptible_of, workdir_persistence
from .judge.stack import coarse_memory_accounting
from .record import FAIL, PASS, SKIP, WARN, Finding, RunRecord
from .report.checklist import subject_range

CONFIRMED, RULED_OUT, UNKNOWN = "confirmed", "ruled out", "unknown"
FactVerdict = tuple[str, str]  # (state, figure)


@dataclass(frozen=True)
class Cause:
    name: str
    rules_out: tuple[str, ...] = ()  # checks that test it: a problem confirms it, a pass rules it out
    checks: tuple[str, ...] = ()  # checks that only bear on it: a problem confirms it, a pass rules nothing out
    measure: str = "gpuvet run"  # the gpuvet command that tests it
    commands: tuple[str, ...] = ()  # what a person runs to confirm it by hand
    facts: Callable[[RunRecord], FactVerdict | None] | None = None  # for causes no check covers
    untested: str = ""  # why the bearing checks cannot rule it out, for "not tested by this run"


@dataclass(frozen=True)
class Symptom:
    name: str  # short name typed on the command line
    description: str
    seed: str  # the seed's own words, to find the row there
    aliases: tuple[str, ...]  # other ways people say it: error messages, Chinese phrases
    causes: tuple[Cause, ...]
    advice: str = ""  # what the seed says to do whatever the cause
    # A symptom that comes and goes with the time of day: one run, taken at one time, can confirm
    # a cause it catches but cannot rule one out.
    by_time_of_day: bool = False


@dataclass
class CauseResult:
    cause: Cause
    state: str
    figures: list[str] = field(default_factory=list)  # what decided it
    next_step: str = ""  # remedy when confirmed, the command to measure it when unknown


@dataclass
class Diagnosis:
    symptom: Symptom
    record: RunRecord | None
    results: list[CauseResult]
    source: str | None = None  # which run answered ("run #4", a file)
    source_note: str | None = None  # why that run ("the latest full `gpuvet run` of this machine")

    def of(self, state: str) -> list[CauseResult]:
        return [r for r in self.results if r.state == state]


# -- answering from a record -----------------------------------------------------------------------

_ORDER = {CONFIRMED: 0, UNKNOWN: 1, RULED_OUT: 2}


def diagnose(symptom: Symptom, record: RunRecord | None = None, source: str | None = None,
             source_note: str | None = None) -> Diagnosis:
    """Every cause of the symptom, confirmed first, then unknown, then ruled out."""
    results = [_answer(cause, record) for cause in symptom.causes]
    if record is not None and symptom.by_time_of_day:
        results = [_one_time_of_day(r, record) for r in results]
    if record is not None:
        results.sort(key=lambda r: _ORDER[r.state])
    return Diagnosis(symptom, record, results, source, source_note)


def _one_time_of_day(result: CauseResult, record: RunRecord) -> CauseResult:
    """A pass at one time of day says nothing about another: what looked fine stays open."""
    if result.state != RULED_OUT:
        return result
    from .store import machine_identity  # the key `gpuvet history --machine` groups runs by

    key = machine_identity(record.machine).key
    when = record.started_at.replace("T", " ")[:16]
    figures = [f"not tested: one run at one time of day cannot rule out a day-time cause; compare runs at "
               f"different times with `gpuvet history --machine {key}`"]
    figures += [f"seen at {when} UTC: {figure}" for figure in result.figures]
    return CauseResult(result.cause, UNKNOWN, figures,
                       f"run `{result.cause.measure or 'gpuvet run'}` by day and at night, then `gpuvet history --machine {key}`")


def _to_measure(cause: Cause) -> str:
    by_hand = f"by hand: {'; '.join(cause.commands)}" if cause.commands else ""
    if not cause.measure or (not cause.rules_out and not cause.checks and cause.facts is None):
        return by_hand
    return f"`{cause.measure}`" + (f"; {by_hand}" if by_hand else "")


def _answer(cause: Cause, record: RunRecord | None) -> CauseResult:
    if record is None:
        return CauseResult(cause, UNKNOWN, [], _to_measure(cause))
    if not cause.rules_out and not cause.checks and cause.facts is None:
        return CauseResult(cause, UNKNOWN, ["a run record cannot show this; check it by hand"], _to_measure(cause))
    found = [f for f in record.findings if f.check in cause.rules_out or f.check in cause.checks]
    if not record.machine.gpus and found and all(f.check.startswith("gpu.") for f in found):
        return _no_gpu_to_tell(cause, record)
    problems = [f for f in found if f.status in (FAIL, WARN)]
    tests = [f for f in found if f.status == PASS and f.check in cause.rules_out]
    fact = cause.facts(record) if cause.facts else None
    if problems:
        figures = _figures(problems) + ([fact[1]] if fact and fact[0] == CONFIRMED else [])
        return CauseResult(cause, CONFIRMED, figures, problems[0].remedy or _to_measure(cause))
    if fact and fact[0] == CONFIRMED:
        return CauseResult(cause, CONFIRMED, [fact[1]], "; ".join(cause.commands))
    if tests or (fact and fact[0] == RULED_OUT):
        figures = _figures(tests) + ([fact[1]] if fact else [])
        return CauseResult(cause, RULED_OUT, figures)
    return CauseResult(cause, UNKNOWN, _open_figures(cause, found, fact), _to_measure(cause))


def _no_gpu_to_tell(cause: Cause, record: RunRecord) -> CauseResult:
    """A run that saw no GPU can neither confirm nor rule out a cause that lives in the GPU: its
    "no GPU visible" is a different problem (`gpuvet doctor container-no-gpu`)."""
    why = record.machine.gpu_error or "no NVIDIA GPU found"
    return CauseResult(cause, UNKNOWN, [f"not tested: this run saw no NVIDIA GPU ({why}), so it cannot tell"],
                       f"where the GPU is visible: {_to_measure(cause)}; if it should be visible here: "
                       f"`gpuvet doctor container-no-gpu`")


def _open_figures(cause: Cause, found: list[Finding], fact: FactVerdict | None) -> list[str]:
    """Why a cause stays open: what would test it, and what the run saw that bears on it."""
    bearing = [f for f in found if f.status == PASS]  # passes of checks that cannot rule it out
    skipped = list(dict.fromkeys(f.summary for f in found if f.status == SKIP))
    if bearing or (fact and cause.untested):
        figures = [f"not tested by this run: {cause.untested}" if cause.untested else "not tested by this run"]
        seen = [line if line.startswith("...") else f"seen: {line}" for line in _figures(bearing, limit=2)]
        return figures + ([fact[1]] if fact else []) + seen
    return ([fact[1]] if fact else []) + skipped[:2] or ["not measured in this run"]


def _figures(findings: list[Finding], limit: int = 3) -> list[str]:
    """ "subjects: summary" per distinct summary, worst first."""
    by_text: dict[tuple[str, str], list[str]] = {}
    for f in sorted(findings, key=lambda f: f.status != FAIL):
        by_text.setdefault((f.check, f.summary), []).append(f.subject)
    lines = [f"{subject_range(list(dict.fromkeys(subjects)))}: {summary}" for (_, summary), subjects in by_text.items()]
    return lines[:limit] + ([f"... {len(lines) - limit} more"] if len(lines) > limit else [])


# -- facts no check covers -------------------------------------------------------------------------

def _driver_here(record: RunRecord) -> FactVerdict | None:
    m = record.machine
    if m.gpus:
        return RULED_OUT, f"the NVIDIA driver answers here: {len(m.gpus)} GPU(s) visible"
    if m.source != "live":
        return None  # a capture says nothing about the container it was not taken in
    where = f" (inside {m.host.container})" if m.host and m.host.container else ""
    return CONFIRMED, f"no GPU visible{where}: {m.gpu_error or 'no NVIDIA GPU found'}"


def _preemptible(record: RunRecord) -> FactVerdict | None:
    preemptible, said_by = preemptible_of(record.options, record.machine.host)
    if preemptible is None:
        return None
    return (CONFIRMED, f"this instance is preemptible ({said_by})") if preemptible else \
        (RULED_OUT, f"this instance is not preemptible ({said_by})")


def _in_container(record: RunRecord) -> FactVerdict | None:
    host = record.machine.host
    if host is None:
        return None
    if host.container:
        return UNKNOWN, f"running in {host.container}: packages installed at run time live in the container and go with it"
    return RULED_OUT, "not in a container"


def _vgpu(record: RunRecord) -> FactVerdict | None:
    modes = {g.virtualization_mode for g in record.machine.gpus}
    if "vgpu" in modes:
        names = subject_range([f"gpu{g.index}" for g in record.machine.gpus if g.virtualization_mode == "vgpu"])
        return CONFIRMED, f"{names}: vGPU guest (every new process pays a slower context start)"
    if modes and modes <= {"none", "passthrough"}:
        # Whole GPUs start faster than vGPU guests, but a slow start has other causes: only the
        # context time itself (gpu.context_init) rules this out.
        return UNKNOWN, f"whole GPUs ({', '.join(sorted(modes))}), not a vGPU guest"
    return None


def _persistence(record: RunRecord) -> FactVerdict | None:
    gpus = record.machine.gpus
    off = [f"gpu{g.index}" for g in gpus if g.persistence_mode is False]
    if off:
        return CONFIRMED, f"persistence mode off on {subject_range(off)}: the driver tears down between processes"
    if gpus and all(g.persistence_mode for g in gpus):
        return RULED_OUT, "persistence mode on"
    return None


def _module_loading(record: RunRecord) -> FactVerdict | None:
    stack = record.machine.stack
    if stack is None:
        return None
    value = (stack.cuda_module_loading or "").upper()
    if value == "LAZY":
        return RULED_OUT, "CUDA_MODULE_LOADING=LAZY"
    if value:
        return CONFIRMED, f"CUDA_MODULE_LOADING={value}: every kernel of every library loads at start-up"
    return UNKNOWN, "CUDA_MODULE_LOADING not set (PyTorch 2.x sets LAZY itself; older code loads eagerly)"


def _workdir_kept(record: RunRecord) -> FactVerdict | None:
    """Whether the working directory outlives the instance, as far as the facts tell."""
    host = record.machine.host
    if host is None or host.workdir is None or host.workdir.fs_type is None:
        return None
    persistent, why = workdir_persistence(host)
    where = f"{host.workdir.path} on {host.workdir.fs_type}"
    if persistent is None:
        return UNKNOWN, f"{where}: {why}"
    return (RULED_OUT if persistent else CONFIRMED), f"{where}: {why}"


def _pcie_full_link(record: RunRecord) -> FactVerdict | None:
    """Rules the link out where every GPU's link reads its full width and generation, as gpu.pcie_link
    reads it: under load, or already at idle (a link downshifts when idle, it never trains up past
    its max under load)."""
    full, idle = [], False
    for gpu in record.machine.gpus:
        state = link_state(gpu)
        if state is None or not state.full:
            return None
        idle = idle or not state.under_load
        full.append((f"gpu{gpu.index}", f"Gen{state.reading.current_gen} x{state.reading.current_width}"))
    if not full:
        return None
    links = ", ".join(dict.fromkeys(link for _, link in full))
    when = "already at idle" if idle else "read under load"
    return RULED_OUT, f"{subject_range([s for s, _ in full])}: the full {links} link, {when}"


def _old_driver(record: RunRecord) -> FactVerdict | None:
    version = record.machine.driver.version
    coarse = coarse_memory_accounting(version)
    if coarse is None:
        return None
    if coarse:
        return CONFIRMED, f"driver {version}: older drivers account memory coarsely (418-era drivers over-report used memory)"
    return RULED_OUT, f"driver {version}"


# -- the symptoms ----------------------------------------------------------------------------------

_SMI_WATCH = "nvidia-smi --query-gpu=index,temperature.gpu,power.draw,power.limit,clocks.sm,clocks_event_reasons.active --format=csv -l 5"
_POWER = Cause("Power limit capped below the default", rules_out=("gpu.power_limit",), measure="gpuvet run",
               commands=("nvidia-smi -q -d POWER", _SMI_WATCH))
_PCIE = Cause("PCIe link narrower or slower than the card (riser, x8 slot, virtualised link)",
              rules_out=("gpu.pcie_bandwidth",), checks=("gpu.pcie_link", "gpu.link_errors"), measure="gpuvet bench pcie",
              commands=("sudo lspci -vv | grep -E 'LnkCap|LnkSta'", "nvidia-smi -q -d PCIE (while a job runs)"),
              facts=_pcie_full_link,
              untested="the link was read idle, where it downshifts; copy across it (`gpuvet bench pcie`) to see its speed")
_WEAK_GPU = Cause("A weaker or cut-down GPU than sold, or one that computes slowly",
                  rules_out=("gpu.gemm", "gpu.memory_bandwidth"), checks=("gpu.model",),
                  measure="gpuvet bench gemm membw --expect 'MODEL'", commands=("nvidia-smi --query-gpu=name,memory.total --format=csv",),
                  untested="the name matches, but only a GEMM and memory benchmark shows how fast it computes")
_THROTTLE = Cause("Clocks cut by heat or a power brake", rules_out=("gpu.sustained",),
                  checks=("gpu.throttle", "gpu.temperature", "gpu.throttle_history"),
                  measure="gpuvet run --soak 10", commands=("nvidia-smi -q -d PERFORMANCE,TEMPERATURE", _SMI_WATCH),
                  untested="clocks and temperature were read once, not under minutes of load, where heat and power brakes show")
_SHARED_GPU = Cause("The GPU is shared (vGPU, MIG slice, or another tenant's processes)", rules_out=("gpu.isolation",),
                    measure="gpuvet run", commands=("nvidia-smi (processes, memory in use)", "nvidia-smi -q -d MEMORY,UTILIZATION"))
_STEAL = Cause("CPU time stolen by the hypervisor (an oversold host)", rules_out=("host.steal",), measure="gpuvet run",
               commands=("vmstat 1 10 (column st)",))
_STORAGE = Cause("Slow disk or network file system for the data",
                 rules_out=("storage.read", "storage.random_read", "storage.small_files"), checks=("storage.workdir",),
                 measure="gpuvet bench disk --path /your/dataset/dir", commands=("iostat -x 5 (await, %util)", "df -hT ."),
                 untested="only where the working directory lives was read; no disk benchmark ran on your data's path")
_CPU_FEED = Cause("Too few CPU cores to decode and augment as fast as the GPU trains", rules_out=("host.cpu_feed",),
                  checks=("host.cpu",), measure="gpuvet bench cpu", commands=("nproc", "top -H while training"),
                  untested="the cores were counted, but how many images per second they prepare was not measured")
_SHM = Cause("DataLoader workers crash or stall: /dev/shm too small", rules_out=("host.shm",), measure="gpuvet run",
             commands=("df -h /dev/shm", "docker run --shm-size=16g ... (or --ipc=host)"))
_LOADER = Cause("DataLoader too slow for the GPU: num_workers or prefetch_factor too low, pin_memory off",
                commands=("time one epoch of the DataLoader alone (for batch in loader: pass) against the GPU's step time",
                          "DataLoader(num_workers=N, prefetch_factor=4, pin_memory=True, persistent_workers=True)"))
_NVLINK = Cause("No NVLink (or links down): the GPUs talk over PCIe", rules_out=("gpu.nvlink", "gpu.p2p"),
                checks=("gpu.fabric", "gpu.link_errors"), measure="gpuvet bench p2p",
                commands=("nvidia-smi topo -m", "nvidia-smi nvlink -s"))
_ALLREDUCE = Cause("Slow all-reduce between the GPUs of this machine", rules_out=("gpu.allreduce",), measure="gpuvet bench allreduce",
                   commands=("NCCL_DEBUG=INFO python train.py (look at the transport: P2P/NVL, SHM or NET)",))
_NETWORK = Cause("Slow network between nodes: no RDMA/RoCE, or a slow NIC", rules_out=("net.node_to_node",),
                 checks=("net.rdma", "net.nics", "stack.peermem"),
                 measure="gpuvet net serve (on one node) / gpuvet net test HOST (on the other)",
                 commands=("ibstat", "ib_write_bw OTHER_NODE", "iperf3 -c OTHER_NODE -P 8"),
                 untested="the NICs and RDMA ports were listed, but nothing was sent between the nodes")
_MIXED = Cause("Mixed GPUs: the slowest sets the pace", rules_out=("gpu.uniform",), measure="gpuvet run",
               commands=("nvidia-smi --query-gpu=index,name,power.limit,pcie.link.width.max --format=csv",))
_DRIVER_CUDA = Cause("Driver too old for the CUDA your PyTorch was built with", rules_out=("stack.driver_cuda",), measure="gpuvet run",
                     commands=("nvidia-smi (CUDA Version, top right)", "python -c 'import torch; print(torch.version.cuda)'"))

SYMPTOMS: tuple[Symptom, ...] = (
    Symptom("slow-from-start", "Slower than the same GPU elsewhere, from the first minute",
            "同样型号显卡，跑分和速度明显偏慢",
            ("slow", "slower than expected", "benchmark is low", "low tflops", "偏慢", "跑分", "残血"),
            (_POWER, _PCIE, _WEAK_GPU, _THROTTLE, _SHARED_GPU),
            "compare against a known-good figure: `gpuvet bench gemm` gives TFLOPS against the model's best"),
    Symptom("slower-and-slower", "Normal at first, then slower and slower",
            "训练一开始正常，过一段时间越来越慢",
            ("gets slower over time", "slows down after a while", "degrades", "越来越慢", "过一段时间"),
            (_THROTTLE,
             Cause("Page cache exhausted, then the disk queues (dataset larger than RAM, slow disk)",
                   rules_out=("storage.read", "storage.random_read"), checks=("storage.workdir",),
                   measure="gpuvet bench disk --path /your/dataset/dir", commands=("iostat -x 5 (await, %util)", "free -g"),
                   untested="only where the working directory lives was read; no disk benchmark ran"),
             _STEAL, _SHARED_GPU,
             Cause("A GPU fault mid-run: the driver logged Xid errors (memory errors, fallen off the bus, GSP) or asks for a reset",
                   rules_out=("gpu.xid",), checks=("gpu.recovery",), measure="gpuvet run",
                   commands=("sudo dmesg -T | grep -E 'NVRM|Xid'", "nvidia-smi -q -d ECC,ROW_REMAPPER"))),
            "watch the temperature and clock curves while it slows: `gpuvet run --soak 10` records them"),
    Symptom("gpu-low-cpu-high", "GPU utilization stays low while the CPU is busy",
            "GPU利用率始终上不去，但CPU很高",
            ("gpu utilization low", "low gpu utilization", "low gpu util", "gpu util low", "low utilization", "gpu idle",
             "cpu bound", "cpu high", "dataloader", "data loader", "利用率", "CPU很高"),
            (_CPU_FEED, _LOADER, _SHM, _STORAGE, _STEAL),
            "raise DataLoader num_workers and prefetch_factor (the first fix to try); pin_memory=True"),
    Symptom("multi-gpu-scaling", "Multi-GPU speed-up far below ideal",
            "多卡训练加速比远低于理论值",
            ("scaling", "speedup", "speed-up", "multi gpu slow", "distributed slow", "allreduce slow", "加速比", "多卡"),
            (_NVLINK, _ALLREDUCE, _PCIE, _NETWORK, _MIXED),
            "turn on NCCL's log (`NCCL_DEBUG=INFO`) to see which transport it picked"),
    Symptom("container-no-gpu", "The container cannot use the GPU: \"could not select device driver\"",
            "容器内无法调用GPU，报错“could not select device driver”",
            ("could not select device driver", "docker gpu", "container", "nvidia-container-toolkit", "torch.cuda.is_available() false",
             "cuda not available", "no cuda", "容器"),
            (Cause("The NVIDIA driver is not reachable here: nvidia-container-toolkit missing, or the container started without --gpus",
                   rules_out=("stack.container_runtime",), measure="gpuvet run (inside the container)",
                   commands=("docker run --rm --gpus all nvidia/cuda:12.4.1-base-ubuntu22.04 nvidia-smi", "nvidia-ctk --version",
                             "sudo nvidia-ctk runtime configure --runtime=docker && sudo systemctl restart docker"),
                   facts=_driver_here),
             Cause("PyTorch cannot use the GPU (CPU-only build, driver too old, or is_available() False)",
                   rules_out=("stack.driver_cuda", "stack.arch_support"), measure="gpuvet run",
                   commands=("python -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available())'",))),
            "install the toolkit or use the platform's official GPU image"),
    Symptom("data-lost-after-restart", "Data or environment lost after a restart",
            "实例重启后环境或数据丢失",
            ("data lost", "lost after reboot", "environment gone", "checkpoint lost", "重启", "丢失"),
            (Cause("Work kept on ephemeral storage (container layer, tmpfs, instance-store disk)",
                   checks=("storage.workdir", "workload.checkpoint"), measure="",  # no run can tell: by hand
                   commands=("findmnt -T .", "lsblk -o NAME,TYPE,ROTA,MODEL", "the provider's docs on instance storage"),
                   facts=_workdir_kept),
             Cause("The preemptible (spot) instance was reclaimed", measure="gpuvet run --preemptible / --on-demand",
                   commands=("check the billing page or instance type",), facts=_preemptible),
             Cause("The environment was installed into the container, not into an image", measure="gpuvet run",
                   commands=("docker commit, or build the environment into your own image",), facts=_in_container)),
            "keep data and checkpoints on shared or object storage, and bake the environment into an image"),
    Symptom("day-night", "Fast at night, slow during the day",
            "夜深人静时跑得飞快，白天卡成PPT",
            ("night", "daytime", "peak hours", "time of day", "白天", "夜"),
            (_SHARED_GPU, _STEAL,
             Cause("Shared storage or network contended at peak hours",
                   rules_out=("storage.read", "storage.small_files", "storage.random_read", "net.loopback", "net.node_to_node"),
                   measure="gpuvet run", commands=("iostat -x 5",))),
            "run gpuvet at both times and compare the records; move heavy jobs off-peak or to better-isolated instances",
            by_time_of_day=True),
    Symptom("cuda-init-slow", "model.to('cuda') or the first CUDA call hangs for seconds",
            "model.to(cuda)之后卡住30秒才响应",
            ("to('cuda') hangs", ".cuda() slow", "first cuda call slow", "hangs for seconds", "context init", "cuda init", "卡住"),
            (Cause("Slow CUDA context creation under virtualization", rules_out=("gpu.context_init",), measure="gpuvet bench latency",
                   commands=("python -c \"import time,torch; t=time.time(); torch.zeros(1).cuda(); print(time.time()-t)\"",),
                   facts=_vgpu, untested="the time to create a CUDA context was not measured"),
             Cause("Persistence mode off: the driver re-initialises for each process", rules_out=("gpu.persistence",),
                   measure="gpuvet run",
                   commands=("nvidia-smi -q | grep -i persistence", "sudo nvidia-smi -pm 1"), facts=_persistence),
             Cause("Eager CUDA module loading", rules_out=("env.cuda_module_loading",), measure="gpuvet run",
                   commands=("export CUDA_MODULE_LOADING=LAZY",), facts=_module_loading),
             Cause("Model weights read from a network file system", checks=("storage.workdir", "storage.read", "storage.small_files"),
                   measure="gpuvet bench disk --path /path/to/weights", commands=("df -hT /path/to/weights",),
                   untested="gpuvet does not know where your weights live")),
            "time it in a fresh process; a notebook kernel restart pays the start-up again"),
    Symptom("no-kernel-image", "\"no kernel image is available for execution on the device\"",
            "no kernel image is available for execution",
            ("no kernel image", "cudaErrorNoKernelImageForDevice", "unsupported gpu architecture", "compute capability", "sm_",
             "unsupported ptx version"),
            (Cause("PyTorch was built without kernels for this GPU's compute capability", rules_out=("stack.arch_support",),
                   measure="gpuvet run",
                   commands=("python -c 'import torch; print(torch.cuda.get_arch_list(), torch.cuda.get_device_capability())'",)),
             _DRIVER_CUDA,
             Cause("A different GPU than the software was built for (mixed fleet)", rules_out=("gpu.model", "gpu.uniform"),
                   measure="gpuvet run --expect 'MODEL'",
                   commands=("nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv",))),
            "install a PyTorch wheel built for this GPU and this driver's CUDA"),
    Symptom("nccl-hang", "NCCL init hangs, or \"NCCL version mismatch\"",
            "NCCL version mismatch，init_process_group卡死在ncclCommInitRank",
            ("nccl", "ncclCommInitRank", "init_process_group hangs", "version mismatch", "distributed hang"),
            (_DRIVER_CUDA,
             Cause("GPU peer-to-peer blocked or broken (ACS, IOMMU, VM)", rules_out=("gpu.p2p", "gpu.allreduce"),
                   measure="gpuvet bench p2p allreduce",
                   commands=("NCCL_P2P_DISABLE=1 python train.py (if that fixes it, P2P is broken)", "nvidia-smi topo -p2p r")),
             Cause("NVLink down", rules_out=("gpu.nvlink",), measure="gpuvet run", commands=("nvidia-smi nvlink -s",)),
             Cause("/dev/shm too small for NCCL's shared-memory transport", rules_out=("host.shm",), measure="gpuvet run",
                   commands=("df -h /dev/shm", "docker run --shm-size=16g ... (or --ipc=host)")),
             Cause("Wrong network interface, or RDMA down, between nodes", rules_out=("net.node_to_node",),
                   checks=("net.nics", "net.rdma"), measure="gpuvet net serve / gpuvet net test HOST",
                   commands=("NCCL_DEBUG=INFO NCCL_SOCKET_IFNAME=eth0 python train.py", "ibstat"),
                   untested="the interfaces were listed, but nothing was sent between the nodes"),
             Cause("NVSwitch fabric manager not running or of another version: CUDA error 802 \"system not yet initialized\"",
                   rules_out=("gpu.fabric",), measure="gpuvet run",
                   commands=("systemctl status nvidia-fabricmanager", "nvidia-smi -q | grep -A3 Fabric")),
             Cause("Different PyTorch/NCCL versions on the nodes", measure="",
                   commands=("python -c 'import torch; print(torch.__version__, torch.cuda.nccl.version())' on every node",))),
            "`NCCL_DEBUG=INFO` says where it stops"),
    Symptom("memory-mismatch", "PyTorch's memory figures disagree with nvidia-smi",
            "torch.cuda.memory_allocated()与nvidia-smi显存占用不一致",
            ("memory_allocated", "memory mismatch", "nvidia-smi memory", "memory_reserved", "显存", "out of memory", "oom"),
            (Cause("Expected: nvidia-smi also counts the CUDA context and the caching allocator's reserve", measure="",
                   commands=("python -c 'import torch; torch.zeros(1).cuda(); print(torch.cuda.memory_reserved(), torch.cuda.mem_get_info())'",
                             "torch.cuda.memory_summary()")),
             Cause("Memory held by another process or tenant, or only a MIG/vGPU share is yours", rules_out=("gpu.isolation",),
                   measure="gpuvet run", commands=("nvidia-smi --query-compute-apps=pid,used_memory --format=csv",)),
             Cause("An old driver that accounts memory coarsely under virtualization", measure="gpuvet run",
                   commands=("nvidia-smi (Driver Version)",), facts=_old_driver)),
            "compare torch.cuda.memory_reserved() (not memory_allocated()) with nvidia-smi, plus ~0.3-0.5 GiB of context"),
)


# -- finding a symptom from what the user typed ----------------------------------------------------

_STOP = {"the", "a", "an", "is", "are", "my", "it", "its", "gpu", "gpus", "and", "or", "to", "of", "in", "on", "for", "with",
         "than", "from", "after", "but", "very", "too", "when", "i", "me", "this", "that", "be", "at", "by", "not"}


def _stem(word: str) -> str:
    for suffix in ("ing", "ed", "er", "s"):
        if len(word) > len(suffix) + 3 and word.endswith(suffix):
            return word[: -len(suffix)]
    return word


def _words(text: str) -> set[str]:
    return {_stem(w) for w in re.findall(r"[a-z0-9_]+", text.lower())} - _STOP


def find_symptom(text: str) -> Symptom | None:
    """The symptom a short name, a phrase, an error message or the seed's Chinese words describe."""
    query = text.strip().lower()
    if not query:
        return None
    for symptom in SYMPTOMS:
        if query.replace(" ", "-").replace("_", "-") == symptom.name:
            return symptom
    scored = [(_score(query, symptom), n, symptom) for n, symptom in enumerate(SYMPTOMS)]
    best = max(scored, key=lambda item: (item[0], -item[1]))
    return best[2] if best[0] > 0 else None


def _score(query: str, symptom: Symptom) -> int:
    phrases = [p.lower() for p in symptom.aliases + (symptom.seed, symptom.description)]
    # A whole phrase (an error message, the seed's row) weighs more than shared words.
    score = sum(3 for p in phrases if p in query or (len(query) >= 2 and query in p))
    vocabulary = _words(" ".join((symptom.name.replace("-", " "), symptom.description) + symptom.aliases))
    return score + len(_words(query) & vocabulary)


# -- terminal --------------------------------------------------------------------------------------

_STATE_STYLE = {CONFIRMED: ("FOUND", "bold red"), RULED_OUT: ("ruled out", "green"), UNKNOWN: ("?", "dim")}


def render_doctor(console: Console, diagnosis: Diagnosis | None = None) -> None:
    """The symptoms gpuvet knows (no diagnosis), or one diagnosis."""
    if diagnosis is None:
        _symptom_list(console)
    else:
        _diagnosis(console, diagnosis)


def _symptom_list(console: Console) -> None:
    console.print("[bold]Symptoms gpuvet doctor knows[/]  [dim](gpuvet doctor NAME, or describe it in your words)[/]")
    for s in SYMPTOMS:
        console.print(f"  [cyan]{s.name:<24}[/] {escape(s.description)}")  # the original words stay searchable


def _diagnosis(console: Console, d: Diagnosis) -> None:
    s = d.symptom
    console.print(f"[bold]{escape(s.description)}[/]  [dim]({s.name})[/]")
    if d.record is None:
        console.print("[dim]No run record: the likely causes and how to tell them apart.[/]")
    else:
        r = d.record
        source = f"{d.source} (started {r.started_at}" if d.source else f"the run of {r.started_at} ("
        console.print(f"[dim]Answered from {escape(source)}, {r.machine.source}, verdict {r.verdict})"
                      f"{': ' + escape(d.source_note) if d.source_note else ''}.[/]")
    for result in d.results:
        word, style = _STATE_STYLE[result.state]
        console.print(f"\n  [{style}]{word:<9}[/]  {escape(result.cause.name)}")
        for figure in result.figures:
            console.print(f"             [dim]{escape(figure)}[/]")
        if result.next_step:
            label = "fix/confirm:" if result.state == CONFIRMED else "check:"
            console.print(f"             [cyan]{label}[/] {escape(result.next_step)}")
    if s.advice:
        console.print(f"\n[bold]Whatever the cause:[/] {escape(s.advice)}")

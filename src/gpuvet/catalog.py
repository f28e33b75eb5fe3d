"""Every check id gpuvet can emit and every benchmark it runs: the one registration the others derive from.

A check's entry names its rule (the function that makes its findings), its inputs (facts, or the
benchmark whose measurements feed it), its levels (health, quick, run, soak), its default action for
a remediator, and its doc line. The judge's rules, `gpuvet health`'s set and its `--skip` choices,
`gpuvet checks` and the README's check tables are all made from this list: adding a check is one
`Check(...)` entry here plus its rule; adding a benchmark one `Benchmark(...)` entry in BENCHMARKS.

This module imports only gpuvet.actions (which imports nothing), so every layer may read it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .actions import (ASK_PROVIDER, CONFIGURE, DRAIN_AND_REPAIR, NONE, REBOOT_NODE, RESET_GPU,
                      UPDATE_SOFTWARE)
from .actions import NAMES as ACTION_NAMES

# The levels a check runs at, as DCGM diag has r1..r4: `gpuvet health` (passive, on a busy node),
# `run --quick` (facts, seconds), the default `run` (facts and benchmarks, about two minutes) and
# `run --soak` (the sustained load held longer).
HEALTH, QUICK, RUN, SOAK = "health", "quick", "run", "soak"
LEVELS = (HEALTH, QUICK, RUN, SOAK)


@dataclass(frozen=True)
class Benchmark:
    name: str  # what `gpuvet bench NAME` takes; its notes are measurements named bench.<name>
    module: str  # where it is measured (relative to gpuvet)
    where: str  # "host": in gpuvet's own process, no torch; "gpu": in the benchmark worker
    cpu_capable: bool  # `--device cpu` measures it on the CPU for real
    fresh_process: bool  # starts fresh processes on a GPU (needs a worker that has not opened it)
    budget_s: float  # seconds `gpuvet bench NAME` gives it (per GPU; GPUs side by side where they run at once)
    cpu_budget_s: float | None  # its budget on `--device cpu`
    doc: str
    run_budget_s: float | None = None  # its budget in the default `gpuvet run` (None: budget_s)


@dataclass(frozen=True)
class Check:
    id: str  # stable: scripts depend on it
    area: str  # the first part of the id: gpu, stack, host, storage, net, env, workload, cpu, cluster, watch
    rule: str  # the function that makes it, relative to gpuvet.judge ("gpu_links.check_pcie_link")
    benchmark: str | None  # the benchmark whose measurements feed it; None: facts alone
    looks_at: str
    fails_when: str
    doc: str
    emitted_by: str = "run"  # run (gpuvet run / inspect / bench), health, net test, cluster, watch log
    per_gpu: bool = False  # judged per GPU from its facts: without any GPU it skips once, saying why
    # Also judged by `gpuvet health`: it stays true on a node busy with someone's job. Not so:
    # gpu.isolation (a running job's processes and memory are the point of the node), gpu.uniform (a
    # configuration difference is an acceptance question, not a reason to drain), host.*, storage.*,
    # net.*, stack.* and env.* (not GPU health, and some read for seconds). gpu.xid judges the kernel
    # log's last 2 h there: the log keeps a fatal Xid until reboot, long after a reset mended it.
    health: bool = False
    action: str = NONE  # what a remediator does when it fails (actions.py); a rule may name another

    def __post_init__(self) -> None:
        if self.action not in ACTION_NAMES:
            raise ValueError(f"{self.id}: unknown action {self.action!r}")

    @property
    def levels(self) -> tuple[str, ...]:
        """The levels that judge it: facts at every level of `gpuvet run` (and health's when marked);
        a benchmark's at the default run and the soak; another command's (net test, cluster, watch
        log) at none of them."""
        if self.emitted_by == HEALTH:
            return (HEALTH,)
        if self.emitted_by != "run":
            return ()
        own = (RUN, SOAK) if self.benchmark else (QUICK, RUN, SOAK)
        return ((HEALTH,) if self.health else ()) + own

    @property
    def inputs(self) -> str:
        """What it is judged from, in words for `gpuvet checks`."""
        return f"bench {self.benchmark}" if self.benchmark else "facts"


BENCHMARKS: tuple[Benchmark, ...] = (
    # Host benchmarks: no GPU and no torch, run first.
    Benchmark("disk", "bench.disk", "host", True, False, 10.0, None,
              "sequential write/read, random 4k reads and small files on each path (fio when installed)"),
    Benchmark("net", "bench.net", "host", True, False, 3.0, None,
              "TCP latency and throughput over loopback (iperf3 when installed); `net test` between hosts"),
    Benchmark("cpu", "bench.cpufeed", "host", True, False, 6.0, None,
              "images/s the CPU decodes and augments, one worker per core"),
    # GPU benchmarks: in the worker process, with deadlines. The default run aims at about two
    # minutes on an 8-GPU node: GEMM, memory and the sustained load run on all GPUs at once; host
    # copies go one GPU at a time, so theirs is short.
    Benchmark("gemm", "bench.gemm", "gpu", True, False, 20.0, 8.0,
              "TFLOPS per dtype over a shape sweep, and the products checked against float64", run_budget_s=12.0),
    Benchmark("membw", "bench.membw", "gpu", True, False, 3.0, 3.0, "device-to-device copy bandwidth", run_budget_s=3.0),
    Benchmark("pcie", "bench.pcie", "gpu", False, False, 2.5, None,
              "host<->GPU copies, pinned and pageable, with the link read while they run", run_budget_s=1.5),
    Benchmark("latency", "bench.latency", "gpu", False, True, 12.0, None,
              "CUDA context start-up in fresh processes and kernel launch latency", run_budget_s=7.0),
    Benchmark("sustained", "bench.sustained", "gpu", True, False, 30.0, 10.0,
              "a sustained load on all GPUs at once with telemetry (`--soak` makes it longer)", run_budget_s=30.0),
    Benchmark("p2p", "bench.p2p", "gpu", False, False, 10.0, None, "the GPU-to-GPU copy matrix", run_budget_s=7.0),
    Benchmark("allreduce", "bench.allreduce", "gpu", True, True, 20.0, 20.0,
              "all-reduce latency and bus bandwidth across the GPUs (one process per rank)", run_budget_s=12.0),
    # Training, a ~1 GB checkpoint, and a fresh process that resumes it.
    Benchmark("workload", "bench.workload", "gpu", True, False, 120.0, 60.0,
              "a small GPT trained end to end: tokens/s, MFU, checkpoint, resume in a fresh process", run_budget_s=20.0),
)


def _watch(state: str, words: str, fails: str, action: str = ASK_PROVIDER) -> Check:
    return Check(f"watch.{state}", "watch", "diagnose.watch_findings", None,
                 f"a watch log: the share of watched time a GPU was {words}", fails,
                 f"time a watched GPU spent {words}", "watch log", action=action)


CHECKS: tuple[Check, ...] = (
    # -- facts of the GPUs (gpuvet run --quick, gpuvet inspect; health's where marked) -----------
    Check("gpu.model", "gpu", "gpu_identity.check_model", None,
          "the exact name and memory; the reference row it matches (`src/gpuvet/specs/data/gpu_specs.csv`, every row sourced)",
          'with `--expect`, another model; warns on "Graphics Device" or memory well under the model\'s',
          "is this the GPU you paid for",
          health=True, action=ASK_PROVIDER),
    Check("gpu.uniform", "gpu", "gpu_identity.check_uniform", None,
          "all GPUs alike: model, memory, power limit, max link, VBIOS, ECC, MIG",
          "models differ (warns on configuration differences)", "are all GPUs of the box alike",
          action=ASK_PROVIDER),
    Check("gpu.isolation", "gpu", "gpu_health.check_isolation", None,
          "whole card (bare metal or passthrough), vGPU guest, MIG slice, processes and memory in use before you start, the kernel driver bound",
          "memory or load nobody you can see accounts for, or a driver other than nvidia (vfio-pci, nouveau); warns on vGPU, MIG, processes already running",
          "is the GPU yours alone",
          per_gpu=True,
          action=ASK_PROVIDER),
    Check("gpu.power_limit", "gpu", "gpu_power.check_power_limit", None,
          "enforced power limit vs the default (or the model's reference default)",
          "at 80% of default or less (warns below 97%), with the `nvidia-smi -pl` command and the settable range", "is the power limit the model's",
          per_gpu=True,
          health=True, action=ASK_PROVIDER),
    Check("gpu.pcie_link", "gpu", "gpu_links.check_pcie_link", None,
          "current vs max PCIe generation and width (NVML, sysfs, lspci; the reading taken under load when there is one), and against the model's own lanes (reference)",
          "width at a quarter of max or less, or a generation two steps low under load; warns on x8 of x16, a max narrower than the model's lanes (an x16 card topping out at x8), or a slot capping the generation. An idle generation drop is power saving and never fails",
          "does the PCIe link run at full width and speed",
          per_gpu=True,
          health=True, action=ASK_PROVIDER),
    Check("gpu.pcie_under_load", "gpu", "gpu_pcie.check_pcie_under_load", None,
          "the link read under load against its maximum (capability, else the model's reference), a link already at its maximum at idle (it never trains up past it), or the copy benchmark at the full link's rate (`gpu.pcie_bandwidth`)",
          'never fails (`gpu.pcie_link` judges a short link); read only at idle below the maximum it is measured, not passed: "read only at idle (Gen1 x16); under load it should show Gen4 x16"',
          "does the link run at its full generation when a job runs",
          per_gpu=True,
          action=NONE),
    Check("gpu.pcie_driver_view", "gpu", "gpu_pcie.check_pcie_driver_view", None,
          "the link's maximum as the NVIDIA driver reads it (NVML, nvidia-smi) against the host's (lspci/sysfs LnkCap), else against the model's own link",
          "warns when the two disagree on width or generation (a virtualization layer or the slot); skips when only the host read the link",
          "does the driver see the link the host shows",
          per_gpu=True,
          health=True, action=ASK_PROVIDER),
    Check("gpu.nvlink", "gpu", "gpu_links.check_nvlink", None,
          "NVLink state per link, or NV# links in `topo -m`",
          'links inactive, no NVLink on a model built with it, or fewer links than the other GPUs; a model without NVLink on a multi-GPU machine is measured ("PCIe only"), one GPU skips (not in play)',
          "are the NVLinks up",
          per_gpu=True,
          health=True, action=RESET_GPU),
    Check("gpu.throttle", "gpu", "gpu_power.check_throttle", None, "active clock-event reasons",
          "HW slowdown, HW/SW thermal slowdown, HW power brake (SW power cap and idle are not faults)", "is the GPU slowed down right now",
          per_gpu=True,
          health=True, action=ASK_PROVIDER),
    Check("gpu.temperature", "gpu", "gpu_power.check_temperature", None,
          "temperature vs the slowdown threshold (87 C assumed, and said, when the capture does not report it)", "within 3 C of slowdown (warns within 10 C, or hot while idle)",
          "is the GPU near its slowdown temperature",
          per_gpu=True,
          health=True, action=ASK_PROVIDER),
    Check("gpu.fan_failure", "gpu", "gpu_cooling.check_fan_failure", None,
          "each fan's speed (NVML per fan; nvidia-smi's 'Fan Speed', and ERR! in its Fan column)",
          "a fan whose reading fails (ERR!, Unknown Error), or a fan at 0% within 10 C of slowdown; a GPU that "
          "reports no fan (passively cooled by the chassis) skips", "are the GPU's fans working",
          per_gpu=True,
          health=True, action=ASK_PROVIDER),
    Check("gpu.ecc", "gpu", "gpu_health.check_ecc", None,
          "ECC mode, uncorrectable errors, retired pages, remapped rows",
          "errors since reset, a pending retirement or remap, a failed remap", "is the memory healthy",
          per_gpu=True,
          health=True, action=RESET_GPU),
    Check("gpu.xid", "gpu", "gpu_xid.check_xid", None,
          'the kernel log since boot (live: /dev/kmsg, else `journalctl -k -b`, else `dmesg`, whichever this user may read; or a dmesg / `dmesg -T` / `journalctl -k` / syslog capture): NVIDIA Xid and NVSwitch SXid events, "fallen off the bus", "RmInitAdapter failed", PCIe AER errors on a GPU\'s bus; each named by GPU (PCI bus id), code, time and count, against an Xid table kept as data (`src/gpuvet/specs/data/xid.csv`, from NVIDIA\'s Xid catalogue)',
          "hardware Xids (48, 62, 64, 74, 79, 92, 94, 95, 119, 120 ...; 63 while a remap is pending; NVLink 144-150 and SXids the line or table calls fatal), a GPU the driver cannot start, uncorrected AER; warns on application Xids (13, 31, 43, 45 ...) and corrected AER. An unreadable log is a skip that says why (kernel.dmesg_restrict, a container without the host's log)",
          "has the driver logged GPU faults",
          health=True, action=RESET_GPU),
    Check("gpu.link_errors", "gpu", "gpu_signals.check_link_errors", None,
          "PCIe replays since reset (NVML, `Replays Since Reset`), the kernel's AER counters in sysfs, NVLink error counters per link (NVML; `nvidia-smi nvlink -e` captures, Blackwell's counter names too)",
          "uncorrected AER errors; warns above DCGM's 8 replays per minute (over the uptime; a capture's count alone is shown, not judged), on corrected AER errors and on NVLink errors, naming the link (DCGM fails 1 replay or recovery error within a minute; a count since the counters were reset has no time)", "are the links clean",
          per_gpu=True,
          action=REBOOT_NODE),
    Check("gpu.fabric", "gpu", "gpu_signals.check_fabric", None,
          "NVSwitch systems (HGX, DGX): each GPU's fabric registration (NVML GpuFabricInfo, the `Fabric` section of `-q`) and the fabric manager service (running, the driver's exact version)",
          'a registration not Completed/Success, the service stopped or of another version: CUDA then fails with error 802 "system not yet initialized"', "is the NVSwitch fabric up",
          per_gpu=True,
          action=REBOOT_NODE),
    Check("gpu.recovery", "gpu", "gpu_signals.check_recovery", None,
          "what the driver says must happen (`GPU Recovery Action`: reset, drain and reset, reboot), the spare rows left per memory bank (`Bank Remap Availability Histogram`) and the remapped rows",
          "any recovery action, a bank with no spare row (warns on banks low on them), a pending or failed row remap, 512 rows remapped for uncorrectable errors (DCGM's `DCGM_LIMIT_MAX_ROW_REMAP_UNCORRECTABLE`; Azure's health checks fail above 512)", "does the GPU need a reset",
          per_gpu=True,
          action=RESET_GPU),
    Check("gpu.throttle_history", "gpu", "gpu_signals.check_throttle_history", None,
          "time spent slowed since the driver loaded (`Clocks Event Reasons Counters`, NVML violation counters): one idle capture shows minutes of HW or thermal slowdown",
          "a minute or more in HW slowdown, thermal slowdown or power brake (warns on less); time at the power cap is shown, not a fault", "has the GPU been slowed before",
          per_gpu=True,
          action=ASK_PROVIDER),
    Check("gpu.persistence", "gpu", "gpu_signals.check_persistence", None, "persistence mode",
          "warns when off on a datacenter GPU (every CUDA start re-initialises it)", "is persistence mode on",
          per_gpu=True,
          action=CONFIGURE),
    Check("gpu.trend", "gpu", "gpu_trend.check_trend", None,
          "a monitoring loop given to `inspect` (`nvidia-smi --query-gpu=... --format=csv -l 5`, `-lms`, `nvidia-smi dmon`), each GPU's rows as a time series",
          "the clock falling 15% under load (warns at 7%), heat within 3 C of slowdown; warns on heat climbing 5 C, power held at the limit with clocks under 85% of max, idle samples between busy ones; an idle loop is measured, not judged", "how the GPU behaved over a monitoring loop",
          action=ASK_PROVIDER),
    # -- GPU benchmarks (gpuvet run, gpuvet bench) --------------------------------------------
    Check("gpu.gemm", "gpu", "gpu_bench.check_gemm", "gemm", "TFLOPS per dtype (fp32, tf32, fp16, bf16, fp8) over a shape sweep with L2 flushes and CUDA-event timing",
          "the best measured figure for the model (mamf-finder) or, loosely, its dense peak; and the box's other GPUs", "does the GPU compute at speed",
          action=ASK_PROVIDER),
    Check("gpu.correctness", "gpu", "gpu_bench.check_correctness", "gemm",
          "the GEMM products against a float64 reference and a checksum", "any mismatch is silent data corruption",
          "does the GPU compute right",
          action=DRAIN_AND_REPAIR),
    Check("gpu.memory_bandwidth", "gpu", "gpu_bench.check_memory_bandwidth", "membw", "device copy, read + write counted",
          "the model's memory bandwidth", "is the memory as fast as the model's",
          action=ASK_PROVIDER),
    Check("gpu.pcie_bandwidth", "gpu", "gpu_bench.check_pcie_bandwidth", "pcie",
          "host<->GPU, pinned and pageable, host buffer on the GPU's NUMA node; the link read by NVML while it runs",
          "what the link carries, or the model's own link (reference gen and lanes) when that is wider: a link cut to x8 is judged against x16; the box's other GPUs; measured, not judged, with neither", "do host copies reach the link's speed",
          action=ASK_PROVIDER),
    Check("gpu.context_init", "gpu", "gpu_bench.check_context_init", "latency", "CUDA context creation in fresh processes",
          "far slower than passthrough (vGPU-like)", "how long a CUDA context takes",
          action=ASK_PROVIDER),
    Check("gpu.kernel_launch", "gpu", "gpu_bench.check_kernel_launch", "latency", "kernel launch latency",
          "over 20 us to queue one PyTorch kernel", "how long a kernel launch takes",
          action=ASK_PROVIDER),
    Check("gpu.sustained", "gpu", "gpu_sustained.check_sustained", "sustained", "30 s (or `--soak`) of load on all GPUs, telemetry at 10 Hz",
          "throughput decay, thermal/power-brake reasons, clocks below max with power to spare, heat, spread between GPUs",
          "does the GPU hold its speed under load",
          action=ASK_PROVIDER),
    Check("gpu.p2p", "gpu", "gpu_multi.check_p2p", "p2p", "the P2P copy matrix",
          "well under NVLink or PCIe from the topology", "how fast GPUs copy to each other", action=ASK_PROVIDER),
    Check("gpu.allreduce", "gpu", "gpu_multi.check_allreduce", "allreduce", "all-reduce latency and bus bandwidth",
          "well under NVLink or PCIe from the topology", "how fast the GPUs all-reduce",
          action=ASK_PROVIDER),
    # -- benchmarks measured on the CPU (gpuvet bench --device cpu) -----------------------------
    *(Check(f"cpu.{name}", "cpu", "cpu_bench.check_cpu_benchmarks", name, f"the {name} benchmark measured on the CPU",
            "never (no reference for a CPU); skips say why", f"{name} on --device cpu")
      for name in ("gemm", "membw", "pcie", "latency", "sustained", "p2p", "allreduce")),
    # -- training end to end (gpuvet run, gpuvet workload) ----------------------------------------
    Check("workload.throughput", "workload", "workload.check_throughput", "workload", "a small GPT's tokens/s and MFU",
          "well under the GPU's peak", "does real training run at speed",
          action=ASK_PROVIDER),
    Check("workload.checkpoint", "workload", "workload.check_checkpoint", "workload", "checkpoint write and read",
          "not writable, slow, or on storage that does not persist", "can training save its state",
          action=CONFIGURE),
    Check("workload.resume", "workload", "workload.check_resume", "workload", "resume in a fresh process",
          "losses differ from an uninterrupted run", "does training resume where it stopped",
          action=NONE),
    # -- the software stack ------------------------------------------------------------------------
    Check("stack.driver_cuda", "stack", "stack.check_driver_cuda", None,
          "the driver's CUDA vs the CUDA your PyTorch was built with (CUDA release notes)",
          "driver too old, or a CPU-only PyTorch on a GPU machine; warns under minor-version compatibility", "can this driver run this PyTorch",
          action=UPDATE_SOFTWARE),
    Check("stack.arch_support", "stack", "stack.check_arch_support", None,
          "`torch.cuda.get_arch_list()` vs each GPU's compute capability",
          "no kernels for this GPU, or `torch.cuda.is_available()` False", "does PyTorch have kernels for this GPU",
          action=UPDATE_SOFTWARE),
    Check("stack.peermem", "stack", "stack_runtime.check_peermem", None,
          "nvidia_peermem loaded where RDMA NICs are (GPUDirect RDMA for NCCL)",
          "with `--multi-node`, not loaded (warns without it)", "can NCCL use GPUDirect RDMA",
          action=CONFIGURE),
    Check("stack.nccl", "stack", "stack_runtime.check_nccl", None,
          "the NCCL version your PyTorch carries (`torch.cuda.nccl.version()`)",
          'shown on one node; across the nodes of `gpuvet cluster`, a node whose NCCL differs fails `cluster.uniform` (the seeds\' "NCCL version mismatch")', "which NCCL runs here",
          action=UPDATE_SOFTWARE),
    Check("stack.container_runtime", "stack", "stack_runtime.check_container_runtime", None,
          "inside a container: `/dev/nvidia*` nodes, the driver's libcuda mounted and of the kernel module's version; on a Docker host: the NVIDIA runtime or a CDI spec",
          'GPU nodes without libcuda, or a libcuda of another version ("driver/library version mismatch"); warns on a container without GPU nodes (started without `--gpus`, or CPU-only) and on Docker without the runtime ("could not select device driver")',
          "can containers see the GPU",
          action=CONFIGURE),
    Check("stack.toolkit", "stack", "stack.check_toolkit", None,
          "the CUDA toolkit installed (`nvcc --version`, `/usr/local/cuda/version.json` or `version.txt`) vs the driver (CUDA release notes) and vs the CUDA PyTorch was built with",
          "driver older than the toolkit's minimum outside minor-version compatibility (seed 2: stop deploying); warns under minor-version compatibility, on another CUDA major than PyTorch's (extensions fail), or nvcc and /usr/local/cuda disagreeing", "can this driver run this toolkit",
          action=UPDATE_SOFTWARE),
    # -- the host, its storage and network (facts, then the host benchmarks) ----------------------
    Check("host.cpu", "host", "host.check_cpu", None, "usable cores per GPU", "under 4 cores per GPU",
          "enough CPU cores for the GPUs",
          action=ASK_PROVIDER),
    Check("host.shm", "host", "host.check_shm", None, "/dev/shm size", "under 1 GiB",
          "enough shared memory for data loaders",
          action=CONFIGURE),
    Check("host.steal", "host", "host.check_steal", None, "CPU steal time", "15% steal or more",
          "does a neighbour take the CPU",
          action=ASK_PROVIDER),
    Check("host.somaxconn", "host", "host.check_somaxconn", None, "the TCP accept queue (net.core.somaxconn)",
          "never (warns when small)", "can servers accept many connections",
          action=CONFIGURE),
    Check("host.preemptible", "host", "host.check_preemptible", None,
          "whether the instance can be reclaimed: what you stated (`--preemptible` / `--on-demand`), else the cloud's instance metadata (EC2, GCP, Azure)", "warns when preemptible; unknown is a skip that says how to tell gpuvet",
          "can the instance be taken away mid-job",
          action=NONE),
    Check("storage.workdir", "storage", "host.check_workdir", None,
          "the file system and device behind the working directory, and its free space",
          "warns on a container layer, tmpfs, network FS, little free space",
          "where the work directory really lives",
          action=CONFIGURE),
    Check("storage.persistence", "storage", "host.check_persistence", None,
          "whether the working directory outlives the instance (its file system, device and platform)",
          "warns on storage lost with the instance or container (container layer, tmpfs, instance storage), and on storage of unknown persistence on a preemptible instance; unknown is a skip that says how to find out", "do checkpoints survive the instance",
          action=CONFIGURE),
    Check("storage.write", "storage", "host_io.check_storage", "disk", "sequential write MB/s on each path",
          "well under the device type's figure", "how fast checkpoints write",
          action=ASK_PROVIDER),
    Check("storage.read", "storage", "host_io.check_storage", "disk", "sequential read MB/s, data really on the device",
          "well under the device type's figure", "how fast data sets read",
          action=ASK_PROVIDER),
    Check("storage.random_read", "storage", "host_io.check_storage", "disk", "random 4k read IOPS",
          "well under the device type's figure", "how fast shuffled samples read",
          action=ASK_PROVIDER),
    Check("storage.small_files", "storage", "host_io.check_storage", "disk", "small-file reads per second",
          "well under the device type's figure", "how fast many small files read",
          action=ASK_PROVIDER),
    Check("storage.shared", "storage", "host_io.check_shared_storage", "disk",
          "whether a tested path was shared storage: a network file system, or a volume other than the working directory's (`--path`)", "never; a skip says when only the local disk was tested, and how to test the dataset's mount",
          "was the storage data is read from tested",
          action=NONE),
    Check("net.nics", "net", "host_io.check_network", None, "NIC link speeds",
          "with --multi-node: slow NICs", "how fast the NICs are",
          action=ASK_PROVIDER),
    Check("net.rdma", "net", "host_io.check_network", None, "RDMA/InfiniBand ports and their state",
          "with --multi-node: no active RDMA", "is RDMA there for multi-node jobs",
          action=ASK_PROVIDER),
    Check("net.loopback", "net", "host_io.check_network", "net", "TCP latency and throughput over loopback",
          "far slower than the seeds' table (0.02 ms vs 0.38 ms)", "how fast the host's network stack is",
          action=ASK_PROVIDER),
    Check("host.cpu_feed", "host", "feed.check_cpu_feed", "cpu", "images/s the CPU decodes and augments, one worker per core",
          "what the GPUs consume for a reference model", "can the CPU feed the GPUs",
          action=ASK_PROVIDER),
    # -- the environment's audit (gpuvet run only) -------------------------------------------------
    Check("env.exposed_servers", "env", "env.check_environment", None,
          "servers listening on all interfaces without a token", "an open server", "is anything left open",
          action=CONFIGURE),
    Check("env.ssh_login", "env", "env.check_environment", None, "SSH root and password login",
          "never (advises with the line to add)", "is SSH login locked down",
          action=CONFIGURE),
    Check("env.authorized_keys", "env", "env.check_environment", None, "authorized_keys without restrictions",
          "never (advises with the line to add)", "who may log in",
          action=CONFIGURE),
    Check("env.ssh_keepalive", "env", "env.check_environment", None, "SSH keep-alive settings",
          "never (advises with the line to add)", "do idle SSH sessions survive",
          action=CONFIGURE),
    Check("env.jupyter", "env", "env.check_environment", None, "Jupyter output limits and root directory",
          "never (advises with the line to add)", "is Jupyter set up to keep work",
          action=CONFIGURE),
    Check("env.cuda_module_loading", "env", "env.check_environment", None, "CUDA_MODULE_LOADING",
          "never (advises with the line to add)", "are CUDA modules loaded lazily",
          action=CONFIGURE),
    # -- the passive node check (gpuvet health) ------------------------------------------------
    Check("gpu.reachable", "gpu", "health.check_reachable", None,
          "every NVIDIA GPU on the PCI bus answers NVML; with `--expect-gpus N`, N GPUs are there",
          "a GPU fallen off the bus (NVML: GPU lost), one only sysfs sees, NVML broken while GPUs are on the bus, fewer GPUs than expected", "are all GPUs there", "health",
          action=REBOOT_NODE),
    Check("health.probe", "health", "health.check_probes", None, "each probe answered within its deadline",
          "the GPU probe (NVML) hung past it: a wedged GPU or driver", "did every probe answer", "health",
          action=REBOOT_NODE),
    # -- between hosts (gpuvet net test) ---------------------------------------------------------
    Check("net.node_to_node", "net", "host_io.check_network", "net", "TCP latency and throughput to another host",
          "well under the link speed of the NIC on the route", "how fast this host reaches another",
          "net test",
          action=ASK_PROVIDER),
    # -- a multi-node run (gpuvet cluster) -------------------------------------------------------
    Check("cluster.nodes", "cluster", "cluster.judge_cluster", None, "every node joined and reported",
          "a node missing, or stuck in a phase the others passed (warns when its cross-node ranks did not start "
          "within --start-timeout: a loaded node, not a broken one)", "did every node take part", "cluster",
          action=ASK_PROVIDER),
    Check("cluster.node_checks", "cluster", "cluster.judge_cluster", None, "the nodes' own findings, grouped by check",
          "a node's check failed", "which nodes fail which checks", "cluster",
          action=ASK_PROVIDER),
    Check("cluster.uniform", "cluster", "cluster.judge_cluster", None, "GPU model, driver, CUDA, link across nodes",
          "models differ between nodes (warns on configuration)", "are all nodes alike", "cluster",
          action=ASK_PROVIDER),
    Check("cluster.stragglers", "cluster", "cluster.judge_cluster", None, "each node's figures vs the others'",
          "a node well below the cluster's baseline", "which node holds the others back", "cluster",
          action=ASK_PROVIDER),
    Check("cluster.ring", "cluster", "cluster.judge_cluster", None, "node-to-node transfers in a ring",
          "a node or a link much slower than the others", "is the network between nodes even", "cluster",
          action=ASK_PROVIDER),
    Check("cluster.allreduce", "cluster", "cluster.judge_cluster", None, "the cross-node all-reduce bus bandwidth",
          "far below what the NICs carry", "how fast the nodes all-reduce", "cluster",
          action=ASK_PROVIDER),
    Check("cluster.fallback", "cluster", "cluster.judge_cluster", None, "the backend the meeting ran over",
          "never (warns when gloo on the CPUs stood in for NCCL)", "did the cluster run on the GPUs", "cluster",
          action=CONFIGURE),
    Check("cluster.run", "cluster", "cluster.judge_cluster", None, "whether the run reached its end",
          "stopped before its end", "is this report complete", "cluster",
          action=NONE),
    # -- a watch log (gpuvet report LOG) ---------------------------------------------------------
    Check("watch.diagnosis", "watch", "diagnose.watch_findings", None, "a watched GPU's diagnoses over the log",
          "never (passes when the GPU stayed ok or idle)", "a GPU that stayed ok", "watch log",
          action=NONE),
    _watch("lost", "lost (NVML could no longer read it)", "at any time", RESET_GPU),
    _watch("thermal", "slowed down by heat", "over the fault share of the watched time (warns under it)"),
    _watch("hw_slowdown", "slowed down by hardware (clocks cut)", "over the fault share of the watched time (warns under it)"),
    _watch("neighbour", "shared with someone else's process", "never (warns)"),
    _watch("power_capped", "held at its power cap", "never (warns)"),
    _watch("clocks_held", "held below its clocks with power to spare", "never (warns)"),
    _watch("cpu_steal", "starved by CPU steal", "never (warns)"),
    _watch("input_bound", "waiting for input", "never (warns)", CONFIGURE),
    _watch("io_bound", "waiting for storage", "never (warns)", CONFIGURE),
    _watch("slowing", "slower and slower", "never (warns)"),
    _watch("underused", "underused", "never (warns)", CONFIGURE),
    Check("watch.job", "watch", "diagnose.watch_job_finding", None, "the followed job's CPU and storage IO",
          "never (a record, no threshold)", "what the watched job did", "watch log",
          action=NONE),
    Check("watch.gpus", "watch", "diagnose.watch_without_gpus", None, "whether the log holds a GPU",
          "never (skips when no GPU was watched)", "was any GPU watched", "watch log",
          action=NONE),
    Check("watch.log", "watch", "watch_log.watch_log_notes", None, "what the watch log could not hold",
          "never (skips for each part not watched)", "what was not watched", "watch log",
          action=NONE),
)

BY_ID: dict[str, Check] = {c.id: c for c in CHECKS}
BENCHMARK_BY_NAME: dict[str, Benchmark] = {b.name: b for b in BENCHMARKS}

HOST_BENCHMARKS: tuple[str, ...] = tuple(b.name for b in BENCHMARKS if b.where == "host")
GPU_BENCHMARKS: tuple[str, ...] = tuple(b.name for b in BENCHMARKS if b.where == "gpu")
ALL_BENCHMARKS: tuple[str, ...] = HOST_BENCHMARKS + GPU_BENCHMARKS  # the order a run takes them in


PER_GPU_CHECKS: frozenset[str] = frozenset(c.id for c in CHECKS if c.per_gpu)


def at_level(level: str) -> tuple[str, ...]:
    """The ids judged at a level (health, quick, run, soak), in catalogue order: `gpuvet health
    --skip` takes exactly health's."""
    return tuple(c.id for c in CHECKS if level in c.levels)


def fed_by(benchmark: str, emitted_by: str = "run") -> tuple[str, ...]:
    """The ids a benchmark's measurements feed (in `gpuvet run` unless told)."""
    return tuple(c.id for c in CHECKS if c.benchmark == benchmark and c.emitted_by == emitted_by)


def is_check(check_id: str) -> bool:
    return check_id in BY_ID


def checked(check_id: str) -> str:
    """`check_id`, which must be in the catalogue: how a rule names the checks it judges (a module
    declares each once, `GPU_ECC = checked("gpu.ecc")`), so a misspelt or removed id stops the import
    instead of emitting findings of no check."""
    if check_id not in BY_ID:
        raise KeyError(f"{check_id!r} is not in gpuvet's catalogue of checks")
    return check_id


def as_json() -> dict[str, Any]:
    checks = [{**asdict(c), "levels": list(c.levels), "inputs": c.inputs} for c in CHECKS]
    return {"checks": checks, "benchmarks": [asdict(b) for b in BENCHMARKS], "levels": list(LEVELS),
            "actions": list(ACTION_NAMES)}
